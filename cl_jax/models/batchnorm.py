"""Batch normalisation with statistics over equal groups of the batch ("virtual devices").

Hand-written because flax's ``nn.BatchNorm`` groups statistics only across devices
(``axis_name`` / ``axis_index_groups``), while MoCo's per-device BN and shuffle-BN need
per-group statistics on any number of devices, including one. With the global batch sharded
over a ``data`` mesh axis and ``num_groups`` a multiple of the device count, the reshape
(B, ...) -> (G, B/G, ...) keeps every group on one device, so each device computes its
groups' statistics locally; the only cross-device reduction is the (C,)-sized average that
updates the running statistics. On a mesh with Explicit axes, a ``num_groups`` that would
split a group across devices is rejected with a ValueError.

Groups whose rows lie anywhere in the batch (``scattered_group_normalise``, MoCo's shuffle-BN
computed without moving the key images) take their statistics with a (G, 2C) all-reduce of
per-group sums across devices instead; that path is forward only.

The training-mode normalisation (``group_normalise``) moves the bytes it needs and no more, the
train step being bound by memory traffic: its statistics take one pass over x (the shifted sums
of x and x^2), the normalisation (and the ReLU that follows, fused in with ``relu``) one more;
its hand-written backward takes one pass for the two per-channel sums of the output's gradient
and one for the input's gradient, and keeps only x in its own dtype and the (G, C) statistics
(autodiff of the float32 formula would keep float32 copies of x - mean and of the normalised
output, about 130 MB per image in a bfloat16 ResNet-50 at 224 px, and the ReLU its output and
mask). The gradient is the same function, rounded in float32 as autodiff's is.
"""

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from cl_jax.models import pooling


def _explicit_batch_shards(x: jax.Array) -> int:
  """Number of shards of x's batch axis over Explicit mesh axes (1 when not so sharded)."""
  sharding = jax.typeof(x).sharding
  axes = sharding.spec[0] if len(sharding.spec) else None
  if axes is None:
    return 1
  axes = axes if isinstance(axes, tuple) else (axes,)
  return math.prod(sharding.mesh.shape[axis] for axis in axes)


def _grouped(x: jax.Array, num_groups: int) -> jax.Array:
  """(B, ..., C) -> (G, B/G, ..., C) in float32."""
  return x.astype(jnp.float32).reshape((num_groups, x.shape[0] // num_groups) + x.shape[1:])


def _group_axes(grouped: jax.Array) -> tuple[int, ...]:
  """The axes a group's statistics reduce: all but the group axis and the channels."""
  return tuple(range(1, grouped.ndim - 1))


def _sums(a, b, axes):
  """(sum(a), sum(b)) over axes (axis 1, the group's rows, and the spatial axes after it),
  keepdims, for a and b (G, B/G, ..., C), each compiler's way of reading their common inputs
  once (jax.lax.platform_dependent, resolved when the step is lowered for its platform): two
  plain reductions on TPUs, whose compiler fuses sibling reductions into one pass (and keeps a
  float32 copy of a and b for a variadic one), and elsewhere _variadic_sums."""
  return jax.lax.platform_dependent(
      a,
      b,
      tpu=functools.partial(_plain_sums, axes=axes),
      default=functools.partial(_variadic_sums, axes=axes),
  )


def _plain_sums(a, b, axes):
  """_sums as two reductions."""
  return jnp.sum(a, axis=axes, keepdims=True), jnp.sum(b, axis=axes, keepdims=True)


def _variadic_sums(a, b, axes):
  """_sums as XLA's GPU compiler runs it in one pass: first each row's sums over its spatial
  axes, as one variadic reduction (one kernel for both, reading their common inputs once, and
  neither writes nor reads again what both recompute, such as a ReLU's mask), then the rows'
  sums, one plain reduction of both (concatenated on the channel axis), which XLA's partitioner
  turns into partial sums and one all-reduce where the rows lie on several devices (for a
  variadic reduction it would gather the whole input)."""
  shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape))
  inner = tuple(i for i in axes if i != 1)
  if inner:
    zeros = (jnp.zeros((), a.dtype), jnp.zeros((), b.dtype))
    a, b = jax.lax.reduce((a, b), zeros, lambda p, q: (p[0] + q[0], p[1] + q[1]), inner)
  sums = jnp.sum(jnp.concatenate([a, b], axis=-1), axis=1)  # one (G, 2C) reduction
  sa, sb = jnp.split(sums, 2, axis=-1)
  return sa.reshape(shape), sb.reshape(shape)


