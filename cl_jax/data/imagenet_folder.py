"""ImageNet-2012, or its 100-class subset ImageNet-100, as the folder of images that cl_jax reads
(data.name folder; configs/mocov2_patchns.py:folder is the ImageNet-100 recipe on it), prepared
from the ILSVRC2012 archives or their extracted folders with nothing beyond requirements.txt:

  python -m cl_jax.data.imagenet_folder --train=ILSVRC2012_img_train.tar \\
      --val=ILSVRC2012_img_val.tar --out=DIR [--classes=imagenet100|imagenet2012]

writes DIR/train/<wnid>/<file>.JPEG and DIR/val/<wnid>/<file>.JPEG, the JPEG files as they are
(not decoded or re-encoded; --max_side=N [--quality=90] stores images larger than N pixels on
their longer side at N, as cl_jax.data.bounded_folder does, for faster decoding: the papers
trained on the images as they are). --classes=imagenet100 (the default) keeps the 100 WordNet ids of
cl_jax/data/imagenet100_classes.txt (CMC's subset, Tian et al. 2019); imagenet2012 keeps all.

Sources:
- --train: ILSVRC2012_img_train.tar (one <wnid>.tar per class inside it), or a folder holding
  either <wnid>/ subfolders of images or <wnid>.tar files;
- --val: ILSVRC2012_img_val.tar (50,000 images in one folder), or a folder of them, flat or in
  <wnid>/ subfolders. Flat validation images are labelled by the validation ground truth as
  WordNet ids, one per image in file-name order: TFDS's validation_labels.txt, which
  tensorflow-datasets ships (--val_labels=FILE reads another).

Before writing, it prints the classes and the bytes the chosen images need beside the free space
of DIR's disk, and stops when they do not fit. It can be stopped and started again: each training
class is written into DIR/.partial/ and moved into place when complete, the validation split
likewise as a whole; what is complete is skipped.
"""

import dataclasses
import os
import re
import shutil
import sys
import tarfile
from collections.abc import Callable, Iterator

import tqdm
from absl import app, flags

from cl_jax.data import bounded_folder, image_folder, tfds_source
from cl_jax.runtime import cli
from cl_jax.runtime.errors import UsageError

CLASS_LISTS = ("imagenet100", "imagenet2012")
WNID = re.compile(r"^n\d{8}$")
VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG$", re.IGNORECASE)
PARTIAL = ".partial"


@dataclasses.dataclass(frozen=True)
class Class:
  """One training class: its WordNet id, its bytes on the source, and `files()`, an iterator of
  (file name, bytes) of its images."""

  wnid: str
  size: int
  files: Callable[[], Iterator[tuple[str, bytes]]]


def _tar_images(fileobj) -> Iterator[tuple[str, bytes]]:
  """(base name, bytes) of every image file in an open tar stream."""
  with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
    for member in tar:
      name = os.path.basename(member.name)
      if member.isfile() and name.lower().endswith(image_folder.IMAGE_EXTENSIONS):
        yield name, tar.extractfile(member).read()


def _folder_images(folder: str) -> Iterator[tuple[str, bytes]]:
  for name in sorted(os.listdir(folder)):
    if name.lower().endswith(image_folder.IMAGE_EXTENSIONS):
      with open(os.path.join(folder, name), "rb") as f:
        yield name, f.read()


def _folder_size(folder: str) -> int:
  return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())


def train_classes(source: str) -> list[Class]:
  """The training classes of `source` (module docstring), sorted by WordNet id."""
  if os.path.isfile(source):
    with tarfile.open(source) as outer:
      members = [m for m in outer.getmembers() if m.isfile() and m.name.endswith(".tar")]

    def inner(member: tarfile.TarInfo):
      def files():
        with tarfile.open(source) as outer:
          yield from _tar_images(outer.extractfile(member.name))

      return files

    found = [Class(os.path.basename(m.name)[:-4], m.size, inner(m)) for m in members]
  elif os.path.isdir(source):
    found = []
    for name in sorted(os.listdir(source)):
      path = os.path.join(source, name)
      if os.path.isdir(path) and WNID.match(name):
        found.append(Class(name, _folder_size(path), lambda p=path: _folder_images(p)))
      elif name.endswith(".tar") and WNID.match(name[:-4]):

        def files(p=path):
          with open(p, "rb") as f:
            yield from _tar_images(f)

        found.append(Class(name[:-4], os.path.getsize(path), files))
  else:
    raise UsageError(f"--train={source} is neither ILSVRC2012_img_train.tar nor a folder")
  found = [c for c in found if WNID.match(c.wnid)]
  if not found:
    raise UsageError(
        f"--train={source} holds no class: expected <wnid>.tar files in the archive, or "
        "<wnid>/ subfolders or <wnid>.tar files in the folder (wnid as n01440764)"
    )
  return sorted(found, key=lambda c: c.wnid)


