"""Tests for cl_jax.data.tfds_source, with no real dataset and no network.

Each test data_dir holds the TFDS metadata files (dataset_info.json, features.json, label files)
that `tfds build` writes next to the records, so `builder.is_prepared()` holds. The records come
from `tfds.testing.mock_data` (random examples, or a fake data source with known labels for
ImageNet-100), or, in the last tests, from tiny genuine ArrayRecord shards written here.
"""

import concurrent.futures
import io
import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import PIL.Image
import pytest

import cl_jax.data
from cl_jax.data import tfds_source

tfds = pytest.importorskip("tensorflow_datasets")
array_record_module = pytest.importorskip("array_record.python.array_record_module")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


# A loader process that has not finished after this many seconds prints every thread's stack
# (faulthandler) and exits, failing the test with the stacks instead of hanging it.
_LOADER_HANG_S = 120


def _run_in_own_group(code: str, args: tuple[str, ...]) -> tuple[int, str, str]:
  """`python -c code *args` in its own process group, killed as a whole once the process has
  ended or hung past the faulthandler's deadline (an orphaned grain worker dies with it); the
  output goes through files, which no orphan can hold open. (returncode, stdout, stderr)."""
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        stdout=out,
        stderr=err,
        text=True,
        start_new_session=True,
    )
    try:
      proc.wait(timeout=_LOADER_HANG_S + 60)
    except subprocess.TimeoutExpired:
      pass
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the process and all its children have ended
      pass
    proc.wait()
    out.seek(0)
    err.seek(0)
    return proc.returncode, out.read(), err.read()


NUM_MOCK_EXAMPLES = 6


def write_prepared_dataset(data_dir, tfds_name, splits, file_format="array_record"):
  """Lays out a dataset in data_dir/<name>/<version>/ as `tfds build` does.

  Args:
    data_dir: TFDS data directory.
    tfds_name: registered TFDS builder name; its real features and label names are used.
    splits: split name -> number of records (metadata only, records come from mock_data), or
      -> list of example dicts, serialized into one ArrayRecord shard.
    file_format: file format recorded in dataset_info.json.
  """
  builder = tfds.builder(tfds_name, data_dir=str(data_dir), file_format=file_format)
  builder.data_path.mkdir(parents=True)
  split_infos = []
  for split, content in splits.items():
    template = tfds.core.ShardedFileTemplate(
        data_dir=builder.data_path,
        dataset_name=tfds_name,
        split=split,
        filetype_suffix=file_format,
    )
    if isinstance(content, list):
      writer = array_record_module.ArrayRecordWriter(
          os.fspath(template.sharded_filepath(shard_index=0, num_shards=1)), "group_size:1"
      )
      for example in content:
        writer.write(builder.info.features.serialize_example(example))
      writer.close()
    size = len(content) if isinstance(content, list) else content
    split_infos.append(
        tfds.core.SplitInfo(
            name=split, shard_lengths=[size], num_bytes=0, filename_template=template
        )
    )
  builder.info.set_splits(tfds.core.SplitDict(split_infos))
  builder.info.write_to_directory(builder.data_path)


def encoded(image, image_format):
  """(H, W, 3) uint8 image encoded as PNG or JPEG bytes."""
  buffer = io.BytesIO()
  PIL.Image.fromarray(image).save(buffer, format=image_format, quality=100)
  return buffer.getvalue()


