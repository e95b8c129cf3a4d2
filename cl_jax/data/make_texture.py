"""The offline job that makes the texture version of a dataset (Ge et al. 2021, Sec. 2.2).

python -m cl_jax.data.make_texture --dataset=NAME --out=DIR [--split=train|test] [--size=S]
    [--workers=N] [--seed=0] [--shard_size=1000]
    [--image_size=32] [--num_images=N] [--trifeature_seed=0]    (--dataset=trifeature)
    [--data_dir=DIR]                                            (TFDS datasets)

Image i of the split, read through cl_jax.data.sources.open_source (role "pretrain" for
--split=train, "test" for --split=test), gets the S x S texture image
`quilting.texture_image(image_i, S, np.random.default_rng([seed, i]))`: image quilting from a
centred and a random exemplar patch. The randomness of an image depends on (seed, i) only, so
the result depends neither on --workers nor on interruptions. For Trifeature the source is the
one of `cl_jax.config_defaults.base_config().data` with --image_size, --num_images (default: the
config's train or test count) and --trifeature_seed applied, and S defaults to the image size;
TFDS datasets need --data_dir and --size.

DIR receives meta.json first (texture_source.META_FIELDS), then shard_{j:05d}.npy, the
(n_j, S, S, 3) uint8 textures of images [j * n, j * n + n_j) with n = --shard_size. Each file is
written to a temporary name and renamed into place, so an existing shard is finished work: a
rerun with the same arguments makes only the missing shards, and a rerun with other arguments
into the same DIR is refused, naming the fields that differ. Shards are the unit of work of the
--workers processes (spawn context; --workers=1 works in this process). One job per DIR.
"""

import concurrent.futures
import json
import multiprocessing
import os
import queue
import sys
import uuid

import ml_collections
import numpy as np
import tqdm
from absl import app, flags

from cl_jax import config_defaults
from cl_jax.data import quilting, sources, tfds_source
from cl_jax.data import texture_source as ts
from cl_jax.runtime import child_processes, cli
from cl_jax.runtime.errors import UsageError

SPLIT_ROLES = {"train": "pretrain", "test": "test"}
_TEMP_SUFFIX = ".tmp"


class TextureDirMismatchError(UsageError):
  """The output directory holds a texture dataset made with other arguments."""


def data_config(
    dataset: str,
    split: str,
    *,
    data_dir: str | None = None,
    image_size: int | None = None,
    num_images: int | None = None,
    trifeature_seed: int | None = None,
) -> ml_collections.ConfigDict:
  """`base_config().data` for the dataset, with the given fields applied.

  image_size, num_images (of the split) and trifeature_seed apply to Trifeature only, data_dir
  to TFDS datasets only; None keeps the config's value.
  """
  if dataset not in sources.DATASET_NAMES:
    raise UsageError(
        f"unknown dataset {dataset!r}; choose one of {', '.join(sources.DATASET_NAMES)}"
    )
  if split not in SPLIT_ROLES:
    raise UsageError(f"unknown split {split!r}; choose one of {', '.join(SPLIT_ROLES)}")
  data = config_defaults.base_config().data
  data.name = dataset
  trifeature_args = {
      "image_size": image_size,
      "num_images": num_images,
      "trifeature_seed": trifeature_seed,
  }
  if dataset == "trifeature":
    if data_dir:
      raise UsageError("--data_dir applies to TFDS datasets only, not to trifeature")
    if image_size is not None:
      data.image_size = image_size
    if num_images is not None:
      setattr(data, "trifeature_test" if split == "test" else "trifeature_train", num_images)
    if trifeature_seed is not None:
      data.trifeature_seed = trifeature_seed
  else:
    given = [f"--{name}" for name, value in trifeature_args.items() if value is not None]
    if given:
      raise UsageError(f"{', '.join(given)} apply to --dataset=trifeature only, not to {dataset}")
    if not data_dir:
      raise UsageError(f"--data_dir (a prepared TFDS data_dir) is required for {dataset}")
    data.data_dir = data_dir
  return data


def open_source(data: ml_collections.ConfigDict, split: str):
  """The source of `data` for split "train" or "test"; bad arguments and missing TFDS data
  raise UsageError with a one-line message."""
  try:
    return sources.open_source(data, SPLIT_ROLES[split])
  except (UsageError, ValueError) as e:
    raise UsageError(" ".join(line.strip() for line in str(e).splitlines())) from e


def texture_meta(
    data: ml_collections.ConfigDict, split: str, source, *, size: int, shard_size: int, seed: int
) -> dict:
  """The meta.json of the textures of `source` (texture_source.META_FIELDS)."""
  if data.name == "trifeature":
    source_args = {
        "image_size": data.image_size,
        "num_images": len(source),
        "trifeature_seed": data.trifeature_seed,
    }
  else:
    spec = tfds_source.dataset_spec(data.name)
    source_args = {
        "tfds_name": spec.tfds_name,
        "tfds_split": getattr(spec.splits, SPLIT_ROLES[split]),
    }
  return {
      "format": ts.FORMAT_VERSION,
      "dataset": data.name,
      "split": split,
      "num_images": len(source),
      "size": size,
      "shard_size": shard_size,
      "seed": seed,
      "exemplar_rule": quilting.EXEMPLAR_RULE,
      "source": source_args,
      "image_digest": ts.image_digest(source),
  }


