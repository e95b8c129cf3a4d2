"""Photometric part of the views (MoCo-v2 "aug-plus" and LooC's atomic augmentations), batched in
JAX on the accelerator.

MoCo-v2 "aug-plus" (Chen et al. 2020, "Improved baselines with momentum contrastive learning"):
ColorJitter(0.4, 0.4, 0.4, 0.1) with p=0.8, grayscale p=0.2, Gaussian blur sigma ~ U[0.1, 2]
with p=0.5, then ImageNet mean/std normalisation (solarize p=0 here; BYOL recipes turn it on).
Randomness is explicit: `sample_photometric` draws every random
choice of a batch of views into a flat dict of arrays with leading dimension B, and
`apply_photometric` is a deterministic, jit-able function of images and that dict, so one view
can take another view's parameters.

LooC (Xiao et al. 2021, "What should not be contrastive in contrastive learning", Sec. 3 and 4,
App. A) builds extra key views that copy one "atomic augmentation" of the query view and draw the
others afresh. Its three atomic augmentations are the groups of `ATOMIC_GROUPS`, copied between
param dicts by `share`:
  colour    jitter + grayscale (keys jitter, brightness, contrast, saturation, hue, order,
            grayscale);
  rotation  by k * 90 degrees counter-clockwise (as np.rot90 on the (H, W) axes), k = 0 with
            probability 1 - rotation_prob, else uniform in {1, 2, 3}; images must be square (the
            host crops to S x S);
  texture   texture randomisation. The paper restyles the image with a pretrained style-transfer
            network (Gatys et al. 2016; Geirhos et al. 2018); this module uses a weight-free
            stand-in, random convolutions (Xu et al. 2021, "Robust and generalizable visual
            representation learning via random convolutions", RandConv), see
            cl_jax.data.random_conv.
Blur and solarize belong to no group: every view draws them independently. Rotation and texture
are off by default (probability 0; LooC uses 0.5 for both, App. A). Their keys are in the param
dict only when their probability is > 0 (`param_keys`), so with both off the dict, the random
numbers (the new ops draw from jax.random.fold_in(rng, ...), not from the split that draws the
MoCo-v2 keys) and the images are exactly the MoCo-v2 ones, and the new ops cost nothing.

Order in `apply_photometric`: texture, jitter, grayscale, blur, solarize, rotation. Texture comes
first as style transfer does (it restyles the source image; Stylized-ImageNet, Geirhos et al.
2018, is made before any augmentation), and since it keeps each channel's mean and std the colour
ops that follow see the image's own colour statistics. Rotation comes last; it commutes with the
pixel-wise ops and (up to rounding) with the isotropic, reflect-padded blur.

Colour jitter (torchvision's ColorJitter) and grayscale live in cl_jax.data.colour_jitter,
texture randomisation in cl_jax.data.random_conv. dm-pix's solarize is used as is. The Gaussian
blur is written here (see `_blur`): dm-pix's pads with zeros, and its convolution with a
per-example sigma is much slower under vmap.
"""

import dataclasses
import functools

import dm_pix as pix
import jax
import jax.numpy as jnp
import numpy as np

from cl_jax.data import colour_jitter, random_conv

PARAM_KEYS = (
    "jitter",
    "brightness",
    "contrast",
    "saturation",
    "hue",
    "order",
    "grayscale",
    "blur",
    "sigma",
    "solarize",
)
ROTATION_KEYS = ("rotation",)
TEXTURE_KEYS = ("texture", "texture_kernel")
# The PhotometricSpec fields that are probabilities, each in [0, 1] (the aug config block's too).
PROBABILITY_FIELDS = (
    "jitter_prob",
    "grayscale_prob",
    "blur_prob",
    "solarize_prob",
    "rotation_prob",
    "texture_prob",
)
ATOMIC_GROUPS: dict[str, tuple[str, ...]] = {
    "colour": ("jitter", "brightness", "contrast", "saturation", "hue", "order", "grayscale"),
    "rotation": ROTATION_KEYS,
    "texture": TEXTURE_KEYS,
}
# fold_in data deriving the new ops' PRNG keys from the sampling key, apart from the split that
# draws PARAM_KEYS.
_ROTATION_STREAM = 1
_TEXTURE_STREAM = 2


