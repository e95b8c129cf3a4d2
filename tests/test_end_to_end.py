"""The main job end to end on a tiny Trifeature config, in subprocesses.

Covers: pretraining + probe report, the start-up summary and the plain log
lines of a run whose output is not a terminal; exact resume after SIGKILL; a
diverging run stops before saving, and its advice resumes it.
"""

import glob
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from cl_jax import train
from cl_jax.runtime import checkpoint, metrics, parallel, run_config
from tests import forked_commands, preemption_trials, tiny_run
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # subprocess runs or compiled train steps: minutes

TINY = [
    *tiny_run.FLAGS,
    "--config.probe.epochs=5",
    "--config.probe.batch_size=64",
    "--config.probe.decay_epochs=(3,)",
]


def _run(workdir, *extra, timeout=600):
  """`python -m cl_jax.main` of the tiny run, in a process forked from one that has imported
  the libraries (tests/forked_commands.py)."""
  args = ["cl_jax.main", f"--workdir={workdir}", *TINY, *extra]
  return forked_commands.shared().run(args, timeout=timeout)


def _losses(workdir) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))}


def _steps(workdir) -> list[int]:
  return sorted(
      int(os.path.basename(p))
      for p in glob.glob(os.path.join(workdir, "checkpoints", "*"))
      if os.path.basename(p).isdigit()
  )


def test_pretrain_then_probe_report(finished_run, finished_run_copy):
  """The shared finished run (tests/tiny_run.py FINISHED): 16 steps, checkpoints every 4, the
  kNN monitor every 8, the fast probe at the end; then the paper probe on its step 12."""
  workdir, proc = pathlib.Path(finished_run.workdir), finished_run
  records = metrics.read_metrics(str(workdir))  # the probe's row merged into step 16's
  assert [r["step"] for r in records] == list(range(1, 17))  # 256 // 32 * 2 epochs
  assert {"loss", "probe/fast/shape/top1"} <= set(records[-1])
  for key in ("loss", "lr", "pos_mean", "neg_mean", "neg_var", "ns_mean", "param_norm"):
    assert all(np.isfinite(r[key]) for r in records), key
  # img/s leaves out the first step (compilation): from the second logged step on.
  assert "img_per_s" not in records[0]
  assert all(np.isfinite(r["img_per_s"]) and r["img_per_s"] > 0 for r in records[1:])
  assert records[0]["lr"] > records[-1]["lr"]  # cosine decay
  # The health signals: logged every step, and the quick recipe's embeddings keep their
  # spread (the plain MoCo-v2 head of this tiny run falls to std x sqrt(d) 0.09, rank 2.1,
  # by step 16).
  for key in (
      "health/std",
      "health/std_sqrt_d",
      "health/rank",
      "health/align",
      "health/uniform",
      "health/collapsed",
  ):
    assert all(np.isfinite(r[key]) for r in records), key
  assert records[-1]["health/std_sqrt_d"] > 0.25 and records[-1]["health/rank"] > 3.0
  assert glob.glob(str(workdir / "tb" / "events.out.tfevents.*"))
  assert _steps(workdir) == [12, 16]  # keep_checkpoints = 2
  report = json.loads((workdir / "probe_step16_fast.json").read_text())
  assert set(report["accuracy"]) == {"shape", "texture", "colour"}
  for acc in report["accuracy"].values():
    assert 0.0 <= acc["top1"] <= acc["top5"] <= 1.0
  # The random-init baseline: the same probe on the step-0 network, cached per config.
  assert set(report["random_init"]) == {"shape", "texture", "colour"}
  for acc in report["random_init"].values():
    assert 0.0 <= acc["top1"] <= acc["top5"] <= 1.0
  assert len(glob.glob(os.path.join(os.environ["CL_JAX_CACHE"], "random_init", "*.json"))) >= 1
  assert "colour" in proc.stdout and "random init" in proc.stdout
  # Not a terminal: no progress bar, one plain line per logging step, after the summary.
  assert "\r" not in proc.stdout + proc.stderr
  assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")] == [
      f"{i}/16" for i in range(1, 17)
  ]
  for line in (
      f"workdir   {workdir} (new run)",
      "devices   1 process(es), 1 cpu device(s)",
      "batch     32 global, 32 per device",
      "steps     8 per epoch x 2 epochs = 16",
      "M parameters",
      "data      trifeature 16 px: pretrain 256, probe train 256, " "test 128",
      "moco + non-semantic negatives (patch, 1 per query",
  ):
    assert line in proc.stdout, line

  paper = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.probe",
          f"--workdir={finished_run_copy}",
          "--step=12",
          "--protocol=paper",
          "--baseline=false",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert paper.returncode == 0, paper.stderr[-3000:]
  report = json.loads((finished_run_copy / "probe_step12_paper.json").read_text())
  assert report["step"] == 12 and report["protocol"] == "paper" and "random_init" not in report
  assert set(report["accuracy"]) == {"shape", "texture", "colour"}


