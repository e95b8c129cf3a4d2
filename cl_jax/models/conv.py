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

A stride-2 convolution on few input channels (the ImageNet stem: 7x7 on 3 channels) can run
as its space-to-depth form (``Conv(space_to_depth=True)``): the same sum of products as a
stride-1 convolution of the image's 2x2 blocks stacked as channels (``space_to_depth``) with
the kernel rearranged to match (``space_to_depth_kernel``), its input channels padded to a
multiple of 8 with zeros. The parameter keeps its (kh, kw, C_in, C_out) shape; only the
order of the float32 accumulation differs. GPUs run the direct form of the stem without tensor
cores (3 channels) after padding the image in a kernel of their own; the stacked form is an
ordinary tensor-core convolution (4x4 on 16 channels for the stem), as TPUs' ResNets use it.
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


_CHANNEL_MULTIPLE = 8  # the stacked channels are padded to a multiple of this


def _stacked_taps(kernel: int, pad: int) -> tuple[int, int, int]:
  """(taps, left padding, offset) of a stride-2 convolution's space-to-depth form along one
  axis: with j = t - pad for the kernel's taps t = 0 .. kernel - 1 and block offsets
  m = floor(j / 2) in [m_lo, m_hi], the form has m_hi - m_lo + 1 taps, pads -m_lo blocks before
  (m_hi after) and holds tap t at index t + offset of the zero-padded 2 * taps-long axis, with
  offset = -pad - 2 m_lo (0 or 1)."""
  m_lo, m_hi = -((pad + 1) // 2), (kernel - 1 - pad) // 2
  return m_hi - m_lo + 1, -m_lo, -pad - 2 * m_lo


def space_to_depth(x: jax.Array, padding: Padding = ((0, 0), (0, 0))) -> jax.Array:
  """(B, H, W, C) -> (B, ceil(H/2) + pt + pb, ceil(W/2) + pl + pr, C4), C4 = 4C rounded up to
  a multiple of 8: S[b, pt + i, pl + j, (q_h, q_w, c)] = x[b, 2i + q_h, 2j + q_w, c] (zero
  beyond x's edge), padded by `padding` ((pt, pb), (pl, pr)) blocks of zeros, the padded
  channels zero."""
  b, h, w, c = x.shape
  x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)))
  h, w = x.shape[1] // 2, x.shape[2] // 2
  s = x.reshape(b, h, 2, w, 2, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, 4 * c)
  return jnp.pad(s, ((0, 0), *padding, (0, -4 * c % _CHANNEL_MULTIPLE)))


def space_to_depth_kernel(kernel: jax.Array, padding: Padding) -> tuple[jax.Array, Padding]:
  """The stride-2 convolution with `kernel` (kh, kw, C, O) and `padding` ((p, p), (p, p)) as a
  stride-1 convolution of space_to_depth(x): (kernel' (th, tw, C4, O), its padding), with
  kernel'[m_h, m_w, (q_h, q_w, c), o] = kernel[2 (m_h + m_lo) + q_h + p, ..., c, o] where that
  index lies in the kernel, else 0, so that for every output pixel
    sum_{t_h, t_w} x[2i + t_h - p, 2j + t_w - p] kernel[t_h, t_w]
      = sum_{m_h, m_w} S[i + m_h + m_lo, j + m_w + m_lo] kernel'[m_h, m_w]."""
  kh, kw, c, o = kernel.shape
  (ph, ph_end), (pw, pw_end) = padding
  if ph != ph_end or pw != pw_end:
    raise ValueError(f"space_to_depth needs symmetric padding, got {padding}")
  (th, lh, oh), (tw, lw, ow) = _stacked_taps(kh, ph), _stacked_taps(kw, pw)
  k = jnp.pad(kernel, ((oh, 2 * th - kh - oh), (ow, 2 * tw - kw - ow), (0, 0), (0, 0)))
  k = k.reshape(th, 2, tw, 2, c, o).transpose(0, 2, 1, 3, 4, 5).reshape(th, tw, 4 * c, o)
  k = jnp.pad(k, ((0, 0), (0, 0), (0, -4 * c % _CHANNEL_MULTIPLE), (0, 0)))
  return k, ((lh, th - 1 - lh), (lw, tw - 1 - lw))


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
    space_to_depth: compute a stride-2 convolution (symmetric padding) in its space-to-depth
      form (space_to_depth, space_to_depth_kernel): the same output and kernel gradient.
  """

  features: int
  kernel_size: tuple[int, int]
  strides: tuple[int, int]
  padding: Padding
  dtype: Any
  kernel_init: Callable
  grad_mesh: Mesh | None = None
  space_to_depth: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """(B, H, W, C_in) -> (B, H', W', features) in ``dtype``."""
    shape = (*self.kernel_size, x.shape[-1], self.features)
    kernel = self.param("kernel", self.kernel_init, shape, jnp.float32)
    x = x.astype(self.dtype)
    strides, padding = self.strides, self.padding
    if self.space_to_depth:
      if strides != (2, 2):
        raise ValueError(f"space_to_depth needs strides (2, 2), got {strides}")
      # The blocks' zero padding (asymmetric) written with the stacked image, once: cuDNN
      # takes symmetric padding only, and XLA would pad a copy for each convolution reading it.
      kernel, blocks = space_to_depth_kernel(kernel, padding)
      x, strides, padding = space_to_depth(x, blocks), (1, 1), ((0, 0), (0, 0))
    if self.grad_mesh is None or jnp.dtype(self.dtype) == jnp.float32:
      return convolve(x, kernel.astype(self.dtype), strides, padding)
    return convolve_f32_weight_grad(x, kernel, strides, padding, self.grad_mesh)