@dataclasses.dataclass(frozen=True)
class PhotometricSpec:
  """Strengths and probabilities of the photometric ops (defaults: MoCo-v2 aug-plus).

  Attributes:
    jitter_prob: probability of applying colour jitter, in [0, 1].
    brightness, contrast, saturation: jitter strengths s >= 0; factors ~ U[max(0, 1 - s), 1 + s]
      (torchvision clamps the lower bound of the range at 0).
    hue: hue strength h in [0, 0.5]; shift ~ U[-h, h] in turns of the colour wheel.
    grayscale_prob: probability of converting to 3-channel luma, in [0, 1].
    blur_prob: probability of Gaussian blur, in [0, 1].
    blur_sigma: (min, max) blur standard deviation in pixels, 0 < min <= max.
    blur_kernel_fraction: kernel side relative to the image side, in (0, 1]; the kernel has
      radius floor(int(fraction * min(H, W)) / 2), i.e. 2 * 11 + 1 = 23 taps at 224 px.
    solarize_prob: probability of solarizing (x -> 1 - x where x >= 0.5), in [0, 1].
    rotation_prob: probability of rotating by 90, 180 or 270 degrees (uniform), in [0, 1]; LooC
      uses 0.5. Needs square images.
    texture_prob: probability of texture randomisation by a random convolution, in [0, 1]; LooC
      uses 0.5. Needs images of side >= 4 (the reflect padding of the 7 x 7 kernel).
    mean, std: per-channel RGB normalisation constants (std > 0).
    dtype: "float32" or "bfloat16", the dtype the views are held in from the colour ops to the
      end of the blur (the colour ops' output and each of the blur's two matrix products, which
      accumulate in float32); every op computes in float32. "bfloat16" halves those bytes and
      keeps the views within 0.75 grey levels of "float32" (held less 0.5, see _centre;
      tests/test_photometric.py), about what a bfloat16 network's first layer rounds away.
  """

  jitter_prob: float = 0.8
  brightness: float = 0.4
  contrast: float = 0.4
  saturation: float = 0.4
  hue: float = 0.1
  grayscale_prob: float = 0.2
  blur_prob: float = 0.5
  blur_sigma: tuple[float, float] = (0.1, 2.0)
  blur_kernel_fraction: float = 0.1
  solarize_prob: float = 0.0
  rotation_prob: float = 0.0
  texture_prob: float = 0.0
  mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
  std: tuple[float, float, float] = (0.229, 0.224, 0.225)
  dtype: str = "float32"

  def __post_init__(self):
    for name in PROBABILITY_FIELDS:
      value = getattr(self, name)
      if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"PhotometricSpec.{name} is a probability and must be in [0, 1], " f"got {value!r}."
        )
    for name in ("brightness", "contrast", "saturation"):
      value = getattr(self, name)
      if not value >= 0.0:
        raise ValueError(
            f"PhotometricSpec.{name} is a jitter strength and must be >= 0 "
            f"(0 turns it off), got {value!r}."
        )
    if not 0.0 <= self.hue <= 0.5:
      raise ValueError(
          f"PhotometricSpec.hue must be in [0, 0.5] (a shift of up to half the "
          f"colour wheel), got {self.hue!r}."
      )
    if len(self.blur_sigma) != 2 or not 0.0 < self.blur_sigma[0] <= self.blur_sigma[1]:
      raise ValueError(
          f"PhotometricSpec.blur_sigma must be an ordered pair (min, max) with "
          f"0 < min <= max, got {self.blur_sigma!r}."
      )
    if not 0.0 < self.blur_kernel_fraction <= 1.0:
      raise ValueError(
          f"PhotometricSpec.blur_kernel_fraction must be in (0, 1], got "
          f"{self.blur_kernel_fraction!r}."
      )
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(
          f"PhotometricSpec.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}."
      )
    if len(self.mean) != 3:
      raise ValueError(f"PhotometricSpec.mean must have 3 (RGB) entries, got {self.mean!r}.")
    if len(self.std) != 3 or not all(s > 0.0 for s in self.std):
      raise ValueError(
          f"PhotometricSpec.std must have 3 (RGB) entries, all > 0, got " f"{self.std!r}."
      )


