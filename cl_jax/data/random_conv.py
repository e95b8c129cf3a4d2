"""Texture randomisation of one image by a random convolution (Xu et al. 2021, "Robust and
generalizable visual representation learning via random convolutions", RandConv): the op of the
texture group of the photometric views (cl_jax.data.photometric), a weight-free stand-in for
LooC's style transfer. Holds the kernels' sampling, the reflect-padded convolution and the
per-channel standardisation back to the image's own statistics.
"""

import jax
import jax.numpy as jnp

# Random-convolution kernel sides k (RandConv's multi-scale set); every kernel is stored as a
# 7 x 7 one whose taps outside its centred k x k window are zero.
KERNEL_SIZES = (1, 3, 5, 7)
RADIUS = max(KERNEL_SIZES) // 2
_EPS = 1e-6  # floor of the convolved channel's std in the standardisation


def sample_kernel(rng: jax.Array, batch_size: int) -> jax.Array:
  """(B, 7, 7, 3, 3) float32 RandConv kernels (Xu et al. 2021, Sec. 3), (tap row, tap column,
  input channel, output channel).

  Per example the side k is uniform in KERNEL_SIZES; the taps of the centred k x k window
  are i.i.d. N(0, 1 / (3 k^2)) (He initialisation with gain 1 for fan-in 3 k^2, as RandConv
  draws its random layer), the other taps are 0.
  """
  size_key, weight_key = jax.random.split(rng)
  sizes = jnp.asarray(KERNEL_SIZES, jnp.int32)[
      jax.random.randint(size_key, (batch_size,), 0, len(KERNEL_SIZES))
  ]
  side = 2 * RADIUS + 1
  weights = jax.random.normal(weight_key, (batch_size, side, side, 3, 3), jnp.float32)
  offsets = jnp.abs(jnp.arange(side) - RADIUS)
  inside = jnp.maximum(offsets[:, None], offsets[None, :]) <= (sizes // 2)[:, None, None]
  std = 1.0 / (jnp.sqrt(3.0) * sizes.astype(jnp.float32))
  return jnp.where(inside[..., None, None], weights * std[:, None, None, None, None], 0.0)


def random_conv(image: jax.Array, kernel: jax.Array) -> jax.Array:
  """Cross-correlation of (H, W, 3) with a (7, 7, 3, 3) kernel, reflect-padded, same size:

    y[i, j, o] = sum_{u, v, c} kernel[u, v, c, o] xpad[i + u, j + v, c],

  xpad the image reflect-padded by 3 on each side (d c b | a b c d | c b a), so that a constant
  image stays constant (zero padding, RandConv's, darkens or brightens the border depending on the
  kernel's sign). Written as 147 broadcast multiply-adds, one per (tap, input channel), which XLA
  fuses into one loop. Under vmap with per-example kernels, lax.conv becomes a grouped
  convolution and per-tap (3, 3) matmuls become batched dots, both measured 13x to 25x slower on
  CPU (B=64, 32 and 64 px).
  """
  height, width = image.shape[:2]
  side = 2 * RADIUS + 1
  pad = (RADIUS, RADIUS)
  padded = jnp.pad(image, (pad, pad, (0, 0)), mode="reflect")
  return sum(
      padded[u : u + height, v : v + width, c : c + 1] * kernel[u, v, c]
      for u in range(side)
      for v in range(side)
      for c in range(3)
  )


def texture(image: jax.Array, kernel: jax.Array) -> jax.Array:
  """Texture randomisation of (H, W, 3) in [0, 1]: random convolution, then per-channel
  standardisation back to the input's statistics, clipped to [0, 1]:

    y = random_conv(x, kernel),  out_c = clip(mean_c(x) + std_c(x) (y_c - mean_c(y))
                                                / max(std_c(y), 1e-6), 0, 1),

  means and (population) standard deviations over the H x W pixels of channel c. RandConv
  (Xu et al. 2021) convolves mean/std-normalised inputs, whose response stays near the data's
  scale; on [0, 1] images the kernel's gain (sum of its taps, ~ N(0, 1)) rescales and can negate
  the image's mean, so mixing the raw response with the image (RandConv-mix) and clipping would
  saturate much of the image. Matching each channel's mean and std removes that gain, keeps the
  image's global colour statistics, which belong to the colour group, and randomises the local
  structure: texture and colour stay separate atomic augmentations. A constant channel stays
  constant (up to float32 rounding of its mean).
  """
  y = random_conv(image, kernel)
  mean_x, std_x = jnp.mean(image, axis=(0, 1)), jnp.std(image, axis=(0, 1))
  mean_y, std_y = jnp.mean(y, axis=(0, 1)), jnp.std(y, axis=(0, 1))
  return jnp.clip(mean_x + std_x * (y - mean_y) / jnp.maximum(std_y, _EPS), 0.0, 1.0)
