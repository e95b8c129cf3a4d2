"""Texture versions of a dataset's images (Ge et al. 2021, Sec. 2.2) next to the images.

`TextureSource(source, texture_dir, dataset=..., split=...)` wraps a random-access source
(cl_jax.data.sources): record i is the source's record i plus KEY ("texture_image"), the
(S, S, 3) uint8 texture image that `python -m cl_jax.data.make_texture` synthesised from image
i. (The key is not "texture": Trifeature records already use that name for a label.)

The texture dataset is a directory written by that job:

  meta.json          the job's arguments and the source's identity (META_FIELDS);
  shard_{j:05d}.npy  (n_j, S, S, 3) uint8, the textures of images [j * n, j * n + n_j) with
                     n = meta["shard_size"].

On construction the source is checked against meta.json (dataset, split, number of images and
the digest of its first and last image) and every shard must exist; otherwise
`TextureDatasetError` says which `python -m cl_jax.data.make_texture ...` command makes or
finishes the dataset.
"""

import hashlib
import json
import os
import shlex
from typing import Any

import numpy as np

from cl_jax.runtime.errors import UsageError

KEY = "texture_image"
META_FILE = "meta.json"
FORMAT_VERSION = 1
DEFAULT_SHARD_SIZE = 1000
DEFAULT_SEED = 0
# Texture side of Ge et al.'s ImageNet-Texture: the size hint for datasets of varying image size.
PAPER_SIZE = 224
# meta.json: format version, dataset name, split ("train" or "test"), number of images, texture
# side in pixels, images per shard, synthesis seed, the exemplar and quilting rule, the source's
# own arguments (Trifeature: image_size, num_images, trifeature_seed; TFDS: tfds_name and
# tfds_split) and image_digest (`image_digest` of the source).
META_FIELDS = (
    "format",
    "dataset",
    "split",
    "num_images",
    "size",
    "shard_size",
    "seed",
    "exemplar_rule",
    "source",
    "image_digest",
)


class TextureDatasetError(UsageError, FileNotFoundError):
  """The texture dataset is missing, incomplete or made from other images; the message holds
  the make_texture command that makes it."""


def shard_name(j: int) -> str:
  """File name of shard j."""
  return f"shard_{j:05d}.npy"