def _start_and_stop(workdir, sig) -> tuple[int, str]:
  """Start the stop-and-resume trials' run (tests/preemption_trials.py), send `sig` to its
  process group once it has saved step 8 or later; (exit status, stderr)."""
  proc = subprocess.Popen(
      preemption_trials.command(workdir),
      cwd=ROOT,
      env=tiny_run.env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  )
  deadline = time.time() + 300
  while time.time() < deadline and not any(s >= 8 for s in _steps(workdir)):
    time.sleep(0.02)
  os.killpg(proc.pid, sig)  # the whole group, as a terminal's Ctrl-C does
  _, err = proc.communicate(timeout=300)
  return proc.returncode, err


def test_killed_and_interrupted_runs_resume_exactly(tmp_path, straight_run):
  """Against the shared run never stopped (48 steps, a checkpoint every 4)."""
  killed, interrupted = tmp_path / "killed", tmp_path / "ctrl_c"
  reference = _losses(straight_run.workdir)
  assert sorted(reference) == list(range(1, 49))

  _start_and_stop(killed, signal.SIGKILL)
  killed_at = max(_steps(killed))
  assert 8 <= killed_at < 48, "the run was not killed during training"

  status, err = _start_and_stop(interrupted, signal.SIGINT)
  assert status == 130
  lines = err.strip().splitlines()
  assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
  saved = int(lines[0].split("saved a checkpoint at step ")[1].split(".")[0])
  assert saved == max(_steps(interrupted)) and saved >= 8
  assert lines[0].endswith("--probe=false") and "Resume with: python -m cl_jax.main" in lines[0]

  for workdir, step in ((killed, killed_at), (interrupted, saved)):
    resumed = preemption_trials.run(workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from the checkpoint at step {step} of 48" in resumed.stdout
    # One metrics row per step, every one equal to the uninterrupted run's.
    steps = [r["step"] for r in metrics.read_jsonl(workdir / "metrics.jsonl")]
    assert steps == list(range(1, 49))
    assert _losses(workdir) == reference


def test_diverging_run_stops_before_saving_and_its_advice_resumes(tmp_path):
  workdir = tmp_path / "run"
  first = _run(
      workdir, "--config.optim.epochs=1", "--config.train.checkpoint_every=4", "--probe=false"
  )
  assert first.returncode == 0, first.stderr[-3000:]
  assert _steps(workdir) == [4, 8]

  lr = (
      "--config.optim.epochs=3",
      "--config.train.checkpoint_every=4",
      "--allow_config_change",
      "--probe=false",
  )
  bad = _run(workdir, *lr, "--config.optim.lr=1e30")
  assert bad.returncode == 1
  message = bad.stderr.strip().splitlines()[-1]
  assert message.startswith("error: training diverged at step 9: the parameter norm "), message
  assert "resume from step 8" in message and "lower --config.optim.lr" in message
  assert _steps(workdir) == [4, 8]  # nothing saved after the divergence

  config = run_config.read(workdir)
  mesh = parallel.make_mesh(jax.devices()[:1])
  make_state = train.build(config, 256, mesh).make_state
  state, meta = checkpoint.restore(
      checkpoint.make_manager(workdir, read_only=True), jax.eval_shape(make_state)
  )
  assert int(state.step) == 8 and meta["queue_shards"] == 1 and meta["keys_per_step"] == 32
  leaves = [np.asarray(x) for x in jax.tree.leaves(state.params)]
  assert all(np.all(np.isfinite(x)) for x in leaves)
  norm = np.sqrt(sum(float(np.sum(np.square(x, dtype=np.float64))) for x in leaves))
  np.testing.assert_allclose(meta["param_norm"], norm, rtol=1e-5)
  assert meta["param_norm"] < 2 * meta["param_norm_init"]

  # The advice is true: a lower learning rate resumes from step 8 and finishes.
  good = _run(workdir, *lr, "--config.optim.lr=0.06")
  assert good.returncode == 0, good.stderr[-3000:]
  assert "resuming from the checkpoint at step 8" in good.stdout
  records = metrics.read_jsonl(workdir / "metrics.jsonl")
  assert [r["step"] for r in records] == list(range(1, 25))
  assert all(np.isfinite(r["loss"]) for r in records)
  assert {"config.json", "config.step0.json", "config.step8.json"} <= set(os.listdir(workdir))
  assert run_config.read(workdir).optim.lr == 0.06
  assert json.loads((workdir / "config.step0.json").read_text())["optim"]["epochs"] == 1


def test_training_path_does_not_import_tensorflow():
  code = (
      "import sys\n"
      "from cl_jax import main, train\n"
      "from cl_jax.evaluators import linear_probe, registry\n"
      "from cl_jax.data import sources\n"
      "from configs import mocov2_patchns\n"
      "c = mocov2_patchns.get_config(None)\n"
      "c.data.image_size, c.data.trifeature_train = 16, 8\n"
      "sources.open_source(c.data, 'pretrain')[0]\n"
      "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
      "assert 'tensorflow_datasets' not in sys.modules, 'tensorflow_datasets imported'\n"
  )
  proc = subprocess.run(
      [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
