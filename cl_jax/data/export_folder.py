"""Write Trifeature images as a folder of image files, in the layout data.name=folder reads.

python -m cl_jax.data.export_folder --out=DIR [--label=shape] [--train=5000] [--val=1000]
    [--image_size=32] [--format=jpeg] [--seed=0]

DIR/train/<class>/<n>.jpg and DIR/val/<class>/<n>.jpg, the class being the image's value of
--label (shape, texture or colour; Trifeature's train and test splits, cl_jax.data.trifeature):
a labelled folder like a user's own, to try pretraining and the probe on image files
(cl_jax.data.folder_source) before pointing data.folder at real ones. Prints DIR when written.
"""

import os

import numpy as np
import PIL.Image
from absl import app, flags

from cl_jax.data import trifeature
from cl_jax.runtime import cli
from cl_jax.runtime.errors import UsageError

NAMES = {"shape": trifeature.SHAPES, "texture": trifeature.TEXTURES, "colour": trifeature.COLOURS}
FORMATS = {"jpeg": ("JPEG", ".jpg"), "png": ("PNG", ".png")}


def export(
    out: str,
    label: str,
    train: int,
    val: int,
    image_size: int,
    fmt: str = "jpeg",
    seed: int = 0,
) -> str:
  """Write the train and val splits under `out` (module docstring) and return `out`; an image
  already written is kept."""
  if label not in NAMES:
    raise UsageError(f"--label must be one of {', '.join(NAMES)}, got {label!r}")
  if fmt not in FORMATS:
    raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
  pil_format, extension = FORMATS[fmt]
  for split, source_split, count in (("train", "train", train), ("val", "test", val)):
    data = trifeature.load(source_split, image_size=image_size, num_images=count, seed=seed)
    for n, (image, value) in enumerate(zip(data.images, data.labels[label])):
      folder = os.path.join(out, split, NAMES[label][int(value)])
      path = os.path.join(folder, f"{n:06d}{extension}")
      if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        PIL.Image.fromarray(np.asarray(image, np.uint8)).save(path, format=pil_format, quality=95)
  return out


def _define_flags():
  flags.DEFINE_string("out", None, "Folder to write (train/ and val/ in it).", required=True)
  flags.DEFINE_enum("label", "shape", list(NAMES), "The factor whose values are the classes.")
  flags.DEFINE_integer("train", 5000, "Training images.", lower_bound=1)
  flags.DEFINE_integer("val", 1000, "Validation images.", lower_bound=1)
  flags.DEFINE_integer("image_size", 32, "Image side in pixels.", lower_bound=16)
  flags.DEFINE_enum("format", "jpeg", list(FORMATS), "Image file format.")
  flags.DEFINE_integer("seed", 0, "Trifeature's seed (its split of the combinations).")


def main(argv):
  del argv
  f = flags.FLAGS
  with cli.report():
    print(export(f.out, f.label, f.train, f.val, f.image_size, f.format, f.seed))


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
