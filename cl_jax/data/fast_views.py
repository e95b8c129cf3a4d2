"""The fast CPU path for image files (``data.decoder="fast"``): JPEGs decoded by libjpeg-turbo
called directly, views resampled by a vectorised antialiased bilinear resize.

The default path (``data.decoder="pil"``) decodes with PIL and cuts each view with PIL's resize
of a box of the image (cl_jax.data.image_folder.decode, cl_jax.data.geometric.apply_crop). On one
core of a 2-core AMD EPYC (Zen 4), an ImageNet-size JPEG costs about 1.6 ms to decode and each
of its two 224 px views 1.1 ms to resample there (docs/benchmarks.md, "JPEG end to end"). This
path does the same work with two libraries that do it faster (2.1-2.3 times the images per core
there):

- decoding: ``simplejpeg`` (libjpeg-turbo's TurboJPEG API, accurate integer IDCT and smooth
  chroma upsampling, as PIL configures libjpeg-turbo): the same pixels as PIL's decode (a CMYK
  JPEG, which TurboJPEG converts to RGB by its own rounding, within one grey level). Files that
  are not JPEGs (PNG), and JPEGs that TurboJPEG refuses, are decoded by PIL.
- resampling: PyTorch's antialiased bilinear resize of uint8 images (``torch.nn.functional.
  interpolate(..., antialias=True)``, the triangle filter widened by the scale factor, as PIL's
  BILINEAR), vectorised over the channels of a channels-last image: about 4 times PIL's speed.
  It resizes the crop (as torchvision's ``resized_crop`` does), where PIL's resize of a box also
  reads the pixels just outside the box for the filter's support: the views agree within one
  grey level (0.02 on average) but in a view's outermost 1 + ceil(upscale factor) rows and
  columns, where they can differ by more, and at a rare interior pixel (fewer than one in a
  million of ImageNet-size views) by 2, the two kernels' fixed-point roundings
  (tests/test_fast_views.py measures both on JPEGs of several sizes and subsamplings).

Not used, measured (docs/benchmarks.md): libjpeg-turbo's DCT-domain scaling (decoding at M/8 of
the size where both views' crops allow) changed the views by 1.6 grey levels on average; its
fast IDCT and fast chroma upsampling gain 4% and change them by 1.

simplejpeg is in requirements.txt; PyTorch is optional (INSTALL; its CPU build is enough): the
config check names what is missing in one line (missing_packages).
"""

import numpy as np

from cl_jax.data import geometric, image_folder

DECODERS = ("pil", "fast", "gpu")  # "gpu": cl_jax.data.gpu_views
INSTALL = "pip install simplejpeg torch --extra-index-url https://download.pytorch.org/whl/cpu"
_JPEG_MAGIC = b"\xff\xd8"


def missing_packages() -> list[str]:
  """The packages of this path that cannot be imported (simplejpeg, torch)."""
  missing = []
  for name in ("simplejpeg", "torch"):
    try:
      __import__(name)
    except ImportError:
      missing.append(name)
  return missing


def decode(path: str) -> np.ndarray:
  """The image file `path` as (H, W, 3) uint8 RGB (decode_data of its bytes)."""
  with open(path, "rb") as f:
    return decode_data(f.read(), path)


def decode_data(data: bytes, path: str) -> np.ndarray:
  """The bytes `data` of the image file `path` as (H, W, 3) uint8 RGB: a JPEG by simplejpeg,
  anything else (or a JPEG simplejpeg refuses: a damaged file) by image_folder.decode(path),
  which raises one of image_folder.DECODE_ERRORS for an unreadable file."""
  import simplejpeg

  if data[:2] == _JPEG_MAGIC:
    try:
      return simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ValueError:
      pass
  return image_folder.decode(path)


def apply_crop(image: np.ndarray, params: geometric.CropParams, size: int) -> np.ndarray:
  """The crop `params.box` (integer pixels, from geometric.sample_crop) of `image` resized to
  (size, size) by antialiased bilinear resampling, mirrored left-right when params.flip.

  Args:
    image: (H, W, 3) uint8.
    params: box [y0, x0, y1, x1] inside the image, with integer coordinates, and the flip.
    size: output side in pixels.

  Returns:
    (size, size, 3) uint8: geometric.apply_crop's view to within one grey level but at its
    border (module docstring).
  """
  import torch

  if torch.get_num_threads() != 1:
    torch.set_num_threads(1)  # one view is too small to share; the cores run the step
  y0, x0, y1, x1 = (int(v) for v in np.asarray(params.box))
  height, width = image.shape[:2]
  if not (0 <= y0 < y1 <= height and 0 <= x0 < x1 <= width) or not np.array_equal(
      params.box, np.asarray([y0, x0, y1, x1], np.float32)
  ):
    raise ValueError(
        f"params.box {np.asarray(params.box).tolist()} must hold integers with "
        f"0 <= y0 < y1 <= {height} and 0 <= x0 < x1 <= {width}; sample it with "
        f"sample_crop(rng, {height}, {width})"
    )
  # A writable copy of the crop (a copy of rows, unlike a mirrored one) as a channels-last
  # (1, 3, h, w) tensor, the layout of the vectorised uint8 kernel, which writes its output
  # channels-last too: (1, size, size, 3) in memory.
  batch = torch.from_numpy(np.array(image[y0:y1, x0:x1]))[None].permute(0, 3, 1, 2)
  out = torch.nn.functional.interpolate(
      batch, size=(size, size), mode="bilinear", antialias=True, align_corners=False
  )
  if params.flip:
    out = out.flip(3)
  return out.permute(0, 2, 3, 1)[0].numpy()
