"""Your own images as a dataset: a folder of JPEG or PNG files, for pretraining and the probe.

`--config.data.name=folder --config.data.folder=DIR` reads DIR in one of two layouts:
- DIR/train/<class>/... and DIR/val/<class>/... (or DIR/test/): pretraining reads train/, the
  linear probe and kNN fit on train/ and evaluate on val/ (test/ where there is no val/); an
  image's label is the class folder it lies in, at any depth below it;
- any other tree of images: pretraining reads every image under DIR, at any depth, and there
  are no labels (a run on it sets probe.after_pretrain=False; the probe asks for the layout
  above).

The file index (the images' paths relative to their split folder, sorted, and their classes)
follows the folder: every start walks the tree (a progress bar on a terminal) and takes its
signature, the number of images, their total size and the newest modification time. The index
is cached as JSON in <data.cache_dir>/folder_index/ (data.cache_dir "": $CL_JAX_CACHE or
~/.cache/cl_jax), keyed by the folder's absolute path; a folder whose signature differs from its
cached index's (images added, removed or replaced) is indexed again, with a line on stderr
naming the cache file and what changed. The index's digest (of its files and labels) is kept in
a run's workdir (data_index.json), and a run that resumes over a folder whose index changed is
refused (its data order would change) unless resumed with cl_jax.main --reindex. An image that
vanished after the index was taken is named as such. Unreadable images are handled as
cl_jax.data.image_folder does for the evaluators (data.bad_images: "stop" names the file and
stops, "skip" decodes every image once and leaves the unreadable ones out, each named).
"""

import hashlib
import json
import os
import sys
from typing import Any

import ml_collections
import numpy as np
import tqdm
from absl import logging

from cl_jax.data import fast_views, gpu_views, image_folder
from cl_jax.data.tfds_source import UNLABELLED, DatasetNotFoundError
from cl_jax.runtime import metrics
from cl_jax.runtime.errors import UsageError

TRAIN, TEST_SPLITS = "train", ("val", "test")
INDEX_FOLDER = "folder_index"


def split_folder(root: str, role: str) -> str:
  """The folder read for `role` (pretrain, probe_train or test) under `root` (module
  docstring); UsageError when the probe's roles have no labelled split."""
  train = os.path.join(root, TRAIN)
  if role == "pretrain":
    return train if os.path.isdir(train) else root
  test = next(
      (os.path.join(root, s) for s in TEST_SPLITS if os.path.isdir(os.path.join(root, s))), None
  )
  if not os.path.isdir(train) or test is None:
    raise UsageError(
        f"data.folder={root}: the probe and kNN read labelled splits, {root}/train/<class>/ and "
        f"{root}/val/<class>/ (or test/); this folder has "
        f"{'no train/' if not os.path.isdir(train) else 'no val/ or test/'}. Pretrain with "
        "--config.probe.after_pretrain=False, or add the splits"
    )
  return train if role == "probe_train" else test


def _walk(folder: str) -> tuple[list[str], dict]:
  """(every image under `folder` (IMAGE_EXTENSIONS, any case, any depth) as sorted paths
  relative to it, the tree's signature {"images", "bytes", "newest_mtime_ns"}); a progress bar
  counts them on a terminal."""
  found, size, newest = [], 0, 0
  bar = tqdm.tqdm(desc=f"indexing {folder}", unit=" images", disable=not sys.stderr.isatty())
  for directory, subfolders, names in os.walk(folder, followlinks=True):
    subfolders.sort()
    for name in names:
      if name.lower().endswith(image_folder.IMAGE_EXTENSIONS):
        path = os.path.join(directory, name)
        stat = os.stat(path)
        size, newest = size + stat.st_size, max(newest, stat.st_mtime_ns)
        found.append(os.path.relpath(path, folder))
        bar.update()
  bar.close()
  return sorted(found), {"images": len(found), "bytes": size, "newest_mtime_ns": newest}


def build_index(folder: str) -> dict:
  """{"folder", "files" (sorted relative paths), "classes" (sorted class folder names, or
  None), "labels" (per file, or None), "signature" (_walk's), "digest" (of files and labels)}:
  labelled when every image lies inside a first-level folder, the class being that folder."""
  if not os.path.isdir(folder):
    raise DatasetNotFoundError(f"data.folder: {folder!r} is not a folder of images")
  files, signature = _walk(folder)
  if not files:
    raise DatasetNotFoundError(
        f"no images in {folder!r}: expected files ending in "
        f"{', '.join(image_folder.IMAGE_EXTENSIONS)} (any case), at any depth"
    )
  tops = [f.split(os.sep, 1)[0] if os.sep in f else None for f in files]
  classes, labels = None, None
  if not any(t is None for t in tops):
    classes = sorted(set(tops))
    position = {c: i for i, c in enumerate(classes)}
    labels = [position[t] for t in tops]
  listed = json.dumps([files, labels]).encode()
  return {
      "folder": folder,
      "files": files,
      "classes": classes,
      "labels": labels,
      "signature": signature,
      "digest": hashlib.sha256(listed).hexdigest()[:16],
  }


