"""The Trifeature dataset (Hermann & Lampinen, 2020) as used by the IFM paper (Robinson et al.,
2021, Sec. 2.3): three independent factors (shape, texture, colour) with 10 values each.

The 1000 factor combinations are split 80/20 by a seeded permutation: training images use only
the 800 training combinations, test images only the 200 held-out ones. Images of a split are
spread evenly over its combinations: image i shows combination ``combos[i % len(combos)]``
(combinations in permuted order, so a small split still samples combinations at random).
Rendering lives in ``trifeature_render``.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
import tqdm

from cl_jax.data.trifeature_render import (
    COLOUR_RGB,
    COLOURS,
    MAX_SHAPE_ANGLE_DEG,
    MAX_TEXTURE_ANGLE_DEG,
    SHAPES,
    TEXTURES,
    render,
)

__all__ = [
    "COLOURS",
    "COLOUR_RGB",
    "FACTORS",
    "MAX_SHAPE_ANGLE_DEG",
    "MAX_TEXTURE_ANGLE_DEG",
    "NUM_COMBINATIONS",
    "NUM_TRAIN_COMBINATIONS",
    "SHAPES",
    "SPLITS",
    "TEXTURES",
    "TrifeatureData",
    "TrifeatureSource",
    "generate",
    "load",
    "render",
    "split_combinations",
]

FACTORS = ("shape", "texture", "colour")
FACTOR_VALUES = {"shape": SHAPES, "texture": TEXTURES, "colour": COLOURS}
SPLITS = ("train", "test")
NUM_COMBINATIONS = len(SHAPES) * len(TEXTURES) * len(COLOURS)
NUM_TRAIN_COMBINATIONS = NUM_COMBINATIONS * 8 // 10

# Bumped whenever rendering changes, so stale caches are never read.
CACHE_VERSION = 1
CACHE_ENV_VAR = "CL_JAX_CACHE"

# Stream ids that keep the seeded random streams apart (SeedSequence entropy [seed, stream]).
_COMBINATION_STREAM = 0
_RENDER_STREAM = {"train": 1, "test": 2}


@dataclasses.dataclass(frozen=True)
class TrifeatureData:
  """A rendered split.

  Attributes:
    images: (N, S, S, 3) uint8.
    labels: factor name (FACTORS) -> (N,) int32 index into SHAPES / TEXTURES / COLOURS.
  """

  images: np.ndarray
  labels: dict[str, np.ndarray]

  def __post_init__(self):
    if self.images.ndim != 4 or self.images.shape[-1] != 3 or self.images.dtype != np.uint8:
      raise ValueError(
          "images must be an (N, S, S, 3) uint8 array; got "
          f"{self.images.dtype} {self.images.shape}."
      )
    if set(self.labels) != set(FACTORS):
      raise ValueError(f"labels must have exactly the keys {FACTORS}; got {sorted(self.labels)}.")
    for name, values in self.labels.items():
      if values.shape != (len(self.images),):
        raise ValueError(
            f"labels[{name!r}] must have shape ({len(self.images)},); got {values.shape}."
        )


def _check_args(split: str, image_size: int, num_images: int, seed: int) -> None:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}; got {split!r}.")
  if int(image_size) != image_size or image_size < 16:
    raise ValueError(f"image_size must be an integer >= 16 pixels; got {image_size!r}.")
  if int(num_images) != num_images or num_images < 1:
    raise ValueError(f"num_images must be an integer >= 1; got {num_images!r}.")
  if int(seed) != seed or seed < 0:
    raise ValueError(f"seed must be a non-negative integer; got {seed!r}.")


def split_combinations(split: str, seed: int) -> np.ndarray:
  """Factor combinations of a split, in seeded random order.

  Returns:
    (C, 3) int32 rows (shape, texture, colour); C = 800 for "train" and 200 for "test". The two
    splits partition the 1000 combinations; combination k is (k // 100, k // 10 % 10, k % 10).
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}; got {split!r}.")
  rng = np.random.default_rng([int(seed), _COMBINATION_STREAM])
  order = rng.permutation(NUM_COMBINATIONS)
  chosen = order[:NUM_TRAIN_COMBINATIONS] if split == "train" else order[NUM_TRAIN_COMBINATIONS:]
  sizes = (len(SHAPES), len(TEXTURES), len(COLOURS))
  return np.stack(np.unravel_index(chosen, sizes), axis=1).astype(np.int32)


