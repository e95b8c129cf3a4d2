"""Tests for cl_jax.models: GroupBatchNorm, ResNet backbones, heads and the encoder."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from cl_jax.models import batchnorm
from cl_jax.models.batchnorm import GroupBatchNorm, group_normalise
from cl_jax.models.encoder import build_encoder
from cl_jax.models.heads import MLPHead, l2_normalize
from cl_jax.models.relu import relu
from cl_jax.models.resnet import ResidualBlock, ResNet, ResNet18, ResNet50, resnet_feature_dim


def _key(seed):
  # The RBG generator compiles in milliseconds on CPU; threefry sampling costs about half a
  # second of XLA compilation per distinct parameter shape, which dominates a ResNet init.
  return jax.random.key(seed, impl='rbg')


def _init_and_train_step(module, x):
  """Initialises ``module`` on x and runs one training-mode forward pass; jit it whole so
  that init and apply share one compilation."""
  variables = module.init(_key(0), x, train=False)
  out, _ = module.apply(variables, x, train=True, mutable=['batch_stats'])
  return variables, out


def _param_count(tree):
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(tree))


# ---------------------------------------------------------------- GroupBatchNorm


def _bn_variables(rng, channels):
  return {
      'params': {
          'scale': rng.normal(size=channels).astype(np.float32),
          'bias': rng.normal(size=channels).astype(np.float32),
      },
      'batch_stats': {
          'mean': rng.normal(size=channels).astype(np.float32),
          'var': rng.uniform(0.5, 2.0, size=channels).astype(np.float32),
      },
  }


def _numpy_group_bn(x, scale, bias, groups, eps):
  """Per-group batch norm in float64; returns (y, group means (G, C), group biased vars)."""
  x = np.asarray(x, np.float64)
  grouped = x.reshape((groups, x.shape[0] // groups) + x.shape[1:])
  axes = tuple(range(1, grouped.ndim - 1))
  mean = grouped.mean(axis=axes, keepdims=True)
  var = grouped.var(axis=axes, keepdims=True)
  y = ((grouped - mean) / np.sqrt(var + eps)).reshape(x.shape) * scale + bias
  channels = x.shape[-1]
  return y, mean.reshape(groups, channels), var.reshape(groups, channels)


@pytest.mark.parametrize('groups', [1, 4])
def test_group_batchnorm_training_matches_numpy(groups):
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(8, 3, 2, 5)) * 3 + 1).astype(np.float32)
  variables = _bn_variables(rng, 5)
  module = GroupBatchNorm(num_groups=groups, momentum=0.8)
  y, updates = module.apply(variables, x, use_running_average=False, mutable=['batch_stats'])

  p, s = variables['params'], variables['batch_stats']
  y_ref, mean, var = _numpy_group_bn(x, p['scale'], p['bias'], groups, 1e-5)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  new = updates['batch_stats']
  np.testing.assert_allclose(new['mean'], 0.8 * s['mean'] + 0.2 * mean.mean(0), rtol=1e-5)
  np.testing.assert_allclose(new['var'], 0.8 * s['var'] + 0.2 * var.mean(0), rtol=1e-5)


@pytest.mark.parametrize('shape', [(8, 3, 2, 5), (32, 6)])
def test_group_batchnorm_scattered_groups_match_numpy(shape):
  # Rows of a group anywhere in the batch (shuffle-BN by statistics): group g's statistics
  # are those of the rows with groups[i] == g, computed in float64 by NumPy over exactly those
  # rows; each row is normalised with its own group's; running statistics as contiguous.
  # At least 8 values per group and channel: a variance from shifted sums of 2 or 3 values can
  # lose float32 digits to cancellation (the key encoder's groups hold thousands).
  rng = np.random.default_rng(1)
  x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
  num_groups = 4
  groups = rng.permutation(np.arange(shape[0]) % num_groups)
  variables = _bn_variables(rng, shape[-1])
  module = GroupBatchNorm(num_groups=num_groups, momentum=0.8)
  y, updates = module.apply(variables, x, False, jnp.asarray(groups), mutable=['batch_stats'])
  p, s = variables['params'], variables['batch_stats']
  y_ref = np.empty(shape)
  means, variances = [], []
  for g in range(num_groups):
    rows = x[groups == g].astype(np.float64)
    axes = tuple(range(rows.ndim - 1))
    mean, var = rows.mean(axis=axes), rows.var(axis=axes)
    y_ref[groups == g] = (rows - mean) / np.sqrt(var + 1e-5) * p['scale'] + p['bias']
    means.append(mean)
    variances.append(var)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  new = updates['batch_stats']
  np.testing.assert_allclose(new['mean'], 0.8 * s['mean'] + 0.2 * np.mean(means, 0), rtol=1e-5)
  np.testing.assert_allclose(new['var'], 0.8 * s['var'] + 0.2 * np.mean(variances, 0), rtol=1e-5)


def test_group_batchnorm_single_group_equals_flax_batchnorm():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(6, 4, 4, 3)).astype(np.float32) * 2 - 1
  variables = _bn_variables(rng, 3)
  ours, ours_stats = GroupBatchNorm(num_groups=1).apply(
      variables, x, use_running_average=False, mutable=['batch_stats']
  )
  theirs, theirs_stats = nn.BatchNorm(momentum=0.9, epsilon=1e-5).apply(
      variables, x, use_running_average=False, mutable=['batch_stats']
  )
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
  for name in ('mean', 'var'):
    np.testing.assert_allclose(
        ours_stats['batch_stats'][name], theirs_stats['batch_stats'][name], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize('groups, untouched', [(4, [0, 1, 2, 3, 6, 7]), (1, [])])
def test_group_batchnorm_groups_do_not_see_each_other(groups, untouched):
  """Replacing group 2 (rows 4, 5 of 8) changes only group 2's rows when G = 4; with G = 1
  every row's output moves."""
  rng = np.random.default_rng(2)
  x = rng.normal(size=(8, 3)).astype(np.float32)
  x_other = x.copy()
  x_other[4:6] = rng.normal(size=(2, 3)) * 5 + 3
  variables = _bn_variables(rng, 3)
  module = GroupBatchNorm(num_groups=groups)
  run = lambda inp: np.asarray(
      module.apply(variables, inp, use_running_average=False, mutable=['batch_stats'])[0]
  )
  y, y_other = run(x), run(x_other)
  moved = [row for row in range(8) if row not in untouched]
  np.testing.assert_array_equal(y[untouched], y_other[untouched])
  assert np.all(np.abs(y[moved] - y_other[moved]).max(axis=1) > 1e-3)


