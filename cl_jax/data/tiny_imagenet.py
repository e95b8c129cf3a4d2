"""Tiny-ImageNet (200 classes, 64 px; 100,000 training and 10,000 validation images) as a TFDS
dataset, prepared once from the official archive tiny-imagenet-200.zip, which TFDS's catalog
does not hold:

  python -m cl_jax.data.tiny_imagenet --zip=tiny-imagenet-200.zip --data_dir=DIR

writes DIR/tiny_imagenet/1.0.0 as ArrayRecord. Labels are the WordNet ids of wnids.txt in sorted
order; the unlabelled test split is left out. Importing `register()` defines the TFDS builder
(and imports TensorFlow), so only runs that read Tiny-ImageNet pay for it.
"""

import functools
import io
import os
import sys
import zipfile

import numpy as np
from absl import app, flags

NAME = "tiny_imagenet"
ARCHIVE = "tiny-imagenet-200.zip"
URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_ROOT = "tiny-imagenet-200/"


def read_archive(path: str):
  """The labelled examples of the archive: (sorted wnids, {split: [(key, image, wnid)]}) with
  split "train" (train/<wnid>/images/*.JPEG) and "validation" (val/images, labelled by
  val/val_annotations.txt); images are (64, 64, 3) uint8, grayscale ones converted to RGB."""
  from PIL import Image  # pylint: disable=import-outside-toplevel

  def decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

  with zipfile.ZipFile(path) as archive:
    names = set(archive.namelist())
    wnids = sorted(archive.read(_ROOT + "wnids.txt").decode().split())
    train = []
    for wnid in wnids:
      prefix = f"{_ROOT}train/{wnid}/images/"
      for name in sorted(n for n in names if n.startswith(prefix) and n.endswith(".JPEG")):
        train.append((name, decode(archive.read(name)), wnid))
    validation = []
    for line in archive.read(_ROOT + "val/val_annotations.txt").decode().splitlines():
      if line.strip():
        filename, wnid = line.split("\t")[:2]
        name = f"{_ROOT}val/images/{filename}"
        validation.append((name, decode(archive.read(name)), wnid))
  return wnids, {"train": train, "validation": validation}


@functools.cache
def register():
  """Define (once per process) and return the TFDS builder class of `tiny_imagenet`."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  class TinyImagenet(tfds.core.GeneratorBasedBuilder):
    """Tiny-ImageNet from the manually downloaded tiny-imagenet-200.zip."""

    VERSION = tfds.core.Version("1.0.0")
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"Place {ARCHIVE} (from {URL}) in the manual_dir."

    def _info(self):
      return self.dataset_info_from_configs(
          features=tfds.features.FeaturesDict(
              {
                  "image": tfds.features.Image(shape=(64, 64, 3)),
                  "label": tfds.features.ClassLabel(num_classes=200),
              }
          ),
          supervised_keys=("image", "label"),
          homepage="https://www.kaggle.com/c/tiny-imagenet",
      )

    def _split_generators(self, dl_manager):
      path = os.path.join(dl_manager.manual_dir, ARCHIVE)
      if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
      wnids, splits = read_archive(path)
      label = {w: i for i, w in enumerate(wnids)}
      return {split: self._generate_examples(examples, label) for split, examples in splits.items()}

    def _generate_examples(self, examples, label):
      for key, image, wnid in examples:
        yield key, {"image": image, "label": label[wnid]}

  return TinyImagenet


def prepare(archive: str, data_dir: str) -> str:
  """Build the dataset from `archive` into `data_dir` as ArrayRecord; returns its directory."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  if not os.path.isfile(archive):
    raise FileNotFoundError(f"{archive} not found: download {ARCHIVE} from {URL}")
  builder = register()(data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
          manual_dir=os.path.dirname(os.path.abspath(archive))
      )
  )
  return str(builder.data_path)


_ZIP = flags.DEFINE_string("zip", None, f"Path of {ARCHIVE}.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data_dir to write the dataset into.")


def main(argv):
  del argv
  if not _ZIP.value or not _DATA_DIR.value:
    sys.exit(f"error: give --zip=<path of {ARCHIVE}> and --data_dir=<TFDS data_dir>")
  if os.path.basename(_ZIP.value) != ARCHIVE:
    sys.exit(f"error: --zip must be the official {ARCHIVE}, got {_ZIP.value}")
  try:
    print(prepare(_ZIP.value, _DATA_DIR.value))
  except FileNotFoundError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main)
