"""Pretraining and the probe on a folder of your images (cl_jax.data.folder_source): the two
layouts, the cached index, unreadable images, the same data order after a restart, and a run of
cl_jax.main on a generated folder of JPEGs."""

import json
import os

import numpy as np
import PIL.Image
import pytest

from cl_jax import config_defaults
from cl_jax.data import folder_source, image_folder, pipeline, sources
from cl_jax.data.tfds_source import UNLABELLED
from cl_jax.runtime.errors import UsageError
from tests import tiny_run


def _image(path, seed: int, size=(40, 48), fmt="JPEG"):
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
  PIL.Image.fromarray(pixels).save(path, format=fmt)


def make_labelled(root, per_class: int = 6, classes=("cat", "dog"), val: int = 2):
  """root/train/<class>/ and root/val/<class>/ of JPEGs and PNGs, one class with a nested
  subfolder."""
  n = 0
  for split, count in (("train", per_class), ("val", val)):
    for c in classes:
      for i in range(count):
        nested = "deep/" if c == classes[0] and i % 2 else ""
        ext, fmt = (".png", "PNG") if i % 3 == 0 else (".JPG", "JPEG")
        _image(os.path.join(root, split, c, f"{nested}{i:03d}{ext}"), n, fmt=fmt)
        n += 1
  return root


def _data(root, cache, **fields):
  c = config_defaults.base_config().data
  c.update(name="folder", folder=str(root), cache_dir=str(cache), **fields)
  return c


def test_a_labelled_folder_gives_each_split_its_classes_and_caches_the_index(tmp_path):
  root = make_labelled(tmp_path / "images")
  data = _data(root, tmp_path / "cache")
  train = sources.open_source(data, "probe_train")
  test = sources.open_source(data, "test")
  assert (len(train), len(test)) == (12, 4) and train.num_classes == {"label": 2}
  # Sorted by path; a nested image belongs to its top class folder.
  names = [os.path.relpath(f, root / "train") for f in train.files]
  assert names == sorted(names) and "cat/deep/001.JPG" in names
  assert train.labels.tolist() == [0] * 6 + [1] * 6
  item = train[names.index("dog/004.JPG")]
  assert item["image"].shape == (40, 48, 3) and item["label"] == 1
  # Pretraining reads train/, whose index is cached.
  pretrain = sources.open_source(data, "pretrain")
  assert pretrain.files == train.files and pretrain.digest == train.digest
  cached = folder_source.index_path(str(tmp_path / "cache"), str(root / "train"))
  assert json.loads(open(cached).read())["classes"] == ["cat", "dog"]


def test_the_index_follows_the_folder_when_images_are_added_removed_or_replaced(tmp_path, capsys):
  root = make_labelled(tmp_path / "images")
  data = _data(root, tmp_path / "cache")
  first = sources.open_source(data, "pretrain")
  cached = folder_source.index_path(str(tmp_path / "cache"), str(root / "train"))
  assert capsys.readouterr().err == ""  # a new index, nothing changed
  again = sources.open_source(data, "pretrain")
  assert again.files == first.files and capsys.readouterr().err == ""
  # Added: the new image is listed, with one line naming the cache file and why.
  _image(root / "train" / "cat" / "999.jpg", 99)
  added = sources.open_source(data, "pretrain")
  err = capsys.readouterr().err
  assert len(added) == 13 and str(root / "train" / "cat" / "999.jpg") in added.files
  assert "changed since it was indexed (12 -> 13 images" in err and cached in err
  assert added.digest != first.digest
  # Removed.
  os.remove(root / "train" / "dog" / "004.JPG")
  removed = sources.open_source(data, "pretrain")
  assert len(removed) == 12 and "13 -> 12 images" in capsys.readouterr().err
  # Replaced in place (same name, other pixels and size): the same files, indexed again.
  _image(root / "train" / "dog" / "005.JPG", 5, size=(30, 20))
  replaced = sources.open_source(data, "pretrain")
  assert replaced.files == removed.files and "indexed again" in capsys.readouterr().err
  assert replaced[replaced.files.index(str(root / "train/dog/005.JPG"))]["image"].shape == (
      30,
      20,
      3,
  )


