"""Weights & Biases as an optional tracker (cl_jax.runtime.wandb_tracker), in W&B's offline
mode: every metrics.jsonl row of a tiny run, stopped and resumed and then probed, is in the
W&B run's files under one run id; without wandb, log.wandb=true stops in one line."""

import glob
import json
import os
import subprocess
import sys

import pytest

from cl_jax.runtime import wandb_tracker
from cl_jax.runtime.errors import UsageError
from tests import tiny_run

wandb = pytest.importorskip("wandb")  # in requirements.txt: CI has it


def _history(workdir) -> dict[int, dict]:
  """{step: the merged items logged at that step} over every offline run of `workdir`, read
  with W&B's own reader of its transaction logs (`wandb leet inspect --json`)."""
  wandb_cli = os.path.join(os.path.dirname(sys.executable), "wandb")
  rows = {}
  for log in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))):
    out = subprocess.run(
        [wandb_cli, "leet", "inspect", "--json", log],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    for line in out.splitlines():
      record = json.loads(line)
      if record.get("type") == "history":
        item = record["history"]["item"]
        rows.setdefault(item["_step"], {}).update(item)
  return rows


@pytest.mark.slow
def test_every_metrics_row_reaches_one_wandb_run_across_a_resume_and_the_probe(tmp_path):
  workdir = tmp_path / "run"
  flags = tiny_run.FLAGS + ["--config.optim.epochs=1", "--config.log.wandb=true"]
  env = {**tiny_run.env(), "WANDB_MODE": "offline"}
  for extra in (["--stop_at_step=4"], []):
    proc = subprocess.run(
        tiny_run.command(workdir, flags + extra),
        cwd=tiny_run.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
  run_id = (workdir / wandb_tracker.RUN_ID_FILE).read_text().strip()
  logs = glob.glob(str(workdir / "wandb" / "offline-run-*" / f"run-{run_id}.wandb"))
  assert len(logs) == 3  # the first chunk, the resumed chunk, the probe: one run id
  history = _history(str(workdir))
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert {r["step"] for r in rows} == set(range(1, 9))
  assert any(k.startswith("probe/") for r in rows for k in r)  # the probe's row is there too
  for row in rows:
    logged = history[row["step"]]
    for key, value in row.items():
      if key != "step":
        assert logged[key] == pytest.approx(value, rel=1e-12, abs=0), (row["step"], key)


def test_without_wandb_the_run_stops_at_start_in_one_line(monkeypatch):
  from cl_jax import config_defaults

  c = config_defaults.base_config()
  wandb_tracker.check_available(c)  # off: nothing needed
  c.log.wandb = True
  monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
  with pytest.raises(UsageError, match=r"needs the wandb package: pip install wandb"):
    wandb_tracker.check_available(c)
