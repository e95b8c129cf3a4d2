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


def _strided_conv64(x, kernel, pad):
  """NumPy float64: sum_{t_h, t_w} xpad[b, 2i + t_h, 2j + t_w] kernel[t_h, t_w] (x zero-padded
  by pad on each side), and the function giving the kernel's gradient for an output gradient."""
  x = np.pad(np.asarray(x, np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  kernel = np.asarray(kernel, np.float64)
  kh, kw = kernel.shape[:2]
  ho, wo = (x.shape[1] - kh) // 2 + 1, (x.shape[2] - kw) // 2 + 1
  window = lambda th, tw: x[:, th : th + 2 * ho - 1 : 2, tw : tw + 2 * wo - 1 : 2]
  out = sum(
      np.einsum("bijc,co->bijo", window(th, tw), kernel[th, tw])
      for th in range(kh)
      for tw in range(kw)
  )
  kernel_grad = lambda g: np.stack([
      np.stack([np.einsum("bijc,bijo->co", window(th, tw), g) for tw in range(kw)])
      for th in range(kh)
  ])  # fmt: skip
  return out, kernel_grad


@pytest.mark.parametrize(
    "height, width, kernel, pad, channels",
    [(32, 32, 7, 3, 3), (33, 30, 7, 3, 3), (17, 17, 7, 3, 3), (16, 18, 3, 1, 5), (20, 20, 5, 2, 2)],
)
def test_space_to_depth_form_is_the_strided_convolution(height, width, kernel, pad, channels):
  """Conv(space_to_depth=True), stride 2, in float32: its output and kernel gradient equal a
  float64 NumPy strided convolution's, even and odd image sides, to float32 rounding; its
  parameter is the direct convolution's ((k, k, C, O), the same initial values)."""
  x = jax.random.normal(jax.random.key(0), (2, height, width, channels))
  padding = ((pad, pad), (pad, pad))
  module = conv.Conv(4, (kernel, kernel), (2, 2), padding, jnp.float32, conv_init)
  stacked = conv.Conv(
      4, (kernel, kernel), (2, 2), padding, jnp.float32, conv_init, space_to_depth=True
  )
  params = stacked.init(jax.random.key(1), x)
  assert params["params"]["kernel"].shape == (kernel, kernel, channels, 4)
  np.testing.assert_array_equal(
      params["params"]["kernel"], module.init(jax.random.key(1), x)["params"]["kernel"]
  )
  want, kernel_grad = _strided_conv64(x, params["params"]["kernel"], pad)
  got, vjp = jax.vjp(lambda p: stacked.apply(p, x), params)
  assert got.shape == want.shape
  scale = np.abs(want).max()
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=2e-6 * scale)
  g = jax.random.normal(jax.random.key(2), got.shape)
  (grads,) = vjp(g)
  want_grad = kernel_grad(np.asarray(g, np.float64))
  np.testing.assert_allclose(
      np.asarray(grads["params"]["kernel"], np.float64),
      want_grad,
      rtol=0,
      atol=2e-6 * np.abs(want_grad).max(),
  )


def test_space_to_depth_stacks_blocks_and_places_the_taps_by_hand():
  """The stem's form by hand: image pixel (2i + q_h, 2j + q_w, c) is stacked channel
  (q_h, q_w, c) of block (i, j), 12 channels padded to 16 with zeros; the 7x7 kernel's tap t
  lands at block tap m = floor((t - 3) / 2) + 2, phase q = (t - 3) mod 2 (4 taps, the first
  phase-0 tap zero), padding 2 before and 1 after."""
  x = jnp.arange(2 * 4 * 6 * 3, dtype=jnp.float32).reshape(2, 4, 6, 3)
  s = conv.space_to_depth(x)
  assert s.shape == (2, 2, 3, 16)
  assert s[1, 1, 2, (1 * 2 + 0) * 3 + 2] == x[1, 3, 4, 2]
  assert s[0, 0, 1, (0 * 2 + 1) * 3 + 0] == x[0, 0, 3, 0]
  assert not np.any(s[..., 12:])
  padded = conv.space_to_depth(x, ((2, 1), (2, 1)))
  assert padded.shape == (2, 5, 6, 16)
  np.testing.assert_array_equal(padded[:, 2:4, 2:5], s)
  assert not np.any(padded[:, :2]) and not np.any(padded[:, 4:]) and not np.any(padded[:, :, 5:])
  k = jnp.arange(7 * 7 * 3 * 2, dtype=jnp.float32).reshape(7, 7, 3, 2) + 1
  stacked, padding = conv.space_to_depth_kernel(k, ((3, 3), (3, 3)))
  assert stacked.shape == (4, 4, 16, 2) and padding == ((2, 1), (2, 1))
  for th in range(7):
    for tw in range(7):
      (mh, qh), (mw, qw) = divmod(th - 3, 2), divmod(tw - 3, 2)
      np.testing.assert_array_equal(
          stacked[mh + 2, mw + 2, (qh * 2 + qw) * 3 : (qh * 2 + qw + 1) * 3], k[th, tw]
      )
  assert np.count_nonzero(stacked) == k.size  # every other entry is zero


def test_space_to_depth_bfloat16_weight_gradient_over_devices():
  """With a mesh of 8 devices in bfloat16, the stacked form's kernel gradient (the float32
  sum of the devices' gradients, mapped back to the (k, k, C, O) kernel) is the float64
  strided convolution's to bfloat16 rounding."""
  mesh = parallel.make_mesh(jax.devices()[:8])
  x = jax.random.normal(jax.random.key(0), (16, 12, 12, 3)).astype(jnp.bfloat16)
  stacked = conv.Conv(
      6, (7, 7), (2, 2), ((3, 3), (3, 3)), jnp.bfloat16, conv_init, grad_mesh=mesh,
      space_to_depth=True,
  )  # fmt: skip
  kernel = stacked.init(jax.random.key(1), x)["params"]["kernel"]
  g = jax.random.normal(jax.random.key(2), (16, 6, 6, 6)).astype(jnp.bfloat16)

  def loss(kernel, x):
    out = stacked.apply({"params": {"kernel": kernel}}, x)
    return jnp.sum(out.astype(jnp.float32) * g.astype(jnp.float32))

  got = jax.jit(jax.grad(loss))(kernel, jax.device_put(x, parallel.batch_sharding(mesh)))
  assert got.dtype == jnp.float32 and got.shape == kernel.shape
  _, kernel_grad = _strided_conv64(x.astype(jnp.float32), kernel.astype(jnp.bfloat16), 3)
  want = kernel_grad(np.asarray(g, np.float64))
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-2 * np.abs(want).max())
