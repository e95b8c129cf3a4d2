"""Tiny-ImageNet, prepared from a small archive laid out like tiny-imagenet-200.zip and read back
through cl_jax's TFDS source."""

import io
import zipfile

import numpy as np
import PIL.Image
import pytest

from cl_jax.data import tfds_source

pytest.importorskip("tensorflow_datasets")
pytest.importorskip("array_record.python.array_record_module")
tiny_imagenet = pytest.importorskip("cl_jax.data.tiny_imagenet")

WNIDS = ["n02", "n01", "n03"]  # wnids.txt order; labels follow the sorted order


def _jpeg(value: int, mode: str = "RGB") -> bytes:
  image = PIL.Image.new(mode, (64, 64), (value, 0, 255 - value) if mode == "RGB" else value)
  buffer = io.BytesIO()
  image.save(buffer, format="JPEG", quality=95)
  return buffer.getvalue()


def _archive(path):
  root = "tiny-imagenet-200/"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(root + "wnids.txt", "\n".join(WNIDS) + "\n")
    for i, wnid in enumerate(WNIDS):
      for j in range(2):
        mode = "L" if (i, j) == (0, 1) else "RGB"  # the archive holds some grayscale JPEGs
        z.writestr(f"{root}train/{wnid}/images/{wnid}_{j}.JPEG", _jpeg(40 * i + 10 * j, mode))
      z.writestr(f"{root}train/{wnid}/{wnid}_boxes.txt", "")
    annotations = ["val_0.JPEG\tn03\t0\t0\t10\t10", "val_1.JPEG\tn01\t0\t0\t10\t10"]
    z.writestr(root + "val/val_annotations.txt", "\n".join(annotations) + "\n")
    z.writestr(root + "val/images/val_0.JPEG", _jpeg(200))
    z.writestr(root + "val/images/val_1.JPEG", _jpeg(100))


@pytest.mark.slow
def test_prepared_archive_reads_back_with_sorted_wnid_labels(tmp_path):
  archive = tmp_path / "manual" / tiny_imagenet.ARCHIVE
  archive.parent.mkdir()
  _archive(archive)
  data_dir = str(tmp_path / "tfds")
  tiny_imagenet.prepare(str(archive), data_dir)
  train = tfds_source.open_source("tiny_imagenet", "pretrain", data_dir)
  test = tfds_source.open_source("tiny_imagenet", "test", data_dir)
  assert (len(train), len(test)) == (6, 2)
  records = [train[i] for i in range(6)]
  assert all(r["image"].shape == (64, 64, 3) and r["image"].dtype == np.uint8 for r in records)
  assert sorted(r["label"] for r in records) == [0, 0, 1, 1, 2, 2]
  # n03 -> 2, n01 -> 0; the red channel tells the two validation images apart.
  by_red = sorted((int(test[i]["image"][..., 0].mean()), test[i]["label"]) for i in range(2))
  assert [label for _, label in by_red] == [0, 2]


def test_an_unprepared_data_dir_names_the_prepare_command(tmp_path):
  with pytest.raises(tfds_source.DatasetNotFoundError, match="python -m cl_jax.data.tiny_imagenet"):
    tfds_source.open_source("tiny_imagenet", "pretrain", str(tmp_path))
