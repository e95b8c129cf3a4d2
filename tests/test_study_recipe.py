"""cl_jax.studies.recipe: the recipe check's table rows (random init -> trained (gain), final
loss, std x sqrt(d), the steps flagged as collapsed, wall time, commit and processor) from study
records, and from the record of a finished run directory as cl_jax.main leaves it."""

from cl_jax.analysis import study_records
from cl_jax.studies import recipe
from cl_jax.studies.arms import QUICK
from tests import study_fakes as F


def _record(step, trained, init, loss, std_sqrt_d, flagged, wall_s) -> dict:
  """The parts of a study record the recipe table reads (accuracies in percent)."""
  values = {"loss": loss}
  for k, t, i in zip(("colour", "shape", "texture"), trained, init):
    values[k] = t
    values[f"random_init/{k}"] = i
  if std_sqrt_d is not None:
    values["std_sqrt_d"] = std_sqrt_d
  return {"step": step, "wall_s": wall_s, "metrics": values, "collapse_flagged_steps": flagged}


def _rows(table: str) -> list[str]:
  """The rows without their last two cells (commit, processor: test_a_row_names_...)."""
  lines = table.splitlines()
  assert lines[0] == (
      "| config | seed | colour | shape | texture | final loss | std x sqrt(d) | "
      "collapse flagged at | wall s | commit | processor |"
  )
  assert lines[1] == "|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|"
  return [line.rsplit(" | ", 2)[0] + " |" for line in lines[2:]]


def test_rows_from_records():
  records = {
      # In another order than the study's arms: the table follows the arms, then the seeds.
      "simclr": {
          1: _record(312, (50.0, 40.0, 30.0), (40.0, 45.0, 30.0), 4.25, None, [], None),
      },
      "mocov2": {
          1: _record(312, (80.0, 30.0, 20.0), (10.0, 10.0, 10.0), 5.0, 0.1, [10, 20, 312], 99.6),
          0: _record(312, (90.0, 33.0, 28.0), (75.0, 17.0, 23.0), 6.5, 0.6, [10], 150.0),
      },
  }
  assert _rows(recipe.markdown_table(recipe.STUDY, records)) == [
      "| mocov2 | 0 | 75.0 -> 90.0 (+15.0) | 17.0 -> 33.0 (+16.0) | 23.0 -> 28.0 (+5.0) | "
      "6.500 | 0.60 | steps 10-10 (1 log) | 150 |",
      "| mocov2 | 1 | 10.0 -> 80.0 (+70.0) | 10.0 -> 30.0 (+20.0) | 10.0 -> 20.0 (+10.0) | "
      "5.000 | 0.10 | steps 10-end (3 logs) | 100 |",
      "| simclr | 1 | 40.0 -> 50.0 (+10.0) | 45.0 -> 40.0 (-5.0) | 30.0 -> 30.0 (+0.0) | "
      "4.250 | - | - | - |",
  ]
  assert _rows(recipe.markdown_table(recipe.STUDY, {})) == []


def test_row_from_the_record_of_a_finished_run(tmp_path):
  # A run whose first logged step (4) is below the health threshold std x sqrt(d) 0.2.
  arm = QUICK["mocov2"]
  config = study_records.arm_config(arm, 0, F.TINY)
  run = tmp_path / "mocov2" / "seed0"
  F.make_run(
      run,
      config,
      {"colour": 0.9, "shape": 0.33, "texture": 0.28},
      {"colour": 0.75, "shape": 0.17, "texture": 0.23},
      std_sqrt_d=(0.1, 0.6),
  )
  record = study_records.collect(arm, 0, config, run, F.STEPS, 150.0, ())
  assert record["collapse_flagged_steps"] == [4]
  assert _rows(recipe.markdown_table(recipe.STUDY, {"mocov2": {0: record}})) == [
      "| mocov2 | 0 | 75.0 -> 90.0 (+15.0) | 17.0 -> 33.0 (+16.0) | 23.0 -> 28.0 (+5.0) | "
      "4.000 | 0.60 | steps 4-4 (1 log) | 150 |"
  ]
  # A run that ends collapsed says so; one never collapsed has nothing flagged.
  run = tmp_path / "mocov2" / "seed1"
  config = study_records.arm_config(arm, 1, F.TINY)
  F.make_run(run, config, F.accuracies(1, 0.5), F.accuracies(1, 0.1), std_sqrt_d=(0.1, 0.15))
  record = study_records.collect(arm, 1, config, run, F.STEPS, None, ())
  assert _rows(recipe.markdown_table(recipe.STUDY, {"mocov2": {1: record}}))[0].endswith(
      "| 4.000 | 0.15 | steps 4-end (2 logs) | - |"
  )
  run = tmp_path / "mocov2" / "seed2"
  config = study_records.arm_config(arm, 2, F.TINY)
  F.make_run(run, config, F.accuracies(2, 0.5), F.accuracies(2, 0.1), std_sqrt_d=(0.5, 0.6))
  record = study_records.collect(arm, 2, config, run, F.STEPS, 7.0, ())
  assert _rows(recipe.markdown_table(recipe.STUDY, {"mocov2": {2: record}}))[0].endswith(
      "| 4.000 | 0.60 | - | 7 |"
  )


def test_a_row_names_the_records_commit_and_processor():
  """By hand: the commit of the record's code, "-" for a record older than code versions, and
  the processor as its model and widest vector instructions."""
  new = _record(624, (99.85, 57.55, 35.9), (74.75, 17.05, 23.15), 5.0663, 0.9776, [], 557.6)
  new.update(code={"commit": "3484e57"}, environment={"cpu": "AMD EPYC", "isa": "avx512f avx2"})
  old = dict(new, environment={"cpu": "AMD EPYC", "isa": "avx2"})
  del old["code"]
  rows = recipe.markdown_table(recipe.STUDY, {"mocov2": {0: new, 1: old}}).splitlines()[2:]
  assert rows == [
      "| mocov2 | 0 | 74.8 -> 99.8 (+25.1) | 17.1 -> 57.5 (+40.5) | 23.1 -> 35.9 (+12.8) | 5.066 "
      "| 0.98 | - | 558 | `3484e57` | AMD EPYC (avx512f) |",
      "| mocov2 | 1 | 74.8 -> 99.8 (+25.1) | 17.1 -> 57.5 (+40.5) | 23.1 -> 35.9 (+12.8) | 5.066 "
      "| 0.98 | - | 558 | - | AMD EPYC (avx2) |",
  ]
