"""Tests for LooC's atomic augmentations in cl_jax.data.photometric: rotation, texture
randomisation (random convolutions), the ATOMIC_GROUPS and `share`, and backward compatibility of
the MoCo-v2 pipeline when both new ops are off."""

import dataclasses
import functools
import os
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from cl_jax.data import photometric, random_conv
from tests import conftest
from tests.test_photometric import (
    RADIUS,
    SIZE,
    SPEC,
    B,
    neutral_params,
    np_blur,
    np_gray,
    np_jitter,
    params_at,
    random_images,
)

ROTATION = dataclasses.replace(SPEC, rotation_prob=0.5)
TEXTURE = dataclasses.replace(SPEC, texture_prob=0.5)
LOOC = dataclasses.replace(SPEC, rotation_prob=0.5, texture_prob=0.5, solarize_prob=0.5)
# tests/data/photometric_v1.npz holds the MoCo-v2 aug-plus pipeline's params and images (a
# module with the aug-plus ops alone), made with:
#   spec = PhotometricSpec(grayscale_prob=0.5, blur_kernel_fraction=0.5, solarize_prob=0.5)
#   images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
#   params = jax.device_get(sample_photometric(jax.random.key(1), 4, spec))
#   output = np.asarray(apply_photometric(to_float(images), params, spec))
#   np.savez_compressed(path, images=images, output=output,
#                       **{"param_" + k: v for k, v in params.items()})
# (output re-made when grayscale's luma became a weighted sum: at most 2.4e-7 from before).
FIXTURE = os.path.join(os.path.dirname(__file__), "data", "photometric_v1.npz")
FIXTURE_SPEC = photometric.PhotometricSpec(
    grayscale_prob=0.5, blur_kernel_fraction=0.5, solarize_prob=0.5
)


# ---------------------------------------------------------------- NumPy references (float64)


def np_random_conv(x, kernel):
  """Reflect-padded cross-correlation, explicit loops over output pixels and channels."""
  r = kernel.shape[0] // 2
  padded = np.pad(x, ((r, r), (r, r), (0, 0)), mode="reflect")
  height, width = x.shape[:2]
  out = np.zeros((height, width, kernel.shape[-1]))
  for i in range(height):
    for j in range(width):
      window = padded[i : i + kernel.shape[0], j : j + kernel.shape[1]]  # (7, 7, 3 in)
      for o in range(kernel.shape[-1]):
        out[i, j, o] = np.sum(window * kernel[..., o])
  return out


def np_texture(x, kernel):
  y = np_random_conv(x, kernel)
  standardised = (y - y.mean((0, 1))) / np.maximum(y.std((0, 1)), 1e-6)
  return np.clip(x.mean((0, 1)) + x.std((0, 1)) * standardised, 0, 1)


# ---------------------------------------------------------------- helpers


def apply(images, params, spec):
  return np.asarray(photometric.apply_photometric(images, params, spec))


def sampled(seed, spec=LOOC, batch=B):
  return jax.device_get(photometric.sample_photometric(jax.random.key(seed), batch, spec))


def texture_kernels(seed=0):
  """(4, 7, 7, 3, 3) sampled kernels of sides 1, 3, 5, 7 (the first of each among 64 draws)."""
  kernels = sampled(seed, TEXTURE, 64)["texture_kernel"]
  sides = kernel_sides(kernels)
  return np.stack([kernels[np.flatnonzero(sides == k)[0]] for k in (1, 3, 5, 7)])


def kernel_sides(kernels):
  """(N, 7, 7, 3, 3) -> (N,) side 2r + 1 of the smallest centred window holding every non-zero."""
  offsets = np.abs(np.arange(7) - 3)
  extent = np.maximum(offsets[:, None], offsets[None, :])
  nonzero = np.any(kernels != 0, axis=(-2, -1))  # (N, 7, 7)
  return 2 * np.max(np.where(nonzero, extent, 0), axis=(1, 2)) + 1


# ---------------------------------------------------------------- rotation


