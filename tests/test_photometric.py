"""Tests for cl_jax.data.photometric against NumPy re-derivations of each op."""

import dataclasses
import itertools

import jax
import numpy as np
import pytest

from cl_jax.data import photometric

LUMA = np.array([0.299, 0.587, 0.114])
# Every apply in this file uses (B, 16, 16, 3) images and blur radius int(0.5 * 16) // 2 = 4, so
# the jitted apply compiles once.
B, SIZE, RADIUS = 4, 16, 4
SPEC = photometric.PhotometricSpec(blur_kernel_fraction=0.5)


# ---------------------------------------------------------------- NumPy references (float64)


def np_gray(x):
  return (x @ LUMA)[..., None]


def np_brightness(x, f):
  return np.clip(f * x, 0, 1)


def np_contrast(x, f):
  return np.clip(f * x + (1 - f) * np_gray(x).mean(), 0, 1)


def np_saturation(x, f):
  return np.clip(f * x + (1 - f) * np_gray(x), 0, 1)


def np_rgb_to_hsv(x):
  """Textbook hexcone model: V = max, S = (max - min) / max, H by the sector of the max."""
  r, g, b = x[..., 0], x[..., 1], x[..., 2]
  v = x.max(-1)
  c = v - x.min(-1)
  s = np.where(v > 0, c / np.where(v > 0, v, 1), 0)
  safe_c = np.where(c > 0, c, 1)
  h = (
      np.select(
          [c == 0, v == r, v == g],
          [0.0, ((g - b) / safe_c) % 6, (b - r) / safe_c + 2],
          (r - g) / safe_c + 4,
      )
      / 6
  )
  return h, s, v


def np_hsv_to_rgb(h, s, v):
  """Inverse hexcone: sector i = floor(6h), fraction f, then (p, q, t) per sector."""
  h6 = (h % 1.0) * 6
  i = np.floor(h6).astype(int) % 6
  f = h6 - np.floor(h6)
  p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
  table = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
  return np.stack(
      [np.select([i == k for k in range(6)], [row[ch] for row in table]) for ch in range(3)], -1
  )


def np_hue(x, shift):
  h, s, v = np_rgb_to_hsv(x)
  return np.clip(np_hsv_to_rgb(h + shift, s, v), 0, 1)


def np_blur(x, sigma, radius):
  """Separable Gaussian with reflect padding, one 1-D np.convolve per row / column / channel."""
  taps = np.arange(-radius, radius + 1)
  w = np.exp(-(taps**2) / (2 * sigma**2))
  w /= w.sum()
  padded = np.pad(x, ((radius, radius), (radius, radius), (0, 0)), mode="reflect")
  rows = np.apply_along_axis(lambda a: np.convolve(a, w, mode="valid"), 1, padded)
  return np.apply_along_axis(lambda a: np.convolve(a, w, mode="valid"), 0, rows)


def np_jitter(x, p, order):
  ops = [
      lambda y: np_brightness(y, p["brightness"]),
      lambda y: np_contrast(y, p["contrast"]),
      lambda y: np_saturation(y, p["saturation"]),
      lambda y: np_hue(y, p["hue"]),
  ]
  for k in order:
    x = ops[k](x)
  return x


# ---------------------------------------------------------------- helpers


def neutral_params(batch, **overrides):
  """Hand-built params with every op off or neutral, then `overrides` (scalars broadcast)."""
  params = {
      "jitter": np.zeros(batch, bool),
      "brightness": np.ones(batch, np.float32),
      "contrast": np.ones(batch, np.float32),
      "saturation": np.ones(batch, np.float32),
      "hue": np.zeros(batch, np.float32),
      "order": np.tile(np.arange(4, dtype=np.int32), (batch, 1)),
      "grayscale": np.zeros(batch, bool),
      "blur": np.zeros(batch, bool),
      "sigma": np.ones(batch, np.float32),
      "solarize": np.zeros(batch, bool),
  }
  for key, value in overrides.items():
    params[key] = np.broadcast_to(np.asarray(value, params[key].dtype), params[key].shape)
  return params


def params_at(params):
  """The jitter factors of example 0, as floats for the NumPy references."""
  return {k: float(params[k][0]) for k in ("brightness", "contrast", "saturation", "hue")}


def random_images(batch=B, seed=0):
  return np.random.default_rng(seed).random((batch, SIZE, SIZE, 3)).astype(np.float32)


def apply(images, params, spec=SPEC):
  return np.asarray(photometric.apply_photometric(images, params, spec))


