"""Image quilting (Efros & Freeman 2001) for the texture-based negatives of Ge et al. (2021).

Ge et al. (2021, "Robust Contrastive Learning Using Negative Samples with Diminished Semantics",
Sec. 2.2) build a texture version of every training image with a non-parametric example-based
texture synthesiser fed two exemplar patches of the image, one centred and one at a random
position: the texture keeps the image's local colour and texture statistics but not its global
layout (shape). The synthesiser here is image quilting (Efros & Freeman 2001, "Image quilting for
texture synthesis and transfer", SIGGRAPH), the patch-based member of the Efros-Leung /
Wei-Levoy family:

  * square patches of `patch` pixels are placed in raster order, `patch - overlap` pixels apart,
    so each overlaps the patch on its left and the one above it by `overlap` pixels;
  * the candidates are all patch-sized windows of all exemplars; the first patch is drawn
    uniformly among them, every later one uniformly among the candidates whose overlap error
    (sum of squared differences with the pixels already placed in its left and top overlap) is
    at most (1 + tolerance) times the smallest;
  * the new patch replaces the placed pixels on its side of the minimum-error boundary cut: the
    cheapest 8-connected path through the squared-difference surface of the overlap, found by
    dynamic programming (one path down the left overlap, one across the top overlap).

The overlap errors of all candidates of an exemplar come from FFT cross-correlations; the inputs
are uint8, so every error is an integer and rounding makes them exact.
"""

import math
from collections.abc import Sequence

import numpy as np

# Exemplar sides of Ge et al. (2021): 96 px "when image size allows", otherwise 48 px.
EXEMPLAR_SIDES = (96, 48)
MIN_IMAGE_SIDE = 8
EXEMPLAR_RULE = (
    "two square exemplars of side s, one centred and one at a uniformly random position: "
    "s = 96 if the shorter image side is >= 192, 48 if >= 96, else half the shorter side; "
    "image quilting with patch = max(3, s // 4) and overlap = max(1, round(patch / 6)), "
    "tolerance 0.1"
)
DEFAULT_TOLERANCE = 0.1


def exemplar_size(height: int, width: int) -> int:
  """Side in pixels of the two square exemplars cut from a (height, width) image.

  96 px when the shorter side is at least 192 px, 48 px when it is at least 96 px (Ge et al.
  2021 use 96 px "when image size allows, otherwise 48"); smaller images (CIFAR, the 32 px
  Trifeature images) get half the shorter side, rounded down. The exemplar is thus at most half
  the shorter side, so the randomly placed one can show parts of the image the centred one
  misses.

  Raises:
    ValueError: the shorter side is below MIN_IMAGE_SIDE (8) pixels.
  """
  short = min(int(height), int(width))
  if short < MIN_IMAGE_SIDE:
    raise ValueError(
        f"texture synthesis needs images of at least {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE} pixels, "
        f"got {height}x{width}."
    )
  for side in EXEMPLAR_SIDES:
    if short >= 2 * side:
      return side
  return short // 2


