"""The ImageNet stem's 3x3, stride-2 max-pool with a backward that each compiler runs well.

Autodiff of a max-pool is XLA's select-and-scatter, which its GPU compiler rewrites into a
reduce-window carrying float32 values and int32 indices and a scatter (about 3.2 GB per step
for the MoCo-v2 ResNet-50 at 224 px, batch 256). Off TPUs the pool keeps, beside its output,
which of its 9 window offsets holds each window's first maximum in row-major order
(select-and-scatter's choice with its `>=` select), one int8 per output element
(window_maxima); the gradient is a sum over the offsets of each window's gradient where the
offset is that window's, placed back by strided padding (place), one pass that reads y's
gradient and the offsets, not x or y. The stem runs its batch norm, ReLU and this max-pool as
one op (cl_jax.models.batchnorm.group_normalise_pool), whose backward places the gradient
inside the batch norm's dx pass. XLA's TPU compiler runs select-and-scatter natively but does
not fuse that sum: it keeps a float32 copy of the padded input per offset (1.6 GB per chip at
128 images of 224 px), so on TPUs the max-pool takes autodiff's gradient
(jax.lax.platform_dependent, resolved when the step is lowered for its platform), and the stem's
batch norm recomputes the pool's input for it in the backward
(cl_jax.models.batchnorm.normalise_then_pool).
"""

import functools

import jax
import jax.numpy as jnp

_WINDOW, _STRIDE, _PAD = 3, 2, 1
NO_MAXIMUM = _WINDOW * _WINDOW  # a `first` offset that place() puts nowhere


def _padded(x: jax.Array) -> jax.Array:
  """x (B, H, W, C) with one row and column of -inf on every side."""
  return jnp.pad(x, ((0, 0), (_PAD, _PAD), (_PAD, _PAD), (0, 0)), constant_values=-jnp.inf)


def _offset(padded: jax.Array, di: int, dj: int, out_h: int, out_w: int) -> jax.Array:
  """The element at offset (di, dj) of every window: (B, out_h, out_w, C)."""
  return padded[:, di : di + _STRIDE * out_h : _STRIDE, dj : dj + _STRIDE * out_w : _STRIDE]


def max_pool_3x3_s2(x: jax.Array) -> jax.Array:
  """(B, H, W, C) -> (B, ceil(H/2), ceil(W/2), C): the max over 3x3 windows at stride 2 with
  one row and column of padding on each side (flax's nn.max_pool(x, (3, 3), (2, 2),
  ((1, 1), (1, 1)))), in x's dtype; its gradient autodiff's (select-and-scatter) on TPUs and
  the summed one of _summed_gradient_pool elsewhere, equal for every input. Its ops are named
  under "max_pool" (what cl_jax.bench.hlo_kernels counts as pooling)."""
  with jax.named_scope("max_pool"):
    return jax.lax.platform_dependent(x, tpu=_pool, default=_summed_gradient_pool)


def _pool(x: jax.Array) -> jax.Array:
  """The max-pool itself (max_pool_3x3_s2), differentiated by autodiff."""
  return jax.lax.reduce_window(
      x,
      -jnp.inf,
      jax.lax.max,
      (1, _WINDOW, _WINDOW, 1),
      (1, _STRIDE, _STRIDE, 1),
      ((0, 0), (_PAD, _PAD), (_PAD, _PAD), (0, 0)),
  )


def select_and_scatter_gradient(x: jax.Array, g: jax.Array) -> jax.Array:
  """The gradient of _pool at x (B, H, W, C) for its output's gradient g: autodiff's, which
  XLA runs as select-and-scatter (each window's gradient to its first maximum); x's dtype."""
  return jax.vjp(_pool, x)[1](g)[0]


@jax.custom_vjp
def _summed_gradient_pool(x: jax.Array) -> jax.Array:
  """_pool with the gradient of _backward."""
  return _pool(x)


def window_maxima(x: jax.Array, *others: jax.Array) -> tuple[jax.Array, ...]:
  """(y, first, *at_first) of x (B, H, W, C): y (B, ceil(H/2), ceil(W/2), C) = _pool(x), the
  maximum of the 9 window offsets' elements; first (int8, y's shape) the offset 3 di + dj of
  each window's first maximum in row-major order (select-and-scatter's choice); and each of
  `others` (arrays of x's shape) at that position."""
  out_h, out_w = -(-x.shape[1] // _STRIDE), -(-x.shape[2] // _STRIDE)

  def offsets(a):
    padded = _padded(a) if a is x else jnp.pad(a, ((0, 0), (_PAD, _PAD), (_PAD, _PAD), (0, 0)))
    return [_offset(padded, di, dj, out_h, out_w) for di in range(_WINDOW) for dj in range(_WINDOW)]

  candidates = offsets(x)
  y = functools.reduce(jnp.maximum, candidates)
  # Built from the windows' own arrays (not from new constants), so that they keep y's
  # sharding under explicitly sharded meshes.
  first = jnp.full_like(y, NO_MAXIMUM, dtype=jnp.int8)
  for k in reversed(range(_WINDOW * _WINDOW)):
    first = jnp.where(candidates[k] == y, jnp.int8(k), first)
  at_first = []
  for other in others:
    values = offsets(other)
    picked = values[-1]
    for k in range(_WINDOW * _WINDOW - 1):
      picked = jnp.where(first == k, values[k], picked)
    at_first.append(picked)
  return (y, first, *at_first)


def place(g: jax.Array, first: jax.Array, height: int, width: int) -> jax.Array:
  """sum over offsets k = 3 di + dj of place_k(g * [first == k]), float32 (B, height, width, C):
  every window's g (B, out_h, out_w, C) at its first maximum's input position (first ==
  NO_MAXIMUM: nowhere), placed by strided padding; an input that is the maximum of several
  windows takes all their values."""
  out_h, out_w = first.shape[1:3]
  g32, zero = g.astype(jnp.float32), jnp.zeros((), jnp.float32)
  dx = None
  for di in range(_WINDOW):
    for dj in range(_WINDOW):
      # Window (i, j)'s element (di, dj) sits at padded row 2 i + di, column 2 j + dj.
      placed = jax.lax.pad(
          jnp.where(first == _WINDOW * di + dj, g32, zero),
          zero,
          (
              (0, 0, 0),
              (di, height + 2 * _PAD - di - (_STRIDE * (out_h - 1) + 1), _STRIDE - 1),
              (dj, width + 2 * _PAD - dj - (_STRIDE * (out_w - 1) + 1), _STRIDE - 1),
              (0, 0, 0),
          ),
      )
      dx = placed if dx is None else dx + placed
  return dx[:, _PAD : _PAD + height, _PAD : _PAD + width]


def _forward(x):
  """y = _pool(x) and, for the gradient, each window's first maximum (window_maxima)."""
  y, first = window_maxima(x)
  return y, (first, x.shape[1:3])


def _backward(residuals, g):
  """dx = place(g, first): every window's gradient to its first maximum, summed in float32
  and cast to g's dtype."""
  first, (height, width) = residuals
  return (place(g, first, height, width).astype(g.dtype),)


_summed_gradient_pool.defvjp(_forward, _backward)
