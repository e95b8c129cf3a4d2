"""The stem's max-pool (cl_jax.models.pooling) against flax's nn.max_pool and its autodiff
(XLA's select-and-scatter)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.models import pooling
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


def test_the_backward_keeps_each_windows_first_maximum_as_an_int8_offset():
  """The residual of the forward off TPUs: per window, the row-major offset 3 di + dj of its
  first maximum, against a NumPy loop over the windows (ties from 3 levels; padding never
  wins, every window holding at least one element)."""
  rng = np.random.default_rng(2)
  x = rng.integers(0, 3, (2, 7, 8, 3)).astype(np.float32)
  y, (first, _) = pooling._forward(jnp.asarray(x))  # pylint: disable=protected-access
  assert first.dtype == jnp.int8 and first.shape == y.shape == (2, 4, 4, 3)
  padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
  expected = np.zeros(first.shape, np.int8)
  for b, i, j, c in np.ndindex(*first.shape):
    window = padded[b, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3, c].reshape(-1)
    expected[b, i, j, c] = int(np.argmax(window))  # np.argmax: the first maximum
  np.testing.assert_array_equal(first, expected)
  np.testing.assert_array_equal(y, _flax(jnp.asarray(x)))