def config_spec(config) -> PhotometricSpec:
  """The PhotometricSpec of a run's config: each field of its `aug` block is the spec's field of
  that name (sequences as tuples), and the views are held in the network's dtype
  (config.model.dtype), which its first layer rounds them to anyway; the spec's other fields keep
  their defaults."""
  fields = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in config.aug.items()}
  return PhotometricSpec(**fields, dtype=config.model.dtype)


def blur_radius(height: int, width: int, spec: PhotometricSpec) -> int:
  """Gaussian kernel radius r (kernel 2r + 1 taps) = int(fraction * min(H, W)) // 2."""
  return int(spec.blur_kernel_fraction * min(height, width)) // 2


def param_keys(spec: PhotometricSpec) -> tuple[str, ...]:
  """Keys of `sample_photometric`'s dict under `spec`: PARAM_KEYS, then ROTATION_KEYS if
  rotation_prob > 0 and TEXTURE_KEYS if texture_prob > 0."""
  return (
      PARAM_KEYS
      + (ROTATION_KEYS if spec.rotation_prob > 0.0 else ())
      + (TEXTURE_KEYS if spec.texture_prob > 0.0 else ())
  )


def sample_photometric(
    rng: jax.Array, batch_size: int, spec: PhotometricSpec
) -> dict[str, jax.Array]:
  """Draws every random choice of B photometric views.

  Returns:
    Flat dict (keys `param_keys(spec)`), each array with leading dim B: jitter, grayscale, blur,
    solarize (B,) bool ~ Bernoulli(prob); brightness, contrast, saturation (B,) float32
    ~ U[max(0, 1 - s), 1 + s]; hue (B,) float32 ~ U[-h, h]; order (B, 4) int32, an independent
    uniform permutation of the jitter ops (0 brightness, 1 contrast, 2 saturation, 3 hue) per
    example; sigma (B,) float32 ~ U[blur_sigma]. If rotation_prob > 0: rotation (B,) int32,
    quarter turns counter-clockwise, 0 with probability 1 - rotation_prob, else uniform in
    {1, 2, 3}. If texture_prob > 0: texture (B,) bool ~ Bernoulli(texture_prob) and
    texture_kernel (B, 7, 7, 3, 3) float32 (see random_conv.sample_kernel).
  """
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
  params = _sample_moco(rng, batch_size, spec)
  if spec.rotation_prob > 0.0:
    params["rotation"] = _sample_rotation(
        jax.random.fold_in(rng, _ROTATION_STREAM), batch_size, spec.rotation_prob
    )
  if spec.texture_prob > 0.0:
    flag_key, kernel_key = jax.random.split(jax.random.fold_in(rng, _TEXTURE_STREAM))
    params["texture"] = jax.random.bernoulli(flag_key, spec.texture_prob, (batch_size,))
    params["texture_kernel"] = random_conv.sample_kernel(kernel_key, batch_size)
  return params


def _sample_rotation(rng: jax.Array, batch_size: int, prob: float) -> jax.Array:
  """(B,) int32 quarter turns: 0 with probability 1 - prob, else uniform in {1, 2, 3}."""
  flag_key, turns_key = jax.random.split(rng)
  rotate = jax.random.bernoulli(flag_key, prob, (batch_size,))
  turns = jax.random.randint(turns_key, (batch_size,), 1, 4, jnp.int32)
  return jnp.where(rotate, turns, 0)