def test_group_batchnorm_eval_uses_running_stats():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(4, 2, 2, 6)).astype(np.float32)
  variables = _bn_variables(rng, 6)
  module = GroupBatchNorm(num_groups=2)
  y = module.apply(variables, x, use_running_average=True)
  p, s = variables['params'], variables['batch_stats']
  y_ref = (x - s['mean']) / np.sqrt(s['var'] + 1e-5) * p['scale'] + p['bias']
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  # A single example is normalised the same way as inside a batch.
  np.testing.assert_allclose(
      module.apply(variables, x[:1], use_running_average=True), y[:1], rtol=1e-6, atol=1e-6
  )


def test_group_batchnorm_bfloat16_output_with_float32_statistics():
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=(8, 4, 4, 3)) + 100.0, jnp.bfloat16)
  variables = _bn_variables(rng, 3)
  y, updates = GroupBatchNorm(num_groups=2, dtype=jnp.bfloat16).apply(
      variables, x, use_running_average=False, mutable=['batch_stats']
  )
  assert y.dtype == jnp.bfloat16
  assert updates['batch_stats']['mean'].dtype == jnp.float32
  p, s = variables['params'], variables['batch_stats']
  y_ref, mean, _ = _numpy_group_bn(np.asarray(x, np.float32), p['scale'], p['bias'], 2, 1e-5)
  np.testing.assert_allclose(np.asarray(y, np.float32), y_ref, rtol=2e-2, atol=3e-2)
  np.testing.assert_allclose(
      updates['batch_stats']['mean'], 0.9 * s['mean'] + 0.1 * mean.mean(0), rtol=1e-5
  )


@pytest.mark.skipif(jax.device_count() < 4, reason='needs 4 devices (e.g. 4 CPU devices)')
def test_group_batchnorm_sharded_batch_matches_single_device():
  """Groups that are whole device shards give the unsharded result; groups that would
  straddle devices of an Explicit mesh are refused."""
  mesh = jax.make_mesh((4,), ('data',), axis_types=(jax.sharding.AxisType.Explicit,))
  rng = np.random.default_rng(6)
  x = rng.normal(size=(16, 2, 2, 3)).astype(np.float32)
  variables = _bn_variables(rng, 3)
  sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data')))
  y_ref, mean, var = _numpy_group_bn(
      x, variables['params']['scale'], variables['params']['bias'], 8, 1e-5
  )
  module = GroupBatchNorm(num_groups=8)
  train = jax.jit(
      lambda v, inp, m=module: m.apply(v, inp, use_running_average=False, mutable=['batch_stats'])
  )
  with jax.set_mesh(mesh):
    y, updates = train(variables, sharded)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        updates['batch_stats']['var'],
        0.9 * variables['batch_stats']['var'] + 0.1 * var.mean(0),
        rtol=1e-5,
    )
    with pytest.raises(ValueError, match='num_groups 2 must be 1 or a multiple of the 4'):
      GroupBatchNorm(num_groups=2).apply(
          variables, sharded, use_running_average=False, mutable=['batch_stats']
      )


def _numpy_bn_objective(x, scale, bias, groups, eps, w, a, b):
  """float64 sum(w * y) + sum(a * mu) + sum(b * var) of the per-group batch norm."""
  y, mean, var = _numpy_group_bn(x, scale, bias, groups, eps)
  return np.sum(w * y) + np.sum(a * mean) + np.sum(b * var)


def _numerical_gradient(f, value, step=1e-6):
  """Central differences of the float64 scalar function f at value, elementwise."""
  value = np.asarray(value, np.float64)
  grad = np.zeros_like(value)
  for i in np.ndindex(value.shape):
    up, down = value.copy(), value.copy()
    up[i] += step
    down[i] -= step
    grad[i] = (f(up) - f(down)) / (2 * step)
  return grad