def _default_labels() -> str:
  import tensorflow_datasets  # pylint: disable=import-outside-toplevel

  root = os.path.dirname(tensorflow_datasets.__file__)
  return os.path.join(root, "datasets", "imagenet2012", "validation_labels.txt")


def val_images(source: str, labels_file: str | None) -> tuple[list[tuple[str, str, int]], Callable]:
  """([(file name, wnid, bytes)] of the validation images of `source`, a function that
  iterates (file name, wnid, image bytes) over them)."""
  labels: list[str] | None = None

  def label(name: str) -> str:
    nonlocal labels
    if labels is None:
      path = labels_file or _default_labels()
      with open(path) as f:
        labels = f.read().split()
    match = VAL_NAME.search(name)
    if match is None or not 0 < int(match.group(1)) <= len(labels):
      raise UsageError(
          f"validation image {name} has no label: flat validation images are named "
          "ILSVRC2012_val_<8 digits>.JPEG and labelled by --val_labels, one wnid per line"
      )
    return labels[int(match.group(1)) - 1]

  if os.path.isfile(source):
    with tarfile.open(source) as tar:
      members = [m for m in tar.getmembers() if m.isfile()]
    listed = [(os.path.basename(m.name), label(m.name), m.size) for m in members]

    def read():
      with open(source, "rb") as f:
        for name, data in _tar_images(f):
          yield name, label(name), data

    return listed, read
  if not os.path.isdir(source):
    raise UsageError(f"--val={source} is neither ILSVRC2012_img_val.tar nor a folder")
  listed = []
  for name in sorted(os.listdir(source)):
    path = os.path.join(source, name)
    if os.path.isdir(path) and WNID.match(name):
      listed += [
          (f, name, os.path.getsize(os.path.join(path, f))) for f in sorted(os.listdir(path))
      ]
    elif name.lower().endswith(image_folder.IMAGE_EXTENSIONS):
      listed.append((name, label(name), os.path.getsize(path)))

  def read_folder():
    for name, wnid, _ in listed:
      flat = os.path.join(source, name)
      with open(flat if os.path.exists(flat) else os.path.join(source, wnid, name), "rb") as f:
        yield name, wnid, f.read()

  return listed, read_folder


def _free_bytes(out: str) -> int:
  existing = os.path.abspath(out)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  return shutil.disk_usage(existing).free


def _gb(n: int) -> str:
  return f"{n / 1e9:.1f} GB"