def imagenet100_wnids():
  path = pathlib.Path(cl_jax.data.__file__).with_name("imagenet100_classes.txt")
  return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def test_importing_module_does_not_import_tensorflow():
  code = (
      "import sys, cl_jax.data.tfds_source; "
      "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
      "('tensorflow', 'tensorflow_datasets')); "
      "assert not bad, bad"
  )
  result = subprocess.run(
      [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
  )
  assert result.returncode == 0, result.stderr


def test_unknown_dataset_name_lists_allowed_names(tmp_path):
  with pytest.raises(ValueError) as error:
    tfds_source.open_source("imagenet1k", "pretrain", str(tmp_path))
  for name in ("cifar10", "cifar100", "stl10", "imagenet2012", "imagenet100"):
    assert name in str(error.value)


def test_unknown_split_role_is_rejected(tmp_path):
  with pytest.raises(ValueError, match="probe_train"):
    tfds_source.open_source("cifar10", "validation", str(tmp_path))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("cifar10", ["tfds build cifar10 --data_dir={d} --file_format=array_record"]),
        ("stl10", ["tfds build stl10 --data_dir={d} --file_format=array_record"]),
        (
            "imagenet100",
            [
                "ILSVRC2012_img_train.tar",
                os.path.join("{d}", "downloads", "manual"),
                "tfds build imagenet2012 --data_dir={d} --file_format=array_record",
            ],
        ),
    ],
)
def test_missing_dataset_names_the_preparation_command(tmp_path, monkeypatch, name, expected):
  def no_download(*args, **kwargs):
    raise AssertionError("open_source must never download")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_download)
  data_dir = str(tmp_path)
  with pytest.raises(tfds_source.DatasetNotFoundError) as error:
    tfds_source.open_source(name, "pretrain", data_dir)
  assert isinstance(error.value, FileNotFoundError)
  message = str(error.value)
  assert repr(name) in message and repr(data_dir) in message
  for fragment in expected:
    assert fragment.format(d=data_dir) in message
  assert list(tmp_path.iterdir()) == []


def test_tfrecord_dataset_asks_for_array_record(tmp_path):
  write_prepared_dataset(tmp_path, "cifar10", {"train": 4, "test": 4}, file_format="tfrecord")
  with pytest.raises(tfds_source.DatasetFormatError, match="--out_file_format=array_record"):
    tfds_source.open_source("cifar10", "pretrain", str(tmp_path))


@pytest.mark.parametrize(
    "name, role, split, side, num_classes",
    [
        ("cifar10", "pretrain", "train", 32, 10),
        ("cifar10", "test", "test", 32, 10),
        ("cifar100", "probe_train", "train", 32, 100),
        ("stl10", "pretrain", "unlabelled", 96, 10),
        ("stl10", "test", "test", 96, 10),
    ],
)
def test_mocked_source_reads_the_role_split(tmp_path, name, role, split, side, num_classes):
  write_prepared_dataset(
      tmp_path, name, {s: NUM_MOCK_EXAMPLES for s in ("train", "test", "unlabelled")}
  )
  reader = tfds.testing.PickableDataSourceMock()
  with tfds.testing.mock_data(
      num_examples=NUM_MOCK_EXAMPLES, data_dir=str(tmp_path), mock_array_record_data_source=reader
  ):
    source = tfds_source.open_source(name, role, str(tmp_path))
    examples = [source[i] for i in range(len(source))]
  (instructions,), _ = reader.call_args
  assert [os.path.basename(f.filename) for f in instructions] == [
      f"{name}-{split}.array_record-00000-of-00001"
  ]
  assert len(examples) == NUM_MOCK_EXAMPLES
  assert source.num_classes == {"label": num_classes}
  for example in examples:
    assert example["image"].dtype == np.uint8 and example["image"].shape == (side, side, 3)
    assert type(example["label"]) is int
  labels = np.array([example["label"] for example in examples])
  if split == "unlabelled":
    np.testing.assert_array_equal(labels, -1)
  else:
    assert labels.min() >= 0 and labels.max() < num_classes


def test_index_out_of_range(tmp_path):
  write_prepared_dataset(tmp_path, "cifar10", {"train": NUM_MOCK_EXAMPLES, "test": 2})
  with tfds.testing.mock_data(num_examples=NUM_MOCK_EXAMPLES, data_dir=str(tmp_path)):
    source = tfds_source.open_source("cifar10", "pretrain", str(tmp_path))
    with pytest.raises(IndexError):
      source[NUM_MOCK_EXAMPLES]