def _bn_problem(seed, shape, groups):
  rng = np.random.default_rng(seed)
  x = (rng.normal(size=shape) * 2 + 0.5).astype(np.float32)
  scale = rng.normal(size=shape[-1]).astype(np.float32)
  bias = rng.normal(size=shape[-1]).astype(np.float32)
  w = rng.normal(size=shape).astype(np.float32)
  a = rng.normal(size=(groups, shape[-1])).astype(np.float32)
  b = rng.normal(size=(groups, shape[-1])).astype(np.float32)
  return x, scale, bias, w, a, b


def _jax_bn_gradients(x, scale, bias, w, a, b, groups, dtype=jnp.float32):
  def objective(x, scale, bias):
    shift = jnp.zeros_like(scale)
    y, mean, var = group_normalise(
        x, None, scale, bias, shift, groups, 1e-5, jnp.dtype(dtype), False
    )
    return jnp.sum(w * y.astype(jnp.float32)) + jnp.sum(a * mean) + jnp.sum(b * var)

  return jax.grad(objective, argnums=(0, 1, 2))(x.astype(dtype), scale, bias)


@pytest.mark.parametrize('groups', [1, 4])
def test_group_normalise_gradients_match_numpy_central_differences(groups):
  """The hand-written backward (the normalised output and both statistics) equals float64
  central differences of the NumPy forward, for the input, the scale and the bias."""
  x, scale, bias, w, a, b = _bn_problem(7, (8, 3, 2, 5), groups)
  dx, dscale, dbias = _jax_bn_gradients(x, scale, bias, w, a, b, groups)
  x64, s64, b64 = (np.asarray(v, np.float64) for v in (x, scale, bias))
  f = lambda xx, ss, bb: _numpy_bn_objective(xx, ss, bb, groups, 1e-5, w, a, b)
  np.testing.assert_allclose(dx, _numerical_gradient(lambda v: f(v, s64, b64), x64), atol=2e-5)
  np.testing.assert_allclose(
      dscale, _numerical_gradient(lambda v: f(x64, v, b64), s64), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
      dbias, _numerical_gradient(lambda v: f(x64, s64, v), b64), rtol=1e-5, atol=1e-5
  )


@pytest.mark.slow
def test_group_normalise_gradients_in_bfloat16_within_rounding():
  """bfloat16 input and output: the input gradient comes back in bfloat16 and agrees with
  the float64 central differences at bfloat16's precision; scale and bias stay float32."""
  x, scale, bias, w, a, b = _bn_problem(8, (8, 4, 4, 3), 2)
  x = np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))  # representable input
  dx, dscale, dbias = _jax_bn_gradients(x, scale, bias, w, a, b, 2, jnp.bfloat16)
  assert dx.dtype == jnp.bfloat16 and dscale.dtype == jnp.float32
  x64, s64, b64 = (np.asarray(v, np.float64) for v in (x, scale, bias))
  f = lambda xx, ss, bb: _numpy_bn_objective(xx, ss, bb, 2, 1e-5, w, a, b)
  ref = _numerical_gradient(lambda v: f(v, s64, b64), x64)
  np.testing.assert_allclose(np.asarray(dx, np.float32), ref, rtol=2e-2, atol=2e-2)
  # Scale and bias see y only through its bfloat16 cast: bfloat16 rounding of w-weighted sums.
  np.testing.assert_allclose(
      dscale, _numerical_gradient(lambda v: f(x64, v, b64), s64), rtol=2e-2, atol=5e-2
  )


@pytest.mark.parametrize('ending', ['none', 'relu', 'residual_relu'])
def test_group_normalise_equals_autodiff_of_the_plain_formula(ending):
  """Output, statistics and gradients (of x, the residual, scale and bias) within float32
  rounding of autodiff through the textbook two-pass formula followed by jax.nn.relu, the
  residual added before it: what the ResNet computed before the statistics took one pass and
  the ReLU and residual add were fused into its batch norms."""
  x, scale, bias, w, a, b = _bn_problem(9, (16, 4, 4, 6), 4)
  residual = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
  shift = np.full(6, 0.3, np.float32)
  relu_on, with_residual = ending != 'none', ending == 'residual_relu'

  def plain(x, r, scale, bias):
    grouped = x.reshape((4, 4) + x.shape[1:])
    mean = jnp.mean(grouped, axis=(1, 2, 3), keepdims=True)
    var = jnp.mean(jnp.square(grouped - mean), axis=(1, 2, 3), keepdims=True)
    y = ((grouped - mean) * jax.lax.rsqrt(var + 1e-5)).reshape(x.shape) * scale + bias
    y = y + r if with_residual else y
    return (jax.nn.relu(y) if relu_on else y), mean.reshape(4, 6), var.reshape(4, 6)

  def ours(x, r, scale, bias):
    r = r if with_residual else None
    return group_normalise(x, r, scale, bias, shift, 4, 1e-5, jnp.dtype(jnp.float32), relu_on)

  def objective(f):
    def value(x, r, scale, bias):
      y, mean, var = f(x, r, scale, bias)
      return jnp.sum(w * y) + jnp.sum(a * mean) + jnp.sum(b * var)

    return jax.jit(jax.grad(value, argnums=(0, 1, 2, 3)))

  for got, want in zip(
      jax.jit(ours)(x, residual, scale, bias), jax.jit(plain)(x, residual, scale, bias)
  ):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  got, want = (objective(f)(x, residual, scale, bias) for f in (ours, plain))
  if not with_residual:
    got, want = got[:1] + got[2:], want[:1] + want[2:]
  for g, v in zip(got, want):
    np.testing.assert_allclose(g, v, rtol=1e-5, atol=1e-5)


