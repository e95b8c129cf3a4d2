"""Labelled images read from a folder of class folders, as a grain source.

`ImageFolderSource(root, class_names)` reads `<root>/<class name>/<image file>` (the layout of
torchvision's ImageFolder and of the released ImageNet-R, -A, -Sketch, Stylized-ImageNet and,
one folder per corruption and severity, ImageNet-C): a picklable random-access source like
`tfds_source.TfdsSource`, whose label is the position of the image's class in `class_names`.
Class folders not in `class_names` are skipped, which is how a dataset is restricted to the
classes a model knows. Images are decoded with PIL (no TensorFlow).

Unreadable images (a truncated JPEG, a zero-byte file, a file that is no image) are handled as
`bad_images` says: "stop" (default) raises BadImageError, naming the file, when it is read;
"skip" decodes every image once at construction and leaves the unreadable ones out, each named
in a warning on stderr and listed in `skipped`. Nothing is ever silently replaced: PIL's
LOAD_TRUNCATED_IMAGES stays off.
"""

import concurrent.futures
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import PIL.Image

from cl_jax.data.tfds_source import DatasetNotFoundError
from cl_jax.runtime.errors import UsageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
BAD_IMAGES = ("stop", "skip")
# What PIL raises for a file it cannot decode: UnidentifiedImageError (an OSError) for a file
# it cannot identify (zero bytes, no image header), OSError for a truncated image ("image file
# is truncated"), SyntaxError and ValueError for some broken headers, DecompressionBombError
# for an image over twice Image.MAX_IMAGE_PIXELS.
DECODE_ERRORS = (OSError, SyntaxError, ValueError, PIL.Image.DecompressionBombError)
CHECK_THREADS = 4  # threads of the "skip" check (PIL releases the GIL while it decodes)


class BadImageError(UsageError):
  """An image of an ImageFolderSource cannot be decoded; the message names the file, the
  reason and the way on (remove or replace it, or --bad_images=skip)."""


def check_bad_images(value: str) -> str:
  """`value` if it is one of BAD_IMAGES, else UsageError naming them."""
  if value not in BAD_IMAGES:
    raise UsageError(f"bad_images must be one of {', '.join(BAD_IMAGES)}; got {value!r}")
  return value


def _class_files(root: str, class_name: str) -> list[str]:
  """Sorted image files of `<root>/<class_name>/` (no files if the folder is absent)."""
  folder = os.path.join(root, class_name)
  if not os.path.isdir(folder):
    return []
  names = sorted(os.listdir(folder))
  return [os.path.join(folder, n) for n in names if n.lower().endswith(IMAGE_EXTENSIONS)]


def decode(path: str) -> np.ndarray:
  """The image file `path` fully decoded, (H, W, 3) uint8 RGB (convert forces the load, so a
  truncated file fails here); raises one of DECODE_ERRORS for an unreadable file."""
  with PIL.Image.open(path) as image:
    return np.asarray(image.convert("RGB"), np.uint8)


def _reason(path: str, error: BaseException) -> str:
  """Why `path` could not be decoded, in one line without the path."""
  try:
    empty = os.path.getsize(path) == 0
  except OSError:
    empty = False
  if empty:
    return "the file is empty (0 bytes)"
  if isinstance(error, PIL.UnidentifiedImageError):
    return "PIL cannot identify it as an image (not a JPEG or PNG, or cut short in its header)"
  text = " ".join(str(error).split())
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def unreadable(path: str) -> str | None:
  """The reason `path` cannot be decoded (one line), or None if it decodes."""
  try:
    decode(path)
  except DECODE_ERRORS as error:
    return _reason(path, error)
  return None


def read(path: str, how_to_skip: str, decoder: Callable[[str], np.ndarray] = decode) -> np.ndarray:
  """`path` decoded by `decoder` (decode, or cl_jax.data.fast_views.decode), or BadImageError
  naming the file, the reason and `how_to_skip` (the flag that leaves unreadable images out)."""
  try:
    return decoder(path)
  except DECODE_ERRORS as error:
    raise BadImageError(
        f"cannot read image {path}: {_reason(path, error)}. Remove or replace the file, or "
        f"{how_to_skip} to leave unreadable images out (each is then named in a warning and "
        "counted in the report)"
    ) from error


