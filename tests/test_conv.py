"""cl_jax.models.conv against flax's nn.Conv and a per-device NumPy sum of weight gradients."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.models import conv
from cl_jax.models.encoder import build_encoder
from cl_jax.models.resnet import conv_init
from cl_jax.runtime import parallel
from configs import mocov2_patchns

PADDING = ((1, 1), (1, 1))


def _modules(dtype, mesh=None):
  ours = conv.Conv(6, (3, 3), (2, 2), PADDING, dtype=dtype, kernel_init=conv_init, grad_mesh=mesh)
  flax = nn.Conv(
      6,
      (3, 3),
      strides=(2, 2),
      padding=PADDING,
      use_bias=False,
      dtype=dtype,
      param_dtype=jnp.float32,
      kernel_init=conv_init,
  )
  return ours, flax


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_forward_and_parameters_are_flax_convs(dtype):
  """The same kernel from the same key, the same output bit for bit."""
  x = jax.random.normal(jax.random.key(0), (4, 9, 9, 5))
  ours, flax = _modules(dtype)
  params = ours.init(jax.random.key(1), x)
  want = flax.init(jax.random.key(1), x)
  np.testing.assert_array_equal(params["params"]["kernel"], want["params"]["kernel"])
  got = ours.apply(params, x)
  assert got.dtype == dtype
  np.testing.assert_array_equal(
      np.asarray(got, np.float32), np.asarray(flax.apply(want, x), np.float32)
  )


def test_bfloat16_weight_gradient_is_the_float32_sum_of_the_devices_gradients():
  """On 8 devices, each holding 2 of the 16 images: the kernel gradient is the float32 sum
  of the 8 per-device bfloat16 weight gradients (each computed here on its own device's
  images, cast to float32, summed in float64), not 8 times it; the input gradient is
  autodiff's."""
  mesh = parallel.make_mesh(jax.devices()[:8])
  x = jax.random.normal(jax.random.key(0), (16, 9, 9, 5)).astype(jnp.bfloat16)
  cotangent = jax.random.normal(jax.random.key(2), (16, 5, 5, 6)).astype(jnp.bfloat16)
  ours, flax = _modules(jnp.bfloat16, mesh)
  params = ours.init(jax.random.key(1), x)
  kernel = params["params"]["kernel"]

  def loss(module, kernel, x):
    out = module.apply({"params": {"kernel": kernel}}, x)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32))

  sharded = jax.device_put(x, parallel.batch_sharding(mesh))
  grad_kernel, grad_x = jax.jit(jax.grad(loss, argnums=(1, 2)), static_argnums=0)(
      ours, kernel, sharded
  )
  assert grad_kernel.dtype == jnp.float32

  def device_grad(x_shard, g_shard):
    out, vjp = jax.vjp(lambda w: conv.convolve(x_shard, w, (2, 2), PADDING), kernel.astype(x.dtype))
    assert out.dtype == jnp.bfloat16
    # Cast as the step casts it (a CPU may skip the rounding to bfloat16 in both).
    return vjp(g_shard)[0].astype(jnp.float32)

  shards = [
      np.asarray(jax.jit(device_grad)(x[2 * i : 2 * i + 2], cotangent[2 * i : 2 * i + 2]))
      for i in range(8)
  ]
  want = np.sum([s.astype(np.float64) for s in shards], axis=0)
  np.testing.assert_allclose(np.asarray(grad_kernel, np.float64), want, rtol=1e-5, atol=1e-5)
  # A bfloat16 sum of the same gradients is further away: the float32 sum is not bf16-rounded.
  rounded = np.asarray(jnp.asarray(want).astype(jnp.bfloat16), np.float64)
  assert np.abs(rounded - want).max() > 10 * np.abs(np.asarray(grad_kernel) - want).max()

  _, want_x = jax.grad(loss, argnums=(1, 2))(flax, kernel, x)
  np.testing.assert_array_equal(np.asarray(grad_x, np.float32), np.asarray(want_x, np.float32))


def test_float32_convolution_takes_autodiff_even_with_a_mesh():
  """A float32 network has no rounding to avoid: its gradient is autodiff's, and its program
  has no shard_map of its own (the same HLO as nn.Conv's)."""
  mesh = parallel.make_mesh(jax.devices()[:2])
  x = jax.random.normal(jax.random.key(0), (4, 9, 9, 5))
  ours, flax = _modules(jnp.float32, mesh)
  params = ours.init(jax.random.key(1), x)

  def loss(module, params):
    return jnp.sum(module.apply(params, x) ** 2)

  grad = jax.grad(loss, argnums=1)
  assert jax.jit(grad, static_argnums=0).lower(ours, params).as_text().replace(
      "jit_grad", ""
  ) == jax.jit(grad, static_argnums=0).lower(flax, params).as_text().replace("jit_grad", "")


def test_the_training_encoder_reduces_in_the_configured_dtype():
  """build_encoder with the training mesh: float32 reduction gives every convolution the mesh
  (bfloat16 reduction and evaluation encoders none); a bad dtype is named."""
  mesh = parallel.make_mesh(jax.devices()[:2])
  model = mocov2_patchns.get_config(None).model
  model.dtype = "bfloat16"
  assert build_encoder(model, mesh=mesh).backbone.grad_mesh is mesh
  assert build_encoder(model).backbone.grad_mesh is None
  model.grad_reduce_dtype = "bfloat16"
  assert build_encoder(model, mesh=mesh).backbone.grad_mesh is None
  model.grad_reduce_dtype = "float16"
  with pytest.raises(ValueError, match="model.grad_reduce_dtype must be 'float32' or 'bfloat16'"):
    build_encoder(model, mesh=mesh)