# ---------------------------------------------------------------- single ops


def test_numpy_hsv_reference_round_trips():
  x = random_images().astype(np.float64)
  np.testing.assert_allclose(np_hsv_to_rgb(*np_rgb_to_hsv(x)), x, atol=1e-12)


@pytest.mark.parametrize(
    "name,factors,reference",
    [
        ("brightness", [0.3, 0.8, 1.0, 1.7], np_brightness),
        ("contrast", [0.0, 0.6, 1.0, 1.4], np_contrast),
        ("saturation", [0.0, 0.6, 1.0, 1.8], np_saturation),
        ("hue", [-0.5, -0.1, 0.07, 0.5], np_hue),
    ],
)
def test_single_jitter_op_matches_numpy(name, factors, reference):
  images = random_images()
  params = neutral_params(B, jitter=True)
  params[name] = np.array(factors, np.float32)
  expected = [reference(x.astype(np.float64), f) for x, f in zip(images, factors)]
  np.testing.assert_allclose(apply(images, params), expected, atol=2e-6)


def test_jitter_flag_off_leaves_image_unchanged():
  images = random_images()
  params = neutral_params(B, brightness=0.5, hue=0.2, jitter=[True, False, True, False])
  out = apply(images, params)
  np.testing.assert_array_equal(out[1::2], images[1::2])
  assert not np.allclose(out[0], images[0])


def test_grayscale_matches_numpy():
  images = random_images()
  out = apply(images, neutral_params(B, grayscale=True))
  np.testing.assert_allclose(out, np.repeat(np_gray(images.astype(np.float64)), 3, -1), atol=1e-6)


def test_blur_matches_numpy_separable_convolution():
  images = random_images()
  sigmas = np.array([0.1, 0.9, 2.0, 1.3], np.float32)
  params = neutral_params(B, blur=True)
  params["sigma"] = sigmas
  expected = [np_blur(x.astype(np.float64), s, RADIUS) for x, s in zip(images, sigmas)]
  np.testing.assert_allclose(apply(images, params), expected, atol=1e-6)


def test_blur_kernel_size_follows_moco_recipe():
  spec = photometric.PhotometricSpec()
  assert 2 * photometric.blur_radius(224, 224, spec) + 1 == 23
  assert 2 * photometric.blur_radius(32, 32, spec) + 1 == 3
  assert photometric.blur_radius(SIZE, SIZE, SPEC) == RADIUS
  assert photometric.blur_radius(16, 16, spec) == 0  # 1 tap: blur is the identity


def test_solarize_matches_numpy():
  images = random_images()
  images[0, 0, 0] = [0.5, 0.49999, 1.0]
  out = apply(images, neutral_params(B, solarize=True))
  np.testing.assert_allclose(out, np.where(images >= 0.5, 1 - images, images), atol=1e-7)


# ---------------------------------------------------------------- composition


def test_every_jitter_order_matches_numpy():
  orders = np.array(list(itertools.permutations(range(4))), np.int32)  # all 24
  images = random_images(seed=1)
  params = neutral_params(B, jitter=True, brightness=1.3, contrast=0.6, saturation=1.7, hue=0.23)
  outs = []
  for batch_orders in orders.reshape(-1, B, 4):
    params["order"] = batch_orders
    outs.append(apply(images, params))
    for x, y, order in zip(images, outs[-1], batch_orders):
      np.testing.assert_allclose(
          y,
          np_jitter(x.astype(np.float64), params_at(params), order),
          atol=3e-6,
          err_msg=f"order {order}",
      )
  # The order matters: the same image gives different results under different orders.
  assert np.abs(outs[0][0] - outs[-1][0]).max() > 0.05


def test_full_pipeline_matches_numpy():
  images = random_images(seed=2)
  params = neutral_params(
      B,
      jitter=True,
      brightness=0.7,
      contrast=1.3,
      saturation=0.4,
      hue=-0.3,
      grayscale=[False, True, False, True],
      blur=True,
      sigma=1.5,
      solarize=[True, True, False, False],
  )
  params["order"] = np.array([[3, 1, 0, 2], [2, 0, 3, 1], [0, 1, 2, 3], [1, 3, 2, 0]], np.int32)
  out = apply(images, params)
  for i in range(B):
    x = np_jitter(images[i].astype(np.float64), params_at(params), params["order"][i])
    if params["grayscale"][i]:
      x = np.repeat(np_gray(x), 3, -1)
    x = np_blur(x, 1.5, RADIUS)
    if params["solarize"][i]:
      x = np.where(x >= 0.5, 1 - x, x)
    np.testing.assert_allclose(out[i], x, atol=3e-6)


