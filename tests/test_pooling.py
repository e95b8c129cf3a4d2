"""The stem's max-pool (cl_jax.models.pooling) against flax's nn.max_pool and its autodiff
(XLA's select-and-scatter)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.models.pooling import max_pool_3x3_s2


def _flax(x):
  return nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))


@pytest.mark.parametrize("shape", [(2, 8, 8, 3), (3, 7, 9, 2)])
@pytest.mark.parametrize("levels", [None, 3])
def test_output_and_gradient_equal_select_and_scatter(shape, levels):
  """Forward bit for bit; gradient equal to autodiff's, ties included (levels: values drawn
  from 3 levels, so most windows hold several maxima, each window's gradient going to its
  first one in row-major order); an input that is the maximum of several windows sums
  their gradients."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=shape) if levels is None else rng.integers(0, levels, shape)
  x = jnp.asarray(x, jnp.float32)
  g = jnp.asarray(rng.normal(size=_flax(x).shape), jnp.float32)
  np.testing.assert_array_equal(max_pool_3x3_s2(x), _flax(x))
  ours = jax.vjp(max_pool_3x3_s2, x)[1](g)[0]
  theirs = jax.vjp(_flax, x)[1](g)[0]
  np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
  # Every window's gradient lands once: the totals agree.
  np.testing.assert_allclose(jnp.sum(ours), jnp.sum(g), rtol=1e-5)


def test_bfloat16_gradient_within_rounding():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(2, 16, 16, 4)), jnp.bfloat16)
  g = jnp.asarray(rng.normal(size=(2, 8, 8, 4)), jnp.bfloat16)
  ours = jax.vjp(max_pool_3x3_s2, x)[1](g)[0]
  theirs = jax.vjp(_flax, x)[1](g)[0]
  assert ours.dtype == jnp.bfloat16
  np.testing.assert_allclose(
      np.asarray(ours, np.float32), np.asarray(theirs, np.float32), rtol=1e-2, atol=1e-2
  )


def test_gradient_is_select_and_scatter_on_tpus_and_the_summed_one_elsewhere():
  """Lowered for each platform (no TPU or GPU needed): autodiff's select-and-scatter on TPUs,
  which their compiler runs natively; the sum over window offsets (strided pads) on GPUs.
  test_output_and_gradient_equal_select_and_scatter checks that the two gradients agree."""
  x = jax.ShapeDtypeStruct((2, 8, 8, 3), jnp.float32)
  grad = jax.jit(jax.grad(lambda x: jnp.sum(max_pool_3x3_s2(x) ** 2)))
  tpu = grad.trace(x).lower(lowering_platforms=("tpu",)).as_text()
  cuda = grad.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "select_and_scatter" in tpu and "stablehlo.pad" not in tpu
  assert "select_and_scatter" not in cuda and cuda.count("stablehlo.pad") >= 9