def _sample_moco(rng: jax.Array, batch_size: int, spec: PhotometricSpec) -> dict[str, jax.Array]:
  """The PARAM_KEYS entries of `sample_photometric`."""
  keys = dict(zip(PARAM_KEYS, jax.random.split(rng, len(PARAM_KEYS))))
  shape = (batch_size,)

  def factor(name: str) -> jax.Array:
    strength = getattr(spec, name)
    return jax.random.uniform(
        keys[name], shape, jnp.float32, max(0.0, 1.0 - strength), 1.0 + strength
    )

  identity = jnp.broadcast_to(
      jnp.arange(colour_jitter.NUM_JITTER_OPS, dtype=jnp.int32),
      (batch_size, colour_jitter.NUM_JITTER_OPS),
  )
  return {
      "jitter": jax.random.bernoulli(keys["jitter"], spec.jitter_prob, shape),
      "brightness": factor("brightness"),
      "contrast": factor("contrast"),
      "saturation": factor("saturation"),
      "hue": jax.random.uniform(keys["hue"], shape, jnp.float32, -spec.hue, spec.hue),
      "order": jax.random.permutation(keys["order"], identity, axis=1, independent=True),
      "grayscale": jax.random.bernoulli(keys["grayscale"], spec.grayscale_prob, shape),
      "blur": jax.random.bernoulli(keys["blur"], spec.blur_prob, shape),
      "sigma": jax.random.uniform(keys["sigma"], shape, jnp.float32, *spec.blur_sigma),
      "solarize": jax.random.bernoulli(keys["solarize"], spec.solarize_prob, shape),
  }


def share(
    source: dict[str, jax.Array], target: dict[str, jax.Array], group: str
) -> dict[str, jax.Array]:
  """A copy of `target` whose keys of ATOMIC_GROUPS[group] are taken from `source`.

  LooC's view generation (Xiao et al. 2021, Sec. 3): key view k_i copies the parameters of the
  i-th atomic augmentation from the query view, x_i^{k_i} = x_i^q, and draws the others
  independently, e.g. share(query_params, sample_photometric(rng_i, B, spec), "rotation").
  A group whose op is off (its keys in neither dict: rotation_prob or texture_prob is 0) has
  nothing to share, and `target` is returned as a copy.

  Raises:
    ValueError: `group` is not in ATOMIC_GROUPS, only one of the dicts has the group's keys, or a
      key's shapes differ between the two.
  """
  if group not in ATOMIC_GROUPS:
    raise ValueError(f"Unknown atomic group {group!r}; the groups are {sorted(ATOMIC_GROUPS)}.")
  keys = ATOMIC_GROUPS[group]
  if not any(k in source or k in target for k in keys):
    return dict(target)
  for name, params in (("source", source), ("target", target)):
    missing = [k for k in keys if k not in params]
    if missing:
      raise ValueError(
          f"Sharing group {group!r} needs its keys {list(keys)} in both dicts, but {name} lacks "
          f"{missing}; sample both views with the same PhotometricSpec."
      )
  for k in keys:
    if jnp.shape(source[k]) != jnp.shape(target[k]):
      raise ValueError(
          f"source[{k!r}] has shape {jnp.shape(source[k])} but target[{k!r}] has shape "
          f"{jnp.shape(target[k])}; the two views must have the same batch size."
      )
  return {**target, **{k: source[k] for k in keys}}


# The blur's products in float32 to about 2^-11 (TF32 on a GPU, three bfloat16 passes on a TPU):
# a single bfloat16 pass rounds the taps by up to 2^-9, 0.6 grey levels.
_BLUR_PRECISION = jax.lax.Precision.HIGH


