"""The generated ImageNet-like JPEG folder of the input benchmark (cl_jax.bench.input).

`make_jpeg_folder` writes `<root>/<class>/<i>.JPEG` (10 classes, cached with a manifest):
widths 300-600 px, aspect ratios 3:4 to 4:3, smooth 1/f content with a few textured objects
(`natural_image`), PIL quality 90, so that the files are about as large as ImageNet's
(50-150 KB) and about as costly to decode.
"""

import concurrent.futures
import json
import math
import multiprocessing
import os
import shutil

import numpy as np
import PIL.Image
from PIL import ImageDraw, ImageFilter

from cl_jax.runtime.errors import UsageError

NUM_CLASSES = 10
FOLDER_VERSION = 1
MANIFEST = "folder.json"
QUALITY = 90
WIDTH_RANGE = (300, 600)  # pixels, uniform
ASPECT_RANGE = (3 / 4, 4 / 3)  # width / height, log-uniform


def default_root(num_images: int, seed: int) -> str:
  """The cached folder's default place: $CL_JAX_CACHE (else ~/.cache/cl_jax)/jpeg_folder_...."""
  home = os.path.join(os.path.expanduser("~"), ".cache", "cl_jax")
  cache = os.environ.get("CL_JAX_CACHE") or home
  return os.path.join(cache, f"jpeg_folder_v{FOLDER_VERSION}_seed{seed}_n{num_images}")


def class_names() -> list[str]:
  """The folder's class names, in label order."""
  return [f"class{c:02d}" for c in range(NUM_CLASSES)]


def image_path(root: str, i: int) -> str:
  """Image i's file: `<root>/class<i mod 10>/<i>.JPEG`."""
  return os.path.join(root, class_names()[i % NUM_CLASSES], f"{i:06d}.JPEG")


def _fields(rng: np.random.Generator, height: int, width: int, alphas) -> np.ndarray:
  """(len(alphas), height, width) float64 Gaussian fields with amplitude spectra 1/f^alpha (the
  power spectrum of natural images falls as about 1/f^2), each of zero mean and unit std."""
  fy = np.fft.fftfreq(height)[:, None]
  fx = np.fft.rfftfreq(width)[None, :]
  f = np.hypot(fy, fx)
  f[0, 0] = 1.0
  alphas = np.asarray(alphas, np.float64)[:, None, None]
  amplitude = f[None] ** -alphas
  amplitude[:, 0, 0] = 0.0
  shape = (len(alphas), height, width // 2 + 1)
  spectrum = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) * amplitude
  x = np.fft.irfft2(spectrum, s=(height, width), axes=(1, 2))
  return x / x.std(axis=(1, 2), keepdims=True)


def natural_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
  """A smooth natural-looking (height, width, 3) uint8 image: a 1/f luminance field with
  smoother, weaker colour fields on a random base colour, 2-6 soft-edged ellipses and polygons
  of their own colour and 1/f texture, and a little pixel noise (film grain)."""
  lum, cb, cr, tex_a, tex_b = _fields(
      rng, height, width, [rng.uniform(0.9, 1.2), 1.8, 1.8, rng.uniform(0.8, 1.5), 1.1]
  )
  img = rng.uniform(60, 190, 3) + 35 * lum[..., None]
  img += 12 * cb[..., None] * np.array([1.0, -0.5, -0.5])
  img += 12 * cr[..., None] * np.array([0.0, 1.0, -1.0])
  for n in range(int(rng.integers(2, 7))):
    mask = PIL.Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(mask)
    cy, cx = rng.uniform(0, height), rng.uniform(0, width)
    r = rng.uniform(0.1, 0.35) * min(height, width)
    if rng.random() < 0.5:
      ry = r * rng.uniform(0.5, 1.5)
      draw.ellipse([cx - r, cy - ry, cx + r, cy + ry], fill=255)
    else:
      k = int(rng.integers(3, 8))
      angle, radius = np.sort(rng.uniform(0, 2 * np.pi, k)), r * rng.uniform(0.5, 1.2, k)
      draw.polygon(list(zip(cx + radius * np.cos(angle), cy + radius * np.sin(angle))), fill=255)
    blurred = mask.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 2.5)))
    m = np.asarray(blurred, np.float64)[..., None] / 255.0
    texture = np.roll(tex_a if n % 2 == 0 else tex_b, int(rng.integers(0, height)), axis=0)
    obj = rng.uniform(20, 235, 3) + rng.uniform(10, 30) * texture[..., None]
    img = img * (1 - m) + obj * m
  img += rng.normal(0, 2.0, img.shape)
  return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def image_size(seed: int, i: int) -> tuple[int, int]:
  """(height, width) of image i: width ~ U{300..600}, aspect log-uniform in [3/4, 4/3]."""
  rng = np.random.default_rng([seed, i, 0])
  width = int(rng.integers(WIDTH_RANGE[0], WIDTH_RANGE[1] + 1))
  aspect = math.exp(rng.uniform(math.log(ASPECT_RANGE[0]), math.log(ASPECT_RANGE[1])))
  return round(width / aspect), width