def _pool_problem(seed, shape, groups, levels):
  """x (continuous, or integers in [0, levels) then shifted so that the ReLU cuts some and
  windows tie), scale, bias, and objective weights for the pooled output and both statistics."""
  rng = np.random.default_rng(seed)
  if levels:
    x = rng.integers(0, levels, shape).astype(np.float32)
  else:
    x = (rng.normal(size=shape) * 2 + 0.5).astype(np.float32)
  c = shape[-1]
  scale, bias = (rng.normal(size=c).astype(np.float32) for _ in range(2))
  pooled = (shape[0], -(-shape[1] // 2), -(-shape[2] // 2), c)
  w = rng.normal(size=pooled).astype(np.float32)
  a, b = (rng.normal(size=(groups, c)).astype(np.float32) for _ in range(2))
  return x, scale, bias, w, a, b


def _pool_gradients(normalise_pool, x, scale, bias, w, a, b):
  """Output, statistics and the gradients of x, scale and bias of a (x, scale, bias) ->
  (pooled, mean, var) function under a weighted-sum objective."""

  def value(x, scale, bias):
    out = normalise_pool(x, scale, bias)
    return sum(jnp.sum(u * v) for u, v in zip((w, a, b), out)), out

  grads, out = jax.grad(value, argnums=(0, 1, 2), has_aux=True)(x, scale, bias)
  return list(out) + list(grads)


@pytest.mark.parametrize('op', ['group_normalise_pool', 'normalise_then_pool'])
@pytest.mark.parametrize('groups,levels', [(1, 0), (4, 0), (2, 3)])
def test_group_normalise_pool_equals_autodiff_of_the_plain_formula(groups, levels, op):
  """The stem's batch norm, ReLU and max-pool in one op, in both forms (off TPUs and on them):
  output, statistics and gradients of x, scale and bias within float32 rounding of autodiff
  through the textbook two-pass batch norm, jax.nn.relu and flax's max-pool
  (select-and-scatter), odd sides included; with x on 3 levels most windows tie and many lie
  wholly under the ReLU."""
  shape = (8, 7, 9, 5)
  x, scale, bias, w, a, b = _pool_problem(15, shape, groups, levels)
  shift = np.full(5, 0.4, np.float32)

  def plain(x, scale, bias):
    grouped = x.reshape((groups, shape[0] // groups) + shape[1:])
    mean = jnp.mean(grouped, axis=(1, 2, 3), keepdims=True)
    var = jnp.mean(jnp.square(grouped - mean), axis=(1, 2, 3), keepdims=True)
    y = ((grouped - mean) * jax.lax.rsqrt(var + 1e-5)).reshape(shape) * scale + bias
    pooled = nn.max_pool(jax.nn.relu(y), (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    return pooled, mean.reshape(groups, -1), var.reshape(groups, -1)

  def ours(x, scale, bias):
    f32 = jnp.dtype(jnp.float32)
    return getattr(batchnorm, op)(x, scale, bias, shift, groups, 1e-5, f32)

  got = jax.jit(functools.partial(_pool_gradients, ours))(x, scale, bias, w, a, b)
  want = jax.jit(functools.partial(_pool_gradients, plain))(x, scale, bias, w, a, b)
  for g, v in zip(got, want):
    np.testing.assert_allclose(g, v, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['train', 'eval', 'scattered'])
def test_a_norm_with_max_pool_equals_the_norm_then_the_max_pool(mode):
  """GroupBatchNorm(relu=True, max_pool=True) against the same norm followed by
  max_pool_3x3_s2: output, updated running statistics and (training mode) the gradients of the
  input and both parameters, in training mode, eval mode and with scattered groups."""
  from cl_jax.models.pooling import max_pool_3x3_s2  # pylint: disable=import-outside-toplevel

  x = jnp.asarray(np.random.default_rng(16).normal(size=(4, 10, 10, 3)), jnp.float32)
  variables = jax.tree.map(jnp.asarray, _bn_variables(np.random.default_rng(17), 3))
  groups = jnp.asarray([1, 0, 0, 1]) if mode == 'scattered' else None

  def apply(fused, variables, x):
    norm = GroupBatchNorm(num_groups=2, relu=True, max_pool=fused)
    y, updates = norm.apply(variables, x, mode == 'eval', groups, mutable=['batch_stats'])
    return (y if fused else max_pool_3x3_s2(y)), updates

  (y, stats), (y_ref, stats_ref) = apply(True, variables, x), apply(False, variables, x)
  assert y.shape == (4, 5, 5, 3)
  np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-6)
  for got, want in zip(jax.tree.leaves(stats), jax.tree.leaves(stats_ref)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  if mode == 'train':
    w = jnp.asarray(np.random.default_rng(18).normal(size=y.shape), jnp.float32)
    grad = lambda fused: jax.grad(lambda v, x: jnp.sum(w * apply(fused, v, x)[0]), argnums=(0, 1))(
        variables, x
    )
    for got, want in zip(jax.tree.leaves(grad(True)), jax.tree.leaves(grad(False))):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_stem_pools_inside_its_norm_off_tpus_and_after_it_on_tpus():
  """Lowered for each platform (no TPU or GPU needed): the training-mode norm with max_pool
  differentiates through select-and-scatter on TPUs and through group_normalise_pool's
  backward (strided pads, no select-and-scatter) on GPUs."""
  norm = GroupBatchNorm(num_groups=2, relu=True, max_pool=True)
  x = jnp.zeros((4, 8, 8, 3), jnp.float32)
  variables = norm.init(_key(0), x, False)

  def loss(params, x):
    y, _ = norm.apply({**variables, 'params': params}, x, False, mutable=['batch_stats'])
    return jnp.sum(y**2)

  grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
  tpu = grad.trace(variables['params'], x).lower(lowering_platforms=('tpu',)).as_text()
  cuda = grad.trace(variables['params'], x).lower(lowering_platforms=('cuda',)).as_text()
  assert 'select_and_scatter' in tpu
  assert 'select_and_scatter' not in cuda and cuda.count('stablehlo.pad') >= 9


@pytest.mark.parametrize('offset', [0.0, 3.0])
def test_one_pass_statistics_of_bfloat16_inputs_with_a_large_mean(offset):
  """bfloat16 inputs whose mean (300) dwarfs their spread (2): the one-pass statistics,
  shifted by a per-channel guess of the mean `offset` spreads away from it (the running
  mean's lag), against float64 NumPy mean and biased variance of the same bfloat16 values:
  relative error at most 1e-4."""
  rng = np.random.default_rng(11)
  x = jnp.asarray(rng.normal(size=(32, 8, 8, 16)) * 2 + 300, jnp.bfloat16)
  x64 = np.asarray(x.astype(jnp.float32), np.float64).reshape(4, 8 * 8 * 8, 16)
  shift = jnp.full(16, 300 + 2 * offset, jnp.float32)
  ones, zeros = jnp.ones(16, jnp.float32), jnp.zeros(16, jnp.float32)
  _, mean, var = jax.jit(
      lambda x: group_normalise(x, None, ones, zeros, shift, 4, 1e-5, jnp.dtype(jnp.bfloat16), True)
  )(x)
  np.testing.assert_allclose(mean, x64.mean(axis=1), rtol=1e-4)
  np.testing.assert_allclose(var, x64.var(axis=1), rtol=1e-4)


def test_group_sums_are_plain_reductions_on_tpus_and_one_variadic_elsewhere():
  """The statistics' and the backward's two sums (batchnorm._sums), lowered for each platform
  (no TPU or GPU needed): two plain reductions on TPUs, whose compiler fuses them; one
  two-operand reduction on GPUs and CPUs. Both forms give the same sums (run here on CPU)."""
  x = jax.ShapeDtypeStruct((4, 6, 6, 8), jnp.float32)
  c = jax.ShapeDtypeStruct((8,), jnp.float32)

  def loss(x, scale, bias, shift):
    y = group_normalise(x, None, scale, bias, shift, 2, 1e-5, jnp.dtype(jnp.float32), True)[0]
    return jnp.sum(y**2)

  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  variadic = re.compile(r':2 = stablehlo\.reduce\(')
  tpu = step.trace(x, c, c, c).lower(lowering_platforms=('tpu',)).as_text()
  cuda = step.trace(x, c, c, c).lower(lowering_platforms=('cuda',)).as_text()
  assert not variadic.search(tpu) and 'stablehlo.reduce' in tpu
  assert len(variadic.findall(cuda)) == 2  # the forward's statistics and the backward's sums
  rng = np.random.default_rng(3)
  a, b = (jnp.asarray(rng.normal(size=(2, 3, 5, 5, 4)), jnp.float32) for _ in range(2))
  axes = (1, 2, 3)
  for got, want in zip(batchnorm._plain_sums(a, b, axes), batchnorm._variadic_sums(a, b, axes)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      batchnorm._plain_sums(a, b, axes)[1],
      np.asarray(b, np.float64).sum(axis=axes, keepdims=True),
      rtol=1e-5,
      atol=1e-5,
  )


@pytest.mark.parametrize('groups', [1, 8])
@pytest.mark.slow
def test_group_normalise_gradients_on_8_devices_equal_one_device(groups):
  """The batch sharded over 8 devices (one group per device, or one group over all of them)
  gives the one-device output, statistics and gradients."""
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Explicit,))
  x, scale, bias, w, a, b = _bn_problem(10, (16, 3, 3, 4), groups)
  one = _jax_bn_gradients(x, scale, bias, w, a, b, groups)
  spec = jax.sharding.PartitionSpec('data')
  xs, ws = (jax.device_put(v, jax.sharding.NamedSharding(mesh, spec)) for v in (x, w))
  with jax.set_mesh(mesh):
    many = jax.jit(_jax_bn_gradients, static_argnums=6)(xs, scale, bias, ws, a, b, groups)
  assert many[0].sharding.spec[0] == 'data'
  for got, want in zip(many, one):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('groups', [1, 8])
@pytest.mark.slow
def test_group_normalise_pool_on_8_devices_equals_one_device(groups):
  """The stem's norm, ReLU and max-pool with the batch sharded over 8 devices gives the
  one-device output, statistics and gradients."""
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Explicit,))
  x, scale, bias, w, a, b = _pool_problem(19, (16, 6, 6, 4), groups, 0)
  shift = jnp.zeros(4, jnp.float32)
  ours = lambda x, s, b: batchnorm.group_normalise_pool(
      x, s, b, shift, groups, 1e-5, jnp.dtype(jnp.float32)
  )
  run = jax.jit(functools.partial(_pool_gradients, ours))
  one = run(x, scale, bias, w, a, b)
  data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  xs, ws = (jax.device_put(v, data) for v in (x, w))
  with jax.set_mesh(mesh):
    many = run(xs, scale, bias, ws, a, b)
  assert many[0].sharding.spec[0] == 'data'
  for got, want in zip(many, one):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_relu_forward_and_gradient_equal_jax_nn_relu():
  """The output-only ReLU: same values and gradient as jax.nn.relu, zeros and signs included."""
  x = jnp.asarray([[-2.0, -0.0, 0.0, 1e-30, 3.0], [5.0, -1e-30, 0.5, -7.0, 2.0]], jnp.float32)
  g = jnp.arange(10, dtype=jnp.float32).reshape(2, 5) + 1
  for dtype in (jnp.float32, jnp.bfloat16):
    xd, gd = x.astype(dtype), g.astype(dtype)
    np.testing.assert_array_equal(relu(xd), jax.nn.relu(xd))
    ours = jax.vjp(relu, xd)[1](gd)[0]
    theirs = jax.vjp(jax.nn.relu, xd)[1](gd)[0]
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.asarray(ours, np.float32)[0], [0, 0, 0, 4, 5])


def test_group_batchnorm_rejects_indivisible_batch():
  x = np.zeros((6, 3), np.float32)
  with pytest.raises(ValueError, match=r'batch size 6 .*num_groups 4'):
    GroupBatchNorm(num_groups=4).init(_key(0), x, use_running_average=False)


# ---------------------------------------------------------------- ResNet


def _shapes(module, size, batch=2):
  def forward(x):
    variables = module.init(_key(0), x, train=False)
    return module.apply(variables, x, train=True, mutable=['batch_stats'])[0], variables

  return jax.eval_shape(forward, jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32))