def _statistics(grouped, shift):
  """(mean, var), each (G, 1, ..., 1, C), of grouped (G, B/G, ..., C) float32. Feature maps
  (spatial axes present) in one pass: the sums of d = x - shift and d^2 (one read of x),
  mean = shift + S1 / N, var = S2 / N - (S1 / N)^2 (the biased variance; float32 cancels little
  where shift is near the mean). (G, B/G, C) inputs (the heads' batch norms, whose bytes do not
  matter) in two passes, mean then mean((x - mean)^2), which no shift can make less exact."""
  axes = _group_axes(grouped)
  if grouped.ndim == 3:
    mean = jnp.mean(grouped, axis=axes, keepdims=True)
    return mean, jnp.mean(jnp.square(grouped - mean), axis=axes, keepdims=True)
  count = math.prod(grouped.shape[a] for a in axes)
  d = grouped - shift
  first, second = _sums(d, jnp.square(d), axes)
  first, second = first / count, second / count
  return shift + first, jnp.maximum(second - jnp.square(first), 0.0)


def _affine(x, scale, bias, mean, rstd, num_groups):
  """z = (x - mean) rstd scale + bias as x * gain + offset, float32 (G, B/G, ..., C)."""
  gain = rstd * scale
  return _grouped(x, num_groups) * gain + (bias - mean * gain)


def _forward(x, residual, scale, bias, shift, num_groups, epsilon, dtype, relu):
  """(y, mean, var, rstd): y as in group_normalise; mean, var, rstd (G, 1, ..., 1, C)."""
  mean, var = _statistics(_grouped(x, num_groups), shift)
  rstd = jax.lax.rsqrt(var + epsilon)
  z = _output(x, residual, scale, bias, mean, rstd, num_groups, relu)
  y = z.reshape(x.shape).astype(dtype)
  if residual is not None:
    # A block's output is the next block's residual: without the barrier XLA's GPU compiler
    # (which may skip roundings, xla_allow_excess_precision) fuses the chain of residual adds
    # across blocks and writes a float32 copy of it beside y.
    y = jax.lax.optimization_barrier(y)
  return y, mean, var, rstd


def _output(x, residual, scale, bias, mean, rstd, num_groups, relu):
  """The normalised x plus the residual, then the ReLU: float32 (G, B/G, ..., C)."""
  z = _affine(x, scale, bias, mean, rstd, num_groups)
  if residual is not None:
    z = z + _grouped(residual, num_groups)
  return jnp.maximum(z, 0.0) if relu else z


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def group_normalise(
    x, residual, scale, bias, shift, num_groups: int, epsilon: float, dtype, relu: bool
):
  """Batch norm of x (B, ..., C) over G = num_groups contiguous groups, optionally plus a
  residual and followed by a ReLU (a residual block's end), with its gradient.

  Forward, per group g of N = B/G x (spatial size) values per channel (Ioffe & Szegedy 2015,
  Alg. 1), in float32 whatever x's dtype, the statistics in one pass over x (the sums of
  d = x - shift and of d^2, shift a per-channel guess of the mean such as the running mean):
    mu_g = shift + sum(d) / N,  var_g = sum(d^2) / N - (sum(d) / N)^2,
    r_g = 1 / sqrt(var_g + epsilon)
    y_g  = (x_g - mu_g) r_g * scale + bias [+ residual_g], then max(y_g, 0) with relu
  cast to dtype. Backward (the same paper's Sec. 3 chain rule, summed per group), with
  xhat = (x - mu_g) r_g recomputed from the saved x, dy the output's gradient (with relu:
  where y_g > 0, the mask recomputed from x, or read from y where a residual was added, so that
  no mask or masked gradient is written), and dy's per-group sums S1 = sum(dy),
  S2 = sum(dy xhat), both taken in one pass:
    dx_g = r_g scale (dy - S1 / N - xhat S2 / N) + dmu_g / N + dvar_g 2 (x - mu_g) / N
    dscale = sum_g S2,  dbias = sum_g S1,  dresidual = dy
  The residuals are x (and y, with a residual) in their own dtype (bfloat16 in mixed
  precision) and the (G, C) statistics, instead of the float32 full-size intermediates that
  autodiff of the forward would keep. shift takes no gradient.

  Args:
    x: (B, ..., C), B divisible by num_groups.
    residual: None, or an array of x's shape added before the ReLU.
    scale, bias, shift: (C,) float32.
    num_groups: G.
    epsilon: added to the variance.
    dtype: the dtype of y.
    relu: apply max(., 0) to the output.

  Returns:
    (y (B, ..., C) in dtype, mu (G, C), var (G, C)); var is the biased variance.
  """
  y, mean, var, _ = _forward(x, residual, scale, bias, shift, num_groups, epsilon, dtype, relu)
  channels = x.shape[-1]
  return y, mean.reshape(num_groups, channels), var.reshape(num_groups, channels)