def test_rotation_matches_np_rot90():
  images = random_images()
  params = neutral_params(B)
  params["rotation"] = np.arange(4, dtype=np.int32)
  out = apply(images, params, ROTATION)
  for i in range(B):
    np.testing.assert_array_equal(out[i], np.rot90(images[i], i))


@pytest.mark.slow
def test_rotation_is_applied_last():
  """rot90 after the other ops; before the (not rotation-equivariant) random convolution it
  would differ."""
  images = random_images(seed=3)
  spec = dataclasses.replace(LOOC, jitter_prob=1.0, blur_prob=1.0, texture_prob=1.0)
  params = sampled(4, spec)
  params["rotation"] = np.array([1, 2, 3, 0], np.int32)
  unrotated = {k: v for k, v in params.items() if k != "rotation"}
  rotated = apply(images, params, LOOC)
  plain = apply(images, unrotated, TEXTURE)
  for i in range(B):
    np.testing.assert_allclose(rotated[i], np.rot90(plain[i], params["rotation"][i]), atol=1e-6)
  rotated_first = apply(np.rot90(images, 1, axes=(1, 2)), unrotated, TEXTURE)
  assert np.abs(rotated_first[0] - rotated[0]).max() > 0.1


@pytest.mark.slow
def test_sampled_rotation_frequencies():
  n = 20000
  spec = dataclasses.replace(photometric.PhotometricSpec(), rotation_prob=0.5)
  rotation = sampled(5, spec, n)["rotation"]
  chex.assert_shape(rotation, (n,))
  chex.assert_type(rotation, np.int32)
  np.testing.assert_allclose(
      np.bincount(rotation, minlength=4) / n, [0.5, 1 / 6, 1 / 6, 1 / 6], atol=0.015
  )  # > 4 standard deviations
  always = sampled(6, dataclasses.replace(spec, rotation_prob=1.0), 2000)["rotation"]
  assert set(np.unique(always)) == {1, 2, 3}


def test_rotation_needs_square_images():
  params = neutral_params(B)
  params["rotation"] = np.zeros(B, np.int32)
  with pytest.raises(ValueError, match="square"):
    apply(np.zeros((B, 16, 12, 3), np.float32), params, ROTATION)


# ---------------------------------------------------------------- texture randomisation


@pytest.mark.slow
def test_random_conv_matches_numpy():
  images = random_images(seed=7)
  kernels = texture_kernels()
  out = np.asarray(jax.jit(jax.vmap(random_conv.random_conv))(images, kernels))
  for x, y, kernel in zip(images, out, kernels):
    np.testing.assert_allclose(y, np_random_conv(x.astype(np.float64), kernel), atol=2e-6)


@pytest.mark.slow
def test_texture_matches_numpy():
  images = random_images(seed=8)
  params = neutral_params(B)
  params["texture"] = np.array([True, True, True, False])
  params["texture_kernel"] = texture_kernels(seed=1)
  out = apply(images, params, TEXTURE)
  for i in range(3):
    expected = np_texture(images[i].astype(np.float64), params["texture_kernel"][i])
    np.testing.assert_allclose(out[i], expected, atol=2e-6)
  np.testing.assert_array_equal(out[3], images[3])
  assert np.abs(out[:3] - images[:3]).max() > 0.1


def test_texture_then_colour_blur_solarize_matches_numpy():
  images = random_images(seed=9)
  params = neutral_params(
      B, jitter=True, brightness=1.2, contrast=0.7, saturation=1.5, hue=0.15, blur=True, sigma=1.1
  )
  params["order"] = np.array([[3, 1, 0, 2], [2, 0, 3, 1], [0, 1, 2, 3], [1, 3, 2, 0]], np.int32)
  params["grayscale"] = np.array([False, True, False, False])
  params["solarize"] = np.array([True, False, False, True])
  params["texture"] = np.ones(B, bool)
  params["texture_kernel"] = texture_kernels(seed=2)
  out = apply(images, params, TEXTURE)
  for i in range(B):
    x = np_texture(images[i].astype(np.float64), params["texture_kernel"][i])
    x = np_jitter(x, params_at(params), params["order"][i])
    if params["grayscale"][i]:
      x = np.repeat(np_gray(x), 3, -1)
    x = np_blur(x, 1.1, RADIUS)
    if params["solarize"][i]:
      x = np.where(x >= 0.5, 1 - x, x)
    np.testing.assert_allclose(out[i], x, atol=5e-6)


