"""Real datasets read from a prepared TensorFlow Datasets `data_dir`, as grain sources.

`open_source(name, split_role, data_dir)` returns a `TfdsSource`: a picklable random-access
source (`__len__`, `__getitem__`) that grain can shard and hand to worker processes. Records are
read through `tfds.builder(...).as_data_source(...)`, i.e. ArrayRecord random access, so the
dataset must have been prepared with `--file_format=array_record`. Nothing is ever downloaded:
a dataset missing from `data_dir` raises `DatasetNotFoundError` with the command that prepares it.

ImageNet-100 is ImageNet-2012 restricted to the 100 WordNet ids in `imagenet100_classes.txt`;
its labels are the positions of the ids in the sorted list. The record indices of the subset are
found once by reading every label, then cached as an `.npy` file.

TensorFlow and tensorflow_datasets are imported inside functions only, so importing this module
(and training on the built-in dataset) works where TensorFlow is not installed.
"""

import dataclasses
import hashlib
import importlib.resources
import io
import os
import re
import threading
import uuid
from typing import Any

import numpy as np
from absl import logging

from cl_jax.runtime import logs
from cl_jax.runtime.errors import UsageError

SPLIT_ROLES = ("pretrain", "probe_train", "test")
UNLABELLED = -1
INDEX_CACHE_FOLDER = "cl_jax_index"
_LABEL_READ_CHUNK = 4096


@dataclasses.dataclass(frozen=True)
class Splits:
  """TFDS split names read for each split role.

  Attributes:
    pretrain: split for self-supervised pretraining (labels unused).
    probe_train: labelled split the linear probe is fitted on.
    test: labelled split the probe is evaluated on.
  """

  pretrain: str
  probe_train: str
  test: str


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """How one supported dataset maps onto TFDS.

  Attributes:
    tfds_name: TFDS builder whose records are read.
    splits: TFDS split name for each split role.
    num_classes: number of classes of the labels the source returns.
    native_resolution: side in pixels of the stored square images, or None where the size varies
      per image (ImageNet: models are trained on random resized crops).
    unlabelled_splits: TFDS splits without labels; their records get label -1.
    classes_file: None, or a file in `cl_jax/data` listing the WordNet ids kept (one per line);
      labels become the ids' positions in the sorted list.
  """

  tfds_name: str
  splits: Splits
  num_classes: int
  native_resolution: int | None
  unlabelled_splits: frozenset[str] = frozenset()
  classes_file: str | None = None


_IMAGENET_SPLITS = Splits(pretrain="train", probe_train="train", test="validation")
_CIFAR_SPLITS = Splits(pretrain="train", probe_train="train", test="test")

DATASETS: dict[str, DatasetSpec] = {
    "cifar10": DatasetSpec("cifar10", _CIFAR_SPLITS, num_classes=10, native_resolution=32),
    "cifar100": DatasetSpec("cifar100", _CIFAR_SPLITS, num_classes=100, native_resolution=32),
    "stl10": DatasetSpec(
        "stl10",
        Splits(pretrain="unlabelled", probe_train="train", test="test"),
        num_classes=10,
        native_resolution=96,
        unlabelled_splits=frozenset({"unlabelled"}),
    ),
    "tiny_imagenet": DatasetSpec(
        "tiny_imagenet", _IMAGENET_SPLITS, num_classes=200, native_resolution=64
    ),
    "imagenet2012": DatasetSpec(
        "imagenet2012", _IMAGENET_SPLITS, num_classes=1000, native_resolution=None
    ),
    "imagenet100": DatasetSpec(
        "imagenet2012",
        _IMAGENET_SPLITS,
        num_classes=100,
        native_resolution=None,
        classes_file="imagenet100_classes.txt",
    ),
}


class DatasetNotFoundError(UsageError, FileNotFoundError):
  """The dataset is not prepared in `data_dir`; the message holds the command that prepares it."""


class DatasetFormatError(UsageError, ValueError):
  """The dataset is prepared, but in a file format without random access (e.g. tfrecord)."""


def dataset_spec(name: str) -> DatasetSpec:
  """The `DatasetSpec` of a supported dataset name; ValueError listing the names otherwise."""
  if name not in DATASETS:
    raise ValueError(
        f"Unknown dataset {name!r}. Supported datasets: {', '.join(sorted(DATASETS))}."
    )
  return DATASETS[name]


