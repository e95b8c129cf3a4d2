"""The decodings of the input benchmark (cl_jax.bench.input): exact, DCT-domain reduced, fast,
gpu.

`JpegSource` decodes each JPEG of the folder at full size (exact, as ImageFolderSource) or at
libjpeg's 1/2, 1/4 or 1/8 (`reduction`: the largest that keeps every possible crop at least
margin x the view's side); DECODES names the three decodings. Where simplejpeg and torch are
installed, `sources` adds "fast": full size by libjpeg-turbo, the views resampled by PyTorch
(data.decoder="fast", cl_jax.data.fast_views), and where JAX runs on a GPU with nvImageCodec
installed "gpu": the files' bytes read on the host, the crops decoded and resampled on the GPU
(data.decoder="gpu", cl_jax.data.gpu_views); each timed with `decoder_config`. `view_difference`
measures how far reduced decoding's views are from exact decoding's, and `decode_ms` the cost
of decoding at each reduction.
"""

import io
import math
import time

import numpy as np
import PIL.Image

from cl_jax.bench.jpeg_folder import class_names
from cl_jax.data import fast_views, geometric, gpu_views, image_folder

# The aspect-ratio range of the pipeline's crops (geometric.sample_crop's default, which
# pipeline.pretrain_dataset does not change).
CROP_RATIO = (3 / 4, 4 / 3)


