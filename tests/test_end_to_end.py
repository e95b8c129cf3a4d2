"""The main job end to end on a tiny Trifeature config, in subprocesses.

Covers: pretraining + probe report; exact resume after SIGKILL; a diverging
run stops with a message and leaves the last good checkpoint intact.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np

from cl_jax import checkpoint, metrics, parallel, train
from tests import tiny_run
from tests.conftest import ROOT

TINY = [*tiny_run.FLAGS,
        "--config.probe.epochs=5",
        "--config.probe.batch_size=64",
        "--config.probe.decay_epochs=(3,)"]


def _cmd(workdir, *extra):
  return [sys.executable, "-m", "cl_jax.main", f"--workdir={workdir}", *TINY, *extra]


def _run(workdir, *extra, timeout=600):
  return subprocess.run(_cmd(workdir, *extra), cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)


def _losses(workdir) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))}


def _steps(workdir) -> list[int]:
  return sorted(int(os.path.basename(p)) for p in glob.glob(os.path.join(workdir, "checkpoints", "*"))
                if os.path.basename(p).isdigit())


def test_pretrain_then_probe_report(tmp_path):
  workdir = tmp_path / "run"
  proc = _run(workdir, "--config.optim.epochs=2", "--config.train.checkpoint_every=4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = metrics.read_jsonl(workdir / "metrics.jsonl")
  assert [r["step"] for r in records] == list(range(1, 17))     # 256 // 32 * 2 epochs
  for key in ("loss", "lr", "pos_mean", "neg_mean", "neg_var", "ns_mean", "img_per_s"):
    assert all(np.isfinite(r[key]) for r in records), key
  assert records[0]["lr"] > records[-1]["lr"]                   # cosine decay
  # The health signals: logged every step, and the quick recipe's embeddings keep their
  # spread (the plain MoCo-v2 head of this tiny run falls to std x sqrt(d) 0.09, rank 2.1, by step 16).
  for key in ("health/std", "health/std_sqrt_d", "health/rank", "health/align",
              "health/uniform", "health/collapsed"):
    assert all(np.isfinite(r[key]) for r in records), key
  assert records[-1]["health/std_sqrt_d"] > 0.25 and records[-1]["health/rank"] > 3.0
  assert glob.glob(str(workdir / "tb" / "events.out.tfevents.*"))
  assert _steps(workdir) == [12, 16]                            # keep_checkpoints = 2
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

  paper = subprocess.run([sys.executable, "-m", "cl_jax.probe", f"--workdir={workdir}",
                          "--step=12", "--protocol=paper", "--baseline=false"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
  assert paper.returncode == 0, paper.stderr[-3000:]
  report = json.loads((workdir / "probe_step12_paper.json").read_text())
  assert report["step"] == 12 and report["protocol"] == "paper" and "random_init" not in report
  assert set(report["accuracy"]) == {"shape", "texture", "colour"}


def test_sigkill_resume_reaches_the_same_loss(tmp_path):
  extra = ("--config.optim.epochs=6", "--config.train.checkpoint_every=4", "--probe=false")
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  proc = subprocess.Popen(_cmd(killed, *extra), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while time.time() < deadline and not any(s >= 8 for s in _steps(killed)):
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  interrupted_at = max(_steps(killed))
  assert 8 <= interrupted_at < 48, "the run was not killed during training"

  resumed = _run(killed, *extra)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resuming from the checkpoint at step {interrupted_at}" in resumed.stdout
  done = _run(straight, *extra)
  assert done.returncode == 0, done.stderr[-3000:]
  a, b = _losses(straight), _losses(killed)
  assert len(a) == 48
  for step in (interrupted_at + 1, 40, 48):
    assert a[step] == b[step], (step, a[step], b[step])


def test_diverging_run_stops_and_keeps_last_good_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  first = _run(workdir, "--config.optim.epochs=1", "--config.train.checkpoint_every=4",
               "--probe=false")
  assert first.returncode == 0, first.stderr[-3000:]
  assert _steps(workdir) == [4, 8]

  bad = _run(workdir, "--config.optim.epochs=3", "--config.train.checkpoint_every=4",
             "--config.optim.lr=1e30", "--probe=false")
  assert bad.returncode != 0
  assert "diverged" in bad.stderr and "last good checkpoint (step 8) is intact" in bad.stderr
  assert _steps(workdir) == [4, 8]

  config = train.read_config(workdir)
  mesh = parallel.make_mesh(jax.devices()[:1])
  _, _, _, make_state, _ = train.build(config, 256, mesh)
  state, meta = checkpoint.restore(checkpoint.make_manager(workdir, read_only=True),
                                   jax.eval_shape(make_state))
  assert int(state.step) == 8 and meta == {"queue_shards": 1, "keys_per_step": 32}
  leaves = [np.asarray(x) for x in jax.tree.leaves(state.params)]
  assert all(np.all(np.isfinite(x)) for x in leaves)


def test_training_path_does_not_import_tensorflow():
  code = ("import sys\n"
          "from cl_jax import main, train, linear_probe\n"
          "from cl_jax.data import sources\n"
          "from configs import mocov2_patchns\n"
          "c = mocov2_patchns.get_config(None)\n"
          "c.data.image_size, c.data.trifeature_train = 16, 8\n"
          "sources.open_source(c.data, 'pretrain')[0]\n"
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
          "assert 'tensorflow_datasets' not in sys.modules, 'tensorflow_datasets imported'\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