@pytest.mark.slow
def test_texture_outputs_stay_in_unit_interval():
  spec = dataclasses.replace(LOOC, texture_prob=1.0, jitter_prob=0.0, grayscale_prob=0.0)
  for seed in range(8):
    images = random_images(seed=seed)
    images[:, 0, :4] = np.eye(4, 3)  # exact 0s and 1s
    images[1] = images[1] > 0.5  # binary
    images[2, :, :, 1] = 0.25  # one constant channel
    images[3] = 0.6  # constant image
    out = apply(images, sampled(seed, spec), spec)
    assert np.isfinite(out).all() and out.min() >= 0.0 and out.max() <= 1.0
    np.testing.assert_allclose(out[2, :, :, 1], 0.25, atol=5e-6)


def test_texture_keeps_a_constant_image():
  params = neutral_params(B)
  params["texture"] = np.ones(B, bool)
  params["texture_kernel"] = texture_kernels(seed=3)
  images = np.broadcast_to(np.float32([0.2, 0.5, 0.9]), (B, SIZE, SIZE, 3))
  np.testing.assert_allclose(apply(images, params, TEXTURE), images, atol=5e-6)  # float32 mean


@pytest.mark.slow
def test_sampled_texture_kernels():
  n = 4000
  p = sampled(10, dataclasses.replace(photometric.PhotometricSpec(), texture_prob=0.5), n)
  chex.assert_shape(p["texture"], (n,))
  chex.assert_type(p["texture"], bool)
  assert abs(p["texture"].mean() - 0.5) < 0.035
  kernels = p["texture_kernel"]
  chex.assert_shape(kernels, (n, 7, 7, 3, 3))
  chex.assert_type(kernels, np.float32)
  sides = kernel_sides(kernels)
  assert set(np.unique(sides)) == set(random_conv.KERNEL_SIZES)
  np.testing.assert_allclose(np.bincount(sides, minlength=8)[1::2] / n, 0.25, atol=0.03)
  for k in random_conv.KERNEL_SIZES:
    lo, hi = 3 - k // 2, 3 + k // 2 + 1
    window = kernels[sides == k][:, lo:hi, lo:hi]
    assert np.all(window != 0)  # the whole k x k window is drawn
    np.testing.assert_allclose(window.std(), 1 / np.sqrt(3 * k * k), rtol=0.05)
    assert abs(window.mean()) < 0.05 / k


def test_texture_needs_images_larger_than_the_padding():
  params = neutral_params(2)
  params["texture"] = np.ones(2, bool)
  params["texture_kernel"] = np.zeros((2, 7, 7, 3, 3), np.float32)
  with pytest.raises(ValueError, match="side"):
    apply(np.zeros((2, 3, 3, 3), np.float32), params, TEXTURE)


# ---------------------------------------------------------------- groups and share


def test_atomic_groups_partition_the_looc_keys():
  groups = photometric.ATOMIC_GROUPS
  assert set(groups) == {"colour", "rotation", "texture"}
  grouped = [k for keys in groups.values() for k in keys]
  assert len(grouped) == len(set(grouped))
  ungrouped = set(photometric.param_keys(LOOC)) - set(grouped)
  assert ungrouped == {"blur", "sigma", "solarize"}


@pytest.mark.parametrize("group", ["colour", "rotation", "texture"])
def test_share_copies_exactly_the_group(group):
  source, target = sampled(11), sampled(12)
  before = dict(target)
  shared = photometric.share(source, target, group)
  assert set(shared) == set(target)
  for k in shared:
    expected = source[k] if k in photometric.ATOMIC_GROUPS[group] else target[k]
    assert shared[k] is expected, k
  assert all(target[k] is before[k] for k in before) and set(target) == set(before)