def build_command(tfds_name: str, data_dir: str) -> str:
  """The `tfds build` command that prepares TFDS `tfds_name` in `data_dir` as ArrayRecord, and
  what that command needs installed."""
  return (
      f"tfds build {tfds_name} --data_dir={data_dir} --file_format=array_record\n"
      "(the tfds command of tensorflow-datasets 4.9 needs: pip install apache-beam "
      "importlib_resources)"
  )


def preparation_instructions(name: str, data_dir: str) -> str:
  """How to prepare `name` in `data_dir`, with the exact `tfds build` command."""
  spec = dataset_spec(name)
  if spec.tfds_name == "tiny_imagenet":
    from cl_jax.data import tiny_imagenet  # pylint: disable=import-outside-toplevel

    return (
        f"TFDS has no Tiny-ImageNet: download {tiny_imagenet.ARCHIVE} ({tiny_imagenet.URL}) "
        f"and run:\n  python -m cl_jax.data.tiny_imagenet --zip=<path of "
        f"{tiny_imagenet.ARCHIVE}> --data_dir={data_dir}"
    )
  build = build_command(spec.tfds_name, data_dir)
  if spec.tfds_name != "imagenet2012":
    return f"Prepare it on a machine with internet access:\n  {build}"
  manual_dir = os.path.join(data_dir, "downloads", "manual")
  steps = (
      f"put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar (from image-net.org) into "
      f"{manual_dir}, then run:\n  {build}"
  )
  if name != "imagenet2012":
    return f"{name} is read from the imagenet2012 records. Prepare imagenet2012: {steps}"
  return f"Prepare it: {steps}"


def read_class_list(classes_file: str) -> list[str]:
  """WordNet ids listed in `cl_jax/data/<classes_file>`, one per line, validated unique."""
  text = importlib.resources.files("cl_jax.data").joinpath(classes_file).read_text()
  wnids = [line.strip() for line in text.splitlines() if line.strip()]
  malformed = [w for w in wnids if not re.fullmatch(r"n\d{8}", w)]
  if malformed:
    raise ValueError(f"{classes_file}: not WordNet ids (nXXXXXXXX): {malformed[:5]}")
  if len(set(wnids)) != len(wnids):
    raise ValueError(f"{classes_file}: WordNet ids listed twice")
  return wnids


def subset_label_map(class_names: list[str], kept: list[str]) -> np.ndarray:
  """Label lookup from the full class list to a subset, labels in sorted-subset order.

  Args:
    class_names: the dataset's C class names; label c names class_names[c].
    kept: the K class names to keep (any order).

  Returns:
    (C,) int64: map[c] = position of class_names[c] in sorted(kept), or -1 if not kept.
  """
  missing = sorted(set(kept) - set(class_names))
  if missing:
    raise ValueError(f"Classes not in the dataset's class list: {missing[:5]}")
  position = {wnid: k for k, wnid in enumerate(sorted(kept))}
  return np.array([position.get(c, -1) for c in class_names], dtype=np.int64)


def subset_index(labels: np.ndarray, label_map: np.ndarray) -> np.ndarray:
  """Record indices whose label is kept by `label_map`.

  Args:
    labels: (N,) int labels of all records, in record order.
    label_map: (C,) int64 from `subset_label_map`.

  Returns:
    (M,) int64 increasing indices i with label_map[labels[i]] >= 0.
  """
  return np.flatnonzero(label_map[labels] >= 0).astype(np.int64)


def _register(tfds_name: str) -> None:
  """Define the builders of datasets that cl_jax prepares itself (in this process)."""
  if tfds_name == "tiny_imagenet":
    from cl_jax.data import tiny_imagenet  # pylint: disable=import-outside-toplevel

    tiny_imagenet.register()


# Serialises the opening of TFDS sources (and the first import of tensorflow_datasets) in a
# process; see TfdsSource.records.
_OPEN_LOCK = threading.Lock()


