"""ImageFolderSource's unreadable images (cl_jax.data.image_folder): a truncated JPEG and a
zero-byte file stop the read with a one-line BadImageError naming the file (bad_images "stop"),
or are left out at construction with a warning each (bad_images "skip"). The folder layout,
ordering and pickling are tested with the robustness suite (tests/test_robustness.py)."""

import io
import os
import pickle

import numpy as np
import PIL.Image
import PIL.ImageFile
import pytest

from cl_jax.data import image_folder
from cl_jax.data.image_folder import BadImageError, ImageFolderSource
from cl_jax.data.tfds_source import DatasetNotFoundError
from cl_jax.runtime.errors import UsageError


def _encoded(image: np.ndarray, fmt: str) -> bytes:
  out = io.BytesIO()
  PIL.Image.fromarray(image).save(out, fmt)
  return out.getvalue()


@pytest.fixture(name="folder")
def fixture_folder(tmp_path):
  """(root, good, bad): two class folders a and b of 8x8 images; good {path: (label, image)}
  of the readable ones (PNG pixels exact, JPEG as PIL decodes them), bad the paths of a
  truncated JPEG (a valid one cut in half) and a zero-byte .jpg."""
  rng = np.random.default_rng(0)
  good = {}
  for label, cls in enumerate(["a", "b"]):
    os.makedirs(tmp_path / cls)
    for name, fmt in [("1.png", "PNG"), ("2.jpg", "JPEG"), ("3.JPEG", "JPEG")]:
      path = str(tmp_path / cls / name)
      with open(path, "wb") as f:
        f.write(_encoded(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), fmt))
      good[path] = (label, np.asarray(PIL.Image.open(path).convert("RGB")))
  truncated, empty = str(tmp_path / "a" / "0_truncated.jpg"), str(tmp_path / "b" / "0_empty.jpg")
  data = _encoded(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "JPEG")
  with open(truncated, "wb") as f:
    f.write(data[: len(data) // 2])
  open(empty, "wb").close()
  return str(tmp_path), good, [truncated, empty]


def test_stop_reads_good_images_and_names_a_bad_one(folder):
  root, good, bad = folder
  source = ImageFolderSource(root, ["a", "b"])
  assert len(source) == len(good) + len(bad) and source.skipped == []
  for i, path in enumerate(source.files):
    if path in good:
      label, image = good[path]
      example = source[i]
      assert example["label"] == label
      np.testing.assert_array_equal(example["image"], image)
  for path, reason in zip(bad, ["truncated", "empty (0 bytes)"]):
    with pytest.raises(BadImageError) as error:
      source[source.files.index(path)]
    message = str(error.value)
    assert path in message and "\n" not in message and "--bad_images=skip" in message
    assert reason in message.lower() and isinstance(error.value, UsageError)


def test_stop_keeps_pil_strict():
  # Nothing is replaced silently: a truncated image is an error, not grey pixels.
  assert not PIL.ImageFile.LOAD_TRUNCATED_IMAGES


def test_skip_leaves_bad_images_out_with_a_warning_each(folder, capsys):
  root, good, bad = folder
  source = ImageFolderSource(root, ["a", "b"], bad_images="skip")
  assert len(source) == len(good) and sorted(source.files) == sorted(good)
  assert [path for path, _ in source.skipped] == bad  # in file order
  reasons = dict(source.skipped)
  assert "truncated" in reasons[bad[0]].lower() and "empty (0 bytes)" in reasons[bad[1]]
  warnings = capsys.readouterr().err.splitlines()
  assert warnings == [f"warning: skipped unreadable image {p}: {reasons[p]}" for p in bad]
  for i, path in enumerate(source.files):
    label, image = good[path]
    assert source.labels[i] == label
    example = source[i]
    assert example["label"] == label
    np.testing.assert_array_equal(example["image"], image)
  restored = pickle.loads(pickle.dumps(source))
  assert restored.files == source.files and restored.skipped == source.skipped
  np.testing.assert_array_equal(restored[0]["image"], source[0]["image"])


def test_skip_of_a_folder_with_no_readable_image(tmp_path, capsys):
  os.makedirs(tmp_path / "a")
  (tmp_path / "a" / "x.jpg").write_bytes(b"")
  (tmp_path / "a" / "y.png").write_bytes(b"not a png")
  with pytest.raises(DatasetNotFoundError, match="none of the 2 images .* can be read"):
    ImageFolderSource(str(tmp_path), ["a"], bad_images="skip")
  assert len(capsys.readouterr().err.splitlines()) == 2


def test_a_good_folder_skips_nothing(tmp_path, capsys):
  os.makedirs(tmp_path / "a")
  PIL.Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a" / "x.png")
  source = ImageFolderSource(str(tmp_path), ["a"], bad_images="skip")
  assert len(source) == 1 and source.skipped == [] and capsys.readouterr().err == ""


def test_bad_value_of_bad_images_is_refused(folder):
  with pytest.raises(UsageError, match="bad_images must be one of stop, skip; got 'ignore'"):
    ImageFolderSource(folder[0], ["a", "b"], bad_images="ignore")
  assert image_folder.check_bad_images("skip") == "skip"