@pytest.mark.slow
def test_share_everything_reproduces_the_source_view():
  images = random_images(seed=13)
  source, target = sampled(14), sampled(15)
  for group in photometric.ATOMIC_GROUPS:
    target = photometric.share(source, target, group)
  target.update({k: source[k] for k in ("blur", "sigma", "solarize")})
  np.testing.assert_array_equal(apply(images, target, LOOC), apply(images, source, LOOC))


def only(params, group):
  """`params` with every op outside `group` off (blur and solarize too)."""
  params = dict(params, blur=np.zeros(B, bool), solarize=np.zeros(B, bool))
  off = {
      "colour": dict(jitter=np.zeros(B, bool), grayscale=np.zeros(B, bool)),
      "rotation": dict(rotation=np.zeros(B, np.int32)),
      "texture": dict(texture=np.zeros(B, bool)),
  }
  for other, keys in off.items():
    if other != group:
      params.update(keys)
  return params


@pytest.mark.slow
@pytest.mark.parametrize("group", ["colour", "rotation", "texture"])
def test_views_sharing_a_group_agree_in_it(group):
  images = random_images(seed=16)
  spec = dataclasses.replace(LOOC, jitter_prob=1.0, rotation_prob=1.0, texture_prob=1.0)
  source, target = only(sampled(17, spec), group), only(sampled(18, spec), group)
  source_view = apply(images, source, spec)
  assert np.abs(apply(images, target, spec) - source_view).max() > 0.1
  np.testing.assert_array_equal(
      apply(images, photometric.share(source, target, group), spec), source_view
  )


@pytest.mark.slow
def test_shared_rotation_undoes_to_the_unrotated_key_view():
  images = random_images(seed=19)
  query, key = sampled(20), sampled(21)
  query["rotation"] = np.array([1, 2, 3, 1], np.int32)
  key["rotation"] = np.array([0, 3, 1, 2], np.int32)
  shared = photometric.share(query, key, "rotation")
  view = apply(images, shared, LOOC)
  unrotated = apply(images, dict(key, rotation=np.zeros(B, np.int32)), LOOC)
  for i in range(B):
    np.testing.assert_array_equal(np.rot90(view[i], -query["rotation"][i]), unrotated[i])


def test_share_errors_and_disabled_groups():
  with_rotation, plain = sampled(22, ROTATION), sampled(23, SPEC)
  with pytest.raises(ValueError, match="colour.*rotation.*texture"):
    photometric.share(plain, plain, "color")
  with pytest.raises(ValueError, match="target lacks"):
    photometric.share(with_rotation, plain, "rotation")
  with pytest.raises(ValueError, match="batch size"):
    photometric.share(with_rotation, sampled(24, ROTATION, B + 1), "rotation")
  copy = photometric.share(plain, plain, "texture")  # off in both views: nothing to share
  assert copy == plain and copy is not plain


@pytest.mark.slow
def test_share_under_jit():
  @functools.partial(jax.jit, static_argnames="group")
  def key_view(rng_q, rng_k, images, group):
    query = photometric.sample_photometric(rng_q, B, LOOC)
    key = photometric.share(query, photometric.sample_photometric(rng_k, B, LOOC), group)
    return photometric.augment_with_params(images, key, LOOC)

  images = (random_images(seed=25) * 255).astype(np.uint8)
  rng_q, rng_k = jax.random.key(26), jax.random.key(27)
  out = key_view(rng_q, rng_k, images, "rotation")
  chex.assert_shape(out, (B, SIZE, SIZE, 3))
  expected = photometric.share(sampled(26), sampled(27), "rotation")
  np.testing.assert_allclose(
      out, photometric.augment_with_params(images, expected, LOOC), atol=1e-5
  )


# ---------------------------------------------------------------- backward compatibility


