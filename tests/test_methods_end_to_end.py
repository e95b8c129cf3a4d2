"""SimCLR, BYOL and SimSiam through the main job on the tiny Trifeature run, in subprocesses:
pretraining, checkpoints without queue or target, exact resume, and the probe report."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from cl_jax.runtime import metrics
from tests import forked_commands, tiny_run
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # subprocess runs or compiled train steps: minutes

# The tiny run's data and model sizes (tests/tiny_run.py) without its MoCo-only flags.
SIZES = [
    f
    for f in tiny_run.FLAGS
    if not f.startswith(("--config=", "--config.moco.", "--config.nonsemantic."))
]
PROBE = [
    "--config.probe.epochs=5",
    "--config.probe.batch_size=64",
    "--config.probe.decay_epochs=(3,)",
]


def _run(workdir, name, *extra):
  """`python -m cl_jax.main` in a process forked from one that has imported the libraries
  (tests/forked_commands.py)."""
  args = [
      "cl_jax.main",
      f"--config=configs/{name}.py",
      f"--workdir={workdir}",
      *SIZES,
      "--config.optim.epochs=1",
      *extra,
  ]
  proc = forked_commands.shared().run(args, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _losses(workdir):
  return {r["step"]: r["loss"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))}


@pytest.mark.parametrize(
    "name, extra, keys",
    [
        (
            "simclr",
            [
                "--config.nonsemantic.enabled=true",
                "--config.nonsemantic.patch_min=2",
                "--config.nonsemantic.patch_max=6",
            ],
            ("pos_mean", "neg_mean", "neg_var", "ns_mean"),
        ),
        ("simsiam", ["--config.model.predictor_hidden_dim=8"], ("pos_mean",)),
        ("barlow_twins", [], ("pos_mean", "off_diagonal_rms")),
    ],
)
def test_pretrain_then_probe(tmp_path, name, extra, keys):
  proc = _run(tmp_path, name, *extra, *PROBE)
  records = metrics.read_metrics(str(tmp_path))  # the probe's row merged into step 8's
  assert [r["step"] for r in records] == list(range(1, 9))  # 256 // 32, 1 epoch
  for key in ("loss", *keys):
    assert all(np.isfinite(r[key]) for r in records), key
  report = json.loads((tmp_path / "probe_step8_fast.json").read_text())
  assert set(report["accuracy"]) == {"shape", "texture", "colour"}
  assert "top-1" in proc.stdout
  if name == "simclr":
    # The similarity histograms of a run without queue or target network.
    viz = subprocess.run(
        [sys.executable, "-m", "cl_jax.viz", str(tmp_path), "--batches=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=tiny_run.env(),
    )
    assert viz.returncode == 0, viz.stderr[-3000:]
    [png] = (tmp_path / "viz").glob("sim_hist_*_step8.png")
    with Image.open(png) as image:
      assert image.format == "PNG" and min(image.size) > 100


def test_byol_resumes_exactly(tmp_path):
  flags = ["--config.model.predictor_hidden_dim=8", "--probe=false"]
  _run(tmp_path / "whole", "byol", *flags)
  _run(tmp_path / "split", "byol", *flags, "--stop_at_step=4")
  assert sorted(_losses(tmp_path / "split")) == [1, 2, 3, 4]
  _run(tmp_path / "split", "byol", *flags)
  whole, split = _losses(tmp_path / "whole"), _losses(tmp_path / "split")
  assert sorted(split) == list(range(1, 9))
  np.testing.assert_allclose(
      [split[s] for s in range(1, 9)], [whole[s] for s in range(1, 9)], rtol=1e-6
  )