def blur_matrices(sigma: jax.Array, blur: jax.Array, radius: int, size: int) -> jax.Array:
  """The Gaussian blur along one axis of length n = `size`, as (B, n, n) float32 matrices K with
  blurred = K @ x: K[b, i, j] = sum_k w_bk [reflect(i + k) = j], k = -r..r, with taps
  w_bk ∝ exp(-k^2 / (2 sigma_b^2)) summing to 1 where blur[b], else the identity (w_b0 = 1).

  Borders are reflect-padded (d c b | a b c d | c b a), torchvision GaussianBlur's mode:
  reflect(t) = -t below 0 and 2 (n - 1) - t above n - 1 (needs n > r). So at most three taps
  reach column j of row i, each computed where it lands from its offset, fixed by (i, j), and
  summed in the order of k: k = -i - j (reflected below 0, j > 0), k = j - i, and
  k = 2 (n - 1) - i - j (reflected above n - 1, j < n - 1). (As a sum over the 2r + 1 taps of
  their masks, XLA's GPU compiler took minutes to fuse the 23 terms at 224 px; as gathers from
  the taps, XLA's TPU cost model counts 2 GB more per v5e chip and step.)
  """
  taps = jnp.arange(-radius, radius + 1, dtype=jnp.float32)
  total = jnp.sum(jnp.exp(-(taps**2) / (2.0 * sigma[:, None] ** 2)), axis=1)[:, None, None]
  sigma, blur = sigma[:, None, None], blur[:, None, None]
  rows, cols = np.arange(size)[:, None], np.arange(size)[None, :]

  def tap(offset: np.ndarray, reaches: np.ndarray) -> jax.Array:
    """(B, n, n): w_bk at k = offset[i, j] where it reaches column j, else 0."""
    k = jnp.asarray(offset, jnp.float32)
    weight = jnp.where(blur, jnp.exp(-(k**2) / (2.0 * sigma**2)) / total, (k == 0).astype(k.dtype))
    return jnp.where(reaches & (np.abs(offset) <= radius), weight, 0.0)

  below = tap(-rows - cols, cols > 0)
  direct = tap(cols - rows, np.ones((size, size), bool))
  above = tap(2 * (size - 1) - rows - cols, cols < size - 1)
  return below + direct + above


def _blur(planar: jax.Array, sigma: jax.Array, blur: jax.Array, radius: int) -> jax.Array:
  """Separable Gaussian blur of (B, H, 3, W) views where blur[b] (blur_matrices), the others
  copied: two batched matrix products, along W and then along H, with float32 matrices,
  accumulated in float32 and rounded to the views' dtype (bfloat16 or float32); (B, H, 3, W) in
  that dtype out. A copied view is the identity's product, exact in either dtype. A blur of
  2r + 1 taps as products with banded n x n matrices costs 2n / (2r + 1) times the FLOPs of
  shifted multiply-adds, which a GPU's matrix units absorb, and moves each image twice instead
  of 2 (2r + 1) times; dm-pix's depthwise convolution with a per-example sigma becomes a grouped
  convolution with B * 3 groups under vmap (17x slower on CPU at B=64, 224 px, r=11) and pads
  with zeros, which darkens the border.
  """
  height, width = planar.shape[1], planar.shape[3]
  along_w = blur_matrices(sigma, blur, radius, width)
  along_h = along_w if height == width else blur_matrices(sigma, blur, radius, height)
  product = functools.partial(
      jnp.einsum, precision=_BLUR_PRECISION, preferred_element_type=planar.dtype
  )
  rows = product("bhcw,bvw->bhcv", planar.astype(jnp.float32), along_w)
  return product("bgh,bhcv->bgcv", along_h, rows.astype(jnp.float32))


def _rotate(image: jax.Array, turns: jax.Array) -> jax.Array:
  """(S, S, 3) rotated by `turns` in {0, 1, 2, 3} quarter turns counter-clockwise (np.rot90)."""
  return jax.lax.switch(
      turns, [functools.partial(jnp.rot90, k=k, axes=(0, 1)) for k in range(4)], image
  )


def _param_shape(name: str, batch_size: int) -> tuple[int, ...]:
  if name == "order":
    return (batch_size, colour_jitter.NUM_JITTER_OPS)
  if name == "texture_kernel":
    side = 2 * random_conv.RADIUS + 1
    return (batch_size, side, side, 3, 3)
  return (batch_size,)


def _check_params(params: dict[str, jax.Array], batch_size: int, spec: PhotometricSpec) -> None:
  expected_keys = param_keys(spec)
  if set(params) != set(expected_keys):
    raise ValueError(
        f"params must have exactly the keys {sorted(expected_keys)} (from sample_photometric "
        f"with this spec: rotation_prob > 0 adds {list(ROTATION_KEYS)}, texture_prob > 0 adds "
        f"{list(TEXTURE_KEYS)}), got {sorted(params)}."
    )
  for name in expected_keys:
    expected = _param_shape(name, batch_size)
    if jnp.shape(params[name]) != expected:
      raise ValueError(
          f"params[{name!r}] must have shape {expected} for a batch of "
          f"{batch_size} images, got {jnp.shape(params[name])}."
      )