def _open_records(tfds_name: str, split: str, data_dir: str, decoders=None):
  """The TFDS ArrayRecord data source of one split (random access, numpy examples)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  _register(tfds_name)
  builder = tfds.builder(tfds_name, data_dir=data_dir)
  return builder.as_data_source(split=split, decoders=decoders)


class TfdsSource:
  """Random-access source over one TFDS split, optionally restricted to a subset of records.

  `source[i]` is {"image": (H, W, 3) uint8, "label": int}; the label is -1 on unlabelled splits
  and `label_map[tfds_label]` when a label map is given. The TFDS data source opens on first
  access, so pickling (grain worker processes) carries only names, paths and the index.
  """

  def __init__(
      self,
      tfds_name: str,
      split: str,
      data_dir: str,
      num_classes: int,
      labelled: bool,
      index: np.ndarray | None = None,
      label_map: np.ndarray | None = None,
  ):
    """Args: `index` (M,) int64 record indices to expose; `label_map` (C,) int64 label lookup."""
    self.tfds_name = tfds_name
    self.split = split
    self.data_dir = data_dir
    self._num_classes = num_classes
    self.labelled = labelled
    self.index = index
    self.label_map = label_map
    self._records = None

  @property
  def records(self):
    """The underlying TFDS data source, opened on first use in each process, by one thread:
    grain's read threads reach here together, and their concurrent first imports of
    tensorflow_datasets can deadlock (its lazy imports take a lock of their own inside the
    import lock)."""
    if self._records is None:
      with _OPEN_LOCK:
        if self._records is None:
          self._records = _open_records(self.tfds_name, self.split, self.data_dir)
    return self._records

  @property
  def num_classes(self) -> dict[str, int]:
    return {"label": self._num_classes}

  def __len__(self) -> int:
    return len(self.records) if self.index is None else len(self.index)

  def __getitem__(self, i: int) -> dict[str, Any]:
    if not 0 <= i < len(self):
      raise IndexError(f"index {i} out of range for a source of {len(self)} records")
    record = self.records[int(i if self.index is None else self.index[i])]
    image = np.asarray(record["image"])
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
      raise ValueError(
          f"{self.tfds_name}/{self.split} record {i}: expected a (H, W, 3) uint8 image, got "
          f"{image.dtype} {image.shape}"
      )
    if not self.labelled:
      label = UNLABELLED
    elif self.label_map is None:
      label = int(record["label"])
    else:
      label = int(self.label_map[int(record["label"])])
    return {"image": image, "label": label}

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, "_records": None}

  def __repr__(self) -> str:
    subset = "" if self.index is None else f", {len(self.index)} records kept"
    return f"TfdsSource({self.tfds_name}/{self.split} in {self.data_dir}{subset})"


def default_fallback_cache_dir() -> str:
  """`$XDG_CACHE_HOME/cl_jax`, or `~/.cache/cl_jax`: index caches when data_dir is read-only."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "cl_jax")


