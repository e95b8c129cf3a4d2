"""JPEGs of several sizes and encodings for the decoder tests (tests/test_fast_views.py,
tests/test_gpu_views.py): natural-looking content (cl_jax.bench.jpeg_folder.natural_image),
quality 90."""

import os

import numpy as np
import PIL.Image

from cl_jax.bench.jpeg_folder import natural_image


def write_jpegs(folder, sizes, subsamplings=(0, 1, 2)) -> list[str]:
  """Each (height, width) of `sizes` saved in `folder` with each chroma subsampling of
  `subsamplings` (PIL's 0: 4:4:4, 1: 4:2:2, 2: 4:2:0), baseline and progressive, and as
  greyscale and CMYK JPEGs; returns their paths."""
  paths = []
  for height, width in sizes:
    pixels = natural_image(np.random.default_rng([height, width]), height, width)
    image = PIL.Image.fromarray(pixels)
    for subsampling in subsamplings:
      for progressive in (False, True):
        path = os.path.join(folder, f"{height}_{subsampling}_{int(progressive)}.jpg")
        image.save(path, quality=90, subsampling=subsampling, progressive=progressive)
        paths.append(path)
    for mode in ("L", "CMYK"):
      path = os.path.join(folder, f"{height}_{mode}.jpg")
      image.convert(mode).save(path, quality=90)
      paths.append(path)
  return paths
