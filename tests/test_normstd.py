"""The NormStd analysis (DICR paper, 2025 submission, Sec. 2.2 and 4.2): the dispersion
measures on hand-worked cases, one-vs-rest views that change only their augmentation, the
per-layer representations, and the command on a tiny run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.analysis import dispersion, one_vs_rest
from cl_jax.data import photometric
from cl_jax.models.encoder import build_encoder
from cl_jax.state import init_variables
from configs import simclr
from tests import forked_commands


def test_spread_and_normstd_hand_worked():
  views = np.array([[[0.0, 0.0], [2.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])  # (N=2, R=2, C=2)
  np.testing.assert_allclose(dispersion.spread(views), [1.0, 0.0])
  assert dispersion.norm_std(views, sigma_all=2.0) == pytest.approx(0.25)


def test_pair_iou_hand_worked():
  boxes = np.array([[[0, 0, 2, 2], [1, 0, 3, 2], [5, 5, 6, 6]]], np.float32)
  iou = dispersion.pair_iou(boxes)[0]
  np.testing.assert_allclose(iou, [[1, 1 / 3, 0], [1 / 3, 1, 0], [0, 0, 1]], atol=1e-7)


def test_norm_dist_is_binned_by_iou():
  boxes = np.array([[[0, 0, 2, 2], [1, 0, 3, 2], [5, 5, 6, 6]]], np.float32)
  views = np.array([[[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]]])
  means, counts = dispersion.norm_dist_by_iou(views, boxes, sigma_all=2.0, bins=4)
  # Pairs: (0,1) IoU 1/3 dist 5; (0,2) IoU 0 dist 1; (1,2) IoU 0 dist sqrt(18).
  np.testing.assert_array_equal(counts, [2, 1, 0, 0])
  np.testing.assert_allclose(means[:2], [(1 + np.sqrt(18)) / 4, 2.5])
  assert np.isnan(means[2]) and np.isnan(means[3])


SPEC = photometric.PhotometricSpec(grayscale_prob=0.5, blur_prob=0.0)


def _images(n=3, size=24):
  rng = np.random.default_rng(0)
  return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def _views(aug, repeats=4):
  images = _images()
  rng, key = np.random.default_rng(1), jax.random.key(1)
  crops, params = one_vs_rest.base_draws(rng, key, images, (0.3, 1.0), SPEC)
  out, boxes = one_vs_rest.views(
      aug, rng, jax.random.key(2), images, crops, params, repeats, 16, (0.3, 1.0), SPEC
  )
  return crops, np.asarray(out).reshape(len(images), repeats, 16, 16, 3), boxes


def test_recipe_augmentations():
  assert one_vs_rest.augmentations(SPEC) == ("crop", "flip", "jitter", "grayscale")


@pytest.mark.slow
def test_flip_views_are_the_base_view_or_its_mirror():
  crops, views, boxes = _views("flip")
  for i, crop in enumerate(crops):
    np.testing.assert_array_equal(boxes[i], np.broadcast_to(crop.box, boxes[i].shape))
    first = views[i, 0]
    for v in views[i]:
      assert np.allclose(v, first) or np.allclose(v, first[:, ::-1])


@pytest.mark.slow
def test_photometric_views_share_the_crop_and_differ_in_colour():
  crops, views, boxes = _views("jitter", repeats=6)
  for i, crop in enumerate(crops):
    np.testing.assert_array_equal(boxes[i], np.broadcast_to(crop.box, boxes[i].shape))
    assert not all(np.allclose(v, views[i, 0]) for v in views[i])
  # Same crop and flip: every view of an image has the same pixel order, so grey levels of the
  # grayscale-free views correlate strongly across views.
  grey = views.mean(-1).reshape(3, 6, -1)
  assert min(np.corrcoef(g)[0].min() for g in grey) > 0.5


def test_crop_views_move_the_box_and_keep_the_flip():
  crops, _, boxes = _views("crop")
  assert all(len({tuple(b) for b in boxes[i]}) > 1 for i in range(len(crops)))


@pytest.mark.slow
def test_representations_are_every_block_then_the_embedding():
  c = simclr.get_config()
  c.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  encoder = build_encoder(c.model)
  variables = jax.jit(lambda: init_variables(0, encoder, 16))()
  x = jax.random.normal(jax.random.key(0), (4, 16, 16, 3))
  reps = jax.jit(lambda v, x: one_vs_rest.representations(encoder, v, x))(variables, x)
  names = one_vs_rest.layer_names(reps)
  assert names == [f"stage{s}_block{b}" for s in range(1, 5) for b in (1, 2)] + ["embedding"]
  out = jax.jit(lambda v, x: encoder.apply(v, x, train=False))(variables, x)
  np.testing.assert_allclose(reps["stage4_block2"], out["pooled"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(reps["embedding"], out["z"], rtol=1e-6)
  assert reps["stage2_block1"].shape == (4, 16)
  assert jnp.all(jnp.isfinite(reps["stage1_block1"]))


@pytest.mark.slow
def test_the_command_reports_a_run_and_its_random_init(finished_run_copy, tmp_path):
  """On a copy of the shared finished tiny run (it writes into the workdir): step 16."""
  workdir = finished_run_copy
  cmd = [
      "cl_jax.analysis.normstd",
      f"--workdir={workdir}",
      "--images=8",
      "--views=3",
      "--bins=4",
      "--crop_scale=0.1,1",
  ]
  proc = forked_commands.shared().run(cmd, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = workdir / "normstd"
  for name in (
      "normstd_step16.json",
      "normstd_step16.md",
      "normstd_step16.png",
      "normdist_iou_step16.png",
  ):
    assert (out / name).is_file() and str(out / name) in proc.stdout
  report = json.loads((out / "normstd_step16.json").read_text())
  assert report["augmentations"] == ["crop", "flip", "jitter", "grayscale"]
  assert len(report["layers"]) == 9 and sum(report["iou_pairs"]) == 8 * 3
  for name in ("trained", "random_init"):
    for aug in report["augmentations"]:
      assert all(v >= 0 for v in report[name]["normstd"][aug].values())
  assert report["trained"]["normstd"] != report["random_init"]["normstd"]
  missing = forked_commands.shared().run(
      ["cl_jax.analysis.normstd", f"--workdir={tmp_path / 'none'}"], timeout=600
  )
  assert missing.returncode == 1 and missing.stderr.startswith("error: ")