def num_shards(num_images: int, shard_size: int) -> int:
  """Shards holding num_images images, shard_size per shard (the last one may hold fewer)."""
  return -(-num_images // shard_size)


def image_digest(source) -> str:
  """Hex SHA-256 (first 16 digits) of the shapes and pixels of the source's first and last
  images: it tells apart sources of the same name and length that hold other images."""
  digest = hashlib.sha256()
  for i in sorted({0, len(source) - 1}):
    image = np.ascontiguousarray(source[i]["image"])
    digest.update(repr(image.shape).encode())
    digest.update(image.tobytes())
  return digest.hexdigest()[:16]


def read_meta(texture_dir: str) -> dict[str, Any] | None:
  """The parsed meta.json of texture_dir, or None where there is none."""
  path = os.path.join(texture_dir, META_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def missing_shards(texture_dir: str, meta: dict[str, Any]) -> list[int]:
  """Indices of the shards of `meta` that texture_dir does not hold yet."""
  count = num_shards(meta["num_images"], meta["shard_size"])
  return [j for j in range(count) if not os.path.exists(os.path.join(texture_dir, shard_name(j)))]


def make_command(
    texture_dir: str,
    *,
    dataset: str,
    split: str,
    size: int | None,
    seed: int = DEFAULT_SEED,
    shard_size: int = DEFAULT_SHARD_SIZE,
    source_args: dict[str, Any] | None = None,
    data_dir: str | None = None,
) -> str:
  """The make_texture command line of these arguments (defaults left out).

  source_args: the Trifeature arguments (image_size, num_images, trifeature_seed) as stored in
  meta["source"]; other keys are ignored. size None leaves --size out (its default is the
  Trifeature image size); data_dir is given to TFDS datasets.
  """
  args = ["python", "-m", "cl_jax.data.make_texture", f"--dataset={dataset}", f"--split={split}"]
  args.append(f"--out={texture_dir}")
  if size is not None:
    args.append(f"--size={size}")
  if dataset == "trifeature":
    source_args = source_args or {}
    for name in ("image_size", "num_images", "trifeature_seed"):
      if name in source_args and not (name == "trifeature_seed" and source_args[name] == 0):
        args.append(f"--{name}={source_args[name]}")
  elif data_dir:
    args.append(f"--data_dir={data_dir}")
  if seed != DEFAULT_SEED:
    args.append(f"--seed={seed}")
  if shard_size != DEFAULT_SHARD_SIZE:
    args.append(f"--shard_size={shard_size}")
  return shlex.join(args)


class TextureSource:
  """Random-access source: record i is `source[i]` plus KEY, (S, S, 3) uint8.

  The shards are opened with np.load(mmap_mode="r") on first use in each process, so the
  source pickles (grain worker processes) without them.
  """

  def __init__(
      self, source, texture_dir: str, *, dataset: str, split: str, size: int | None = None
  ):
    """Checks texture_dir against the source.

    Args:
      source: random-access source of the images (cl_jax.data.sources.open_source).
      texture_dir: directory written by make_texture.
      dataset, split: the source's dataset name and split ("train" or "test"), as given to
        make_texture.
      size: the texture side the caller expects, or None to accept meta.json's.

    Raises:
      TextureDatasetError: texture_dir has no texture dataset, one of other images or
        arguments, or an unfinished one; the message holds the command that makes it.
    """
    self.source = source
    self.texture_dir = texture_dir
    meta = read_meta(texture_dir)
    if meta is None:
      raise TextureDatasetError(
          f"no texture dataset in {texture_dir} ({META_FILE} not found); make it with: "
          f"{self._command(dataset, split, size)}"
      )
    expected = {
        "format": FORMAT_VERSION,
        "dataset": dataset,
        "split": split,
        "num_images": len(source),
    }
    if size is not None:
      expected["size"] = size
    differing = [
        f"{k} {meta.get(k)!r} (expected {v!r})" for k, v in expected.items() if meta.get(k) != v
    ]
    if not differing and meta.get("image_digest") != image_digest(source):
      differing.append("image_digest (the source holds other images)")
    if differing:
      raise TextureDatasetError(
          f"the texture dataset in {texture_dir} does not match the source: "
          f"{'; '.join(differing)}. Make a matching one in another directory (or delete this "
          f"one) with: {self._command(dataset, split, size)}"
      )
    missing = missing_shards(texture_dir, meta)
    if missing:
      command = make_command(
          texture_dir,
          dataset=meta["dataset"],
          split=meta["split"],
          size=meta["size"],
          seed=meta["seed"],
          shard_size=meta["shard_size"],
          source_args=meta["source"],
          data_dir=getattr(source, "data_dir", None),
      )
      raise TextureDatasetError(
          f"the texture dataset in {texture_dir} is incomplete: {len(missing)} of "
          f"{num_shards(meta['num_images'], meta['shard_size'])} shards missing "
          f"({shard_name(missing[0])} first); finish it with: {command}"
      )
    self.size = meta["size"]
    self.shard_size = meta["shard_size"]
    self._shards = {}

  def _command(self, dataset: str, split: str, size: int | None) -> str:
    """The make_texture command for self.source: its Trifeature image size and length (a
    non-default Trifeature seed is not known here), or its TFDS data_dir; --size is `size`,
    else for TFDS the dataset's native resolution or PAPER_SIZE where images vary in size."""
    source_args, data_dir = {}, None
    if dataset == "trifeature":
      image = self.source[0]["image"]
      source_args = {"image_size": image.shape[0], "num_images": len(self.source)}
    else:
      from cl_jax.data import tfds_source  # pylint: disable=import-outside-toplevel

      data_dir = getattr(self.source, "data_dir", None)
      if size is None and dataset in tfds_source.DATASETS:
        size = tfds_source.DATASETS[dataset].native_resolution or PAPER_SIZE
    return make_command(
        self.texture_dir,
        dataset=dataset,
        split=split,
        size=size,
        source_args=source_args,
        data_dir=data_dir,
    )

  def _shard(self, j: int) -> np.ndarray:
    """(n_j, S, S, 3) uint8 memory map of shard j, opened on first use."""
    if j not in self._shards:
      self._shards[j] = np.load(os.path.join(self.texture_dir, shard_name(j)), mmap_mode="r")
    return self._shards[j]

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> dict[str, Any]:
    index = int(index)
    if not 0 <= index < len(self):
      raise IndexError(f"index {index} out of range for a source of {len(self)} records.")
    record = dict(self.source[index])
    j, k = divmod(index, self.shard_size)
    record[KEY] = np.array(self._shard(j)[k])
    return record

  @property
  def num_classes(self) -> dict[str, int]:
    return self.source.num_classes

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, "_shards": {}}

  def __repr__(self) -> str:
    return f"TextureSource({self.source!r}, {self.texture_dir}, size={self.size})"
