"""Colour jitter and grayscale luma of one image: the ops of the colour group of the photometric
views (cl_jax.data.photometric).

Colour jitter follows torchvision's ColorJitter on float images in [0, 1] (each op clipped to
[0, 1], the four ops in a random order per example):
  brightness(x, f) = f x
  contrast(x, f)   = f x + (1 - f) mean(gray(x))      (mean over all pixels of the image)
  saturation(x, f) = f x + (1 - f) gray(x)             (per pixel)
  hue(x, h)        = hsv_to_rgb((H + h) mod 1, S, V)   with (H, S, V) = rgb_to_hsv(x)
where gray(x) = 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601 luma, the weights of PIL's
convert("L") that the PIL-based MoCo recipe uses; they sum to exactly 1, so gray stays gray).

dm-pix is used where its op has these semantics: the hue shift (adjust_hue, its RGB <-> HSV
planes). Brightness, contrast, saturation and grayscale are written here because dm-pix's
versions differ: its brightness adds a delta, its contrast blends each channel with that
channel's own mean, its saturation scales the HSV saturation, and its rec601 luma uses 0.2989 for
red.
"""

import dm_pix as pix
import jax
import jax.numpy as jnp

LUMA = (0.299, 0.587, 0.114)
NUM_JITTER_OPS = 4  # order indices: 0 brightness, 1 contrast, 2 saturation, 3 hue


def gray(image: jax.Array) -> jax.Array:
  """(H, W, 3) -> (H, W, 1) BT.601 luma 0.299 R + 0.587 G + 0.114 B, as a weighted sum (a
  matrix product would run on a GPU as a GEMM kernel with a 3-wide operand)."""
  r, g, b = (image[..., i : i + 1] for i in range(3))
  return LUMA[0] * r + LUMA[1] * g + LUMA[2] * b


def _blend(image: jax.Array, other: jax.Array, factor: jax.Array) -> jax.Array:
  """clip(f x + (1 - f) other, 0, 1)."""
  return jnp.clip(factor * image + (1.0 - factor) * other, 0.0, 1.0)


def _brightness(image: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
  """clip(f x, 0, 1), f = p["brightness"]."""
  return jnp.clip(p["brightness"] * image, 0.0, 1.0)


def _contrast(image: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
  """clip(f x + (1 - f) mean(gray(x)), 0, 1), f = p["contrast"]."""
  return _blend(image, jnp.mean(gray(image)), p["contrast"])


def _saturation(image: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
  """clip(f x + (1 - f) gray(x), 0, 1), f = p["saturation"]."""
  return _blend(image, gray(image), p["saturation"])


def _hue(image: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
  """Hue rotated by p["hue"] turns (clipped against HSV round-off)."""
  return jnp.clip(pix.adjust_hue(image, p["hue"]), 0.0, 1.0)


_CHEAP_OPS = (_brightness, _contrast, _saturation)


def jitter(image: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
  """The four ColorJitter ops on one (H, W, 3) image in the order p["order"] (3 = hue).

  Equivalent to x <- op_{order[i]}(x) for i = 0..3, but the hue op, the only costly one (an HSV
  round trip), is computed once instead of at every position: the three cheap ops, kept in their
  relative order, run up to hue's position, hue runs on that state, and the cheap ops after it
  follow. Unrolling all four positions with lax.switch recomputes hue four times, and XLA's
  fusion then duplicates chained HSV round trips (measured 5x slower on CPU).
  """
  order = p["order"]
  hue_position = jnp.argmax(order == 3)
  cheap = order[jnp.argsort(order == 3, stable=True)[:3]]
  states = [image]
  for j in range(3):
    states.append(jax.lax.switch(cheap[j], _CHEAP_OPS, states[-1], p))
  x = _hue(jnp.select([hue_position == j for j in range(4)], states), p)
  for j in range(3):
    x = jnp.where(j >= hue_position, jax.lax.switch(cheap[j], _CHEAP_OPS, x, p), x)
  return x