# ResNet-10 is ResNet-18 less the second basic block of each stage: two 3x3 convs c -> c and
# two BNs (scale and bias) per block, c = 64, 128, 256, 512, i.e.
# 11,176,512 - sum(2 * 9 * c^2 + 4 * c) = 11,176,512 - 6,270,720.
@pytest.mark.parametrize(
    'module, expected',
    [(ResNet50(), 23_508_032), (ResNet18(), 11_176_512), (ResNet(depth=10), 4_905_792)],
)
@pytest.mark.slow
def test_parameter_count_matches_torchvision(module, expected):
  """torchvision resnet50 / resnet18 parameter counts without the 1000-way fc layer, and
  ResNet-10's by hand from ResNet-18's."""
  _, variables = _shapes(module, 32, batch=1)
  assert _param_count(variables['params']) == expected


@pytest.mark.parametrize(
    'depth, stem, width, size, hw, channels',
    [
        (18, 'cifar', 0.125, 32, 4, 64),
        (10, 'cifar', 0.125, 32, 4, 64),
        (18, 'imagenet', 0.25, 32, 1, 128),
        (50, 'cifar', 0.25, 32, 4, 512),
        (50, 'imagenet', 0.125, 32, 1, 256),
        (18, 'imagenet', 0.125, 64, 2, 64),
        (50, 'imagenet', 0.125, 64, 2, 256),
    ],
)
def test_resnet_output_shapes(depth, stem, width, size, hw, channels):
  module = ResNet(depth=depth, stem=stem, width_multiplier=width)
  out, _ = _shapes(module, size)
  assert out['pooled'].shape == (2, channels) and out['pooled'].dtype == jnp.float32
  assert out['feature_map'].shape == (2, hw, hw, channels)
  assert module.feature_dim == resnet_feature_dim(depth, width) == channels