def _group_normalise_fwd(x, residual, scale, bias, shift, num_groups, epsilon, dtype, relu):
  y, mean, var, rstd = _forward(x, residual, scale, bias, shift, num_groups, epsilon, dtype, relu)
  channels = x.shape[-1]
  out = (y, mean.reshape(num_groups, channels), var.reshape(num_groups, channels))
  # With a residual the ReLU's mask is read from y (kept anyway: the next layer's input), not
  # recomputed from x and the residual (XLA would keep a float32 copy of the residual for it).
  mask_source = None if residual is None else y
  return out, (x, mask_source, scale, bias, shift, mean, rstd)


def _group_normalise_bwd(num_groups, epsilon, dtype, relu, residuals, cotangents):
  del epsilon, dtype
  x, y, scale, bias, shift, mean, rstd = residuals  # y: None without a residual
  dy, dmean, dvar = cotangents
  grouped = _grouped(x, num_groups)
  axes = _group_axes(grouped)
  dresidual = None
  if relu and y is not None:
    # The residual's gradient is the masked dy itself: written once (in dy's dtype, exactly),
    # and read by both passes below instead of dy and y.
    dresidual = jnp.where(y > 0, dy, jnp.zeros((), dy.dtype))
    dy = dresidual
  dy = _grouped(dy, num_groups)
  dy_sums = dy
  if relu and y is None:
    # The ReLU's mask, recomputed from x in each pass (which reads x anyway), in two forms
    # equal for every finite z, so that no pass reads a stored mask: given one comparison that
    # both passes share, XLA computes it in the forward and stores a mask that both read (1 + 2
    # bytes per element); given a comparison in the reduction's inputs, XLA's GPU compiler
    # computes it in a kernel of its own or in the forward (1 + 1 bytes), which it does not do
    # for the product with the step function sign(max(z, 0)) in {0, 1}.
    z = _affine(x, scale, bias, mean, rstd, num_groups)
    dy_sums = dy * jnp.sign(jnp.maximum(z, 0.0))
    dy = jnp.where(z > 0, dy, 0.0)
  xhat = (grouped - mean) * rstd
  s1, s2 = _sums(dy_sums, dy_sums * xhat, axes)
  dx, dscale, dbias = _input_gradient(x, dy, xhat, scale, mean, rstd, s1, s2, dmean, dvar)
  return dx, dresidual, dscale, dbias, jnp.zeros_like(shift)


def _input_gradient(x, dy, xhat, scale, mean, rstd, s1, s2, dmean, dvar):
  """(dx in x's shape and dtype, dscale (C,), dbias (C,)) of group_normalise's backward, from
  the grouped float32 dy (masked by the ReLU) and xhat, and dy's per-group sums s1 = sum(dy),
  s2 = sum(dy xhat), (G, 1, ..., 1, C):
    dx_g = r_g scale (dy - S1 / N - xhat S2 / N) + dmu_g / N + dvar_g 2 (x - mu_g) / N."""
  num_groups, channels = mean.shape[0], mean.shape[-1]
  count = dy.size // (num_groups * channels)
  stat_shape = mean.shape
  dx = (
      (rstd * scale) * (dy - s1 / count - xhat * (s2 / count))
      + dmean.reshape(stat_shape) / count
      + dvar.reshape(stat_shape) * (2 / count) * (_grouped(x, num_groups) - mean)
  )
  dscale = s2.reshape(num_groups, channels).sum(axis=0)
  dbias = s1.reshape(num_groups, channels).sum(axis=0)
  return dx.reshape(x.shape).astype(x.dtype), dscale, dbias


