"""Labelled images read from a folder of class folders, as a grain source.

`ImageFolderSource(root, class_names)` reads `<root>/<class name>/<image file>` (the layout of
torchvision's ImageFolder and of the released ImageNet-R, -A, -Sketch, Stylized-ImageNet and,
one folder per corruption and severity, ImageNet-C): a picklable random-access source like
`tfds_source.TfdsSource`, whose label is the position of the image's class in `class_names`.
Class folders not in `class_names` are skipped, which is how a dataset is restricted to the
classes a model knows. Images are decoded with PIL (no TensorFlow).
"""

import os
from typing import Any

import numpy as np
import PIL.Image

from cl_jax.data.tfds_source import DatasetNotFoundError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def _class_files(root: str, class_name: str) -> list[str]:
  """Sorted image files of `<root>/<class_name>/` (no files if the folder is absent)."""
  folder = os.path.join(root, class_name)
  if not os.path.isdir(folder):
    return []
  names = sorted(os.listdir(folder))
  return [os.path.join(folder, n) for n in names if n.lower().endswith(IMAGE_EXTENSIONS)]


class ImageFolderSource:
  """Random-access source over the images `<root>/<class>/*.{jpg,jpeg,png}` (any case).

  `source[i]` is {"image": (H, W, 3) uint8 RGB, "label": int}, the label being the position
  of the image's class folder in `class_names`; images are ordered by class, then file name.
  Pickling carries the file list, not the images.
  """

  def __init__(self, root: str, class_names: list[str]):
    """Args: `root` the folder of class folders; `class_names` the C classes kept, in label
    order (folders of other classes are skipped).

    Raises:
      DatasetNotFoundError: `root` is not a folder, or holds no image of `class_names`.
    """
    if not os.path.isdir(root):
      raise DatasetNotFoundError(
          f"image folder {root!r} does not exist: expected <root>/<class>/<image>.jpg"
      )
    self.root = root
    self.class_names = list(class_names)
    self.files, labels = [], []
    for label, name in enumerate(self.class_names):
      files = _class_files(root, name)
      self.files.extend(files)
      labels.extend([label] * len(files))
    self.labels = np.asarray(labels, np.int64)
    if not self.files:
      found = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))
      raise DatasetNotFoundError(
          f"no images of the {len(self.class_names)} classes ({', '.join(self.class_names[:3])}"
          f"{', ...' if len(self.class_names) > 3 else ''}) in {root!r}: expected "
          f"<root>/<class>/<image> with extensions {', '.join(IMAGE_EXTENSIONS)} (any case); "
          f"found the folders {found[:5]}{' ...' if len(found) > 5 else ''}"
      )

  @property
  def num_classes(self) -> dict[str, int]:
    return {"label": len(self.class_names)}

  def __len__(self) -> int:
    return len(self.files)

  def __getitem__(self, i: int) -> dict[str, Any]:
    if not 0 <= i < len(self):
      raise IndexError(f"index {i} out of range for a source of {len(self)} images")
    with PIL.Image.open(self.files[i]) as image:
      pixels = np.asarray(image.convert("RGB"), np.uint8)
    return {"image": pixels, "label": int(self.labels[i])}

  def __repr__(self) -> str:
    return f"ImageFolderSource({self.root}, {len(self)} images of {len(self.class_names)} classes)"