def drop_unreadable(files: list[str], labels: list, where: str) -> tuple[list, list, list]:
  """(readable files, their labels, [(path, reason)] of the unreadable ones): every file
  decoded once on CHECK_THREADS threads, each unreadable one named in a warning on stderr;
  DatasetNotFoundError when none of the images in `where` can be read."""
  with concurrent.futures.ThreadPoolExecutor(CHECK_THREADS) as pool:
    reasons = list(pool.map(unreadable, files))
  skipped = [(f, r) for f, r in zip(files, reasons) if r is not None]
  for path, reason in skipped:
    print(f"warning: skipped unreadable image {path}: {reason}", file=sys.stderr)
  if len(skipped) == len(files):
    path, reason = skipped[0]
    raise DatasetNotFoundError(
        f"none of the {len(files)} images in {where} can be read (the first, {path}: {reason})"
    )
  kept = [i for i, r in enumerate(reasons) if r is None]
  return [files[i] for i in kept], [labels[i] for i in kept], skipped


class ImageFolderSource:
  """Random-access source over the images `<root>/<class>/*.{jpg,jpeg,png}` (any case).

  `source[i]` is {"image": (H, W, 3) uint8 RGB, "label": int}, the label being the position
  of the image's class folder in `class_names`; images are ordered by class, then file name.
  `files` (N,) are the image paths and `labels` (N,) int64 their labels; `skipped` the
  (path, reason) of the unreadable images left out (bad_images "skip"; empty with "stop").
  Pickling carries the file list, not the images.
  """

  def __init__(self, root: str, class_names: list[str], bad_images: str = "stop"):
    """Args: `root` the folder of class folders; `class_names` the C classes kept, in label
    order (folders of other classes are skipped); `bad_images` what an unreadable image does:
    "stop", `source[i]` of it raises BadImageError naming the file; "skip", every image is
    decoded once here (the cost: one extra decode of every image at start, on CHECK_THREADS
    threads) and the unreadable ones are left out of the source, each named in a line
    `warning: skipped unreadable image <path>: <reason>` on stderr and kept in `skipped`.

    Raises:
      UsageError: `bad_images` is neither "stop" nor "skip".
      DatasetNotFoundError: `root` is not a folder, or holds no image of `class_names`, or
        (with "skip") no readable one.
    """
    self.bad_images = check_bad_images(bad_images)
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
    if not self.files:
      found = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))
      raise DatasetNotFoundError(
          f"no images of the {len(self.class_names)} classes ({', '.join(self.class_names[:3])}"
          f"{', ...' if len(self.class_names) > 3 else ''}) in {root!r}: expected "
          f"<root>/<class>/<image> with extensions {', '.join(IMAGE_EXTENSIONS)} (any case); "
          f"found the folders {found[:5]}{' ...' if len(found) > 5 else ''}"
      )
    self.skipped: list[tuple[str, str]] = []
    if self.bad_images == "skip":
      self.files, labels, self.skipped = drop_unreadable(self.files, labels, repr(root))
    self.labels = np.asarray(labels, np.int64)

  @property
  def num_classes(self) -> dict[str, int]:
    return {"label": len(self.class_names)}

  def __len__(self) -> int:
    return len(self.files)

  def __getitem__(self, i: int) -> dict[str, Any]:
    if not 0 <= i < len(self):
      raise IndexError(f"index {i} out of range for a source of {len(self)} images")
    pixels = read(self.files[i], "pass --bad_images=skip")
    return {"image": pixels, "label": int(self.labels[i])}

  def __repr__(self) -> str:
    return f"ImageFolderSource({self.root}, {len(self)} images of {len(self.class_names)} classes)"