def test_all_probabilities_zero_is_identity():
  spec = dataclasses.replace(
      SPEC, jitter_prob=0.0, grayscale_prob=0.0, blur_prob=0.0, solarize_prob=0.0
  )
  images = random_images()
  for seed in range(4):
    params = photometric.sample_photometric(jax.random.key(seed), B, spec)
    np.testing.assert_array_equal(apply(images, params, spec), images)


def test_outputs_stay_in_unit_interval():
  spec = dataclasses.replace(
      SPEC,
      brightness=3.0,
      contrast=3.0,
      saturation=3.0,
      hue=0.5,
      jitter_prob=1.0,
      solarize_prob=0.5,
  )
  for seed in range(8):
    images = random_images(seed=seed)
    images[:, 0, :4] = np.eye(4, 3)  # exact 0s and 1s
    out = apply(images, photometric.sample_photometric(jax.random.key(seed), B, spec), spec)
    assert out.min() >= 0.0 and out.max() <= 1.0


@pytest.mark.parametrize(
    "sigma, radius, size",
    # The last two: taps reflected at both borders reach one row's columns.
    [(0.9, 2, 5), (1.7, 11, 40), (2.0, 6, 7), (1.3, 11, 12)],
)
def test_blur_matrices_are_the_reflect_padded_taps(sigma, radius, size):
  """blur_matrices by hand: row i of K holds the tap of offset k at column reflect(i + k)."""
  taps = np.exp(-(np.arange(-radius, radius + 1) ** 2) / (2 * sigma**2))
  taps /= taps.sum()
  expected = np.zeros((size, size))
  for i in range(size):
    for k in range(-radius, radius + 1):
      j = abs(i + k)
      j = 2 * (size - 1) - j if j > size - 1 else j
      expected[i, j] += taps[k + radius]
  got = np.asarray(
      photometric.blur_matrices(
          np.array([sigma, sigma], np.float32), np.array([True, False]), radius, size
      )
  )
  np.testing.assert_allclose(got[0], expected, atol=1e-7)
  np.testing.assert_array_equal(got[1], np.eye(size))


def test_blur_matrices_program_does_not_grow_with_the_radius():
  """The matrices take as many operations at 23 taps as at 5: each entry computes the three taps
  that can reach it (a sum over the taps' masks took XLA's GPU compiler minutes at 224 px)."""

  def equations(radius):
    jaxpr = jax.make_jaxpr(lambda s, b: photometric.blur_matrices(s, b, radius, 224))(
        np.ones(4, np.float32), np.ones(4, bool)
    )
    return len(jaxpr.eqns)

  assert equations(11) == equations(2)


@pytest.mark.slow
def test_bfloat16_views_stay_within_one_grey_level_of_float32():
  """Views held in bfloat16 between the passes (a bfloat16 network's runs) against float32 ones,
  with every op on for half the views and a 23-tap blur as at 224 px: at most 0.75 grey levels
  (0.75 / 255) apart, the three roundings (the colour ops' output and each of the blur's
  products, of values less 0.5) each at most 2^-10 = 0.25 grey levels, and not equal (the
  bfloat16 path is really taken). Smooth images, whose neighbours round alike, are the worst
  case: the blur does not average their roundings away."""
  size = 64
  spec = photometric.PhotometricSpec(
      jitter_prob=1.0,
      grayscale_prob=0.5,
      blur_prob=0.5,
      solarize_prob=0.5,
      blur_kernel_fraction=0.36,
  )
  assert photometric.blur_radius(size, size, spec) == 11
  rng = np.random.default_rng(3)
  smooth = np.cumsum(np.cumsum(rng.normal(size=(16, size, size, 3)), 1), 2)
  smooth = (smooth - smooth.min()) / (smooth.max() - smooth.min())
  images = np.concatenate([smooth, rng.random((16, size, size, 3))]).astype(np.float32)
  params = photometric.sample_photometric(jax.random.key(5), 32, spec)
  single = apply(images, params, spec)
  half = apply(images, params, dataclasses.replace(spec, dtype="bfloat16"))
  difference = np.abs(half - single)
  assert 0.0 < difference.max() <= 0.75 / 255.0, difference.max()


# ---------------------------------------------------------------- sampling


