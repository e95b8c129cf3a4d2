"""The regions of DICR (2025 submission "Direct intra-image contrastive regularisation", Sec. 3.2):
where the two crops of an image overlap, in each view's coordinates, and the mean of a feature map
over such a region by bilinear sampling (RoIAlign, Eq. 6).

Boxes are the host pipeline's crop boxes [y0, x0, y1, x1] in source pixels (cl_jax.data.
geometric); view v shows box_v resized to the view and, when flip_v, mirrored left-right. A region
in view coordinates is [y0, x0, y1, x1] as fractions of the view's height and width.
"""

import jax
import jax.numpy as jnp


def overlap_in_views(
    box1: jax.Array, flip1: jax.Array, box2: jax.Array, flip2: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The overlap o of two crops of the same image, in each view's coordinates.

  o = [max(y0), max(x0), min(y1), min(x1)] in source pixels; in view v,
  y -> (y - y0_v) / (y1_v - y0_v), x -> (x - x0_v) / (x1_v - x0_v), and with flip_v
  x -> 1 - x (so the region's left and right edges swap).

  Args:
    box1, box2: (..., 4) float crop boxes [y0, x0, y1, x1] in source pixels.
    flip1, flip2: (...) bool, the views' left-right flips.

  Returns:
    (o1, o2, area): o1, o2 (..., 4) float32 regions [y0, x0, y1, x1] in [0, 1]^2 of view 1 and
    view 2 (all zeros where the crops do not overlap); area (...) float32 the overlap's area in
    source pixels (0 for disjoint crops or crops that touch along an edge).
  """
  box1, box2 = jnp.asarray(box1, jnp.float32), jnp.asarray(box2, jnp.float32)
  top_left = jnp.maximum(box1[..., :2], box2[..., :2])
  bottom_right = jnp.minimum(box1[..., 2:], box2[..., 2:])
  extent = jnp.maximum(bottom_right - top_left, 0.0)
  area = extent[..., 0] * extent[..., 1]
  overlap = jnp.concatenate([top_left, bottom_right], axis=-1)

  def in_view(box, flip):
    origin, size = box[..., :2], box[..., 2:] - box[..., :2]
    y0x0 = (overlap[..., :2] - origin) / size
    y1x1 = (overlap[..., 2:] - origin) / size
    x0 = jnp.where(flip, 1.0 - y1x1[..., 1], y0x0[..., 1])
    x1 = jnp.where(flip, 1.0 - y0x0[..., 1], y1x1[..., 1])
    region = jnp.stack([y0x0[..., 0], x0, y1x1[..., 0], x1], axis=-1)
    return jnp.where((area > 0)[..., None], region, 0.0)

  return in_view(box1, flip1), in_view(box2, flip2), area


def roi_mean(feature_map: jax.Array, region: jax.Array, samples: int) -> jax.Array:
  """Mean of a feature map over a region by bilinear sampling (RoIAlign with one output bin,
  Eq. 6: h_o = integral of f over o / area of o).

  The region is split into samples x samples equal cells; the map is sampled bilinearly at each
  cell's centre (cell (i, j) of the map holds its value at (i + 1/2, j + 1/2) in map units;
  points beyond the outer centres take the border value) and the samples are averaged. A region
  covering the whole map with samples equal to its side gives the plain mean of the map.

  Args:
    feature_map: (h, w, C) features of one view.
    region: (4,) [y0, x0, y1, x1] in [0, 1]^2 view coordinates (overlap_in_views).
    samples: sampling points per side, >= 1.

  Returns:
    (C,) float32 mean feature; differentiable in feature_map.
  """
  if samples < 1:
    raise ValueError(f"samples must be at least 1, got {samples}")
  h, w = feature_map.shape[:2]
  t = (jnp.arange(samples, dtype=jnp.float32) + 0.5) / samples
  ys = jnp.clip((region[0] + t * (region[2] - region[0])) * h - 0.5, 0.0, h - 1)
  xs = jnp.clip((region[1] + t * (region[3] - region[1])) * w - 0.5, 0.0, w - 1)
  y_lo = jnp.floor(ys).astype(jnp.int32)
  x_lo = jnp.floor(xs).astype(jnp.int32)
  y_hi, x_hi = jnp.minimum(y_lo + 1, h - 1), jnp.minimum(x_lo + 1, w - 1)
  wy, wx = (ys - y_lo)[:, None, None], (xs - x_lo)[:, None]
  f = feature_map.astype(jnp.float32)
  rows = f[y_lo] * (1.0 - wy) + f[y_hi] * wy  # (samples, w, C)
  values = rows[:, x_lo] * (1.0 - wx) + rows[:, x_hi] * wx  # (samples, samples, C)
  return values.mean(axis=(0, 1))