def _flatten(meta: dict, prefix: str = "") -> dict:
  """{"a.b": value} for the nested dict {"a": {"b": value}}."""
  flat = {}
  for key, value in meta.items():
    if isinstance(value, dict):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def _write_atomically(path: str, write) -> None:
  """Calls write(file) on a temporary file next to `path`, then renames it to `path`."""
  folder, name = os.path.split(path)
  temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}{_TEMP_SUFFIX}")
  try:
    with open(temp, "xb") as f:
      write(f)
    os.replace(temp, path)
  finally:
    if os.path.exists(temp):
      os.remove(temp)


def _check_out_dir(out_dir: str) -> None:
  """UsageError if `out_dir` names an existing file (it must be a directory or not exist)."""
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise UsageError(f"--out={out_dir} is a file; give a directory (new, or holding textures)")


def prepare_dir(out_dir: str, meta: dict) -> None:
  """Makes out_dir hold `meta`: writes meta.json into a new or empty directory, or checks the
  one there; removes temporary files that an interrupted job left behind.

  Raises:
    TextureDirMismatchError: out_dir holds meta.json of other arguments, or other files.
  """
  _check_out_dir(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  for name in os.listdir(out_dir):
    if name.startswith(".") and name.endswith(_TEMP_SUFFIX):
      os.remove(os.path.join(out_dir, name))
  stored = ts.read_meta(out_dir)
  if stored is None:
    if os.listdir(out_dir):
      raise TextureDirMismatchError(
          f"{out_dir} holds files but no {ts.META_FILE}; choose an empty or new --out"
      )
    text = json.dumps(meta, indent=2).encode()
    _write_atomically(os.path.join(out_dir, ts.META_FILE), lambda f: f.write(text))
    return
  ours, theirs = _flatten(meta), _flatten(stored)
  differing = [
      f"{key} {theirs.get(key)!r} there, {ours.get(key)!r} now"
      for key in sorted(set(ours) | set(theirs))
      if ours.get(key) != theirs.get(key)
  ]
  if differing:
    raise TextureDirMismatchError(
        f"{out_dir} holds textures made with other arguments ({'; '.join(differing)}); rerun "
        f"with its arguments to finish it, or choose another --out"
    )


def shard_textures(source, start: int, stop: int, size: int, seed: int, on_image=None):
  """(stop - start, size, size, 3) uint8 textures of images [start, stop) of `source`.

  on_image: called after every image (progress).
  """
  textures = np.empty((stop - start, size, size, 3), np.uint8)
  for i in range(start, stop):
    rng = np.random.default_rng([seed, i])
    textures[i - start] = quilting.texture_image(source[i]["image"], size, rng)
    if on_image is not None:
      on_image()
  return textures


def _write_shard(source, out_dir: str, meta: dict, j: int, on_image=None) -> None:
  """Synthesises shard j of `meta` and writes it atomically."""
  start = j * meta["shard_size"]
  stop = min(start + meta["shard_size"], meta["num_images"])
  textures = shard_textures(source, start, stop, meta["size"], meta["seed"], on_image)
  _write_atomically(os.path.join(out_dir, ts.shard_name(j)), lambda f: np.save(f, textures))


_WORKER = {}  # in a worker process: its source and the queue of image counts


def _init_worker(source, progress, parent_pid: int) -> None:
  """Worker process start-up: keeps the (pickled) source and the progress queue, and dies
  with the parent whatever kills it (cl_jax.runtime.child_processes)."""
  child_processes.die_with_parent(parent_pid)
  _WORKER.update(source=source, progress=progress)


def _worker_shard(out_dir: str, meta: dict, j: int) -> None:
  """Writes shard j in a worker process, reporting every image to the progress queue."""
  progress = _WORKER["progress"]
  _write_shard(_WORKER["source"], out_dir, meta, j, lambda: progress.put(1))


def _drain(progress, bar) -> None:
  """Moves the image counts that the workers reported onto the progress bar."""
  while True:
    try:
      bar.update(progress.get_nowait())
    except queue.Empty:
      return


def _run_pool(source, out_dir: str, meta: dict, todo: list[int], workers: int, bar) -> None:
  """Writes the shards `todo` in `workers` spawned processes."""
  context = multiprocessing.get_context("spawn")
  progress = context.Queue()
  pool = concurrent.futures.ProcessPoolExecutor(
      min(workers, len(todo)),
      mp_context=context,
      initializer=_init_worker,
      initargs=(source, progress, os.getpid()),
  )
  try:
    pending = {pool.submit(_worker_shard, out_dir, meta, j) for j in todo}
    while pending:
      done, pending = concurrent.futures.wait(
          pending, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED
      )
      _drain(progress, bar)
      for future in done:
        future.result()
  except BaseException:  # a failed shard or Ctrl-C: stop the shards under way at once
    pool.shutdown(wait=False, cancel_futures=True)
    for process in multiprocessing.active_children():
      process.kill()
    raise
  pool.shutdown()
  _drain(progress, bar)


def write_textures(
    source, out_dir: str, meta: dict, *, workers: int = 1, progress: bool = True
) -> list[int]:
  """Makes the shards of `meta` that out_dir lacks (after `prepare_dir`); returns their
  indices."""
  todo = ts.missing_shards(out_dir, meta)
  done = meta["num_images"] - sum(
      min(meta["shard_size"], meta["num_images"] - j * meta["shard_size"]) for j in todo
  )
  bar = tqdm.tqdm(
      total=meta["num_images"],
      initial=done,
      desc=f"textures {meta['dataset']} {meta['split']} {meta['size']}px",
      unit="img",
      disable=not progress,
  )
  with bar:
    if workers > 1 and len(todo) > 1:
      _run_pool(source, out_dir, meta, todo, workers, bar)
    else:
      for j in todo:
        _write_shard(source, out_dir, meta, j, lambda: bar.update(1))
  return todo


def make(
    dataset: str,
    out_dir: str,
    *,
    split: str = "train",
    size: int | None = None,
    workers: int = 1,
    seed: int = ts.DEFAULT_SEED,
    shard_size: int = ts.DEFAULT_SHARD_SIZE,
    data_dir: str | None = None,
    image_size: int | None = None,
    num_images: int | None = None,
    trifeature_seed: int | None = None,
    progress: bool = True,
) -> list[int]:
  """The job: checks the arguments, opens the source, prepares out_dir and writes the missing
  shards; returns the indices of the shards written. Arguments as the command's flags."""
  data = data_config(
      dataset,
      split,
      data_dir=data_dir,
      image_size=image_size,
      num_images=num_images,
      trifeature_seed=trifeature_seed,
  )
  if size is None and dataset != "trifeature":
    raise UsageError(f"--size (texture side in pixels) is required for {dataset}")
  size = data.image_size if size is None else size
  for name, value in (("size", size), ("workers", workers), ("shard_size", shard_size)):
    if value < 1:
      raise UsageError(f"--{name} must be a positive integer, got {value}")
  if seed < 0:
    raise UsageError(f"--seed must be a non-negative integer, got {seed}")
  _check_out_dir(out_dir)  # before the source is opened (rendering Trifeature takes a while)
  source = open_source(data, split)
  meta = texture_meta(data, split, source, size=size, shard_size=shard_size, seed=seed)
  prepare_dir(out_dir, meta)
  return write_textures(source, out_dir, meta, workers=workers, progress=progress)


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {' '.join(argv[1:])}")
  f = flags.FLAGS
  with cli.report():
    try:
      written = make(
          f.dataset,
          f.out,
          split=f.split,
          size=f.size,
          workers=(os.cpu_count() or 1) if f.workers is None else f.workers,
          seed=f.seed,
          shard_size=f.shard_size,
          data_dir=f.data_dir,
          image_size=f.image_size,
          num_images=f.num_images,
          trifeature_seed=f.trifeature_seed,
      )
    except KeyboardInterrupt:
      print(
          f"interrupted: the finished shards in {f.out} are kept; run the same command again "
          "to make the rest",
          file=sys.stderr,
      )
      sys.exit(130)
  print(f"{f.out}: wrote {len(written)} shards; the texture dataset is complete")


def _define_flags() -> None:
  """The command's flags, defined only when it runs as a program (importing the module for its
  functions, as the tests and the spawned workers do, defines none)."""
  flags.DEFINE_string("dataset", None, f"Dataset: {', '.join(sources.DATASET_NAMES)}.")
  flags.DEFINE_string("out", None, "Output directory of meta.json and the shards.")
  flags.DEFINE_enum("split", "train", list(SPLIT_ROLES), "Split (train: the pretraining one).")
  flags.DEFINE_integer(
      "size", None, "Texture side in pixels (default: the Trifeature image size; TFDS: required)."
  )
  flags.DEFINE_integer("workers", None, "Worker processes (default: the number of CPUs).")
  flags.DEFINE_integer("seed", ts.DEFAULT_SEED, "Seed; image i draws from default_rng([seed, i]).")
  flags.DEFINE_integer("shard_size", ts.DEFAULT_SHARD_SIZE, "Images per shard file.")
  flags.DEFINE_string("data_dir", None, "TFDS data_dir (prepared with --file_format=array_record).")
  flags.DEFINE_integer("image_size", None, "Trifeature image size (default: the config's, 32).")
  flags.DEFINE_integer(
      "num_images", None, "Trifeature images of the split (default: the config's 5000 / 2000)."
  )
  flags.DEFINE_integer("trifeature_seed", None, "Trifeature rendering seed (default: 0).")
  flags.mark_flags_as_required(["dataset", "out"])


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