def test_pickled_source_reopens_and_yields_the_same_examples(tmp_path):
  write_prepared_dataset(tmp_path, "cifar10", {"train": NUM_MOCK_EXAMPLES, "test": 2})
  with tfds.testing.mock_data(num_examples=NUM_MOCK_EXAMPLES, data_dir=str(tmp_path)):
    source = tfds_source.open_source("cifar10", "pretrain", str(tmp_path))
    before = [source[i] for i in range(len(source))]
    restored = pickle.loads(pickle.dumps(source))
    after = [restored[i] for i in range(len(restored))]
  assert len(after) == len(before)
  for a, b in zip(after, before):
    np.testing.assert_array_equal(a["image"], b["image"])
    assert a["label"] == b["label"]


def test_threads_reaching_a_reopened_source_together_open_it_once(tmp_path, monkeypatch):
  """grain's read threads all touch a freshly unpickled source at once; one of them opens the
  TFDS source while the others wait (concurrent first imports of tensorflow_datasets can
  deadlock), and all read the same records."""
  write_prepared_dataset(tmp_path, "cifar10", {"train": NUM_MOCK_EXAMPLES, "test": 2})
  with tfds.testing.mock_data(num_examples=NUM_MOCK_EXAMPLES, data_dir=str(tmp_path)):
    source = tfds_source.open_source("cifar10", "pretrain", str(tmp_path))
    expected = [source[i] for i in range(len(source))]
    restored = pickle.loads(pickle.dumps(source))
    opened = []
    open_records = tfds_source._open_records

    def slow_open(*args):
      opened.append(threading.get_ident())
      time.sleep(0.5)  # long enough that every thread arrives while the first is opening
      return open_records(*args)

    monkeypatch.setattr(tfds_source, "_open_records", slow_open)
    threads = 8
    barrier = threading.Barrier(threads)

    def read(i):
      barrier.wait()
      return restored[i % len(expected)]

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
      examples = list(pool.map(read, range(threads)))
  assert len(opened) == 1
  for i, example in enumerate(examples):
    np.testing.assert_array_equal(example["image"], expected[i % len(expected)]["image"])
    assert example["label"] == expected[i % len(expected)]["label"]


class FakeImagenetRecords:
  """Stand-in ImageNet-2012 data source: record i has TFDS label labels[i], pixels all i."""

  def __init__(self, labels, calls):
    self.labels = labels
    self.calls = calls

  def __len__(self):
    return len(self.labels)

  def __getitem__(self, i):
    shape = (5 + i % 3, 7, 3)
    return {
        "image": np.full(shape, i, np.uint8),
        "label": np.int64(self.labels[i]),
        "file_name": "",
    }

  def __getitems__(self, keys):
    self.calls.append(len(keys))
    return [self[k] for k in keys]


@pytest.fixture(name="imagenet")
def fixture_imagenet(tmp_path):
  """Metadata of imagenet2012 in tmp_path and known TFDS labels for its train/validation."""
  names = np.array(
      tfds.builder("imagenet2012", data_dir=str(tmp_path)).info.features["label"].names
  )
  wnids = imagenet100_wnids()
  inside = np.flatnonzero(np.isin(names, wnids))
  outside = np.flatnonzero(~np.isin(names, wnids))
  rng = np.random.default_rng(0)
  labels = {
      "train": rng.permutation(np.concatenate([rng.choice(inside, 9), rng.choice(outside, 11)])),
      "validation": rng.permutation(np.concatenate([rng.choice(inside, 4), outside[:5]])),
  }
  data_dir = tmp_path / "data"
  write_prepared_dataset(data_dir, "imagenet2012", {s: len(v) for s, v in labels.items()})
  label_reads, opens = [], []

  def as_data_source(builder, split, decoders=None, deserialize_method=None):
    del builder, decoders, deserialize_method
    opens.append(split)
    return FakeImagenetRecords(labels[split], label_reads)

  with tfds.testing.mock_data(data_dir=str(data_dir), as_data_source_fn=as_data_source):
    yield {
        "data_dir": data_dir,
        "names": names,
        "labels": labels,
        "label_reads": label_reads,
        "opens": opens,
    }