def default_patch(exemplar_side: int) -> int:
  """Quilting patch side for exemplars of side `exemplar_side`: max(3, exemplar_side // 4)
  (24 px for 96 px exemplars, 12 px for 48 px, 4 px for the 16 px exemplars of 32 px images)."""
  return max(3, exemplar_side // 4)


def default_overlap(patch: int) -> int:
  """Overlap of neighbouring patches: max(1, round(patch / 6)), the 1/6 of Efros & Freeman."""
  return max(1, round(patch / 6))


def _check_image(name: str, image: np.ndarray) -> None:
  if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
    raise ValueError(
        f"{name} must be a numpy uint8 array, got {type(image).__name__} of dtype "
        f"{getattr(image, 'dtype', None)}."
    )
  if image.ndim != 3 or image.shape[-1] != 3:
    raise ValueError(f"{name} must have shape (H, W, 3), got {image.shape}.")


def exemplars(
    image: np.ndarray, rng: np.random.Generator, size: int
) -> tuple[np.ndarray, np.ndarray]:
  """The two exemplar patches of Ge et al. (2021, Sec. 2.2): one centred, one at random.

  Args:
    image: (H, W, 3) uint8 with H, W >= size.
    rng: draws the random patch's top-left corner, uniform over the positions where it fits
      (one `integers` call for the row, then one for the column).
    size: exemplar side in pixels, e.g. `exemplar_size(H, W)`.

  Returns:
    (centred, random), each a (size, size, 3) uint8 copy; the centred one starts at row
    (H - size) // 2 and column (W - size) // 2.
  """
  _check_image("image", image)
  height, width = image.shape[:2]
  if int(size) != size or not 1 <= size <= min(height, width):
    raise ValueError(
        f"exemplar size must be an integer in [1, {min(height, width)}] for an image of shape "
        f"{image.shape}, got {size!r}."
    )
  top, left = (height - size) // 2, (width - size) // 2
  y = int(rng.integers(0, height - size + 1))
  x = int(rng.integers(0, width - size + 1))
  return (
      image[top : top + size, left : left + size].copy(),
      image[y : y + size, x : x + size].copy(),
  )


def min_error_boundary(errors: np.ndarray) -> np.ndarray:
  """Minimum-error boundary cut through an overlap (Efros & Freeman 2001, Sec. 2.1).

  Dynamic programming over E[i, j] = e[i, j] + min(E[i-1, j-1], E[i-1, j], E[i-1, j+1]), then
  back-tracking from the cheapest end.

  Args:
    errors: (L, O) float error surface e, one row per step along the seam (O >= 1 columns).

  Returns:
    (L,) int64 path: path[i] is the column of row i, |path[i+1] - path[i]| <= 1, and
    sum_i errors[i, path[i]] is the smallest over all such paths.
  """
  errors = np.asarray(errors, np.float64)
  if errors.ndim != 2 or 0 in errors.shape:
    raise ValueError(f"errors must be a non-empty (L, O) array, got shape {errors.shape}.")
  length, width = errors.shape
  cost = errors.copy()
  previous = np.full(width + 2, np.inf)  # row i - 1 between infinite borders
  for i in range(1, length):
    previous[1:-1] = cost[i - 1]
    cost[i] += np.minimum(np.minimum(previous[:-2], previous[1:-1]), previous[2:])
  rows = cost.tolist()
  j = min(range(width), key=rows[-1].__getitem__)
  path = [j]
  for row in reversed(rows[:-1]):
    j = min(range(max(j - 1, 0), min(j + 2, width)), key=row.__getitem__)
    path.append(j)
  return np.array(path[::-1], np.int64)


def _new_side(old: np.ndarray, new: np.ndarray, top: bool, left: bool, overlap: int) -> np.ndarray:
  """(B, B) bool, True where the new patch replaces the placed pixels: on its side of the
  boundary cut of the left overlap (if `left`) and of the top overlap (if `top`).

  old, new: (B, B, 3) float64 placed pixels and new patch; path columns go to the new patch.
  """
  side = old.shape[0]
  index = np.arange(side)
  take = np.ones((side, side), bool)
  if left:
    path = min_error_boundary(((old[:, :overlap] - new[:, :overlap]) ** 2).sum(-1))
    take &= index[None, :] >= path[:, None]
  if top:
    path = min_error_boundary(((old[:overlap] - new[:overlap]) ** 2).sum(-1).T)
    take &= index[:, None] >= path[None, :]
  return take


class _Candidates:
  """All (patch, patch) windows of K exemplars of one shape, and their overlap errors.

  Attributes:
    pixels: (K, h, w, 3) uint8 exemplars.
    count: number of windows, K * (h - patch + 1) * (w - patch + 1), in row-major order of
      (exemplar, top, left).
  """

  def __init__(self, exemplars: np.ndarray, patch: int):
    self.pixels = exemplars
    self.patch = patch
    self.shape = exemplars.shape[1:3]
    self.valid = (self.shape[0] - patch + 1, self.shape[1] - patch + 1)
    self.count = len(exemplars) * self.valid[0] * self.valid[1]
    values = exemplars.astype(np.float64)
    self._spectrum = np.fft.rfft2(values, axes=(1, 2))  # (K, h, w // 2 + 1, 3)
    self._energy_spectrum = np.fft.rfft2((values * values).sum(-1))  # (K, h, w // 2 + 1)
    self._energy = {}

  def _correlate(self, spectrum: np.ndarray, template: np.ndarray) -> np.ndarray:
    """(K, valid rows, valid columns) sums of exemplar x template over every window: the
    cross-correlation where the template lies inside the exemplar (no FFT wrap-around).

    spectrum: (K, h, w // 2 + 1[, 3]) exemplar spectra; template: (B, B[, 3]), channels summed.
    """
    product = spectrum * np.conj(np.fft.rfft2(template, s=self.shape, axes=(0, 1)))
    if product.ndim == 4:
      product = product.sum(-1)
    return np.fft.irfft2(product, s=self.shape)[:, : self.valid[0], : self.valid[1]]

  def errors(self, placed: np.ndarray, mask: np.ndarray, key: tuple[bool, bool]) -> np.ndarray:
    """(count,) float64 SSD of every window with `placed` over `mask` (exact integers).

    placed: (B, B, 3) float64 canvas pixels; mask: (B, B) float64 0/1 overlap region, the same
    for the same `key` (top, left).
    """
    if key not in self._energy:
      self._energy[key] = self._correlate(self._energy_spectrum, mask)
    template = placed * mask[..., None]
    cross = self._correlate(self._spectrum, template)
    ssd = self._energy[key] - 2.0 * cross + (template * template).sum()
    return np.maximum(np.rint(ssd), 0.0).ravel()

  def window(self, index: int) -> np.ndarray:
    """(B, B, 3) uint8 window `index` (row-major over exemplar, top, left)."""
    k, rest = divmod(int(index), self.valid[0] * self.valid[1])
    y, x = divmod(rest, self.valid[1])
    return self.pixels[k, y : y + self.patch, x : x + self.patch]


def synthesize(
    exemplars: Sequence[np.ndarray],
    height: int,
    width: int,
    rng: np.random.Generator,
    *,
    patch: int | None = None,
    overlap: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> np.ndarray:
  """Image quilting (Efros & Freeman 2001) of a (height, width) texture from the exemplars.

  Args:
    exemplars: one or more (h, w, 3) uint8 images, each at least patch x patch; every
      patch-sized window of every exemplar is a candidate (exemplars of one shape are searched
      in one batch of FFTs).
    height, width: output size in pixels (>= 1).
    rng: draws the candidate of every patch (one `integers` call per patch, raster order).
    patch: patch side in pixels; default `default_patch(s)` with s the smallest exemplar side.
    overlap: overlap of neighbouring patches, in [1, patch); default `default_overlap(patch)`.
    tolerance: candidates whose overlap error is <= (1 + tolerance) x the best are equally
      likely (0.1 in Efros & Freeman).

  Returns:
    (height, width, 3) uint8: patch (r, c) is placed at row r * (patch - overlap), column
    c * (patch - overlap) of a canvas cropped to (height, width) at the bottom and right.
  """
  if not exemplars:
    raise ValueError("synthesize needs at least one exemplar.")
  for k, exemplar in enumerate(exemplars):
    _check_image(f"exemplars[{k}]", exemplar)
  smallest = min(min(e.shape[:2]) for e in exemplars)
  patch = default_patch(smallest) if patch is None else patch
  overlap = default_overlap(patch) if overlap is None else overlap
  if int(patch) != patch or not 2 <= patch <= smallest:
    raise ValueError(
        f"patch must be an integer in [2, {smallest}] (the smallest exemplar side), got {patch!r}."
    )
  if int(overlap) != overlap or not 1 <= overlap < patch:
    raise ValueError(f"overlap must be an integer in [1, patch={patch}), got {overlap!r}.")
  for name, value in (("height", height), ("width", width)):
    if int(value) != value or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
  if not tolerance >= 0:
    raise ValueError(f"tolerance must be >= 0, got {tolerance!r}.")

  shapes = list(dict.fromkeys(e.shape for e in exemplars))
  candidates = [
      _Candidates(np.stack([e for e in exemplars if e.shape == shape]), patch) for shape in shapes
  ]
  offsets = np.cumsum([0] + [c.count for c in candidates])
  step = patch - overlap
  rows = max(1, math.ceil((height - overlap) / step))
  cols = max(1, math.ceil((width - overlap) / step))
  canvas = np.zeros((rows * step + overlap, cols * step + overlap, 3), np.uint8)
  for r in range(rows):
    for c in range(cols):
      top, left = r > 0, c > 0
      y, x = r * step, c * step
      placed = canvas[y : y + patch, x : x + patch].astype(np.float64)
      if top or left:
        mask = np.zeros((patch, patch))
        mask[:overlap] = top
        mask[:, :overlap] = np.maximum(mask[:, :overlap], left)
        errors = np.concatenate([cand.errors(placed, mask, (top, left)) for cand in candidates])
        allowed = np.flatnonzero(errors <= (1.0 + tolerance) * errors.min())
        choice = int(allowed[rng.integers(len(allowed))])
      else:
        choice = int(rng.integers(offsets[-1]))
      k = int(np.searchsorted(offsets, choice, side="right")) - 1
      new = candidates[k].window(choice - offsets[k])
      if top or left:
        take = _new_side(placed, new.astype(np.float64), top, left, overlap)
        new = np.where(take[..., None], new, canvas[y : y + patch, x : x + patch])
      canvas[y : y + patch, x : x + patch] = new
  return canvas[:height, :width].copy()


def texture_image(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """The texture version of `image` (Ge et al. 2021, Sec. 2.2), by EXEMPLAR_RULE.

  Args:
    image: (H, W, 3) uint8 with min(H, W) >= MIN_IMAGE_SIDE.
    size: output side in pixels (>= 1).
    rng: draws the random exemplar's position, then the quilting's patches.

  Returns:
    (size, size, 3) uint8 quilted from the centred and the random exemplar of side
    `exemplar_size(H, W)` with the default patch and overlap.
  """
  _check_image("image", image)
  return synthesize(list(exemplars(image, rng, exemplar_size(*image.shape[:2]))), size, size, rng)
