"""A seed's run is bit-exact on one machine whatever the load: the tiny run (every step
logged) alone and again beside two busy processes that take the cores logs identical values
(README "Reproducibility: what is bit-exact")."""

import json
import subprocess
import sys

import pytest

from tests import tiny_run
from tests.conftest import ROOT

BUSY = "while True: pass"


def _metrics(workdir) -> list[dict]:
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return [{k: v for k, v in r.items() if k not in ("img_per_s", "knn/seconds")} for r in rows]


def _train(workdir):
  out = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.main",
          f"--workdir={workdir}",
          *tiny_run.FLAGS,
          "--config.optim.epochs=1",
          "--probe=false",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
      env=tiny_run.env(),
  )
  assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.slow
def test_the_same_seed_logs_the_same_values_alone_and_under_load(tmp_path):
  _train(tmp_path / "alone")
  busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
  try:
    _train(tmp_path / "loaded")
  finally:
    for p in busy:
      p.kill()
  alone, loaded = _metrics(tmp_path / "alone"), _metrics(tmp_path / "loaded")
  assert len(alone) == 8 and [r["step"] for r in alone] == list(range(1, 9))
  assert loaded == alone
