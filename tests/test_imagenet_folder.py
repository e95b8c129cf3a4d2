"""ImageNet(-100) prepared as a folder of images (cl_jax.data.imagenet_folder) from a tiny fake
ILSVRC2012 layout: the archives and the extracted folders give the same folder, the classes of
ImageNet-100 only, validation images in their labelled classes, the disk check, a stopped
preparation resumed, and the folder read by data.name=folder."""

import io
import os
import tarfile

import numpy as np
import PIL.Image
import pytest

from cl_jax import config_defaults
from cl_jax.data import imagenet_folder, sources, tfds_source
from cl_jax.runtime.errors import UsageError

IN100 = sorted(tfds_source.read_class_list("imagenet100_classes.txt"))
KEPT = IN100[:2]  # with 3 images each; the other 98 classes of ImageNet-100 hold 1
OTHER = "n99999999"  # not an ImageNet-100 class
CLASSES = (*IN100, OTHER)


def _count(wnid: str) -> int:
  return 3 if wnid in KEPT or wnid == OTHER else 1


def _jpeg(seed: int) -> bytes:
  pixels = np.random.default_rng(seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)
  out = io.BytesIO()
  PIL.Image.fromarray(pixels).save(out, format="JPEG")
  return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def fake_ilsvrc(root) -> dict:
  """ILSVRC2012_img_train.tar (ImageNet-100's classes and OTHER, one tar per class inside),
  ILSVRC2012_img_val.tar (6 images) and its labels file; the same extracted."""
  root = str(root)
  os.makedirs(root, exist_ok=True)
  train_tar = os.path.join(root, "ILSVRC2012_img_train.tar")
  with tarfile.open(train_tar, "w") as outer:
    for k, wnid in enumerate(CLASSES):
      inner = io.BytesIO()
      with tarfile.open(fileobj=inner, mode="w") as t:
        for i in range(_count(wnid)):
          _add(t, f"{wnid}_{i}.JPEG", _jpeg(10 * k + i))
      _add(outer, f"{wnid}.tar", inner.getvalue())
  labels = [KEPT[0], OTHER, KEPT[1], KEPT[0], OTHER, KEPT[1]]
  val_tar = os.path.join(root, "ILSVRC2012_img_val.tar")
  with tarfile.open(val_tar, "w") as tar:
    for i in range(6):
      _add(tar, f"ILSVRC2012_val_{i + 1:08d}.JPEG", _jpeg(100 + i))
  labels_file = os.path.join(root, "labels.txt")
  with open(labels_file, "w") as f:
    f.write("\n".join(labels) + "\n")
  # The same, extracted: train/<wnid>/ and a flat val/.
  for k, wnid in enumerate(CLASSES):
    os.makedirs(os.path.join(root, "train", wnid))
    for i in range(_count(wnid)):
      with open(os.path.join(root, "train", wnid, f"{wnid}_{i}.JPEG"), "wb") as f:
        f.write(_jpeg(10 * k + i))
  os.makedirs(os.path.join(root, "val"))
  for i in range(6):
    with open(os.path.join(root, "val", f"ILSVRC2012_val_{i + 1:08d}.JPEG"), "wb") as f:
      f.write(_jpeg(100 + i))
  return {"train": train_tar, "val": val_tar, "labels": labels_file, "root": root}


def _tree(out) -> dict:
  return {
      split: {
          w: sorted(os.listdir(os.path.join(out, split, w)))
          for w in os.listdir(os.path.join(out, split))
      }
      for split in ("train", "val")
  }


