"""The PyTorch photometric augmentation (cl_jax.bench.torch_augment) against the JAX one
(cl_jax.data.photometric) on the same images and parameters. Needs PyTorch (CPU build:
pip install torch); skipped without it unless CL_JAX_REQUIRE_TORCH=1 (CI), which makes its
absence a failure."""

import os

import jax
import numpy as np
import pytest

if os.environ.get("CL_JAX_REQUIRE_TORCH") == "1":
  import torch
else:
  torch = pytest.importorskip("torch")

from cl_jax.bench import torch_augment  # noqa: E402
from cl_jax.data import photometric  # noqa: E402

B, S = 64, 64


def _problem(seed: int, spec: photometric.PhotometricSpec):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (B, S, S, 3), dtype=np.uint8)
  params = jax.device_get(photometric.sample_photometric(jax.random.key(seed), B, spec))
  return images, params


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_same_images_as_the_jax_augmentation(seed):
  """Every op on (jitter in every order, grayscale, blur, solarize, each on and off across the
  batch): the two agree within bfloat16's rounding of [0, 1] (2^-8), and almost everywhere to
  float32 rounding."""
  spec = photometric.PhotometricSpec(blur_prob=0.5, solarize_prob=0.3)
  images, params = _problem(seed, spec)
  for flag in ("jitter", "grayscale", "blur", "solarize"):
    assert 0 < params[flag].sum() < B, flag  # both branches are exercised
  assert len({tuple(o) for o in params["order"]}) > 10
  radius = photometric.blur_radius(S, S, spec)
  assert radius == 3
  want = np.asarray(photometric.apply_photometric(photometric.to_float(images), params, spec))
  x = torch.from_numpy(images).float() / 255.0
  got = torch_augment.apply_photometric(
      x, {k: torch.from_numpy(np.array(v)) for k, v in params.items()}, radius
  ).numpy()
  diff = np.abs(got - want)
  assert diff.max() <= 2.0**-8
  assert np.mean(diff > 1e-5) < 1e-3


def test_the_identity_where_every_flag_is_off():
  spec = photometric.PhotometricSpec(
      jitter_prob=0.0, grayscale_prob=0.0, blur_prob=0.0, solarize_prob=0.0
  )
  images, params = _problem(2, spec)
  x = torch.from_numpy(images).float() / 255.0
  p = {k: torch.from_numpy(np.array(v)) for k, v in params.items()}
  assert torch.equal(torch_augment.apply_photometric(x, p, 3), x)


def test_texture_and_rotation_are_refused():
  spec = photometric.PhotometricSpec(rotation_prob=0.5)
  images, params = _problem(3, spec)
  p = {k: torch.from_numpy(np.array(v)) for k, v in params.items()}
  with pytest.raises(ValueError, match="rotation are not in the PyTorch reference"):
    torch_augment.apply_photometric(torch.from_numpy(images).float() / 255.0, p, 3)