group_normalise.defvjp(_group_normalise_fwd, _group_normalise_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def group_normalise_pool(x, scale, bias, shift, num_groups: int, epsilon: float, dtype):
  """The ImageNet stem's batch norm, ReLU and 3x3 stride-2 max-pool:
  p = max_pool_3x3_s2(max(BN(x), 0)), BN over G = num_groups contiguous groups as in
  group_normalise, with a backward that takes the batch norm's sums on the pooled grid.

  Each window's gradient g_w reaches one input, its first maximum a(w) (select-and-scatter's
  choice; cl_jax.models.pooling), and passes the ReLU iff p_w > 0. So the per-group sums of the
  normalisation's output gradient dz (S1 = sum(dz), S2 = sum(dz xhat) over the full grid) are
  sums over the windows:
    S1 = sum_w g_w [p_w > 0],  S2 = sum_w g_w [p_w > 0] xhat_a(w),
  read from g, the offsets of the first maxima and x at them (kept by the forward, one int8 and
  one x per window); and dx (group_normalise's formula) reads x and places g_w at a(w) in the
  same pass. In bfloat16 at 112 x 112 x 64 per image the backward moves 1.2 GB per 256 images
  against 2.6 GB for the max-pool's gradient written out and read by the batch norm's two
  passes.

  Args:
    x: (B, H, W, C), B divisible by num_groups.
    scale, bias, shift: (C,) float32.
    num_groups, epsilon, dtype: as group_normalise; the ReLU's output is cast to dtype before
      the max-pool, as in max_pool_3x3_s2(group_normalise(...)[0]).

  Returns:
    (p (B, ceil(H/2), ceil(W/2), C) in dtype, mu (G, C), var (G, C)).
  """
  y, mean, var, _ = _forward(x, None, scale, bias, shift, num_groups, epsilon, dtype, True)
  with jax.named_scope('max_pool'):
    pooled = pooling.window_maxima(y)[0]
  channels = x.shape[-1]
  return pooled, mean.reshape(num_groups, channels), var.reshape(num_groups, channels)


def _group_normalise_pool_fwd(x, scale, bias, shift, num_groups, epsilon, dtype):
  y, mean, var, rstd = _forward(x, None, scale, bias, shift, num_groups, epsilon, dtype, True)
  with jax.named_scope('max_pool'):
    pooled, first, x_first = pooling.window_maxima(y, x)
    # A window whose maximum the ReLU cut to 0 passes no gradient: no first maximum.
    first = jnp.where(pooled > 0, first, jnp.int8(pooling.NO_MAXIMUM))
    # Written by the forward's pass: without the barrier XLA's GPU compiler recomputes x at the
    # first maxima in the backward's sums from all of x (0.4 GB more per step at batch 256).
    pooled, first, x_first = jax.lax.optimization_barrier((pooled, first, x_first))
  channels = x.shape[-1]
  out = (pooled, mean.reshape(num_groups, channels), var.reshape(num_groups, channels))
  return out, (x, x_first, first, scale, mean, rstd)


def _group_normalise_pool_bwd(num_groups, epsilon, dtype, residuals, cotangents):
  del epsilon, dtype
  x, x_first, first, scale, mean, rstd = residuals
  g, dmean, dvar = cotangents
  passed = _grouped(jnp.where(first != pooling.NO_MAXIMUM, g, jnp.zeros((), g.dtype)), num_groups)
  xhat_first = (_grouped(x_first, num_groups) - mean) * rstd
  s1, s2 = _sums(passed, passed * xhat_first, _group_axes(passed))
  with jax.named_scope('max_pool'):
    dz = pooling.place(g, first, x.shape[1], x.shape[2])
  xhat = (_grouped(x, num_groups) - mean) * rstd
  dx, dscale, dbias = _input_gradient(
      x, _grouped(dz, num_groups), xhat, scale, mean, rstd, s1, s2, dmean, dvar
  )
  return dx, dscale, dbias, jnp.zeros(x.shape[-1:], jnp.float32)


group_normalise_pool.defvjp(_group_normalise_pool_fwd, _group_normalise_pool_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def normalise_then_pool(x, scale, bias, shift, num_groups: int, epsilon: float, dtype):
  """group_normalise_pool's function, p = max_pool_3x3_s2(y) with y = max(BN(x), 0) cast to
  dtype, in the form XLA's TPU compiler runs well: the max-pool's gradient is autodiff's
  (select-and-scatter, which it runs natively), and the backward recomputes y from x,
    y = max((x - mu_g) r_g scale + bias, 0),
  where autodiff of max_pool_3x3_s2(group_normalise(x)) would keep y beside x for the
  select-and-scatter (one more activation of the stem's size per view held from the forward
  to the backward: 196 MiB per 128 images of 224 px in bfloat16). The recomputation reads x,
  which the batch norm's backward reads anyway. Shapes, arguments and results as
  group_normalise_pool.
  """
  return _normalise_then_pool_fwd(x, scale, bias, shift, num_groups, epsilon, dtype)[0]


def _normalise_then_pool_fwd(x, scale, bias, shift, num_groups, epsilon, dtype):
  y, mean, var, rstd = _forward(x, None, scale, bias, shift, num_groups, epsilon, dtype, True)
  channels = x.shape[-1]
  pooled = pooling.max_pool_3x3_s2(y)
  out = (pooled, mean.reshape(num_groups, channels), var.reshape(num_groups, channels))
  return out, (x, scale, bias, shift, mean, rstd)


def _normalise_then_pool_bwd(num_groups, epsilon, dtype, residuals, cotangents):
  x, scale, bias, shift, mean, rstd = residuals
  g, dmean, dvar = cotangents
  # Without the barrier XLA's CSE merges the recomputed y with the forward's and keeps it;
  # with x alone, its scheduler recomputes y as soon as x exists. Through g, y is made when
  # the stem's gradient arrives, at the backward's end.
  x, g = jax.lax.optimization_barrier((x, g))
  z = _output(x, None, scale, bias, mean, rstd, num_groups, True)
  y = z.reshape(x.shape).astype(dtype)
  with jax.named_scope('max_pool'):
    dy = pooling.select_and_scatter_gradient(y, g)
  dx, _, dscale, dbias, dshift = _group_normalise_bwd(
      num_groups, epsilon, dtype, True, (x, None, scale, bias, shift, mean, rstd), (dy, dmean, dvar)
  )
  return dx, dscale, dbias, dshift


normalise_then_pool.defvjp(_normalise_then_pool_fwd, _normalise_then_pool_bwd)


def scattered_group_normalise(
    x,
    residual,
    scale,
    bias,
    shift,
    groups: jax.Array,
    num_groups: int,
    epsilon: float,
    dtype,
    relu: bool,
):
  """group_normalise's forward (residual and relu included) for groups whose rows lie anywhere
  in the batch.

  Row i of x belongs to group groups[i]; every group holds B/G rows. With N = B/G x (spatial
  size) values per channel and group, and d_is = x_is - shift, the per-group sums of d and d^2
  over the group's rows i and positions s
    S1_g = sum_{i: groups[i] = g} sum_s d_is,   S2_g = sum_{i: groups[i] = g} sum_s d_is^2
  give the group's statistics (Ioffe & Szegedy 2015, Alg. 1, per group; the biased variance
  from shifted sums, which cancel little when shift is near the mean):
    mu_g  = shift + S1_g / N
    var_g = S2_g / N - (S1_g / N)^2
    y_is  = (x_is - mu_g(i)) / sqrt(var_g(i) + epsilon) * scale + bias
  i.e. group_normalise of the batch permuted so that the groups are contiguous, un-permuted,
  without moving any row: shuffle-BN's statistics computed where the images lie, one (G, 2C)
  all-reduce across devices per BN instead of a gather of the images. Forward only (the key
  encoder takes no gradient).

  Args:
    x: (B, ..., C).
    shift: (C,) a guess of the mean (the running mean).
    groups: (B,) integer group of each row, in [0, num_groups), B / num_groups rows each.
  Returns:
    (y (B, ..., C) in dtype, mean (G, C), var (G, C)), as group_normalise.
  """
  axes = tuple(range(1, x.ndim - 1))
  count = (x.shape[0] // num_groups) * math.prod(x.shape[a] for a in axes)
  x32 = x.astype(jnp.float32)
  d = x32 - shift
  rows = jnp.concatenate([jnp.sum(d, axis=axes), jnp.sum(jnp.square(d), axis=axes)], axis=-1)
  # A sum over the batch axis: each device sums its own rows, XLA all-reduces the (G, 2C).
  sums = jax.ops.segment_sum(rows, groups, num_segments=num_groups) / count
  first, second = jnp.split(sums, 2, axis=-1)
  mean, var = shift + first, jnp.maximum(second - jnp.square(first), 0.0)
  gain = scale * jax.lax.rsqrt(var + epsilon)
  row_shape = (x.shape[0],) + (1,) * len(axes) + (x.shape[-1],)
  offset = (bias - mean * gain)[groups].reshape(row_shape)
  y = x32 * gain[groups].reshape(row_shape) + offset
  if residual is not None:
    y = y + residual.astype(jnp.float32)
  if relu:
    y = jnp.maximum(y, 0.0)
  return y.astype(dtype), mean, var


class GroupBatchNorm(nn.Module):
  """Batch norm (Ioffe & Szegedy 2015, Alg. 1) with statistics per contiguous batch group.

  Training mode, for x of shape (B, ..., C) split into G = ``num_groups`` contiguous groups
  x_g of shape (B/G, ..., C):
    mu_g  = mean(x_g)               over every axis but C        (float32)
    var_g = mean((x_g - mu_g)^2)    biased variance, same axes    (float32)
    y_g   = (x_g - mu_g) / sqrt(var_g + epsilon) * scale + bias   (then max(y_g, 0) with relu)
  both statistics of a feature map from one pass over x, shifted by the running mean
  (group_normalise)
  and the running statistics in collection ``batch_stats`` are updated as
    mean <- momentum * mean + (1 - momentum) * mean_g(mu_g)
    var  <- momentum * var  + (1 - momentum) * mean_g(var_g)
  i.e. the average over groups of each group's *biased* variance (flax's convention; with
  G = 1 this is exactly ``nn.BatchNorm``). The running statistics are left untouched while the
  module is being initialised, as in flax.

  Eval mode (``use_running_average=True``) normalises with the running statistics.

  Attributes:
    num_groups: G, number of equal contiguous groups of the batch axis (1: whole batch).
    momentum: decay of the running averages.
    epsilon: added to the variance before the square root.
    dtype: dtype of the output (statistics and normalisation are computed in float32; the
      backward keeps x in its own dtype, see group_normalise).
    param_dtype: dtype of ``scale`` and ``bias``.
    use_scale: learn a per-channel scale (shape (C,)).
    use_bias: learn a per-channel bias (shape (C,)).
    scale_init: initialiser of ``scale`` (``nn.initializers.zeros`` for the last BN of a
      residual branch).
    bias_init: initialiser of ``bias``.
    relu: follow the normalisation (and the residual's add) by max(., 0) in the same pass
      (training mode: the backward recomputes the ReLU's mask from x, or reads it from the
      output where a residual was added; group_normalise).
    max_pool: follow the ReLU (relu must be on) by the ImageNet stem's 3x3 stride-2 max-pool
      (cl_jax.models.pooling.max_pool_3x3_s2), the output (B, ceil(H/2), ceil(W/2), C); in
      training mode with contiguous groups off TPUs the three run as group_normalise_pool.
  """

  num_groups: int = 1
  momentum: float = 0.9
  epsilon: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  use_scale: bool = True
  use_bias: bool = True
  scale_init: Callable[..., jax.Array] = nn.initializers.ones
  bias_init: Callable[..., jax.Array] = nn.initializers.zeros
  relu: bool = False
  max_pool: bool = False

  @nn.compact
  def __call__(
      self,
      x: jax.Array,
      use_running_average: bool,
      groups: jax.Array | None = None,
      residual: jax.Array | None = None,
  ) -> jax.Array:
    """Normalises x of shape (B, ..., C); returns the same shape in ``self.dtype``.

    In training mode B must be divisible by ``num_groups``; eval mode takes any B.
    groups: None (the G contiguous groups), or (B,) the group of each row in training mode,
    B/G rows each wherever they lie (scattered_group_normalise; forward only).
    residual: None, or an array of x's shape added to the normalised x before the ReLU (a
    residual block's end, in the same pass).
    """
    if (
        isinstance(self.num_groups, bool)
        or not isinstance(self.num_groups, int)
        or (self.num_groups < 1)
    ):
      raise ValueError(f'num_groups must be a positive integer, got {self.num_groups!r}')
    if x.ndim < 2:
      raise ValueError(f'GroupBatchNorm expects input of shape (B, ..., C), got {x.shape}')
    batch, channels = x.shape[0], x.shape[-1]

    ra_mean = self.variable('batch_stats', 'mean', jnp.zeros, (channels,), jnp.float32)
    ra_var = self.variable('batch_stats', 'var', jnp.ones, (channels,), jnp.float32)

    scale = jnp.ones((channels,), jnp.float32)
    if self.use_scale:
      scale = self.param('scale', self.scale_init, (channels,), self.param_dtype)
    bias = jnp.zeros((channels,), jnp.float32)
    if self.use_bias:
      bias = self.param('bias', self.bias_init, (channels,), self.param_dtype)
    scale, bias = scale.astype(jnp.float32), bias.astype(jnp.float32)

    if self.max_pool and (not self.relu or residual is not None):
      raise ValueError('max_pool follows the ReLU of a norm without residual: set relu=True')
    pool = pooling.max_pool_3x3_s2 if self.max_pool else lambda y: y
    if use_running_average:
      x32 = x.astype(jnp.float32)
      y = (x32 - ra_mean.value) * jax.lax.rsqrt(ra_var.value + self.epsilon) * scale + bias
      if residual is not None:
        y = y + residual.astype(jnp.float32)
      return pool((jnp.maximum(y, 0.0) if self.relu else y).astype(self.dtype))
    if batch % self.num_groups:
      raise ValueError(
          f'batch size {batch} is not divisible by num_groups {self.num_groups}; '
          'choose a batch size that is a multiple of the number of BN groups'
      )
    shards = _explicit_batch_shards(x)
    if groups is None and self.num_groups > 1 and self.num_groups % shards:
      raise ValueError(
          f'num_groups {self.num_groups} must be 1 or a multiple of the {shards} shards of '
          'the batch axis, so that every group lies on one device'
      )
    if groups is None and self.max_pool:
      y, mean, var = jax.lax.platform_dependent(
          x,
          scale,
          bias,
          ra_mean.value,
          tpu=self._normalise_then_pool,
          default=functools.partial(
              group_normalise_pool,
              num_groups=self.num_groups,
              epsilon=self.epsilon,
              dtype=jnp.dtype(self.dtype),
          ),
      )
    elif groups is None:
      y, mean, var = group_normalise(
          x,
          residual,
          scale,
          bias,
          ra_mean.value,
          self.num_groups,
          self.epsilon,
          jnp.dtype(self.dtype),
          self.relu,
      )
    else:
      y, mean, var = scattered_group_normalise(
          x,
          residual,
          scale,
          bias,
          ra_mean.value,
          groups,
          self.num_groups,
          self.epsilon,
          jnp.dtype(self.dtype),
          self.relu,
      )
      y = pool(y)
    if not self.is_initializing():
      ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean.mean(axis=0)
      ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var.mean(axis=0)
    return y

  def _normalise_then_pool(self, x, scale, bias, shift):
    """group_normalise_pool's function in TPUs' form (normalise_then_pool)."""
    return normalise_then_pool(
        x, scale, bias, shift, self.num_groups, self.epsilon, jnp.dtype(self.dtype)
    )
