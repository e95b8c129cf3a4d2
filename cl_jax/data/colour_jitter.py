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

The image is held as three (H, W) planes R, G, B, so that every op is per pixel on arrays of one
shape (no slicing or stacking of a channel axis) and XLA compiles the whole jitter into one
elementwise kernel, given the contrast op's mean (contrast_mean, one reduction). The three cheap
ops share one form, x_c <- clip(a x_c + s gray(x) + t, 0, 1): brightness (f, 0, 0), contrast
(f, 0, (1 - f) m), saturation (f, 1 - f, 0), and (1, 0, 0) leaves an image in [0, 1] exactly as it
is. So a random order needs no per-pixel choice between the ops: three slots before the hue op and
three after it, each slot per image either one of the cheap ops or (1, 0, 0).

The hue shift follows dm-pix's adjust_hue (its RGB <-> HSV planes), written out here on the
planes (see _hue for the one change). Brightness, contrast, saturation and grayscale are written
here because dm-pix's versions differ: its brightness adds a delta, its contrast blends each
channel with that channel's own mean, its saturation scales the HSV saturation, and its rec601
luma uses 0.2989 for red.
"""

import jax
import jax.numpy as jnp

LUMA = (0.299, 0.587, 0.114)
NUM_JITTER_OPS = 4  # order indices: 0 brightness, 1 contrast, 2 saturation, 3 hue
_CONTRAST, _SATURATION, _HUE = 1, 2, 3


def gray(image: jax.Array) -> jax.Array:
  """(H, W, 3) -> (H, W, 1) BT.601 luma 0.299 R + 0.587 G + 0.114 B, as a weighted sum (a
  matrix product would run on a GPU as a GEMM kernel with a 3-wide operand)."""
  return _luma(tuple(image[..., i : i + 1] for i in range(3)))


def _luma(planes: tuple[jax.Array, ...]) -> jax.Array:
  r, g, b = planes
  return LUMA[0] * r + LUMA[1] * g + LUMA[2] * b


def _cheap_op(planes, a, s, t):
  """x_c <- clip(a x_c + s gray(x) + t, 0, 1) on each plane; a, s, t scalars."""
  luma = _luma(planes)
  return tuple(jnp.clip(a * x + s * luma + t, 0.0, 1.0) for x in planes)


def _hue(planes, delta):
  """Hue rotated by `delta` turns: (H, S, V) = hsv(x), x <- rgb((H + delta) mod 1, S, V), clipped
  against round-off. The conversions are dm-pix's (rgb_planes_to_hsv_planes and
  hsv_planes_to_rgb_planes), with one change: the channel that holds the maximum is chosen by
  comparing the channels (red first, then green, at ties) rather than by testing which of them
  equals the maximum. When XLA recomputes a plane inside another kernel with another rounding
  (fused multiply-adds), an equality test can find no channel equal to the maximum and take the
  blue sector's formula for a red or green pixel; comparisons keep every pixel in its sector."""
  r, g, b = planes
  value = jnp.maximum(jnp.maximum(r, g), b)
  spread = value - jnp.minimum(jnp.minimum(r, g), b)
  saturation = jnp.where(value > 0, spread / jnp.where(value > 0, value, 1.0), 0.0)
  norm = 1.0 / (6.0 * jnp.where(spread > 0, spread, 1.0))
  red_max = (r >= g) & (r >= b)
  green_max = ~red_max & (g >= b)
  hue = jnp.where(
      red_max,
      norm * (g - b),
      jnp.where(green_max, norm * (b - r) + 2.0 / 6.0, norm * (r - g) + 4.0 / 6.0),
  )
  hue = jnp.where(spread > 0, hue, 0.0) + (hue < 0.0)
  sector = ((hue + delta) % 1.0) * 6.0
  weights = (
      jnp.clip(jnp.abs(sector - 3.0) - 1.0, 0.0, 1.0),
      jnp.clip(2.0 - jnp.abs(sector - 2.0), 0.0, 1.0),
      jnp.clip(2.0 - jnp.abs(sector - 4.0), 0.0, 1.0),
  )
  return tuple(jnp.clip(value * (1.0 - saturation + saturation * w), 0.0, 1.0) for w in weights)


def _in_order(planes, p, mean, limit):
  """The jitter ops at the positions i < limit of p["order"] (limit 4: all of them), the others
  left out. The cheap ops, in their relative order, fill the slots before the hue op and after it
  (module docstring); hue is computed once."""
  order = p["order"]
  hue_position = jnp.argmax(order == _HUE)
  # the cheap ops' positions, in order: 0, 1, 2, 3 without hue's
  positions = [j + (j >= hue_position) for j in range(3)]
  factor = jnp.stack([p["brightness"], p["contrast"], p["saturation"]])
  for before_hue in (True, False):
    for j in range(3):
      code = order[positions[j]]
      f = factor[code]
      on = (positions[j] < limit) & ((j < hue_position) == before_hue)
      a = jnp.where(on, f, 1.0)
      s = jnp.where(on & (code == _SATURATION), 1.0 - f, 0.0)
      t = jnp.where(on & (code == _CONTRAST), (1.0 - f) * mean, 0.0)
      planes = _cheap_op(planes, a, s, t)
    if before_hue:
      rotated = _hue(planes, p["hue"])
      planes = tuple(jnp.where(hue_position < limit, y, x) for x, y in zip(planes, rotated))
  return planes


def contrast_mean(planes: tuple[jax.Array, ...], p: dict[str, jax.Array]) -> jax.Array:
  """The scalar m of the contrast op, clip(f x + (1 - f) m, 0, 1): mean(gray(x)) over all pixels
  of the image (its R, G, B planes, each (H, W)) after the jitter ops that precede contrast in
  p["order"]. A reduction of its own, so that the rest of the jitter is per pixel: XLA computes
  the ops before contrast again inside the reduction, which then reads only the image."""
  before = _in_order(planes, p, 0.0, jnp.argmax(p["order"] == _CONTRAST))
  return jnp.mean(_luma(before))


def jitter_planes(planes: tuple[jax.Array, ...], p: dict[str, jax.Array]) -> tuple[jax.Array, ...]:
  """The four ColorJitter ops on one image's R, G, B planes (each (H, W)) in the order p["order"]
  (3 = hue): x <- op_{order[i]}(x) for i = 0..3, op_0 brightness, op_1 contrast, op_2
  saturation, op_3 hue (module docstring)."""
  return _in_order(planes, p, contrast_mean(planes, p), NUM_JITTER_OPS)


def gray_planes(planes: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
  """Three copies of the luma plane 0.299 R + 0.587 G + 0.114 B."""
  luma = _luma(planes)
  return (luma, luma, luma)


def jitter(image: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
  """jitter_planes of one (H, W, 3) image, (H, W, 3) out."""
  return jnp.stack(jitter_planes(tuple(image[..., i] for i in range(3)), p), -1)