def expected_imagenet100(names, labels, wnids):
  """Kept record indices and their labels: position of the wnid in the sorted 100 ids."""
  record_wnids = names[labels]
  keep = np.isin(record_wnids, wnids)
  return np.flatnonzero(keep), np.searchsorted(np.sort(wnids), record_wnids[keep])


@pytest.mark.parametrize("role, split", [("pretrain", "train"), ("test", "validation")])
def test_imagenet100_keeps_the_100_classes_in_sorted_order(imagenet, tmp_path, role, split):
  kept, kept_labels = expected_imagenet100(
      imagenet["names"], imagenet["labels"][split], imagenet100_wnids()
  )
  source = tfds_source.open_source(
      "imagenet100", role, str(imagenet["data_dir"]), fallback_cache_dir=str(tmp_path / "fb")
  )
  assert source.num_classes == {"label": 100}
  assert len(source) == len(kept) > 0
  for j, (index, label) in enumerate(zip(kept, kept_labels)):
    example = source[j]
    assert example["label"] == label
    assert example["image"].dtype == np.uint8 and example["image"].shape[-1] == 3
    np.testing.assert_array_equal(example["image"], index)


def test_imagenet100_index_is_cached_in_data_dir_and_reused(imagenet, tmp_path):
  data_dir = str(imagenet["data_dir"])
  fallback = tmp_path / "fallback"
  first = tfds_source.open_source(
      "imagenet100", "pretrain", data_dir, fallback_cache_dir=str(fallback)
  )
  reads = len(imagenet["label_reads"])
  assert reads > 0
  (cache_file,) = (imagenet["data_dir"] / tfds_source.INDEX_CACHE_FOLDER).iterdir()
  kept, _ = expected_imagenet100(
      imagenet["names"], imagenet["labels"]["train"], imagenet100_wnids()
  )
  cached = np.load(cache_file)
  assert cached.dtype == np.int64
  np.testing.assert_array_equal(cached, kept)
  assert not fallback.exists()

  second = tfds_source.open_source(
      "imagenet100", "pretrain", data_dir, fallback_cache_dir=str(fallback)
  )
  assert len(imagenet["label_reads"]) == reads
  assert [second[j]["label"] for j in range(len(second))] == [
      first[j]["label"] for j in range(len(first))
  ]


def test_imagenet100_index_falls_back_when_data_dir_is_not_writable(imagenet, tmp_path):
  data_dir = imagenet["data_dir"]
  (data_dir / tfds_source.INDEX_CACHE_FOLDER).write_text("a file where the folder would go")
  fallback = tmp_path / "fallback"
  first = tfds_source.open_source(
      "imagenet100", "test", str(data_dir), fallback_cache_dir=str(fallback)
  )
  reads = len(imagenet["label_reads"])
  cache_files = list(fallback.rglob("*.npy"))
  assert len(cache_files) == 1
  np.testing.assert_array_equal(np.load(cache_files[0]), first.index)
  second = tfds_source.open_source(
      "imagenet100", "test", str(data_dir), fallback_cache_dir=str(fallback)
  )
  assert len(imagenet["label_reads"]) == reads
  np.testing.assert_array_equal(second.index, first.index)


