"""Tests for cl_jax.data.geometric: RandomResizedCrop sampling, crop + resize, eval views."""

import numpy as np
import pytest
from PIL import Image

from cl_jax.data import geometric


def _boxes(seed, n, height, width, **kwargs):
  rng = np.random.default_rng(seed)
  return [geometric.sample_crop(rng, height, width, **kwargs) for _ in range(n)]


@pytest.mark.parametrize("height,width", [(256, 256), (200, 320), (320, 200)])
def test_sampled_boxes_fit_and_respect_scale_and_ratio(height, width):
  for params in _boxes(0, 400, height, width):
    box = params.box
    assert box.dtype == np.float32 and box.shape == (4,)
    np.testing.assert_array_equal(box, np.round(box))  # integer pixels
    y0, x0, y1, x1 = box
    assert 0 <= y0 < y1 <= height and 0 <= x0 < x1 <= width
    h, w = y1 - y0, x1 - x0
    # Rounding w and h to integers moves area and aspect by at most ~0.5 / 98 per side here.
    assert 0.2 * 0.98 <= h * w / (height * width) <= 1.0
    assert 0.75 * 0.98 <= w / h <= 4 / 3 * 1.02


def test_fixed_size_boxes_are_placed_uniformly():
  # Area 1/4 and aspect 1 on 64x64 give exactly 32x32 boxes; offsets must cover 0..32 uniformly.
  params = _boxes(1, 3300, 64, 64, scale=(0.25, 0.25), ratio=(1.0, 1.0))
  boxes = np.stack([p.box for p in params])
  np.testing.assert_array_equal(boxes[:, 2:] - boxes[:, :2], 32)
  for column in (0, 1):
    counts = np.bincount(boxes[:, column].astype(int), minlength=33)
    assert counts.shape == (33,)
    assert counts.min() > 50 and counts.max() < 150  # expected 100 per offset


def test_area_is_uniform_and_aspect_log_uniform():
  # Small boxes on a large image always fit and round by < 0.2 %, so the draws show directly.
  boxes = np.stack([p.box for p in _boxes(3, 3000, 1000, 1000, scale=(0.05, 0.15))])
  h, w = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
  area = h * w / 1e6
  # U(0.05, 0.15): mean 0.1, quartiles 0.075 / 0.125.
  assert abs(area.mean() - 0.1) < 0.003
  np.testing.assert_allclose(np.quantile(area, [0.25, 0.75]), [0.075, 0.125], atol=0.004)
  # log(w / h) ~ U(log 3/4, log 4/3): symmetric about 0, half the boxes taller than wide
  # (a uniform aspect would give E[log r] = 0.028 and P(r < 1) = 0.43).
  log_aspect = np.log(w / h)
  assert abs(log_aspect.mean()) < 0.012
  assert abs((log_aspect < 0).mean() - 0.5) < 0.03


def test_sampling_is_deterministic_per_seed():
  a, b, c = _boxes(7, 50, 90, 120), _boxes(7, 50, 90, 120), _boxes(8, 50, 90, 120)
  np.testing.assert_array_equal([p.box for p in a], [p.box for p in b])
  assert [p.flip for p in a] == [p.flip for p in b]
  assert not np.array_equal([p.box for p in a], [p.box for p in c])


@pytest.mark.parametrize(
    "height,width,ratio,expected",
    [
        # Wide image, ratio above its aspect: full width, height = round(40 / 2) = 20, centred.
        (30, 40, (2.0, 3.0), [5, 0, 25, 40]),
        # Tall image, ratio below its aspect: full height, width = round(40 * 0.5) = 20, centred.
        (40, 30, (0.25, 0.5), [0, 5, 40, 25]),
    ],
)
def test_fallback_is_central_crop_clamped_to_ratio(height, width, ratio, expected):
  # Area fraction 1 with an aspect ratio the image does not have never fits: fallback.
  params = geometric.sample_crop(
      np.random.default_rng(0), height, width, scale=(1.0, 1.0), ratio=ratio
  )
  np.testing.assert_array_equal(params.box, expected)


@pytest.mark.parametrize("flip_prob", [0.0, 0.3, 1.0])
def test_flip_frequency(flip_prob):
  flips = np.array([p.flip for p in _boxes(2, 4000, 50, 50, flip_prob=flip_prob)])
  assert abs(flips.mean() - flip_prob) < 0.03


