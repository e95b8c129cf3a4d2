"""Runs that survive a cluster, in subprocesses of the tiny run: SIGTERM and a chosen extra
signal stop at a step end with a checkpoint and resume bit for bit, a second trainer on the
workdir is refused while the first finishes unharmed, a chunk that is already reached says
so, and a torn metrics line neither stops a resume nor the viz command."""

import os
import signal
import subprocess
import sys
import time

import pytest

from cl_jax import metrics
from tests import preemption_trials as trials
from tests import tiny_run

pytestmark = pytest.mark.slow  # subprocess runs: minutes

ROOT = trials.ROOT


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """(final train state, seconds) of the tiny run never stopped."""
  workdir = tmp_path_factory.mktemp("straight")
  started = time.time()
  done = trials.run(workdir)
  assert done.returncode == 0, done.stderr[-3000:]
  return trials.final_state(workdir), time.time() - started


@pytest.mark.parametrize(
    "sig,fraction",
    [(signal.SIGTERM, 0.1), (signal.SIGTERM, 0.45), (signal.SIGUSR1, 0.3)],
    ids=["term-early", "term-mid", "usr1"],
)
def test_stop_signal_saves_and_resumes_bit_for_bit(tmp_path, reference, sig, fraction):
  state, seconds = reference
  extra = () if sig == signal.SIGTERM else ("--stop_signal=USR1",)
  got = trials.trial(tmp_path / "run", fraction * seconds, sig, state, *extra)
  assert all(got["checks"].values()), (got, got["resume_stderr"])
  if got["status"] != 0:  # it was stopped before its end
    name = signal.Signals(sig).name
    assert got["line"].startswith(f"stopped by {name}: saved a checkpoint at step ")
    assert "Resume with: python -m cl_jax.main --workdir=" in got["line"]


def test_second_writer_is_refused_and_the_first_finishes(tmp_path, reference):
  state, _ = reference
  workdir = tmp_path / "run"
  first = subprocess.Popen(
      trials.command(workdir),
      cwd=ROOT,
      env=tiny_run.env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  deadline = time.time() + 600
  while time.time() < deadline and not trials.steps(workdir):
    time.sleep(0.02)
  second = trials.run(workdir)
  assert second.returncode == 1
  assert second.stderr.strip().count("\n") == 0 and "Traceback" not in second.stderr
  assert f"is in use by another training run (pid {first.pid} on host " in second.stderr
  _, err = first.communicate(timeout=600)
  assert first.returncode == 0, err[-3000:]
  rows = [r["step"] for r in metrics.read_jsonl(workdir / "metrics.jsonl")]
  assert rows == list(range(1, trials.TOTAL + 1))
  assert trials.same_state(trials.final_state(workdir), state)


def test_stop_at_a_reached_step_says_so_and_fails(tmp_path):
  workdir = tmp_path / "run"
  chunk = trials.run(workdir, "--stop_at_step=8")
  assert chunk.returncode == 0, chunk.stderr[-3000:]
  again = trials.run(workdir, "--stop_at_step=8")
  assert again.returncode == 1
  assert again.stderr.strip() == (
      "error: --stop_at_step=8 is at or below the step this run has reached (8 of 48): "
      "nothing to do; give a later step to continue"
  )
  assert trials.steps(workdir)[-1] == 8


def test_torn_metrics_line_resumes_and_viz_reads(tmp_path, reference):
  state, _ = reference
  workdir = tmp_path / "run"
  chunk = trials.run(workdir, "--stop_at_step=8")
  assert chunk.returncode == 0, chunk.stderr[-3000:]
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 9, "loss": 7.')  # a write cut short
  viz = subprocess.run(
      [sys.executable, "-m", "cl_jax.viz", str(workdir)],
      cwd=ROOT,
      env=tiny_run.env(),
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert viz.returncode == 0, viz.stderr[-3000:]
  assert "line 9: not a whole metrics row" in viz.stderr and "Traceback" not in viz.stderr
  resumed = trials.run(workdir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "line 9: not a whole metrics row" in resumed.stderr
  rows = [r["step"] for r in metrics.read_jsonl(workdir / "metrics.jsonl")]
  assert rows == list(range(1, trials.TOTAL + 1))
  assert trials.same_state(trials.final_state(workdir), state)
  assert not os.path.exists(workdir / "metrics.jsonl.tmp")
