"""Geometric part of the MoCo-v2 "aug-plus" views: random resized crop and horizontal flip.

Runs on the host in the input pipeline, one example at a time, on full-resolution images of any
size (numpy + PIL only). Randomness is explicit: `sample_crop` draws every random choice into a
`CropParams`, and `apply_crop` is a deterministic function of the image and those parameters, so
other parts (DICR, texture negatives) can read or reuse them.

Sampling rule (RandomResizedCrop of the MoCo-v2 "aug-plus" views, Chen et al. 2020, "Improved
baselines with momentum contrastive learning"): the crop's area fraction
s ~ U(scale) and log aspect ratio log(r) ~ U(log ratio_min, log ratio_max); the box is
w = round(sqrt(s * H * W * r)), h = round(sqrt(s * H * W / r)) with r = w / h, placed uniformly
where it fits. Up to 10 attempts; if none fits, the whole image cropped centrally to the nearest
allowed aspect ratio.
"""

import dataclasses
import math

import numpy as np
from PIL import Image

_MAX_ATTEMPTS = 10


@dataclasses.dataclass(frozen=True)
class CropParams:
  """One view's geometric parameters.

  Attributes:
    box: (4,) float32 [y0, x0, y1, x1], the crop in source-pixel coordinates (integer-valued,
      end-exclusive, 0 <= y0 < y1 <= H, 0 <= x0 < x1 <= W).
    flip: whether the resized crop is mirrored left-right.
  """

  box: np.ndarray
  flip: bool


def _check_range(name: str, value, low_exclusive: float, high_inclusive: float | None) -> None:
  """Checks that `value` is an ordered pair (a, b) with low_exclusive < a <= b [<= high]."""
  if len(value) != 2:
    raise ValueError(f"{name} must be a pair (min, max), got {value!r}.")
  a, b = float(value[0]), float(value[1])
  if not low_exclusive < a <= b or (high_inclusive is not None and b > high_inclusive):
    upper = "" if high_inclusive is None else f" <= {high_inclusive}"
    raise ValueError(
        f"{name} must satisfy {low_exclusive} < min <= max{upper}, got {value!r}; "
        f"pass an ordered pair inside that range."
    )


def _check_image(image: np.ndarray) -> None:
  if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
    raise ValueError(
        f"image must be a numpy uint8 array, got {type(image).__name__} of dtype "
        f"{getattr(image, 'dtype', None)}; convert with np.asarray(image, np.uint8)."
    )
  if image.ndim != 3 or image.shape[-1] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
    raise ValueError(
        f"image must have shape (H, W, 3) with H, W >= 1, got {image.shape}; "
        f"expand grayscale images to three channels first."
    )


def _check_size(size: int) -> None:
  if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
    raise ValueError(f"size must be an integer >= 1, got {size!r}.")


def sample_crop(
    rng: np.random.Generator,
    height: int,
    width: int,
    *,
    scale: tuple[float, float] = (0.2, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip_prob: float = 0.5,
) -> CropParams:
  """Draws a RandomResizedCrop box and a horizontal flip for an image of shape (height, width).

  Args:
    rng: numpy generator; the draws are, in order, (area fraction, log aspect) per attempt, the
      box's top and left offset, then the flip.
    height, width: source image size in pixels (>= 1).
    scale: (min, max) fraction of the image area, 0 < min <= max <= 1.
    ratio: (min, max) aspect ratio width / height, 0 < min <= max.
    flip_prob: probability in [0, 1] of a left-right flip.

  Returns:
    CropParams with an integer-pixel box inside the image.
  """
  _check_size(height)
  _check_size(width)
  _check_range("scale", scale, 0.0, 1.0)
  _check_range("ratio", ratio, 0.0, None)
  if not 0.0 <= flip_prob <= 1.0:
    raise ValueError(f"flip_prob must be in [0, 1], got {flip_prob!r}.")

  area = height * width
  log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
  for _ in range(_MAX_ATTEMPTS):
    target_area = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(log_low, log_high))
    w = round(math.sqrt(target_area * aspect))
    h = round(math.sqrt(target_area / aspect))
    if 0 < w <= width and 0 < h <= height:
      y0 = int(rng.integers(0, height - h + 1))
      x0 = int(rng.integers(0, width - w + 1))
      break
  else:
    # No attempt fitted: the largest central box whose aspect ratio is clamped to `ratio`.
    image_aspect = width / height
    if image_aspect < ratio[0]:
      w, h = width, max(1, round(width / ratio[0]))
    elif image_aspect > ratio[1]:
      w, h = max(1, round(height * ratio[1])), height
    else:
      w, h = width, height
    y0, x0 = (height - h) // 2, (width - w) // 2
  flip = bool(rng.random() < flip_prob)
  return CropParams(box=np.array([y0, x0, y0 + h, x0 + w], np.float32), flip=flip)


def apply_crop(image: np.ndarray, params: CropParams, size: int) -> np.ndarray:
  """Crops `params.box` and resizes it to (size, size) in one antialiased bilinear PIL call.

  Args:
    image: (H, W, 3) uint8.
    params: box inside the image and flip flag, e.g. from `sample_crop`.
    size: output side in pixels (>= 1).

  Returns:
    (size, size, 3) uint8, mirrored left-right when params.flip.
  """
  _check_image(image)
  _check_size(size)
  box = np.asarray(params.box, np.float64)
  if box.shape != (4,):
    raise ValueError(f"params.box must have shape (4,) [y0, x0, y1, x1], got {box.shape}.")
  y0, x0, y1, x1 = box
  height, width = image.shape[:2]
  if not (0 <= y0 < y1 <= height and 0 <= x0 < x1 <= width):
    raise ValueError(
        f"params.box {box.tolist()} must satisfy 0 <= y0 < y1 <= {height} and "
        f"0 <= x0 < x1 <= {width} for an image of shape {image.shape}; sample it with "
        f"sample_crop(rng, {height}, {width})."
    )
  resized = Image.fromarray(image).resize(
      (size, size), resample=Image.Resampling.BILINEAR, box=(x0, y0, x1, y1)
  )
  out = np.asarray(resized)
  return np.ascontiguousarray(out[:, ::-1]) if params.flip else out


def eval_view(image: np.ndarray, size: int, crop_fraction: float) -> np.ndarray:
  """Evaluation view: resize the shorter side to round(size / crop_fraction), centre-crop size.

  With size=224, crop_fraction=0.875 this is the linear probe's Resize(256) +
  CenterCrop(224) of the MoCo evaluation protocol (He et al. 2020); crop_fraction=1.0 keeps
  small fixed-size images (CIFAR, STL) whole. The longer side keeps the aspect ratio,
  truncated to an integer; the resize is antialiased bilinear.

  Args:
    image: (H, W, 3) uint8.
    size: output side in pixels (>= 1).
    crop_fraction: fraction of the resized shorter side kept, in (0, 1].

  Returns:
    (size, size, 3) uint8.
  """
  _check_image(image)
  _check_size(size)
  if not 0.0 < crop_fraction <= 1.0:
    raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction!r}.")
  height, width = image.shape[:2]
  short = round(size / crop_fraction)
  if height <= width:
    new_h, new_w = short, short * width // height
  else:
    new_h, new_w = short * height // width, short
  resized = np.asarray(
      Image.fromarray(image).resize((new_w, new_h), resample=Image.Resampling.BILINEAR)
  )
  top = int(round((new_h - size) / 2.0))
  left = int(round((new_w - size) / 2.0))
  return np.ascontiguousarray(resized[top : top + size, left : left + size])