def _image(height, width, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_full_box_without_flip_is_a_plain_resize():
  image = _image(37, 53)
  params = geometric.CropParams(box=np.array([0, 0, 37, 53], np.float32), flip=False)
  expected = np.asarray(Image.fromarray(image).resize((16, 16), Image.Resampling.BILINEAR))
  out = geometric.apply_crop(image, params, 16)
  assert out.dtype == np.uint8 and out.shape == (16, 16, 3)
  np.testing.assert_array_equal(out, expected)


def test_box_coordinates_are_y_then_x():
  # An 8x8 box resized to 8x8 is the plain slice image[y0:y1, x0:x1].
  image = _image(20, 30)
  params = geometric.CropParams(box=np.array([2, 13, 10, 21], np.float32), flip=False)
  np.testing.assert_array_equal(geometric.apply_crop(image, params, 8), image[2:10, 13:21])


def test_flip_reverses_columns():
  image = _image(40, 60)
  box = np.array([3, 7, 35, 47], np.float32)
  plain = geometric.apply_crop(image, geometric.CropParams(box=box, flip=False), 12)
  flipped = geometric.apply_crop(image, geometric.CropParams(box=box, flip=True), 12)
  np.testing.assert_array_equal(flipped, np.flip(plain, axis=1))
  assert not np.array_equal(flipped, plain)


@pytest.mark.parametrize(
    "height,width,size,fraction",
    [(37, 50, 16, 0.875), (50, 37, 16, 0.875), (8, 8, 8, 1.0), (300, 200, 224, 0.875)],
)
def test_eval_view_shape(height, width, size, fraction):
  out = geometric.eval_view(_image(height, width), size, fraction)
  assert out.dtype == np.uint8 and out.shape == (size, size, 3)


def test_eval_view_without_resize_is_a_centre_slice():
  # Shorter side 16 already equals round(8 / 0.5): only the centre crop remains.
  image = _image(16, 24)
  np.testing.assert_array_equal(geometric.eval_view(image, 8, 0.5), image[4:12, 8:16])
  np.testing.assert_array_equal(
      geometric.eval_view(image.transpose(1, 0, 2), 8, 0.5), image.transpose(1, 0, 2)[8:16, 4:12]
  )
  square = _image(32, 32)
  np.testing.assert_array_equal(geometric.eval_view(square, 32, 1.0), square)


def test_eval_view_keeps_a_marked_centre():
  image = np.zeros((64, 96, 3), np.uint8)
  image[24:40, 40:56] = 255  # 16x16 mark at the centre
  out = geometric.eval_view(image, 16, 0.5)  # resize to 32x48, keep the central 16x16
  assert out[5:11, 5:11].min() == 255  # inside the mark, now 8x8 at out[4:12, 4:12]
  assert out[:3].max() == 0 and out[-3:].max() == 0
  assert out[:, :3].max() == 0 and out[:, -3:].max() == 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(scale=(0.0, 1.0)), "scale"),
        (dict(scale=(0.6, 0.2)), "scale"),
        (dict(scale=(0.2, 1.5)), "scale"),
        (dict(ratio=(-1.0, 1.0)), "ratio"),
        (dict(ratio=(4 / 3, 3 / 4)), "ratio"),
        (dict(flip_prob=1.5), "flip_prob"),
    ],
)
def test_sample_crop_rejects_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    geometric.sample_crop(np.random.default_rng(0), 32, 32, **kwargs)


def test_sample_crop_rejects_empty_image():
  with pytest.raises(ValueError, match="size"):
    geometric.sample_crop(np.random.default_rng(0), 0, 32)


def test_apply_crop_and_eval_view_reject_bad_input():
  image = _image(10, 10)
  full = geometric.CropParams(box=np.array([0, 0, 10, 10], np.float32), flip=False)
  with pytest.raises(ValueError, match="uint8"):
    geometric.apply_crop(image.astype(np.float32), full, 8)
  with pytest.raises(ValueError, match="shape"):
    geometric.apply_crop(image[..., 0], full, 8)
  with pytest.raises(ValueError, match="size"):
    geometric.apply_crop(image, full, 0)
  outside = geometric.CropParams(box=np.array([0, 0, 11, 10], np.float32), flip=False)
  with pytest.raises(ValueError, match="box"):
    geometric.apply_crop(image, outside, 8)
  with pytest.raises(ValueError, match="crop_fraction"):
    geometric.eval_view(image, 8, 0.0)
