"""One-vs-rest views and per-layer representations (DICR paper, 2025 submission, Sec. 2.2 and
its Fig. 6): for each image, one base draw of every augmentation; then, for one augmentation at
a time, R views that redraw only that augmentation's random choices from the training
distribution and keep the base draw of all the others."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from cl_jax.data import geometric, photometric

# Each photometric augmentation's random choices (keys of photometric.sample_photometric).
PHOTOMETRIC_KEYS = {
    "jitter": ("jitter", "brightness", "contrast", "saturation", "hue", "order"),
    "grayscale": ("grayscale",),
    "blur": ("blur", "sigma"),
    "solarize": ("solarize",),
    "rotation": photometric.ROTATION_KEYS,
    "texture": photometric.TEXTURE_KEYS,
}
_PROBABILITY = {
    "jitter": "jitter_prob",
    "grayscale": "grayscale_prob",
    "blur": "blur_prob",
    "solarize": "solarize_prob",
    "rotation": "rotation_prob",
    "texture": "texture_prob",
}
_BLOCK = re.compile(r"stage(\d+)_block(\d+)")


def augmentations(spec: photometric.PhotometricSpec) -> tuple[str, ...]:
  """The augmentations of a recipe: crop and flip, then each photometric op that it applies."""
  return ("crop", "flip") + tuple(a for a, p in _PROBABILITY.items() if getattr(spec, p) > 0.0)


def base_draws(
    rng: np.random.Generator,
    key: jax.Array,
    images: list[np.ndarray],
    crop_scale: tuple[float, float],
    spec: photometric.PhotometricSpec,
) -> tuple[list[geometric.CropParams], dict[str, jax.Array]]:
  """One draw of every augmentation for each of the N images: crops and photometric params."""
  crops = [geometric.sample_crop(rng, *im.shape[:2], scale=crop_scale) for im in images]
  return crops, photometric.sample_photometric(key, len(images), spec)


def views(
    augmentation: str,
    rng: np.random.Generator,
    key: jax.Array,
    images: list[np.ndarray],
    crops: list[geometric.CropParams],
    params: dict[str, jax.Array],
    repeats: int,
    size: int,
    crop_scale: tuple[float, float],
    spec: photometric.PhotometricSpec,
) -> tuple[jax.Array, np.ndarray]:
  """R one-vs-rest views of each image for `augmentation`.

  Args:
    augmentation: "crop", "flip" or a key of PHOTOMETRIC_KEYS.
    rng, key: host and device randomness of the redraws.
    images: N (H, W, 3) uint8 source images; crops, params: their base_draws.
    repeats: R.
    size: the views' side in pixels.

  Returns:
    ((N * R, size, size, 3) float32 normalised views, image-major; (N, R, 4) float32 crop
    boxes in source pixels).
  """
  n = len(images)
  view_crops = []
  for image, base in zip(images, crops):
    for _ in range(repeats):
      if augmentation == "crop":
        drawn = geometric.sample_crop(rng, *image.shape[:2], scale=crop_scale)
        view_crops.append(geometric.CropParams(box=drawn.box, flip=base.flip))
      elif augmentation == "flip":
        view_crops.append(geometric.CropParams(box=base.box, flip=bool(rng.random() < 0.5)))
      else:
        view_crops.append(base)
  pixels = np.stack(
      [geometric.apply_crop(images[i // repeats], c, size) for i, c in enumerate(view_crops)]
  )
  view_params = {k: jnp.repeat(v, repeats, axis=0) for k, v in params.items()}
  if augmentation in PHOTOMETRIC_KEYS:
    redrawn = photometric.sample_photometric(key, n * repeats, spec)
    view_params.update({k: redrawn[k] for k in PHOTOMETRIC_KEYS[augmentation]})
  out = photometric.augment_with_params(jnp.asarray(pixels), view_params, spec)
  boxes = np.stack([c.box for c in view_crops]).reshape(n, repeats, 4).astype(np.float32)
  return out, boxes


def layer_names(names) -> list[str]:
  """representations' layer names in network order: the residual blocks, then "embedding"."""
  blocks = [n for n in names if _BLOCK.fullmatch(n)]
  blocks.sort(key=lambda n: tuple(int(g) for g in _BLOCK.fullmatch(n).groups()))
  return blocks + ["embedding"]


def representations(encoder, variables: dict, images: jax.Array) -> dict[str, jax.Array]:
  """Per-layer representations in eval-mode batch norm: each residual block's output averaged
  over space (the last block's is the representation h), and the unit embedding z.

  Args:
    images: (B, S, S, 3) normalised views.

  Returns:
    {layer name: (B, C_layer) float32} (order them with layer_names).
  """

  def is_block(module, method: str) -> bool:
    return method == "__call__" and bool(_BLOCK.fullmatch(module.name or ""))

  out, state = encoder.apply(
      variables, images, train=False, capture_intermediates=is_block, mutable=["intermediates"]
  )
  blocks = state["intermediates"]["backbone"]
  names = layer_names(blocks)[:-1]
  reps = {n: jnp.mean(blocks[n]["__call__"][0].astype(jnp.float32), axis=(1, 2)) for n in names}
  reps["embedding"] = out["z"]
  return reps