def _changes(old: dict, new: dict) -> str:
  """What differs between two signatures, in words."""
  out = []
  if old.get("images") != new["images"]:
    out.append(f"{old.get('images')} -> {new['images']} images")
  if old.get("bytes") != new["bytes"]:
    out.append(f"{old.get('bytes')} -> {new['bytes']} bytes")
  if old.get("newest_mtime_ns") != new["newest_mtime_ns"]:
    out.append("a newer file")
  return ", ".join(out) or "an index of an earlier version"


def index_path(cache_dir: str, folder: str) -> str:
  """The cached index of `folder` (module docstring)."""
  root = cache_dir or os.environ.get("CL_JAX_CACHE") or os.path.expanduser("~/.cache/cl_jax")
  key = hashlib.sha256(os.path.abspath(folder).encode()).hexdigest()[:16]
  return os.path.join(root, INDEX_FOLDER, f"{key}.json")


def cached_index(cache_dir: str, folder: str) -> dict:
  """The index of `folder` as it is now (build_index), cached; a line on stderr when the cached
  one described another tree (module docstring)."""
  path = index_path(cache_dir, folder)
  index = build_index(folder)
  if os.path.exists(path):
    with open(path) as f:
      cached = json.load(f)
    if cached.get("signature") == index["signature"] and cached.get("digest") == index["digest"]:
      return cached
    what = _changes(cached.get("signature", {}), index["signature"])
    print(
        f"{folder} changed since it was indexed ({what}): indexed again, "
        f"{len(index['files'])} images, in {path}",
        file=sys.stderr,
    )
  os.makedirs(os.path.dirname(path), exist_ok=True)
  metrics.write_atomically(path, json.dumps(index))
  logging.info("image index of %s: %d images, cached in %s", folder, len(index["files"]), path)
  return index


class VanishedImageError(UsageError):
  """An image listed in the index is no longer in the folder."""


class FolderSource:
  """Random-access source over an index's images: `source[i]` is {"image": (H, W, 3) uint8 RGB,
  "label": int} (UNLABELLED for an unlabelled tree), in index order. `files` the absolute paths,
  `labels` (N,) int64, `skipped` the (path, reason) of the unreadable images left out with
  bad_images "skip". Pickling carries the file list, not the images."""

  def __init__(
      self, index: dict, bad_images: str = "stop", labelled: bool = False, decoder: str = "pil"
  ):
    """Raises UsageError when `labelled` is asked of an index without classes. `decoder`: "pil"
    (image_folder.decode), "fast" (fast_views.decode) or "gpu" (records of the JPEG's bytes
    and size, gpu_views.jpeg_record, for the pipeline's gpu path)."""
    folder = index["folder"]
    if labelled and index["classes"] is None:
      raise UsageError(
          f"{folder} has images outside class folders: the probe needs every image in "
          f"{folder}/<class>/"
      )
    self.folder = folder
    self.decoder = decoder
    self.digest, self.signature = index["digest"], index["signature"]
    self.class_names = index["classes"] or []
    self.files = [os.path.join(folder, f) for f in index["files"]]
    labels = index["labels"] or [UNLABELLED] * len(self.files)
    self.bad_images = image_folder.check_bad_images(bad_images)
    self.skipped: list[tuple[str, str]] = []
    if self.bad_images == "skip":
      self.files, labels, self.skipped = image_folder.drop_unreadable(
          self.files, labels, repr(folder)
      )
    self.labels = np.asarray(labels, np.int64)

  @property
  def num_classes(self) -> dict[str, int]:
    return {"label": len(self.class_names)} if self.class_names else {}

  def __len__(self) -> int:
    return len(self.files)

  def __getitem__(self, i: int) -> dict[str, Any]:
    if not 0 <= i < len(self):
      raise IndexError(f"index {i} out of range for a source of {len(self)} images")
    try:
      if self.decoder == "gpu":
        with open(self.files[i], "rb") as f:
          return {**gpu_views.jpeg_record(f.read(), self.files[i]), "label": int(self.labels[i])}
      decode = fast_views.decode if self.decoder == "fast" else image_folder.decode
      pixels = image_folder.read(self.files[i], "set --config.data.bad_images=skip", decode)
    except image_folder.BadImageError:
      if os.path.exists(self.files[i]):
        raise
      raise VanishedImageError(
          f"{self.files[i]} was in {self.folder} when the run indexed it and is gone: the "
          "folder changed while the run read it. Put the file back, or start the run again "
          "(the folder is indexed at every start; resuming over a changed folder needs "
          "--reindex)"
      ) from None
    return {"image": pixels, "label": int(self.labels[i])}

  def __repr__(self) -> str:
    return f"FolderSource({self.folder}, {len(self)} images, {len(self.class_names)} classes)"


def open_source(data: ml_collections.ConfigDict, role: str) -> FolderSource:
  """The folder source of `data` (data.folder, data.cache_dir, data.bad_images) for `role`."""
  if not data.folder:
    raise UsageError("data.name=folder needs data.folder, the folder of your images")
  folder = split_folder(data.folder, role)
  index = cached_index(data.cache_dir, folder)
  # The probe's pipelines decode on the host: with decoder gpu, by libjpeg-turbo (PIL's pixels).
  decoder = "fast" if data.decoder == "gpu" and role != "pretrain" else data.decoder
  return FolderSource(index, data.bad_images, labelled=role != "pretrain", decoder=decoder)
