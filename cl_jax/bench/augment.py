"""Where should the photometric augmentation run? Prints img/s of each option.

python -m cl_jax.bench.augment [--size=224] [--batch=128]

  host crop      RandomResizedCrop + flip with PIL on one CPU core (what the
                 input pipeline does per view)
  host colour    the photometric ops with PIL on one CPU core (brightness,
                 contrast, saturation, grayscale, Gaussian blur; hue left out,
                 so this underestimates the host cost)
  device colour  cl_jax.data.photometric.augment_batch, jitted and batched on
                 the default JAX backend
"""

import time

import jax
import numpy as np
from absl import app, flags
from PIL import Image, ImageEnhance, ImageFilter

from cl_jax.data import geometric, photometric
from cl_jax.runtime import cli

_SIZE = flags.DEFINE_integer("size", 224, "View size in pixels.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch", 128, "Views per device batch.", lower_bound=1)


def _rate(fn, n: int) -> float:
  fn()
  t = time.perf_counter()
  for _ in range(n):
    fn()
  return n / (time.perf_counter() - t)


def main(argv):
  del argv
  size, batch = _SIZE.value, _BATCH.value
  rng = np.random.default_rng(0)
  source = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
  view = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)

  def host_crop():
    geometric.apply_crop(source, geometric.sample_crop(rng, 375, 500), size)

  def host_colour():
    im = Image.fromarray(view)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
      im = enhance(im).enhance(rng.uniform(0.6, 1.4))
    im = im.convert("L").convert("RGB").filter(ImageFilter.GaussianBlur(rng.uniform(0.1, 2)))
    np.asarray(im)

  spec = photometric.PhotometricSpec()
  views = jax.device_put(np.repeat(view[None], batch, axis=0))
  aug = jax.jit(lambda r, x: photometric.augment_batch(r, x, spec)[0])
  key = jax.random.key(0)

  def device_colour():
    aug(key, views).block_until_ready()

  print(f"view size {size}, backend {jax.default_backend()} ({jax.devices()[0].device_kind})")
  print(f"host crop      {_rate(host_crop, 200):10.0f} img/s per core")
  print(f"host colour    {_rate(host_colour, 200):10.0f} img/s per core")
  print(f"device colour  {batch * _rate(device_colour, 10):10.0f} img/s")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