def test_an_image_that_vanished_after_indexing_is_named_as_such(tmp_path):
  root = make_labelled(tmp_path / "images", per_class=3)
  source = sources.open_source(_data(root, tmp_path / "cache"), "pretrain")
  gone = source.files[2]
  os.remove(gone)
  with pytest.raises(folder_source.VanishedImageError, match="is gone: the folder changed"):
    source[2]


def test_any_tree_of_images_pretrains_without_labels_and_the_probe_asks_for_splits(tmp_path):
  root = tmp_path / "photos"
  _image(root / "a.jpg", 0)
  _image(root / "2021" / "05" / "b.png", 1, fmt="PNG")
  (root / "notes.txt").write_text("not an image")
  data = _data(root, tmp_path / "cache")
  pretrain = sources.open_source(data, "pretrain")
  assert len(pretrain) == 2 and pretrain[1]["label"] == UNLABELLED
  with pytest.raises(UsageError, match="labelled splits.*probe.after_pretrain=False"):
    sources.open_source(data, "probe_train")
  with pytest.raises(UsageError, match="not a folder of images|no images"):
    sources.open_source(_data(tmp_path / "none", tmp_path / "cache"), "pretrain")


def test_unreadable_images_stop_naming_the_file_or_are_skipped_and_named(tmp_path, capsys):
  root = make_labelled(tmp_path / "images", per_class=3)
  bad = root / "train" / "dog" / "broken.jpg"
  bad.write_bytes(b"\xff\xd8\xff not a jpeg")
  stop = sources.open_source(_data(root, tmp_path / "cache"), "pretrain")
  with pytest.raises(image_folder.BadImageError, match="broken.jpg.*bad_images=skip"):
    stop[stop.files.index(str(bad))]
  skip = sources.open_source(_data(root, tmp_path / "cache", bad_images="skip"), "pretrain")
  assert len(skip) == len(stop) - 1 and skip.skipped[0][0] == str(bad)
  assert "warning: skipped unreadable image" in capsys.readouterr().err


def test_a_restart_over_an_unchanged_folder_reads_the_same_batches(tmp_path):
  """The pipeline's element n depends on the index order: a new process (here: a new source)
  over the unchanged folder gets the same batch n; once a file is added, the order differs."""
  root = make_labelled(tmp_path / "images", per_class=8)
  data = _data(root, tmp_path / "cache")

  def batch(n: int) -> dict:
    ds = pipeline.pretrain_dataset(
        sources.open_source(data, "pretrain"),
        batch_size=4,
        image_size=16,
        crop_scale=(0.2, 1.0),
        seed=3,
    )
    return ds[n]

  first = batch(5)  # mid-epoch 2 of 16 images in batches of 4
  again = batch(5)
  for k in ("view1", "view2", "box1"):
    np.testing.assert_array_equal(first[k], again[k])
  _image(root / "train" / "cat" / "000a.jpg", 77)
  assert not np.array_equal(batch(5)["view1"], first["view1"])


def _folder_run_flags(root, cache, epochs: int, *extra: str) -> list[str]:
  """tiny_run's flags on the folder `root` (index cached in `cache`) for `epochs`, no kNN."""
  flags = [f for f in tiny_run.FLAGS if not f.startswith("--config.data.trifeature")]
  return flags + [
      "--config.data.name=folder",
      f"--config.data.folder={root}",
      f"--config.data.cache_dir={cache}",
      f"--config.optim.epochs={epochs}",
      "--config.eval.every=0",
      *extra,
  ]


@pytest.mark.slow
def test_a_run_pretrains_on_a_folder_of_jpegs_and_probes_its_labelled_split(tmp_path):
  root = make_labelled(tmp_path / "images", per_class=20, val=6)
  flags = _folder_run_flags(root, tmp_path / "cache", 1, "--config.probe.batch_size=16")
  proc = tiny_run.start(tmp_path / "run", flags)[0]
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  # 40 images in batches of 32: one step per epoch.
  report = json.loads((tmp_path / "run" / "probe_step1_fast.json").read_text())
  assert set(report["accuracy"]) == {"label"} and 0 <= report["accuracy"]["label"]["top1"] <= 1