def generate(
    split: str,
    *,
    image_size: int,
    num_images: int,
    seed: int,
    progress: bool = True,
    max_shape_angle: float = MAX_SHAPE_ANGLE_DEG,
    max_texture_angle: float = MAX_TEXTURE_ANGLE_DEG,
) -> TrifeatureData:
  """Renders ``num_images`` images of ``split``; deterministic in
  (seed, split, image_size, num_images, max_shape_angle, max_texture_angle). Shapes are
  rotated by up to ``max_shape_angle`` degrees, textures by an angle in
  [0, ``max_texture_angle``) degrees (trifeature_render.render).

  Image i shows combination ``split_combinations(split, seed)[i % C]``; the renders draw from a
  generator seeded by (seed, split), so the placements do not depend on image_size.
  """
  _check_args(split, image_size, num_images, seed)
  combos = split_combinations(split, seed)
  factors = combos[np.arange(num_images) % len(combos)]
  rng = np.random.default_rng([int(seed), _RENDER_STREAM[split]])
  images = np.empty((num_images, image_size, image_size, 3), dtype=np.uint8)
  rows = tqdm.tqdm(factors, desc=f"trifeature {split} {image_size}px", disable=not progress)
  for i, (shape, texture, colour) in enumerate(rows):
    images[i] = render(shape, texture, colour, image_size, rng, max_shape_angle, max_texture_angle)
  labels = {name: np.ascontiguousarray(factors[:, k]) for k, name in enumerate(FACTORS)}
  return TrifeatureData(images=images, labels=labels)


def _default_cache_dir() -> str:
  return os.environ.get(CACHE_ENV_VAR) or os.path.join(
      os.path.expanduser("~"), ".cache", "cl_jax", "trifeature"
  )


def load(
    split: str,
    *,
    cache_dir: str | None = None,
    image_size: int,
    num_images: int,
    seed: int,
    max_shape_angle: float = MAX_SHAPE_ANGLE_DEG,
    max_texture_angle: float = MAX_TEXTURE_ANGLE_DEG,
) -> TrifeatureData:
  """Returns the split from the on-disk cache, generating and caching it on first use.

  The cache file
  ``<cache_dir>/trifeature_v{CACHE_VERSION}_{split}_seed{seed}_{image_size}px_n{num_images}.npz``
  (with ``_angle{a}`` before ``.npz`` when max_shape_angle a is not the default 45, then
  ``_tex{b}`` when max_texture_angle b is not the default 360)
  is written to a temporary file in the same directory and moved into place with os.replace, so
  an interrupted run never leaves a partial file under the final name. ``cache_dir`` defaults
  to $CL_JAX_CACHE if set, else ~/.cache/cl_jax/trifeature.
  """
  _check_args(split, image_size, num_images, seed)
  cache_dir = _default_cache_dir() if cache_dir is None else cache_dir
  angle = "" if max_shape_angle == MAX_SHAPE_ANGLE_DEG else f"_angle{max_shape_angle:g}"
  if max_texture_angle != MAX_TEXTURE_ANGLE_DEG:
    angle += f"_tex{max_texture_angle:g}"
  name = f"trifeature_v{CACHE_VERSION}_{split}_seed{seed}_{image_size}px_n{num_images}{angle}.npz"
  path = os.path.join(cache_dir, name)
  if os.path.exists(path):
    with np.load(path) as npz:
      return TrifeatureData(images=npz["images"], labels={k: npz[k] for k in FACTORS})

  data = generate(
      split,
      image_size=image_size,
      num_images=num_images,
      seed=seed,
      max_shape_angle=max_shape_angle,
      max_texture_angle=max_texture_angle,
  )
  os.makedirs(cache_dir, exist_ok=True)
  fd, tmp_path = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=cache_dir)
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez_compressed(f, images=data.images, **data.labels)
    os.replace(tmp_path, path)
  except BaseException:
    os.remove(tmp_path)
    raise
  return data


class TrifeatureSource:
  """Random-access source for grain: record i is
  {"image": (S, S, 3) uint8, "shape": int, "texture": int, "colour": int}."""

  def __init__(self, data: TrifeatureData):
    self._data = data

  def __len__(self) -> int:
    return len(self._data.images)

  def __getitem__(self, index: int) -> dict:
    index = int(index)
    if not 0 <= index < len(self):
      raise IndexError(f"index {index} out of range for a source of {len(self)} records.")
    record = {"image": self._data.images[index]}
    record.update({name: int(self._data.labels[name][index]) for name in FACTORS})
    return record

  @property
  def num_classes(self) -> dict[str, int]:
    return {name: len(FACTOR_VALUES[name]) for name in FACTORS}

  def __repr__(self) -> str:
    return f"TrifeatureSource(num_records={len(self)}, image_shape={self._data.images.shape[1:]})"