def test_sampled_frequencies_and_ranges():
  n = 20000
  spec = photometric.PhotometricSpec(solarize_prob=0.3)
  p = {
      k: np.asarray(v)
      for k, v in photometric.sample_photometric(jax.random.key(2), n, spec).items()
  }
  assert set(p) == set(photometric.PARAM_KEYS)
  for key, prob in [("jitter", 0.8), ("grayscale", 0.2), ("blur", 0.5), ("solarize", 0.3)]:
    assert p[key].dtype == bool and p[key].shape == (n,)
    assert abs(p[key].mean() - prob) < 0.015, key  # > 4 standard deviations
  for key in ("brightness", "contrast", "saturation"):
    assert p[key].dtype == np.float32
    assert 0.6 <= p[key].min() < 0.61 and 1.39 < p[key].max() <= 1.4
    assert abs(p[key].mean() - 1.0) < 0.01
  assert -0.1 <= p["hue"].min() < -0.099 and 0.099 < p["hue"].max() <= 0.1
  assert 0.1 <= p["sigma"].min() and p["sigma"].max() <= 2.0
  assert abs(p["sigma"].mean() - 1.05) < 0.02
  order = p["order"]
  assert order.dtype == np.int32 and order.shape == (n, 4)
  np.testing.assert_array_equal(np.sort(order, axis=1), np.tile(np.arange(4), (n, 1)))
  np.testing.assert_allclose(np.bincount(order[:, 0], minlength=4) / n, 0.25, atol=0.015)
  assert len({tuple(row) for row in order[:2000]}) == 24


def test_strength_above_one_clamps_lower_bound_at_zero():
  spec = photometric.PhotometricSpec(brightness=1.5)
  b = np.asarray(photometric.sample_photometric(jax.random.key(3), 20000, spec)["brightness"])
  assert b.min() >= 0.0 and b.max() <= 2.5 and abs(b.mean() - 1.25) < 0.05


# ---------------------------------------------------------------- conversion, jit, errors


def test_to_float_and_normalize():
  x = np.random.default_rng(4).integers(0, 256, (2, 4, 4, 3), dtype=np.uint8)
  spec = photometric.PhotometricSpec()
  as_float = np.asarray(photometric.to_float(x))
  np.testing.assert_allclose(as_float, x / 255.0, atol=1e-7)
  np.testing.assert_allclose(
      np.asarray(photometric.normalize(as_float, spec)),
      (x / 255.0 - np.array(spec.mean)) / np.array(spec.std),
      atol=1e-5,
  )


@pytest.mark.slow
def test_augment_batch_runs_under_jit():
  images = np.random.default_rng(5).integers(0, 256, (B, SIZE, SIZE, 3), dtype=np.uint8)
  augment = jax.jit(photometric.augment_batch, static_argnames="spec")
  out, params = augment(jax.random.key(0), images, spec=SPEC)
  assert out.shape == (B, SIZE, SIZE, 3) and out.dtype == np.float32
  unnormalised = np.asarray(out) * np.array(SPEC.std) + np.array(SPEC.mean)
  np.testing.assert_allclose(
      unnormalised, apply(images / np.float32(255), jax.device_get(params)), atol=1e-5
  )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(jitter_prob=1.2), "jitter_prob"),
        (dict(blur_prob=-0.1), "blur_prob"),
        (dict(rotation_prob=1.5), "rotation_prob"),
        (dict(texture_prob=-0.5), "texture_prob"),
        (dict(brightness=-0.4), "brightness"),
        (dict(hue=0.6), "hue"),
        (dict(blur_sigma=(2.0, 0.1)), "blur_sigma"),
        (dict(blur_sigma=(0.0, 1.0)), "blur_sigma"),
        (dict(blur_kernel_fraction=0.0), "blur_kernel_fraction"),
        (dict(std=(0.2, 0.0, 0.2)), "std"),
        (dict(dtype="float16"), "dtype"),
    ],
)
def test_spec_rejects_bad_values(kwargs, match):
  with pytest.raises(ValueError, match=match):
    photometric.PhotometricSpec(**kwargs)


def test_apply_rejects_bad_input():
  images = random_images()
  with pytest.raises(ValueError, match="keys"):
    apply(images, {k: v for k, v in neutral_params(B).items() if k != "hue"})
  with pytest.raises(ValueError, match="shape"):
    apply(images, neutral_params(B + 1))
  with pytest.raises(ValueError, match="to_float"):
    apply((images * 255).astype(np.uint8), neutral_params(B))
  with pytest.raises(ValueError, match="uint8"):
    photometric.to_float(images)
  with pytest.raises(ValueError, match="batch_size"):
    photometric.sample_photometric(jax.random.key(0), 0, photometric.PhotometricSpec())
