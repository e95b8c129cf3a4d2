"""DICR's regions: the overlap of two crops in each view's coordinates (hand-worked boxes, with
flips, containment and disjoint crops) and RoIAlign's region mean against a NumPy reference."""

import dicr_reference
import jax
import numpy as np
import pytest

from cl_jax.addons import dicr_regions


def _overlap(box1, flip1, box2, flip2):
  return [
      np.asarray(x)
      for x in dicr_regions.overlap_in_views(
          np.array(box1, np.float32), flip1, np.array(box2, np.float32), flip2
      )
  ]


def test_partial_overlap_hand_worked():
  # Source overlap: y 20..40, x 30..50 (area 400).
  o1, o2, area = _overlap([0, 10, 40, 50], False, [20, 30, 60, 70], False)
  assert area == 400
  np.testing.assert_allclose(o1, [0.5, 0.5, 1.0, 1.0])  # bottom-right quarter of view 1
  np.testing.assert_allclose(o2, [0.0, 0.0, 0.5, 0.5])  # top-left quarter of view 2


def test_flips_mirror_the_region_left_right():
  o1, o2, _ = _overlap([0, 10, 40, 50], True, [20, 30, 60, 70], True)
  np.testing.assert_allclose(o1, [0.5, 0.0, 1.0, 0.5])  # mirrored: bottom-left quarter
  np.testing.assert_allclose(o2, [0.0, 0.5, 0.5, 1.0])  # mirrored: top-right quarter


def test_containment_is_the_whole_inner_view():
  # View 2 (y 10..30, x 20..60) lies inside view 1 (y 0..40, x 0..80).
  o1, o2, area = _overlap([0, 0, 40, 80], False, [10, 20, 30, 60], True)
  assert area == 20 * 40
  np.testing.assert_allclose(o1, [0.25, 0.25, 0.75, 0.75])
  np.testing.assert_allclose(o2, [0.0, 0.0, 1.0, 1.0])  # all of view 2, flipped or not


@pytest.mark.parametrize("box2", [[50, 0, 60, 10], [0, 40, 40, 60]], ids=["apart", "touching"])
def test_disjoint_crops_have_no_region(box2):
  o1, o2, area = _overlap([0, 0, 40, 40], False, box2, True)
  assert area == 0
  np.testing.assert_array_equal(o1, 0.0)
  np.testing.assert_array_equal(o2, 0.0)


def test_overlap_is_batched():
  boxes1 = np.array([[0, 10, 40, 50], [0, 0, 40, 40]], np.float32)
  boxes2 = np.array([[20, 30, 60, 70], [50, 0, 60, 10]], np.float32)
  o1, _, area = dicr_regions.overlap_in_views(boxes1, np.array([True, False]), boxes2, False)
  np.testing.assert_allclose(area, [400, 0])
  np.testing.assert_allclose(o1, [[0.5, 0.0, 1.0, 0.5], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    "region",
    [[0.1, 0.2, 0.7, 0.9], [0.5, 0.0, 1.0, 0.5], [0.0, 0.0, 1.0, 1.0], [0.3, 0.3, 0.4, 0.35]],
)
@pytest.mark.parametrize("samples", [1, 3, 7])
def test_roi_mean_matches_numpy(region, samples):
  f = np.random.default_rng(0).normal(size=(6, 5, 4)).astype(np.float32)
  got = jax.jit(dicr_regions.roi_mean, static_argnums=2)(f, np.array(region, np.float32), samples)
  np.testing.assert_allclose(got, dicr_reference.roi_mean(f, region, samples), rtol=1e-5, atol=1e-6)


def test_whole_map_at_its_resolution_is_the_plain_mean():
  f = np.random.default_rng(1).normal(size=(4, 4, 3)).astype(np.float32)
  got = dicr_regions.roi_mean(f, np.array([0, 0, 1, 1], np.float32), 4)
  np.testing.assert_allclose(got, f.mean(axis=(0, 1)), rtol=1e-5, atol=1e-6)


def test_quarter_region_of_a_constant_quarter_is_that_constant():
  f = np.zeros((8, 8, 1), np.float32)
  f[4:, 4:] = 2.0  # the bottom-right quarter
  got = dicr_regions.roi_mean(f, np.array([0.5, 0.5, 1.0, 1.0], np.float32), 4)
  np.testing.assert_allclose(got, [2.0], rtol=1e-6)


def test_roi_mean_gradient_reaches_only_the_sampled_cells():
  f = np.random.default_rng(2).normal(size=(8, 8, 2)).astype(np.float32)
  grad = jax.grad(
      lambda f: dicr_regions.roi_mean(f, np.array([0.5, 0.5, 1, 1], np.float32), 4).sum()
  )
  g = np.asarray(grad(f))
  assert np.all(g[:4] == 0) and np.all(g[:, :4] == 0)
  np.testing.assert_allclose(g[4:, 4:].sum(), 2.0, rtol=1e-6)  # the mean's weights sum to 1


def test_roi_mean_rejects_no_samples():
  with pytest.raises(ValueError, match="samples"):
    dicr_regions.roi_mean(np.zeros((2, 2, 1), np.float32), np.array([0, 0, 1, 1.0]), 0)