def test_imagenet100_source_pickles_with_its_index_and_reopens(imagenet, tmp_path):
  source = tfds_source.open_source(
      "imagenet100", "pretrain", str(imagenet["data_dir"]), fallback_cache_dir=str(tmp_path)
  )
  source[0]
  opens = len(imagenet["opens"])
  restored = pickle.loads(pickle.dumps(source))
  restored[0]
  assert len(imagenet["opens"]) == opens + 1
  assert len(restored) == len(source)
  for j in range(len(source)):
    np.testing.assert_array_equal(restored[j]["image"], source[j]["image"])
    assert restored[j]["label"] == source[j]["label"]


def test_subset_label_map_hand_checked():
  label_map = tfds_source.subset_label_map(["n3", "n1", "n2", "n0"], ["n2", "n0"])
  np.testing.assert_array_equal(label_map, [-1, -1, 1, 0])
  with pytest.raises(ValueError, match="n9"):
    tfds_source.subset_label_map(["n3", "n1"], ["n1", "n9"])


def test_imagenet100_from_array_record_files(tmp_path):
  names = tfds.builder("imagenet2012", data_dir=str(tmp_path)).info.features["label"].names
  wnids = imagenet100_wnids()
  labels = np.array(
      [names.index(wnids[3]), 0, names.index(wnids[0]), 999, names.index(wnids[99]), 7]
  )
  examples = [
      {
          "image": encoded(np.full((6 + i, 5, 3), 20 * i, np.uint8), "JPEG"),
          "label": int(label),
          "file_name": f"{names[label]}_{i}.JPEG",
      }
      for i, label in enumerate(labels)
  ]
  data_dir = tmp_path / "data"
  write_prepared_dataset(data_dir, "imagenet2012", {"train": examples, "validation": 2})
  kept, kept_labels = expected_imagenet100(np.array(names), labels, wnids)
  source = tfds_source.open_source(
      "imagenet100", "probe_train", str(data_dir), fallback_cache_dir=str(tmp_path / "fb")
  )
  assert len(source) == len(kept) == 3
  for j, (index, label) in enumerate(zip(kept, kept_labels)):
    example = source[j]
    assert example["label"] == label
    assert example["image"].dtype == np.uint8 and example["image"].shape == (6 + index, 5, 3)
    np.testing.assert_allclose(example["image"], 20 * index, atol=2)


@pytest.mark.slow
def test_cifar10_from_array_record_files_through_a_grain_worker(tmp_path):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, size=(5, 32, 32, 3), dtype=np.uint8)
  labels = [3, 0, 9, 3, 1]
  examples = [
      {"id": str(i), "image": encoded(image, "PNG"), "label": label}
      for i, (image, label) in enumerate(zip(images, labels))
  ]
  write_prepared_dataset(tmp_path, "cifar10", {"train": 2, "test": examples})
  # The loader runs in a fresh process, as in a training run: tensorflow_datasets is not yet
  # imported there when the worker's read threads first open the source.
  code = (
      "import faulthandler, json, sys\n"
      f"faulthandler.dump_traceback_later({_LOADER_HANG_S}, exit=True)\n"
      "import grain, numpy as np\n"
      "from absl import flags\n"
      "from cl_jax.data import tfds_source\n"
      "flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags\n"
      f"source = tfds_source.open_source('cifar10', 'test', {str(tmp_path)!r})\n"
      "loader = grain.DataLoader(data_source=source, sampler=grain.samplers.IndexSampler(\n"
      "    num_records=len(source), shard_options=grain.sharding.NoSharding(),\n"
      "    shuffle=False, num_epochs=1), worker_count=1)\n"
      "loaded = list(loader)\n"
      "np.save(sys.argv[1], np.stack([e['image'] for e in loaded]))\n"
      "print(json.dumps([int(e['label']) for e in loaded]), flush=True)\n"
  )
  out = tmp_path / "images.npy"
  returncode, stdout, stderr = _run_in_own_group(code, (str(out),))
  assert returncode == 0, stderr[-6000:]
  assert json.loads(stdout.strip().splitlines()[-1]) == labels
  np.testing.assert_array_equal(np.load(out), images)