@pytest.mark.parametrize(
    "spec", [photometric.PhotometricSpec(), FIXTURE_SPEC], ids=["defaults", "fixture_spec"]
)
@pytest.mark.slow
def test_the_atomic_ops_leave_the_moco_pipeline_as_it_was(spec):
  """Rotation and texture switched on change none of the aug-plus draws (they draw from keys
  of their own), and with their draws forced off (no quarter turn, no texture) the images are
  aug-plus's alone, to float32 rounding (one unit in the last place: the program with the atomic
  ops fuses its passes differently); the aug-plus pipeline itself is the stored one's, bit for
  bit (test_fixture_from_the_moco_only_module)."""
  images = random_images(seed=28)
  on = dataclasses.replace(spec, rotation_prob=0.5, texture_prob=0.5)
  for seed in range(3):
    plain, atomic = sampled(seed, spec), sampled(seed, on)
    chex.assert_trees_all_equal(plain, {k: atomic[k] for k in photometric.PARAM_KEYS})
    assert atomic["rotation"].any() and atomic["texture"].any()  # the ops were drawn
    forced = {**atomic, "rotation": np.zeros_like(atomic["rotation"])}
    forced["texture"] = np.zeros_like(atomic["texture"])
    np.testing.assert_allclose(apply(images, forced, on), apply(images, plain, spec), atol=2.4e-7)


def fixture_pipeline(out_path: str) -> None:
  """The aug-plus pipeline on FIXTURE's images, as FIXTURE was made: params and output saved
  to `out_path` (.npz)."""
  images = np.load(FIXTURE)["images"]
  params = jax.device_get(photometric.sample_photometric(jax.random.key(1), B, FIXTURE_SPEC))
  out = photometric.apply_photometric(photometric.to_float(images), params, FIXTURE_SPEC)
  np.savez(out_path, output=np.asarray(out), **{"param_" + k: v for k, v in params.items()})


@pytest.mark.slow
def test_fixture_from_the_moco_only_module(tmp_path):
  """The aug-plus pipeline's stored params and images (FIXTURE), bit for bit: computed in a
  process that compiles with XLA's defaults, as FIXTURE was: optimisation level 3 and XLA's own
  fusions (the test processes' level 1, tests/conftest.py, and the Eigen path cl_jax chooses on
  an AVX2-only processor each round some pixels differently)."""
  path = tmp_path / "pipeline.npz"
  code = f"from tests import test_atomic_augment as t; t.fixture_pipeline({str(path)!r})"
  proc = subprocess.run(
      [sys.executable, "-c", code],
      cwd=conftest.ROOT,
      env={**os.environ, "XLA_FLAGS": conftest.DEFAULT_LEVEL_FLAG, "JAX_PLATFORMS": "cpu"},
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  data, got = np.load(FIXTURE), np.load(path)
  keys = [k[len("param_") :] for k in got.files if k.startswith("param_")]
  assert set(keys) == set(photometric.PARAM_KEYS)
  chex.assert_trees_all_equal({k: got[k] for k in got.files}, {k: data[k] for k in got.files})


def test_new_ops_leave_the_moco_keys_unchanged():
  rng = jax.random.key(29)
  moco = photometric.sample_photometric(
      rng, B, dataclasses.replace(LOOC, rotation_prob=0.0, texture_prob=0.0)
  )
  looc = photometric.sample_photometric(rng, B, LOOC)
  assert set(looc) == set(photometric.PARAM_KEYS) | {"rotation", "texture", "texture_kernel"}
  chex.assert_trees_all_equal({k: looc[k] for k in photometric.PARAM_KEYS}, moco)


def test_new_ops_with_flags_off_match_the_moco_output():
  images = random_images(seed=30)
  params = sampled(31)
  params["rotation"] = np.zeros(B, np.int32)
  params["texture"] = np.zeros(B, bool)
  moco = {k: params[k] for k in photometric.PARAM_KEYS}
  np.testing.assert_allclose(apply(images, params, LOOC), apply(images, moco, SPEC), atol=1e-6)


def test_apply_checks_the_keys_against_the_spec():
  images = random_images()
  with pytest.raises(ValueError, match="rotation_prob > 0 adds"):
    apply(images, neutral_params(B), ROTATION)
  with pytest.raises(ValueError, match="keys"):
    apply(images, sampled(32, TEXTURE), SPEC)
  params = sampled(33, TEXTURE)
  params["texture_kernel"] = params["texture_kernel"][:, 1:6, 1:6]
  with pytest.raises(ValueError, match="texture_kernel"):
    apply(images, params, TEXTURE)