@pytest.mark.slow
def test_resnet_float32_and_bfloat16_forward():
  """One set of float32 parameters runs in both dtypes; bf16 stays close to float32."""
  x = jax.random.normal(_key(1), (4, 32, 32, 3))
  f32 = ResNet(depth=18, stem='cifar', width_multiplier=0.25)
  bf16 = f32.clone(dtype=jnp.bfloat16)
  variables, out_f32 = jax.jit(lambda inp: _init_and_train_step(f32, inp))(x)

  # Kaiming-normal fan_out init: std = sqrt(2 / (3 * 3 * 128)) for a 3x3 conv with 128 outputs.
  kernel = variables['params']['stage4_block2']['conv1']['kernel']
  assert kernel.shape == (3, 3, 128, 128) and kernel.dtype == jnp.float32
  np.testing.assert_allclose(np.std(kernel), np.sqrt(2 / (9 * 128)), rtol=0.03)
  np.testing.assert_array_equal(variables['params']['stage4_block2']['bn2']['scale'], 0.0)

  out_bf16, _ = jax.jit(lambda v, inp: bf16.apply(v, inp, train=True, mutable=['batch_stats']))(
      variables, x
  )
  outs = {'f32': out_f32, 'bf16': out_bf16}
  assert outs['bf16']['feature_map'].dtype == jnp.bfloat16
  for out in outs.values():
    assert out['pooled'].dtype == jnp.float32
    np.testing.assert_allclose(
        out['pooled'],
        np.asarray(out['feature_map'], np.float32).mean(axis=(1, 2)),
        rtol=1e-5,
        atol=1e-6,
    )
  assert np.all(np.asarray(outs['f32']['pooled']) >= 0)
  np.testing.assert_allclose(outs['bf16']['pooled'], outs['f32']['pooled'], atol=3e-2)


