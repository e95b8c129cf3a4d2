"""The recipe check's table from run directories as cl_jax.main leaves them."""

import json

import pytest

from cl_jax import recipe_check


def _write_run(run_dir, step, trained, init, records):
  run_dir.mkdir(parents=True)
  acc = lambda v: {k: {"top1": x, "top5": 1.0} for k, x in zip(recipe_check.LABELS, v)}
  report = {"step": step, "accuracy": acc(trained), "random_init": acc(init)}
  (run_dir / f"probe_step{step}_fast.json").write_text(json.dumps(report))
  (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_row_reads_the_last_report_and_the_final_metrics(tmp_path):
  run = tmp_path / "mocov2" / "seed0"
  _write_run(
      run,
      312,
      (0.9, 0.33, 0.28),
      (0.75, 0.17, 0.23),
      [
          {"step": 10, "loss": 7.0, "health/std_sqrt_d": 0.1, "health/rank": 9.0},
          {"step": 312, "loss": 6.5, "health/std_sqrt_d": 0.6, "health/rank": 9.0},
      ],
  )
  # An earlier report (step 12 sorts after 312 as a string) must not be taken as the last.
  (run / "probe_step12_fast.json").write_text(json.dumps({"step": 12}))
  row = recipe_check.summarise_run(str(run), 150.0)
  assert row["step"] == 312
  assert row["trained"] == pytest.approx({"colour": 90.0, "shape": 33.0, "texture": 28.0})
  assert row["random_init"] == pytest.approx({"colour": 75.0, "shape": 17.0, "texture": 23.0})
  assert row["loss"] == 6.5 and row["std_sqrt_d"] == 0.6 and row["flagged_steps"] == [10]
  table = recipe_check.markdown_table([("mocov2", 0, row)])
  assert (
      "| mocov2 | 0 | 75.0 -> 90.0 (+15.0) | 17.0 -> 33.0 (+16.0) | 23.0 -> 28.0 (+5.0) |" in table
  )
  assert "| 6.500 | 0.60 | steps 10-10 (1 log) | 150 |" in table
  # The same run without the collapsed step is not flagged; one ending collapsed says so.
  records = (run / "metrics.jsonl").read_text().splitlines()
  (run / "metrics.jsonl").write_text(records[1] + "\n")
  assert recipe_check.summarise_run(str(run), 150.0)["flagged_steps"] == []
  (run / "metrics.jsonl").write_text(
      "\n".join([records[0], records[0].replace('"step": 10', '"step": 312')])
  )
  row = recipe_check.summarise_run(str(run), None)
  assert "| steps 10-end (2 logs) | - |" in recipe_check.markdown_table([("mocov2", 0, row)])


def test_unfinished_run_has_no_row_and_a_report_without_baseline_is_refused(tmp_path):
  run = tmp_path / "simclr" / "seed1"
  run.mkdir(parents=True)
  assert recipe_check.summarise_run(str(run), None) is None
  (run / "probe_step8_fast.json").write_text(json.dumps({"step": 8, "accuracy": {}}))
  with pytest.raises(ValueError, match="random-init baseline"):
    recipe_check.summarise_run(str(run), None)