def _read_labels(records) -> np.ndarray:
  """(N,) int64 labels of every record of a data source opened with the image left encoded."""
  labels = np.empty(len(records), dtype=np.int64)
  for start in range(0, len(records), _LABEL_READ_CHUNK):
    keys = list(range(start, min(start + _LABEL_READ_CHUNK, len(records))))
    labels[keys[0] : keys[-1] + 1] = [int(r["label"]) for r in records.__getitems__(keys)]
    if (start // _LABEL_READ_CHUNK) % 64 == 63:
      logging.info("Read %d / %d labels", keys[-1] + 1, len(records))
  return labels


def _load_index(path, num_records: int) -> np.ndarray:
  """Cached (M,) int64 index at `path`, checked against the number of records it indexes."""
  index = np.load(io.BytesIO(path.read_bytes()), allow_pickle=False)
  in_range = index.size == 0 or (index.min() >= 0 and index.max() < num_records)
  if index.dtype != np.int64 or index.ndim != 1 or not in_range:
    raise ValueError(f"Index cache {path} does not match the dataset; delete it to rebuild.")
  return index


def _save_index_atomically(path, index: np.ndarray) -> None:
  """Writes `index` as .npy next to `path`, then renames it into place (atomic on POSIX)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  buffer = io.BytesIO()
  np.save(buffer, index, allow_pickle=False)
  partial = path.parent / f".{path.name}.{uuid.uuid4().hex}.partial"
  try:
    partial.write_bytes(buffer.getvalue())
    partial.replace(path)
  finally:
    if partial.exists():
      partial.unlink()


def cached_subset_index(
    builder, split: str, label_map: np.ndarray, kept: list[str], data_dir: str, fallback_dir: str
) -> np.ndarray:
  """(M,) int64 indices of the records of `split` kept by `label_map`, computed once and cached.

  The cache file name holds the TFDS name (with its config), version, split, record count and
  a digest of the kept classes. It lives in `<data_dir>/cl_jax_index/`, or under
  `fallback_dir` (in a folder named by a digest of data_dir) when data_dir cannot be written.
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from etils import epath  # pylint: disable=import-outside-toplevel

  num_records = builder.info.splits[split].num_examples
  classes_digest = hashlib.sha256("\n".join(sorted(kept)).encode()).hexdigest()[:16]
  full_name = builder.name + (f"-{builder.builder_config.name}" if builder.builder_config else "")
  name = f"{full_name}-{builder.version}-{split}-n{num_records}-classes{classes_digest}.npy"
  data_dir_id = data_dir if "://" in data_dir else os.path.abspath(data_dir)
  data_dir_digest = hashlib.sha256(data_dir_id.encode()).hexdigest()[:16]
  primary = epath.Path(data_dir) / INDEX_CACHE_FOLDER / name
  fallback = epath.Path(fallback_dir) / INDEX_CACHE_FOLDER / data_dir_digest / name
  for path in (primary, fallback):
    if path.exists():
      return _load_index(path, num_records)

  logging.info("Indexing %s/%s: reading %d labels once", builder.name, split, num_records)
  records = builder.as_data_source(split=split, decoders={"image": tfds.decode.SkipDecoding()})
  index = subset_index(_read_labels(records), label_map)
  try:
    _save_index_atomically(primary, index)
  except OSError as error:
    logging.warning("Cannot write %s (%s); caching the index at %s", primary, error, fallback)
    _save_index_atomically(fallback, index)
  return index


def prepared_builder(tfds_name: str, data_dir: str, what: str, instructions: str):
  """The TFDS builder of `tfds_name` ("name" or "name/config") in `data_dir`, checked to be
  prepared in a random-access file format. Nothing is downloaded.

  Raises:
    DatasetNotFoundError: not prepared; the message names `what` and gives `instructions`.
    DatasetFormatError: prepared without random access; the message says how to convert it.
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  _register(tfds_name)
  with logs.quiet():  # TFDS warns about an unprepared folder; the error below says more
    builder = tfds.builder(tfds_name, data_dir=data_dir)
    prepared = builder.is_prepared()
  if not prepared:
    raise DatasetNotFoundError(
        f"{what} (TFDS {tfds_name} {builder.version}) is not prepared in data_dir "
        f"{data_dir!r} and is never downloaded at run time.\n{instructions}"
    )
  random_access = tfds.core.FileFormat.with_random_access()
  if not builder.info.available_file_formats() & random_access:
    raise DatasetFormatError(
        f"{what} in {builder.data_path} is stored as {builder.info.file_format.value}, which "
        f"has no random access. Convert it with:\n  tfds convert_format "
        f"--dataset_version_dir={builder.data_path} --out_file_format=array_record\n"
        f"or prepare it again. {instructions}"
    )
  return builder


def open_source(
    name: str, split_role: str, data_dir: str, *, fallback_cache_dir: str | None = None
) -> TfdsSource:
  """Opens the `split_role` split of dataset `name` from a prepared TFDS `data_dir`.

  Args:
    name: one of `DATASETS`.
    split_role: one of `SPLIT_ROLES`: "pretrain", "probe_train" or "test".
    data_dir: TFDS data directory holding the dataset prepared as ArrayRecord.
    fallback_cache_dir: where subset indices (ImageNet-100) are cached when data_dir is
      read-only; None means `default_fallback_cache_dir()`.

  Returns:
    A `TfdsSource` yielding {"image": (H, W, 3) uint8, "label": int}.

  Raises:
    ValueError: unknown name or split role, empty data_dir.
    DatasetNotFoundError: the dataset is not prepared in data_dir (nothing is downloaded).
    DatasetFormatError: the dataset is prepared without a random-access file format.
  """
  spec = dataset_spec(name)
  if split_role not in SPLIT_ROLES:
    raise ValueError(f"Unknown split role {split_role!r}; expected one of {SPLIT_ROLES}.")
  if not isinstance(data_dir, str) or not data_dir:
    raise UsageError(f"data_dir must be a non-empty path string, got {data_dir!r}.")

  builder = prepared_builder(
      spec.tfds_name, data_dir, f"Dataset {name!r}", preparation_instructions(name, data_dir)
  )
  split = getattr(spec.splits, split_role)
  index, label_map = None, None
  if spec.classes_file is not None:
    kept = read_class_list(spec.classes_file)
    if len(kept) != spec.num_classes:
      raise ValueError(
          f"{spec.classes_file} lists {len(kept)} classes; {name} needs {spec.num_classes}."
      )
    label_map = subset_label_map(builder.info.features["label"].names, kept)
    index = cached_subset_index(
        builder,
        split,
        label_map,
        kept,
        data_dir,
        fallback_cache_dir or default_fallback_cache_dir(),
    )
  return TfdsSource(
      spec.tfds_name,
      split,
      data_dir,
      spec.num_classes,
      labelled=split not in spec.unlabelled_splits,
      index=index,
      label_map=label_map,
  )