@pytest.mark.parametrize('kind, planes, in_channels', [('basic', 8, 8), ('bottleneck', 4, 16)])
@pytest.mark.slow
def test_zero_init_residual_block_starts_as_identity(kind, planes, in_channels):
  """With the last BN scale at zero, relu(0 + x) = x for a non-negative input."""
  x = jax.nn.relu(jax.random.normal(_key(2), (4, 6, 6, in_channels)))
  outputs = {}
  for zero_init in (True, False):
    block = ResidualBlock(
        kind=kind,
        planes=planes,
        stride=1,
        bn_groups=2,
        zero_init_residual=zero_init,
        dtype=jnp.float32,
    )
    variables = jax.jit(functools.partial(block.init, train=False))(_key(0), x)
    outputs[zero_init], _ = jax.jit(
        functools.partial(block.apply, train=True, mutable=['batch_stats'])
    )(variables, x)
  np.testing.assert_allclose(outputs[True], x, rtol=1e-6, atol=1e-6)
  assert np.abs(np.asarray(outputs[False]) - np.asarray(x)).max() > 1e-2


@pytest.mark.parametrize(
    'kwargs, message',
    [
        ({'depth': 34}, 'depth must be one of'),
        ({'depth': 18, 'stem': 'tiny'}, 'stem must be one of'),
        ({'depth': 50, 'width_multiplier': 0.1}, 'width_multiplier'),
    ],
)
def test_resnet_rejects_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    ResNet(**kwargs)


# ---------------------------------------------------------------- heads


def test_l2_normalize_matches_numpy():
  x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-3, -2e-3]], np.float32)
  expected = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  np.testing.assert_allclose(l2_normalize(jnp.asarray(x)), expected, rtol=1e-6)
  np.testing.assert_allclose(
      l2_normalize(jnp.asarray(x), axis=0), x / np.linalg.norm(x, axis=0, keepdims=True), rtol=1e-6
  )


@pytest.mark.parametrize('num_layers, use_bn', [(1, False), (2, False), (2, True), (3, False)])
def test_mlp_head_matches_numpy(num_layers, use_bn):
  x = np.random.default_rng(5).normal(size=(4, 6)).astype(np.float32)
  head = MLPHead(hidden_dim=5, out_dim=3, num_layers=num_layers, use_bn=use_bn)
  variables = head.init(_key(0), x, train=False)
  params = variables['params']
  y, _ = head.apply(variables, x, train=True, mutable=['batch_stats'])
  h = x.astype(np.float64)
  for layer in range(1, num_layers):
    h = h @ params[f'hidden{layer}']['kernel'] + params[f'hidden{layer}']['bias']
    if use_bn:
      h = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-5)
    h = np.maximum(h, 0)
  expected = h @ params['out']['kernel'] + params['out']['bias']
  assert y.dtype == jnp.float32 and y.shape == (4, 3)
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
  assert ('bn1' in params) == use_bn
  assert len(params) == num_layers + use_bn


def test_mlp_head_rejects_bad_sizes():
  with pytest.raises(ValueError, match='num_layers must be a positive integer'):
    MLPHead(hidden_dim=8, out_dim=4, num_layers=0)


# ---------------------------------------------------------------- encoder


def _model_config(**overrides):
  fields = dict(
      depth=18,
      stem='cifar',
      width_multiplier=0.125,
      head_hidden_dim=32,
      head_out_dim=16,
      head_layers=2,
      head_bn=False,
      head_out_bn=False,
      predictor_hidden_dim=0,
      dtype='bfloat16',
      bn_groups=2,
  )
  return ml_collections.ConfigDict({**fields, **overrides})


def test_build_encoder_maps_config_to_modules():
  encoder = build_encoder(_model_config(depth=50, stem='imagenet', head_layers=1))
  assert (encoder.backbone.depth, encoder.backbone.stem) == (50, 'imagenet')
  assert encoder.backbone.dtype == jnp.bfloat16 and encoder.backbone.bn_groups == 2
  assert (encoder.head.out_dim, encoder.head.num_layers) == (16, 1)