def prepare(
    train: str,
    val: str,
    out: str,
    classes: str = "imagenet100",
    val_labels: str | None = None,
    log: Callable[[str], None] = print,
    max_side: int = 0,
    quality: int = 90,
) -> dict:
  """Write OUT/train/<wnid>/ and OUT/val/<wnid>/ (module docstring); returns {"classes",
  "train_written", "val_written", "bytes"}: the classes kept, the training classes written by
  this call (the others were complete) and whether it wrote the validation split. max_side > 0
  stores every image at that longer side at most (bounded_folder.bounded, JPEG `quality`)."""
  if classes not in CLASS_LISTS:
    raise UsageError(f"--classes must be one of {', '.join(CLASS_LISTS)}, got {classes!r}")
  if max_side < 0 or not 1 <= quality <= 100:
    raise UsageError(
        f"--max_side must be 0 (as they are) or more and --quality in 1..100, got {max_side} "
        f"and {quality}"
    )
  found = train_classes(train)
  wanted = (
      set(tfds_source.read_class_list("imagenet100_classes.txt"))
      if classes == "imagenet100"
      else {c.wnid for c in found}
  )
  missing = sorted(wanted - {c.wnid for c in found})
  if missing:
    raise UsageError(
        f"--train={train} lacks {len(missing)} of the {len(wanted)} {classes} classes (the first: "
        f"{missing[0]}); give the whole ILSVRC2012 training set"
    )
  kept = [c for c in found if c.wnid in wanted]
  listed, read_val = val_images(val, val_labels)
  val_kept = [(n, w, s) for n, w, s in listed if w in wanted]
  todo = [c for c in kept if not os.path.isdir(os.path.join(out, "train", c.wnid))]
  val_done = os.path.isdir(os.path.join(out, "val"))
  need = sum(c.size for c in todo) + (0 if val_done else sum(s for _, _, s in val_kept))
  free = _free_bytes(out)
  log(
      f"{classes}: {len(kept)} classes, {len(val_kept):,} validation images; "
      f"{len(kept) - len(todo)} training classes{' and the validation split' if val_done else ''} "
      f"already in {out}; {_gb(need)} to write, {_gb(free)} free"
  )
  if need > free:
    raise UsageError(
        f"{out} has {_gb(free)} free and the images need {_gb(need)}: give --out on a larger disk"
    )
  bounded_folder.check_settings(out, max_side, quality)
  if max_side:
    log(f"images stored at a longer side of {max_side} px at most (JPEG quality {quality})")
  partial = os.path.join(out, PARTIAL)
  bar = tqdm.tqdm(todo, desc="training classes", unit=" classes", disable=not sys.stderr.isatty())
  for c in bar:
    work = os.path.join(partial, "train", c.wnid)
    shutil.rmtree(work, ignore_errors=True)  # a class an earlier call left unfinished
    os.makedirs(work)
    for name, data in c.files():
      with open(os.path.join(work, name), "wb") as f:
        f.write(bounded_folder.bounded(data, max_side, quality))
    os.makedirs(os.path.join(out, "train"), exist_ok=True)
    os.rename(work, os.path.join(out, "train", c.wnid))
  if not val_done:
    work = os.path.join(partial, "val")
    shutil.rmtree(work, ignore_errors=True)
    keep = {n for n, _, _ in val_kept}
    for name, wnid, data in tqdm.tqdm(
        read_val(), desc="validation", total=len(listed), disable=not sys.stderr.isatty()
    ):
      if name in keep:
        os.makedirs(os.path.join(work, wnid), exist_ok=True)
        with open(os.path.join(work, wnid, name), "wb") as f:
          f.write(bounded_folder.bounded(data, max_side, quality))
    os.rename(work, os.path.join(out, "val"))
  shutil.rmtree(partial, ignore_errors=True)
  log(f"wrote {out}/train and {out}/val: --config.data.name=folder --config.data.folder={out}")
  return {
      "classes": [c.wnid for c in kept],
      "train_written": [c.wnid for c in todo],
      "val_written": not val_done,
      "bytes": need,
  }


def main(argv):
  del argv
  f = flags.FLAGS
  with cli.report():
    cli.require(("train", "val", "out"), "cl_jax.data.imagenet_folder")
    prepare(f.train, f.val, f.out, f.classes, f.val_labels, max_side=f.max_side, quality=f.quality)


if __name__ == "__main__":
  flags.DEFINE_string("train", None, "ILSVRC2012_img_train.tar, or its extracted folder.")
  flags.DEFINE_string("val", None, "ILSVRC2012_img_val.tar, or its extracted folder.")
  flags.DEFINE_string("out", None, "The folder to write: OUT/train/<wnid>/, OUT/val/<wnid>/.")
  flags.DEFINE_enum("classes", "imagenet100", list(CLASS_LISTS), "The classes to keep.")
  flags.DEFINE_string(
      "val_labels", None, "One wnid per validation image, in file-name order (default: TFDS's)."
  )
  flags.DEFINE_integer(
      "max_side", 0, "Store images at this longer side at most (0: as they are).", lower_bound=0
  )
  flags.DEFINE_integer("quality", 90, "JPEG quality of images resized by --max_side.")
  app.run(main, flags_parser=cli.parse_flags)