def test_the_folder_preset_is_the_imagenet100_recipe_on_your_folder():
  from cl_jax import config_check
  from configs import mocov2_patchns

  c = mocov2_patchns.get_config("folder")
  paper = mocov2_patchns.get_config("imagenet100")
  assert (c.data.name, c.data.image_size, c.model.depth) == ("folder", 224, 50)
  assert (c.optim.lr, c.optim.batch_size, c.moco.queue_size) == (
      paper.optim.lr,
      paper.optim.batch_size,
      paper.moco.queue_size,
  )
  with pytest.raises(config_check.ConfigError, match="set data.folder"):
    config_check.validate(c)


def test_exported_trifeature_images_read_back_with_their_shape_classes(tmp_path):
  from cl_jax.data import export_folder, trifeature

  root = export_folder.export(str(tmp_path / "tri"), "shape", train=30, val=10, image_size=16)
  data = _data(root, tmp_path / "cache")
  train, val = sources.open_source(data, "probe_train"), sources.open_source(data, "test")
  assert (len(train), len(val)) == (30, 10)
  assert train.class_names == sorted(trifeature.SHAPES)
  # Each file's class is its image's shape in Trifeature's train split.
  shapes = trifeature.load("train", image_size=16, num_images=30, seed=0).labels["shape"]
  for path, label in zip(train.files, train.labels):
    n = int(os.path.basename(path).split(".")[0])
    assert train.class_names[label] == trifeature.SHAPES[shapes[n]]
  with pytest.raises(UsageError, match="--label must be one of"):
    export_folder.export(str(tmp_path / "x"), "size", 1, 1, 16)


@pytest.mark.slow
def test_a_folder_run_stopped_mid_epoch_resumes_on_the_same_batches(tmp_path):
  """80 images in batches of 32: 2 steps per epoch, 2 epochs; one run stops after step 1 (mid
  epoch 1) and resumes, another runs through: the same losses at every step."""
  root = make_labelled(tmp_path / "images", per_class=40, val=4)
  flags = _folder_run_flags(root, tmp_path / "cache", 2, "--config.probe.after_pretrain=False")
  losses = {}
  for name, chunks in (("through", [[]]), ("resumed", [["--stop_at_step=1"], []])):
    for extra in chunks:
      proc = tiny_run.start(tmp_path / name, flags + extra)[0]
      _, err = proc.communicate(timeout=600)
      assert proc.returncode == 0, err[-3000:]
    rows = [
        json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    ]
    losses[name] = {r["step"]: r["loss"] for r in rows if "loss" in r}
  assert sorted(losses["through"]) == [1, 2, 3, 4]
  assert losses["resumed"] == losses["through"]


@pytest.mark.slow
def test_a_run_over_a_changed_folder_resumes_only_with_reindex(tmp_path):
  root = make_labelled(tmp_path / "images", per_class=40, val=4)
  flags = _folder_run_flags(root, tmp_path / "cache", 2, "--config.probe.after_pretrain=False")
  run = tmp_path / "run"

  def main(*extra):
    proc = tiny_run.start(run, flags + list(extra))[0]
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err

  code, err = main("--stop_at_step=1")
  assert code == 0, err[-3000:]
  stored = json.loads((run / "data_index.json").read_text())
  assert stored["images"] == 80
  _image(root / "train" / "cat" / "new.jpg", 123)
  code, err = main()
  lines = [ln for ln in err.strip().splitlines() if ln.startswith("error")]
  assert code != 0 and len(lines) == 1, err[-3000:]
  assert "changed since this run started (80 images then, 81 now)" in lines[0]
  assert "--reindex" in lines[0] and "Traceback" not in err
  code, err = main("--reindex")
  assert code == 0, err[-3000:]
  assert json.loads((run / "data_index.json").read_text())["images"] == 81
