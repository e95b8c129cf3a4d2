"""2-D convolution whose weight gradient is summed across devices in float32.

Mixed precision keeps the parameters in float32 and computes in bfloat16. Through autodiff,
a bfloat16 convolution's weight gradient is bfloat16, and with the batch sharded over devices
XLA sums the devices' partial weight gradients in bfloat16, before the cast back to the
float32 parameter: the rounding of that sum grows with the number of devices. Mixed-precision
training as the reference PyTorch code runs it (autocast with DDP) casts each device's weight
gradient to float32 and sums in float32. ``Conv`` with a ``grad_mesh`` does the same: its
backward computes the weight gradient of each device's own batch shard (the same bfloat16
convolution), casts it to float32 and sums it over the mesh's data axis (``lax.psum`` in
``shard_map``); the input gradient is autodiff's. Without a mesh, or in float32, it is the
convolution of flax's ``nn.Conv`` (the same HLO), differentiated by autodiff.

Written here because ``nn.Conv`` casts its kernel to the computation dtype before the
convolution: the float32 sum cannot be reached from outside it.
"""

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cl_jax.runtime.parallel import DATA_AXIS

Padding = tuple[tuple[int, int], tuple[int, int]]


def convolve(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding):
  """(B, H, W, C_in) x (kh, kw, C_in, C_out) -> (B, H', W', C_out): ``nn.Conv``'s
  convolution, in the dtype of x and kernel."""
  return jax.lax.conv_general_dilated(
      x, kernel, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def convolve_f32_weight_grad(
    x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding, mesh: Mesh
) -> jax.Array:
  """convolve(x, kernel cast to x's dtype); the kernel's gradient is the float32 sum over the
  data axis of `mesh` of each device's weight gradient (x and the output gradient sharded by
  batch over that axis; B a multiple of its size)."""
  return convolve(x, kernel.astype(x.dtype), strides, padding)


def _forward(x, kernel, strides, padding, mesh):
  return convolve_f32_weight_grad(x, kernel, strides, padding, mesh), (x, kernel)


def _backward(strides, padding, mesh, residuals, grad):
  x, kernel = residuals
  weight = kernel.astype(x.dtype)
  _, input_vjp = jax.vjp(lambda v: convolve(v, weight, strides, padding), x)
  (grad_x,) = input_vjp(grad)

  def shard_weight_grad(x_shard, grad_shard, weight):
    # The weight as this device's own copy: the transpose of an invariant (replicated) input
    # would sum the devices' gradients itself, in the computation dtype.
    weight = jax.lax.pcast(weight, DATA_AXIS, to="varying")
    _, weight_vjp = jax.vjp(lambda w: convolve(x_shard, w, strides, padding), weight)
    (grad_w,) = weight_vjp(grad_shard)
    return jax.lax.psum(grad_w.astype(kernel.dtype), DATA_AXIS)

  batch = P(DATA_AXIS)
  grad_kernel = jax.shard_map(
      shard_weight_grad, mesh=mesh, in_specs=(batch, batch, P()), out_specs=P()
  )(x, grad, weight)
  return grad_x, grad_kernel


convolve_f32_weight_grad.defvjp(_forward, _backward)


class Conv(nn.Module):
  """Bias-free 2-D convolution with float32 parameters (flax ``nn.Conv``'s parameter
  ``kernel``, (kh, kw, C_in, C_out), and its computation).

  Attributes:
    features: C_out. kernel_size, strides: (kh, kw), (sh, sw). padding: ((top, bottom),
      (left, right)).
    dtype: computation dtype (the input is cast to it, and the kernel).
    kernel_init: the kernel's initialiser.
    grad_mesh: a mesh whose data axis shards the batch: in bfloat16, the weight gradient is
      then summed across that axis in float32 (convolve_f32_weight_grad). None: autodiff's
      gradient, which XLA sums in the computation dtype.
  """

  features: int
  kernel_size: tuple[int, int]
  strides: tuple[int, int]
  padding: Padding
  dtype: Any
  kernel_init: Callable
  grad_mesh: Mesh | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """(B, H, W, C_in) -> (B, H', W', features) in ``dtype``."""
    shape = (*self.kernel_size, x.shape[-1], self.features)
    kernel = self.param("kernel", self.kernel_init, shape, jnp.float32)
    x = x.astype(self.dtype)
    if self.grad_mesh is None or jnp.dtype(self.dtype) == jnp.float32:
      return convolve(x, kernel.astype(self.dtype), self.strides, self.padding)
    return convolve_f32_weight_grad(x, kernel, self.strides, self.padding, self.grad_mesh)