def _write_image(args: tuple[str, int, int]) -> int:
  """Writes image i of the folder of `seed` under `root`; returns its file size in bytes."""
  root, seed, i = args
  height, width = image_size(seed, i)
  pixels = natural_image(np.random.default_rng([seed, i, 1]), height, width)
  path = image_path(root, i)
  PIL.Image.fromarray(pixels).save(path, "JPEG", quality=QUALITY)
  return os.path.getsize(path)


def _manifest(num_images: int, seed: int) -> dict:
  return {"version": FOLDER_VERSION, "num_images": num_images, "seed": seed, "quality": QUALITY}


def _is_complete(root: str, num_images: int, seed: int) -> bool:
  try:
    with open(os.path.join(root, MANIFEST)) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return False
  return {k: manifest.get(k) for k in _manifest(0, 0)} == _manifest(num_images, seed) and all(
      os.path.isfile(image_path(root, i)) for i in range(num_images)
  )


def make_jpeg_folder(root: str, num_images: int, seed: int, workers: int | None = None) -> str:
  """An ImageNet-like JPEG folder `<root>/class<c>/<i>.JPEG` (image i in class i mod 10) of
  `num_images` generated images (`natural_image` at `image_size(seed, i)`, PIL quality 90),
  reused when `root` already holds the complete folder of (num_images, seed).

  The folder is written beside `root` and moved into place once complete, with its manifest
  (folder.json), so an interrupted run leaves no partial folder under `root`. Images are
  written by `workers` processes (default: one per CPU; 0 or 1: in this process). Returns root.

  Raises:
    UsageError: `root` is a file, or a folder neither empty nor this one.
  """
  if num_images < 1:
    raise ValueError(f"num_images must be >= 1, got {num_images}")
  if os.path.exists(root) and not os.path.isdir(root):
    raise UsageError(f"{root!r} is a file; give a folder (new, or holding the generated images)")
  if _is_complete(root, num_images, seed):
    return root
  if os.path.isdir(root) and os.listdir(root):
    raise UsageError(
        f"{root!r} exists and does not hold the generated folder of {num_images} images of "
        f"seed {seed}: remove it or choose another folder"
    )
  partial = f"{root.rstrip(os.sep)}.partial-{os.getpid()}"
  shutil.rmtree(partial, ignore_errors=True)
  for name in class_names():
    os.makedirs(os.path.join(partial, name))
  jobs = [(partial, seed, i) for i in range(num_images)]
  if workers is None:
    workers = os.cpu_count() or 1
  try:
    if workers > 1 and num_images >= 64:
      context = multiprocessing.get_context("spawn")  # no fork of a process running JAX
      with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        list(pool.map(_write_image, jobs, chunksize=16))
    else:
      for job in jobs:
        _write_image(job)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  with open(os.path.join(partial, MANIFEST), "w") as f:
    json.dump(_manifest(num_images, seed), f)
  if os.path.isdir(root):
    os.rmdir(root)  # empty (checked above)
  os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
  os.rename(partial, root)
  return root