@pytest.mark.slow
def test_encoder_outputs_normalised_projection_of_pooled_features():
  # float32: the bfloat16 forward pass is covered above and compiles twice as slowly on CPU.
  encoder = build_encoder(_model_config(dtype='float32'))
  x = jax.random.normal(_key(3), (4, 16, 16, 3))
  variables, out = jax.jit(lambda inp: _init_and_train_step(encoder, inp))(x)
  assert out['pooled'].shape == (4, 64) and out['pooled'].dtype == jnp.float32
  assert out['feature_map'].shape == (4, 2, 2, 64)
  assert out['z'].shape == (4, 16) and out['z'].dtype == jnp.float32
  np.testing.assert_allclose(np.linalg.norm(out['z'], axis=-1), 1.0, rtol=1e-5)

  head = variables['params']['head']
  h = np.maximum(
      np.asarray(out['pooled'], np.float64) @ head['hidden1']['kernel'] + head['hidden1']['bias'], 0
  )
  g = h @ head['out']['kernel'] + head['out']['bias']
  np.testing.assert_allclose(
      out['z'], g / np.linalg.norm(g, axis=-1, keepdims=True), rtol=1e-4, atol=1e-5
  )


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'depth': 34}, r'model.depth must be one of \(10, 18, 50\), got 34'),
        ({'stem': 'tiny'}, 'model.stem'),
        ({'width_multiplier': 0.1}, 'model.width_multiplier'),
        ({'dtype': 'float16'}, 'model.dtype'),
        ({'head_layers': 0}, 'model.head_layers'),
        ({'head_out_dim': 2.5}, 'model.head_out_dim'),
        ({'bn_groups': 0}, 'model.bn_groups'),
    ],
)
def test_build_encoder_names_the_bad_field(overrides, message):
  with pytest.raises(ValueError, match=message):
    build_encoder(_model_config(**overrides))


def test_build_encoder_reports_missing_field():
  cfg = _model_config()
  del cfg['bn_groups']
  with pytest.raises(ValueError, match='bn_groups'):
    build_encoder(cfg)


def _dense_chain(head_params, names, x):
  """NumPy forward of a BN-free stack of dense layers with ReLU between them."""
  for i, name in enumerate(names):
    x = x @ np.asarray(head_params[name]['kernel']) + np.asarray(head_params[name]['bias'])
    if i < len(names) - 1:
      x = np.maximum(x, 0.0)
  return x


@pytest.mark.slow
def test_predictor_maps_the_unnormalised_projection():
  """p = q(g(f(x))) on the raw projection: recomputed in NumPy from the pooled features
  (eval-mode BN with fresh running statistics is x / sqrt(1 + eps))."""
  encoder = build_encoder(_model_config(dtype='float32', predictor_hidden_dim=8))
  x = jax.random.normal(jax.random.key(0), (4, 16, 16, 3))
  variables = jax.jit(functools.partial(encoder.init, train=False))(_key(1), x)
  out = jax.jit(functools.partial(encoder.apply, train=False, predict=True))(variables, x)
  params = variables['params']
  proj = _dense_chain(params['head'], ['hidden1', 'out'], np.asarray(out['pooled']))
  np.testing.assert_allclose(
      np.asarray(out['z']), proj / np.linalg.norm(proj, axis=1, keepdims=True), rtol=1e-4, atol=1e-6
  )
  pred = params['predictor']
  h = proj @ np.asarray(pred['hidden1']['kernel']) + np.asarray(pred['hidden1']['bias'])
  bn = pred['bn1']
  h = h / np.sqrt(1.0 + 1e-5) * np.asarray(bn['scale']) + np.asarray(bn['bias'])
  p = np.maximum(h, 0.0) @ np.asarray(pred['out']['kernel']) + np.asarray(pred['out']['bias'])
  np.testing.assert_allclose(np.asarray(out['p']), p, rtol=1e-4, atol=1e-5)
  assert 'p' not in jax.eval_shape(functools.partial(encoder.apply, train=False), variables, x)


def test_predict_without_predictor_is_an_error():
  # Shapes only: the error is raised while the forward is traced.
  encoder = build_encoder(_model_config(dtype='float32'))
  x = jnp.zeros((2, 16, 16, 3))
  variables = jax.eval_shape(lambda: encoder.init(jax.random.key(0), x, train=False))
  with pytest.raises(ValueError, match='predictor_hidden_dim'):
    jax.eval_shape(lambda v: encoder.apply(v, x, train=False, predict=True), variables)


@pytest.mark.slow
def test_simsiam_projector_has_bn_after_every_layer():
  head = MLPHead(hidden_dim=8, out_dim=6, num_layers=3, use_bn=True, out_bn=True)
  variables = jax.jit(functools.partial(head.init, train=True))(jax.random.key(0), jnp.ones((4, 5)))
  assert sorted(variables['params']) == ['bn1', 'bn2', 'hidden1', 'hidden2', 'out', 'out_bn']
  y, _ = jax.jit(functools.partial(head.apply, train=True, mutable=['batch_stats']))(
      variables, jax.random.normal(jax.random.key(1), (16, 5))
  )
  # Train-mode BN with unit scale and zero bias: every output channel has mean 0, var 1.
  np.testing.assert_allclose(np.asarray(y).mean(0), 0.0, atol=1e-5)
  np.testing.assert_allclose(np.asarray(y).var(0), 1.0, rtol=1e-3)


def test_l2_normalize_has_a_finite_gradient_at_zero():
  # A zero cotangent through a zero vector must stay zero (jnp.where branches).
  grad = jax.grad(lambda x: jnp.where(False, l2_normalize(x).sum(), 0.0))(jnp.zeros((2, 3)))
  np.testing.assert_array_equal(grad, 0.0)
  np.testing.assert_allclose(l2_normalize(jnp.array([[3.0, 4.0]])), [[0.6, 0.8]], rtol=1e-7)
