"""Every check that depends on the data runs before pretraining's first step: a run that the
data cannot finish stops at start with one line on stderr and leaves no workdir behind (no
checkpoint, no metrics row, no lock), where before it could pretrain to its last step first."""

import os
import re
import subprocess

import numpy as np
import pytest
from PIL import Image

from tests import bad_inputs, forked_commands, tiny_run

pytestmark = pytest.mark.slow  # seven start-ups of cl_jax.main, one run of a step

TRAIN = ["cl_jax.main", *tiny_run.FLAGS, "--config.optim.epochs=1"]


def _folder(root, labelled: bool, images: int = 96) -> str:
  """A folder of `images` 24 px JPEGs: DIR/train/<class>/ and DIR/val/<class>/ (16 each, 2
  classes) when labelled, else a flat folder."""
  rng = np.random.default_rng(0)
  for i in range(images + (32 if labelled else 0)):
    split, label = ("train", i % 2) if i < images else ("val", i % 2)
    sub = os.path.join(root, split, f"c{label}") if labelled else root
    os.makedirs(sub, exist_ok=True)
    pixels = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(os.path.join(sub, f"{i}.jpg"))
  return str(root)


def _cases(tmp_path) -> list[tuple[str, list[str], str]]:
  """(name, arguments, the phrase of the one error line; "" where the run must work)."""
  labelled = _folder(tmp_path / "labelled", labelled=True)
  flat = _folder(tmp_path / "flat", labelled=False)
  folder = ["--config.data.name=folder", "--config.optim.batch_size=16", "--config.eval.knn_k=20"]
  return [
      (
          "the fast probe's batch exceeds the probe training set (a labelled folder)",
          [*TRAIN, *folder, f"--config.data.folder={labelled}"],
          "probe.batch_size = 256 exceeds the probe training set (96 images)",
      ),
      (
          "the paper probe's batch exceeds the probe training set (Trifeature)",
          [*TRAIN, "--config.probe.protocol=paper", "--config.probe.batch_size=300"],
          "probe.batch_size = 300 exceeds the probe training set (256 images)",
      ),
      (
          "the kNN monitor's k exceeds its memory bank",
          [*TRAIN, "--config.eval.every=4", "--config.eval.knn_k=300"],
          "eval.knn_k = 300 exceeds the memory bank's 256 images",
      ),
      (
          "texture negatives without their texture images",
          [
              *TRAIN,
              "--config.nonsemantic.kind=texture",
              f"--config.data.texture_dir={tmp_path / 'no_textures'}",
          ],
          "make_texture",
      ),
      (
          "a probe after pretraining on a folder without a labelled split",
          [*TRAIN, *folder, f"--config.data.folder={flat}", "--config.eval.every=0"],
          "has no train/",
      ),
      (
          "the same folder without the probe pretrains (works)",
          [
              *TRAIN,
              *folder,
              f"--config.data.folder={flat}",
              "--config.eval.every=0",
              "--probe=false",
              "--stop_at_step=1",
          ],
          "",
      ),
      (
          "the labelled folder with a batch the probe can take pretrains and probes (works)",
          [
              *TRAIN,
              *folder,
              f"--config.data.folder={labelled}",
              "--config.probe.batch_size=32",
              "--config.probe.epochs=2",
              "--config.probe.decay_epochs=(1,)",
          ],
          "",
      ),
  ]


def _judge(proc: subprocess.CompletedProcess, phrase: str) -> bool:
  """tests/bad_inputs.judge, the progress bars of the data's preparation (the Trifeature
  images, made as the sources open) aside: one error line holding the phrase."""
  bar = re.compile(r"\d+/\d+ \[")
  stderr = "\n".join(ln for ln in proc.stderr.splitlines() if not bar.search(ln))
  return bad_inputs.judge(
      subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr), phrase
  )


def test_data_dependent_checks_stop_the_run_before_its_first_step(tmp_path):
  failed = []
  with forked_commands.Server(tiny_run.env()) as server:
    for n, (name, args, phrase) in enumerate(_cases(tmp_path)):
      workdir = tmp_path / f"w{n}"
      proc = server.run([*args, f"--workdir={workdir}"])
      if not _judge(proc, phrase):
        failed.append(f"{name}: exit {proc.returncode}: {proc.stderr[-600:]}")
      elif phrase and os.path.exists(workdir):
        failed.append(f"{name}: left {sorted(os.listdir(workdir))} in the workdir")
      elif not phrase and "probes" in name and "linear probe" not in proc.stdout:
        failed.append(f"{name}: no probe report in {proc.stdout[-600:]!r}")
  assert not failed, "\n".join(failed)