def reduction(
    height: int,
    width: int,
    view_size: int,
    crop_scale: tuple[float, float],
    margin: float = 2.0,
    ratio: tuple[float, float] = CROP_RATIO,
) -> int:
  """The largest DCT-domain reduction k in (8, 4, 2, 1) of a (height, width) JPEG that keeps
  every random resized crop of the decoded image at least margin x view_size pixels on both
  sides.

  The decoded image is (ceil(height / k), ceil(width / k)) = (h, w). A crop of area fraction
  s >= crop_scale[0] and aspect r in `ratio` has its shorter side at least
  sqrt(crop_scale[0] h w q), q = min(r, 1/r) over the range's ends; the fallback crop (no
  attempt fitted) is the image clamped to the range, whose shorter side is min(h, w). Both must
  reach margin x view_size.
  """
  q = min(ratio[0], 1 / ratio[0], ratio[1], 1 / ratio[1])
  need = margin * view_size
  for k in (8, 4, 2):
    h, w = -(-height // k), -(-width // k)
    if min(h, w) >= need and math.sqrt(crop_scale[0] * h * w * q) >= need:
      return k
  return 1


class JpegSource(image_folder.ImageFolderSource):
  """ImageFolderSource (`source[i]` = {"image": (H, W, 3) uint8 RGB, "label": int}) that can
  decode each JPEG at reduced size.

  view_size None: exact decoding, as ImageFolderSource. view_size S: PIL's Image.draft lets
  libjpeg decode at 1/k of the size in the DCT domain, k = `reduction` of the header's size:
  the largest of 8, 4, 2, 1 at which the pipeline's smallest possible crop (area fraction
  crop_scale[0] at the extreme aspect ratio) still spans margin x S decoded pixels.

  Why per image and not per crop: the pipeline samples the crops after the source returns the
  image, from its shape, so the source must choose k before any crop is known, for all of
  them. A per-crop k (crops sampled from the header's size first) would reduce large crops
  further, but needs the crops sampled before decoding, outside pipeline.pretrain_dataset;
  and libjpeg's entropy decoding, which does not shrink with k, bounds what it could add
  (`decode_ms`: decoding at 1/8 costs about half of decoding at full size).

  Why a margin: with margin 1 no view is ever upsampled, but the DCT reduction is a
  prefilter of its own (at 1/8 a mean over 8 x 8 blocks, variance k^2 / 12 source pixels^2)
  that adds to the view's antialiased bilinear resize (a triangle of half-width
  r = crop side / S, variance r^2 / 6). r >= margin x k bounds the added variance to
  1 / (2 margin^2) of the resize's own: at most 50% (22% more blur width) with margin 1,
  12.5% (6%) with the default margin 2. `view_difference` measures the outcome. The crop
  boxes are then integer pixels of the reduced image, in its coordinates (the box keys of a
  batch are in decoded pixels; DICR, which reads them, depends on their ratios only).
  """

  def __init__(
      self,
      root: str,
      class_names: list[str],
      *,
      view_size: int | None = None,
      crop_scale: tuple[float, float] = (0.08, 1.0),
      margin: float = 2.0,
      fast: bool = False,
      gpu: bool = False,
  ):
    super().__init__(root, class_names)
    self.fast = fast  # decode by fast_views.decode (full size)
    self.gpu = gpu  # no decoding: the bytes and the header's size (gpu_views.jpeg_record)
    self.view_size = view_size
    self.crop_scale = tuple(crop_scale)
    self.margin = margin

  def reduction(self, width: int, height: int) -> int:
    """k of an image of this size (1 for exact decoding)."""
    if self.view_size is None:
      return 1
    return reduction(height, width, self.view_size, self.crop_scale, self.margin)

  def __getitem__(self, i: int) -> dict:
    if not 0 <= i < len(self):
      raise IndexError(f"index {i} out of range for a source of {len(self)} images")
    if self.fast:
      return {"image": fast_views.decode(self.files[i]), "label": int(self.labels[i])}
    if self.gpu:
      with open(self.files[i], "rb") as f:
        return {**gpu_views.jpeg_record(f.read(), self.files[i]), "label": int(self.labels[i])}
    with PIL.Image.open(self.files[i]) as image:
      width, height = image.size  # the header's: nothing is decoded yet
      k = self.reduction(width, height)
      if k > 1:
        image.draft("RGB", (max(1, width // k), max(1, height // k)))
      pixels = np.asarray(image.convert("RGB"), np.uint8)
    return {"image": pixels, "label": int(self.labels[i])}


# Decoding modes: the margin of JpegSource's reduction (None: exact decoding). "reduced" is
# the faithful default; "reduced-max" the largest reduction that never upsamples a view.
DECODES = {"exact": None, "reduced": 2.0, "reduced-max": 1.0}
# Decodings whose views stay close to exact decoding's ("fast": within one grey level but at
# a view's border, cl_jax.data.fast_views; "gpu": the fast path's within one grey level, but for
# the GPU decoder's rounding, cl_jax.data.gpu_views).
FAITHFUL = ("exact", "reduced", "fast", "gpu")


def sources(root: str, config) -> dict[str, JpegSource]:
  """A JpegSource of the folder `root` for each of DECODES, for `config`'s views, and "fast"
  where fast_views' packages are installed."""
  names = class_names()
  size, scale = config.data.image_size, tuple(config.data.crop_scale)
  out = {
      mode: (
          JpegSource(root, names)
          if margin is None
          else JpegSource(root, names, view_size=size, crop_scale=scale, margin=margin)
      )
      for mode, margin in DECODES.items()
  }
  if "fast" in decodings():
    out["fast"] = JpegSource(root, names, fast=True)
  if "gpu" in decodings():
    out["gpu"] = JpegSource(root, names, gpu=True)
  return out


def decodings() -> list[str]:
  """The decodings `sources` gives here: DECODES, "fast" where simplejpeg and torch are
  installed, "gpu" where gpu_views can run (nvImageCodec installed, JAX on a GPU)."""
  return (
      list(DECODES)
      + ([] if fast_views.missing_packages() else ["fast"])
      + ([] if gpu_views.unavailable() else ["gpu"])
  )


def decoder_config(config, mode: str):
  """`config` with the data.decoder of decoding `mode` ("fast" and "gpu" their own, else
  "pil")."""
  config = config.copy_and_resolve_references()
  config.data.decoder = mode if mode in ("fast", "gpu") else "pil"
  return config


def reduces(source: JpegSource) -> bool:
  """Whether `source` decodes any of its images at reduced size (from the files' headers)."""
  for path in source.files:
    with PIL.Image.open(path) as image:
      if source.reduction(*image.size) > 1:
        return True
  return False


def _exact_view(image: np.ndarray, box, size: int) -> np.ndarray:
  return geometric.apply_crop(image, geometric.CropParams(np.float32(box), False), size)


def _moved_by_one_pixel(box: np.ndarray, height: int, width: int) -> np.ndarray | None:
  """`box` [y0, x0, y1, x1] moved by one pixel down, up, right or left (the first that stays
  inside the image), or None for a box that spans the whole image."""
  for axis, limit in ((0, height), (1, width)):
    for step in (1.0, -1.0):
      moved = box.astype(np.float64).copy()
      moved[[axis, axis + 2]] += step
      if moved[axis] >= 0 and moved[axis + 2] <= limit:
        return moved
  return None


def view_difference(exact: JpegSource, reduced: JpegSource, indices, seed: int = 0) -> dict:
  """How far reduced decoding's views are from exact decoding's, over the images `indices`.

  One random resized crop per image is sampled on the reduced image (as the pipeline samples
  it), its box scaled to the exact image's pixels, and both are resized to the view size
  (geometric.apply_crop, no flip). Returns mean_abs (the views' mean absolute difference in
  grey levels), mean_reduction (the mean linear reduction) and shift_1px (for scale: the mean
  absolute difference between the exact view and the exact view of its box moved by one
  source pixel, `_moved_by_one_pixel`; None where every box spans its whole image).
  """
  rng = np.random.default_rng(seed)
  size = reduced.view_size
  diffs, factors, shifts = [], [], []
  for i in indices:
    small, full = reduced[i]["image"], exact[i]["image"]
    params = geometric.sample_crop(rng, small.shape[0], small.shape[1], scale=reduced.crop_scale)
    scale = np.array([full.shape[0] / small.shape[0], full.shape[1] / small.shape[1]] * 2)
    box = np.minimum(params.box * scale, [full.shape[0], full.shape[1]] * 2)
    view = _exact_view(full, box, size).astype(np.float64)
    diffs.append(np.abs(_exact_view(small, params.box, size) - view).mean())
    moved = _moved_by_one_pixel(box, full.shape[0], full.shape[1])
    if moved is not None:
      shifts.append(np.abs(_exact_view(full, moved, size) - view).mean())
    factors.append(full.shape[1] / small.shape[1])
  return {
      "mean_abs": round(float(np.mean(diffs)), 3),
      "mean_reduction": round(float(np.mean(factors)), 2),
      "shift_1px": round(float(np.mean(shifts)), 3) if shifts else None,
  }


def decode_ms(files: list[str], factors=(1, 2, 4, 8)) -> dict[int, float]:
  """Mean ms per image of PIL's decoding of `files` (read into memory first) at 1/k size."""
  data = []
  for path in files:
    with open(path, "rb") as f:
      data.append(f.read())
  out = {}
  for k in factors:
    start = time.perf_counter()
    for blob in data:
      with PIL.Image.open(io.BytesIO(blob)) as image:
        if k > 1:
          image.draft("RGB", (image.size[0] // k, image.size[1] // k))
        image.convert("RGB").load()
    out[k] = round(1e3 * (time.perf_counter() - start) / len(data), 3)
  return out
