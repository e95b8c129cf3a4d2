"""Image folders stored at a bounded resolution: each image whose longer side exceeds max_side is
resized to it (aspect kept) and stored as a JPEG of the given quality; the others are copied as
they are. A smaller store decodes faster (docs/benchmarks.md, "A store at bounded resolution"),
as FFCV's stores do; but the papers trained on the images as they are, and a bound near the
views' size makes most views upsampled crops of a smaller image.

  python -m cl_jax.data.bounded_folder --src=DIR --out=DIR2 --max_side=320 [--quality=90]

copies the image tree DIR (the layout data.name=folder reads: DIR/train/<class>/...,
DIR/val/<class>/..., or any tree) to DIR2 with the same relative paths. Images are resized by PIL
with its antialiased Lanczos filter. A resized image keeps its file name (a PNG resized is stored
as JPEG bytes under its name, which PIL and libjpeg-turbo read by content). DIR2/bounded.json
records max_side and quality; a stopped copy continues where it stopped (files already in DIR2
are kept), and a copy into a DIR2 that holds images stored otherwise is refused.
`python -m cl_jax.data.imagenet_folder --max_side=N` writes ImageNet(-100) bounded directly.
"""

import io
import json
import os
import sys

import PIL.Image
import tqdm
from absl import app, flags

from cl_jax.data import image_folder
from cl_jax.runtime import cli
from cl_jax.runtime.errors import UsageError

SETTINGS_FILE = "bounded.json"


def bounded(data: bytes, max_side: int, quality: int) -> bytes:
  """The image file bytes `data`, its longer side at most `max_side` pixels: unchanged where it
  is already (or max_side is 0), else resized (Lanczos, aspect kept, the longer side max_side,
  the shorter rounded, at least 1) and encoded as an RGB JPEG of `quality`."""
  if max_side <= 0:
    return data
  with PIL.Image.open(io.BytesIO(data)) as image:
    width, height = image.size
    longer = max(width, height)
    if longer <= max_side:
      return data
    size = (max(1, round(width * max_side / longer)), max(1, round(height * max_side / longer)))
    small = image.convert("RGB").resize(size, PIL.Image.Resampling.LANCZOS)
  out = io.BytesIO()
  small.save(out, format="JPEG", quality=quality)
  return out.getvalue()


def _describe(settings: dict) -> str:
  if not settings["max_side"]:
    return "as they are"
  return f"with --max_side={settings['max_side']} --quality={settings['quality']}"


def check_settings(out: str, max_side: int, quality: int) -> None:
  """Records the store's settings (max_side, 0 for images as they are, and quality) in
  OUT/bounded.json, or raises UsageError where OUT already holds images stored otherwise (an
  OUT with files and no record holds them as they are)."""
  settings = {"max_side": max_side, "quality": quality if max_side else None}
  path = os.path.join(out, SETTINGS_FILE)
  if os.path.exists(path):
    with open(path) as f:
      found = json.load(f)
  elif os.path.isdir(out) and os.listdir(out):
    found = {"max_side": 0, "quality": None}
  else:
    found = None
  if found is not None and found != settings:
    raise UsageError(
        f"{out} holds images stored {_describe(found)}, not {_describe(settings)}: give the "
        "same settings to continue it, or another --out"
    )
  if not os.path.exists(path):
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
      json.dump(settings, f)


def copy_folder(src: str, out: str, max_side: int, quality: int = 90) -> dict:
  """Copies the images under `src` to `out` (module docstring); returns {"images", "resized",
  "kept", "bytes_in", "bytes_out"} of the images this call wrote."""
  if not os.path.isdir(src):
    raise UsageError(f"--src={src} is not a folder")
  if max_side < 1 or not 1 <= quality <= 100:
    raise UsageError(
        f"--max_side must be at least 1 and --quality in 1..100, got {max_side} and {quality}"
    )
  check_settings(out, max_side, quality)
  files = sorted(
      os.path.relpath(os.path.join(d, n), src)
      for d, _, names in os.walk(src)
      for n in names
      if n.lower().endswith(image_folder.IMAGE_EXTENSIONS)
  )
  done = {"images": 0, "resized": 0, "kept": 0, "bytes_in": 0, "bytes_out": 0}
  for rel in tqdm.tqdm(files, desc="images", disable=not sys.stderr.isatty()):
    target = os.path.join(out, rel)
    if os.path.exists(target):
      continue
    with open(os.path.join(src, rel), "rb") as f:
      data = f.read()
    small = bounded(data, max_side, quality)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".part", "wb") as f:
      f.write(small)
    os.replace(target + ".part", target)  # a stopped copy leaves no partial image
    done["images"] += 1
    done["resized" if small is not data else "kept"] += 1
    done["bytes_in"] += len(data)
    done["bytes_out"] += len(small)
  return done


def main(argv):
  del argv
  f = flags.FLAGS
  with cli.report():
    cli.require(("src", "out", "max_side"), "cl_jax.data.bounded_folder")
    done = copy_folder(f.src, f.out, f.max_side, f.quality)
    print(
        f"wrote {done['images']} images to {f.out} ({done['resized']} resized to a longer side of "
        f"{f.max_side} px, {done['kept']} copied): {done['bytes_in'] / 1e6:.1f} MB -> "
        f"{done['bytes_out'] / 1e6:.1f} MB"
    )


if __name__ == "__main__":
  flags.DEFINE_string("src", None, "The image folder to copy.")
  flags.DEFINE_string("out", None, "The folder to write (the same relative paths).")
  flags.DEFINE_integer("max_side", None, "The longest side kept, in pixels.", lower_bound=1)
  flags.DEFINE_integer("quality", 90, "JPEG quality of the resized images.", lower_bound=1)
  app.run(main, flags_parser=cli.parse_flags)