def apply_photometric(
    images: jax.Array, params: dict[str, jax.Array], spec: PhotometricSpec
) -> jax.Array:
  """Applies texture, jitter, grayscale, blur, solarize and rotation, each where its per-example
  flag is set.

  Per example: x <- random_conv.texture(x, texture_kernel) if texture; x <- jitter ops in `order` if
  jitter; x <- [gray(x)] * 3 if grayscale; x <- blur(x, sigma) if blur;
  x <- where(x >= 0.5, 1 - x, x) if solarize; x <- rot90(x, rotation). All branches are computed
  and selected with jnp.where / lax.switch, so the function is jit- and vmap-safe. Texture and
  rotation are left out of the program when spec.texture_prob / spec.rotation_prob is 0 (their
  keys are then absent from params), so the output is then bit-identical to the MoCo-v2 pipeline.

  Args:
    images: (B, H, W, 3) float32 in [0, 1]; square (H = W) when spec.rotation_prob > 0, and
      H, W >= 4 when spec.texture_prob > 0.
    params: dict from `sample_photometric(rng, B, spec)` (or a copy with keys from another view,
      see `share`); its keys must be `param_keys(spec)`.
    spec: supplies the blur kernel size and which ops exist (the probabilities were used when
      sampling).

  Returns:
    (B, H, W, 3) float32 in [0, 1].
  """
  if images.ndim != 4 or images.shape[-1] != 3:
    raise ValueError(f"images must have shape (B, H, W, 3), got {images.shape}.")
  if not jnp.issubdtype(images.dtype, jnp.floating):
    raise ValueError(
        f"images must be floating point in [0, 1], got dtype {images.dtype}; "
        f"convert uint8 images with to_float."
    )
  _check_params(params, images.shape[0], spec)
  height, width = images.shape[1:3]
  rotate, texture = spec.rotation_prob > 0.0, spec.texture_prob > 0.0
  if rotate and height != width:
    raise ValueError(
        f"Rotation by quarter turns needs square images (the host crops to S x S), got "
        f"{height} x {width}; set rotation_prob=0 or crop square."
    )
  if texture and min(height, width) <= random_conv.RADIUS:
    raise ValueError(
        f"Texture randomisation reflect-pads by {random_conv.RADIUS} pixels and needs images "
        f"of side >= {random_conv.RADIUS + 1}, got {height} x {width}."
    )
  radius = blur_radius(height, width, spec)
  return _apply_batch(images.astype(jnp.float32), params, radius, rotate, texture, spec.dtype)


def _centre(dtype: str) -> float:
  """What the views less between the passes: held in bfloat16, as x - 0.5 in [-0.5, 0.5],
  which bfloat16 (8 significant bits) rounds by at most 2^-10, a quarter of a grey level,
  against 2^-9 for x itself near 1; the blur commutes with the shift (each row of its matrices
  sums to 1). Held in float32, as x itself (no rounding to save, and a view that no op changes
  comes back bit for bit)."""
  return 0.5 if dtype == "bfloat16" else 0.0


def _colour(image: jax.Array, p: dict[str, jax.Array], dtype: str) -> tuple[jax.Array, ...]:
  """One (H, W, 3) image: jitter where p["jitter"], then grayscale where p["grayscale"]; out as
  its three (H, W) planes R, G, B less _centre(dtype), in `dtype`."""
  planes = tuple(image[..., i] for i in range(3))
  jittered = colour_jitter.jitter_planes(planes, p)
  planes = tuple(jnp.where(p["jitter"], y, x) for x, y in zip(planes, jittered))
  grays = colour_jitter.gray_planes(planes)
  return tuple(
      (jnp.where(p["grayscale"], y, x) - _centre(dtype)).astype(dtype)
      for x, y in zip(planes, grays)
  )