def test_the_archives_and_their_folders_give_the_same_imagenet100_folder(tmp_path):
  fake = fake_ilsvrc(tmp_path / "ilsvrc")
  lines = []
  done = imagenet_folder.prepare(
      fake["train"], fake["val"], str(tmp_path / "a"), val_labels=fake["labels"], log=lines.append
  )
  assert done["classes"] == IN100 and done["val_written"]
  tree = _tree(tmp_path / "a")
  assert tree["train"] == {w: [f"{w}_{i}.JPEG" for i in range(_count(w))] for w in IN100}
  assert tree["val"] == {
      KEPT[0]: ["ILSVRC2012_val_00000001.JPEG", "ILSVRC2012_val_00000004.JPEG"],
      KEPT[1]: ["ILSVRC2012_val_00000003.JPEG", "ILSVRC2012_val_00000006.JPEG"],
  }
  # The files as they were, byte for byte.
  with open(tmp_path / "a" / "train" / KEPT[1] / f"{KEPT[1]}_2.JPEG", "rb") as f:
    assert f.read() == _jpeg(12)
  assert "imagenet100: 100 classes, 4 validation images" in lines[0] and "GB free" in lines[0]
  assert not (tmp_path / "a" / imagenet_folder.PARTIAL).exists()
  extracted = imagenet_folder.prepare(
      os.path.join(fake["root"], "train"),
      os.path.join(fake["root"], "val"),
      str(tmp_path / "b"),
      val_labels=fake["labels"],
      log=lambda s: None,
  )
  assert extracted["classes"] == IN100 and _tree(tmp_path / "b") == tree
  # cl_jax reads it as a labelled folder: 100 classes, 104 training and 4 test images.
  data = config_defaults.base_config().data
  data.update(name="folder", folder=str(tmp_path / "a"), cache_dir=str(tmp_path / "cache"))
  train, test = sources.open_source(data, "probe_train"), sources.open_source(data, "test")
  assert (len(train), len(test), train.class_names) == (104, 4, IN100)


def test_a_stopped_preparation_resumes_and_skips_what_is_complete(tmp_path):
  fake = fake_ilsvrc(tmp_path / "ilsvrc")
  out = tmp_path / "out"
  imagenet_folder.prepare(
      fake["train"], fake["val"], str(out), val_labels=fake["labels"], log=lambda s: None
  )
  # As if stopped while writing the second class: it is gone, a partial copy is left.
  os.rename(out / "train" / KEPT[1], tmp_path / "moved")
  os.makedirs(out / imagenet_folder.PARTIAL / "train" / KEPT[1])
  (out / imagenet_folder.PARTIAL / "train" / KEPT[1] / "half.JPEG").write_bytes(b"\xff\xd8")
  lines = []
  again = imagenet_folder.prepare(
      fake["train"], fake["val"], str(out), val_labels=fake["labels"], log=lines.append
  )
  assert again["train_written"] == [KEPT[1]] and not again["val_written"]
  assert "99 training classes and the validation split already in" in lines[0]
  assert sorted(os.listdir(out / "train" / KEPT[1])) == [f"{KEPT[1]}_{i}.JPEG" for i in range(3)]
  assert not (out / imagenet_folder.PARTIAL).exists()


def test_too_little_disk_and_missing_classes_are_refused_in_one_line(tmp_path, monkeypatch):
  fake = fake_ilsvrc(tmp_path / "ilsvrc")
  monkeypatch.setattr(imagenet_folder, "_free_bytes", lambda out: 100)
  with pytest.raises(UsageError, match=r"has 0.0 GB free and the images need .* larger disk"):
    imagenet_folder.prepare(
        fake["train"],
        fake["val"],
        str(tmp_path / "o"),
        val_labels=fake["labels"],
        log=lambda s: None,
    )
  assert not (tmp_path / "o").exists()
  monkeypatch.undo()
  only_other = tmp_path / "other"
  os.makedirs(only_other / OTHER)
  with pytest.raises(UsageError, match="lacks 100 of the 100 imagenet100 classes"):
    imagenet_folder.prepare(str(only_other), fake["val"], str(tmp_path / "o"), log=lambda s: None)
  with pytest.raises(UsageError, match="--classes must be one of"):
    imagenet_folder.prepare(fake["train"], fake["val"], str(tmp_path / "o"), classes="in50")


def test_all_classes_and_tfds_validation_labels():
  # TFDS's ground truth, shipped with tensorflow-datasets: 50,000 wnids, ImageNet-100's among them.
  with open(imagenet_folder._default_labels()) as f:  # noqa: SLF001
    labels = f.read().split()
  assert len(labels) == 50000 and set(IN100) <= set(labels)
