"""Texture-based non-semantic negatives (Ge et al. 2021, Sec. 2.2) in training: each view's
texture image takes that view's crop, flip and photometric parameters, its key-encoder feature
is the query's NS negative, and a run from the offline texture dataset trains."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from cl_jax import config_check
from cl_jax import train_step as step_lib
from cl_jax.data import geometric, photometric, pipeline, texture_source
from configs import mocov2_texturens
from tests import tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_texture_crop_is_the_view_crop_scaled_to_the_texture():
  params = geometric.CropParams(box=np.array([4, 8, 20, 24], np.float32), flip=True)
  moved = pipeline.texture_crop(params, (40, 60, 3), (20, 30, 3))
  np.testing.assert_array_equal(moved.box, [2, 4, 10, 12])
  assert moved.flip


def test_texture_views_take_their_view_crop_and_flip():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (8, 24, 20, 3), dtype=np.uint8)
  # A texture image that is the image itself makes every texture crop equal its view.
  source = [{"image": x, texture_source.KEY: x} for x in images]
  batch = pipeline.pretrain_dataset(
      source, batch_size=4, image_size=16, crop_scale=(0.2, 1.0), seed=1, texture=True
  )[0]
  np.testing.assert_array_equal(batch["texture1"], batch["view1"])
  np.testing.assert_array_equal(batch["texture2"], batch["view2"])
  # A texture at another resolution gets the same relative box.
  half = [{"image": x, texture_source.KEY: x[::2, ::2]} for x in images]
  small = pipeline.pretrain_dataset(
      half, batch_size=4, image_size=16, crop_scale=(0.2, 1.0), seed=1, texture=True
  )[0]
  for n in range(4):  # the row's source image is the one whose crop is view1
    box, flip = small["box1"][n], bool(small["flip1"][n])
    m = next(
        m
        for m in range(8)
        if np.array_equal(
            geometric.apply_crop(images[m], geometric.CropParams(box, flip), 16), small["view1"][n]
        )
    )
    expected = geometric.apply_crop(images[m][::2, ::2], geometric.CropParams(box / 2, flip), 16)
    np.testing.assert_array_equal(small["texture1"][n], expected)


@pytest.mark.slow
def test_texture_images_take_their_view_photometric_parameters():
  rng = np.random.default_rng(1)
  view1, view2 = rng.integers(0, 256, (2, 6, 16, 16, 3), dtype=np.uint8)
  batch = {"view1": view1, "view2": view2, "texture1": view1, "texture2": view2}
  spec = photometric.PhotometricSpec(blur_prob=0.5)
  v1, v2, _, textures = step_lib.augment_views(jax.random.key(0), batch, spec, texture=True)
  np.testing.assert_array_equal(textures[0], v1)
  np.testing.assert_array_equal(textures[1], v2)
  # Only the parameters are shared: another texture image gives another result.
  other = dict(batch, texture1=view2)
  _, _, _, textures = step_lib.augment_views(jax.random.key(0), other, spec, texture=True)
  assert not np.allclose(textures[0], v1)


def test_config_check_needs_the_texture_dataset_and_one_negative():
  c = mocov2_texturens.get_config(None)
  with pytest.raises(config_check.ConfigError, match="make_texture"):
    config_check.validate(c)
  config_check.validate(c, reads_data=False)  # a job that opens no data (bench, compile)
  c.data.texture_dir = "/somewhere"
  config_check.validate(c)
  c.nonsemantic.num_ns = 2
  with pytest.raises(config_check.ConfigError, match="nonsemantic.num_ns"):
    config_check.validate(c)


def _flags(workdir, texture_dir):
  flags = [f for f in tiny_run.FLAGS if not f.startswith(("--config=", "--config.nonsemantic"))]
  return (
      ["--config=configs/mocov2_texturens.py"]
      + flags
      + [
          f"--config.data.texture_dir={texture_dir}",
          f"--workdir={workdir}",
          "--config.probe.after_pretrain=False",
      ]
  )


@pytest.mark.slow
def test_a_run_trains_on_texture_negatives_and_names_the_missing_dataset(tmp_path):
  env = tiny_run.env()
  missing = subprocess.run(
      [sys.executable, "-m", "cl_jax.main", *_flags(tmp_path / "a", tmp_path / "none")],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert missing.returncode != 0
  assert "python -m cl_jax.data.make_texture" in missing.stderr
  assert "Traceback" not in missing.stderr

  make = [
      sys.executable,
      "-m",
      "cl_jax.data.make_texture",
      "--dataset=trifeature",
      f"--out={tmp_path / 'tex'}",
      "--image_size=16",
      "--num_images=256",
      "--workers=1",
  ]
  subprocess.run(make, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
  run = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.main",
          *_flags(tmp_path / "b", tmp_path / "tex"),
          "--config.optim.epochs=2",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  rows = [json.loads(line) for line in open(tmp_path / "b" / "metrics.jsonl")]
  assert rows[-1]["step"] == 16
  assert all(np.isfinite(r["loss"]) and -1 <= r["ns_mean"] <= 1 for r in rows if "loss" in r)