def _planar(planes: tuple[jax.Array, ...]) -> jax.Array:
  """Three (B, H, W) planes -> (B, H, 3, W), the layout of the blur's matrix products. In
  bfloat16 (an accelerator's runs) each element is selected from its plane, not stacked with
  jnp.stack: XLA's GPU compiler would fuse the colour ops into the stacking, where every output
  element recomputes all three planes (each op of the colour group reads every channel), and
  instead splits the colour ops in two kernels with float32 planes between them (565 MB per 256
  views of 224 px); with a selection it computes the three planes in one kernel and stacks them
  in another (270 MB). In float32 (the CPU's runs, whose records the claims compare) they are
  stacked as before: XLA's CPU compiler fuses the colour ops otherwise around a selection and
  rounds their products otherwise (fused multiply-adds), which would change every such run's
  numbers (tests/test_dicr_step.py's recorded steps)."""
  if planes[0].dtype == jnp.float32:
    return jnp.stack(planes, 2)
  channel = jax.lax.broadcasted_iota(jnp.int32, (1, 1, 3, 1), 2)
  r, g, b = (plane[:, :, None] for plane in planes)
  return jnp.where(channel == 0, r, jnp.where(channel == 1, g, b))


# Jitted so that eager calls (host-side use, tests) run as one compiled program instead of
# dispatching every vmapped op separately; inside an outer jit it is simply inlined.
@functools.partial(jax.jit, static_argnames=("radius", "rotate", "texture", "dtype"))
def _apply_batch(
    images: jax.Array,
    params: dict[str, jax.Array],
    radius: int,
    rotate: bool,
    texture: bool,
    dtype: str,
) -> jax.Array:
  """(B, H, W, 3) float32 -> float32: texture (if `texture`), jitter, grayscale, blur (clipped to
  [0, 1] against rounding of the luma and blur weights), solarize, rotation (if `rotate`); each
  selected by its flag in params. From the colour ops to the end of the blur, the views are
  held in `dtype`; every op computes in float32."""
  x = images
  if texture:
    textured = jax.vmap(random_conv.texture)(x, params["texture_kernel"])
    x = jnp.where(params["texture"][:, None, None, None], textured, x)
  x = _planar(jax.vmap(functools.partial(_colour, dtype=dtype))(x, params))  # (B, H, 3, W)
  if radius:
    x = _blur(x, params["sigma"], params["blur"], radius)
  x = jnp.clip(jnp.swapaxes(x, 2, 3).astype(jnp.float32) + _centre(dtype), 0.0, 1.0)
  x = jnp.where(params["solarize"][:, None, None, None], pix.solarize(x, 0.5), x)
  return jax.vmap(_rotate)(x, params["rotation"]) if rotate else x


def to_float(images: jax.Array) -> jax.Array:
  """uint8 images -> float32 x / 255 in [0, 1], same shape."""
  if images.dtype != jnp.uint8:
    raise ValueError(f"to_float expects uint8 images, got dtype {images.dtype}.")
  return jnp.asarray(images, jnp.float32) / 255.0


def normalize(images: jax.Array, spec: PhotometricSpec) -> jax.Array:
  """(x - mean) / std per RGB channel; images (..., 3) float in [0, 1], float32 out."""
  if images.shape[-1] != 3:
    raise ValueError(f"images must have 3 (RGB) channels last, got shape {images.shape}.")
  mean = jnp.asarray(spec.mean, jnp.float32)
  std = jnp.asarray(spec.std, jnp.float32)
  return (images.astype(jnp.float32) - mean) / std


def augment_with_params(
    images: jax.Array, params: dict[str, jax.Array], spec: PhotometricSpec
) -> jax.Array:
  """Applies given params and normalises: (B, H, W, 3) uint8 -> (B, H, W, 3) float32 normalised
  views, e.g. a LooC key view whose params share a group with the query's (see `share`)."""
  return normalize(apply_photometric(to_float(images), params, spec), spec)


def augment_batch(
    rng: jax.Array, images: jax.Array, spec: PhotometricSpec
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Samples, applies and normalises the photometric part of a batch of views.

  Args:
    rng: PRNG key.
    images: (B, H, W, 3) uint8 (the host pipeline's cropped and flipped views).
    spec: the photometric recipe (static under jit: it is a hashable frozen dataclass).

  Returns:
    ((B, H, W, 3) float32 normalised views, the params dict that produced them).
  """
  if images.ndim != 4:
    raise ValueError(f"images must have shape (B, H, W, 3), got {images.shape}.")
  params = sample_photometric(rng, images.shape[0], spec)
  return augment_with_params(images, params, spec), params
