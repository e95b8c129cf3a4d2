"""Image folders at a bounded resolution (cl_jax.data.bounded_folder, and imagenet_folder's
--max_side): larger images resized to the bound and re-encoded, the others copied byte for byte,
the tree kept, a stopped copy continued, other settings refused."""

import io
import os

import numpy as np
import PIL.Image
import pytest

from cl_jax.bench.jpeg_folder import natural_image
from cl_jax.data import bounded_folder, imagenet_folder
from cl_jax.runtime.errors import UsageError
from tests.test_imagenet_folder import IN100, fake_ilsvrc


def _encoded(height: int, width: int, fmt: str = "JPEG", seed: int = 0) -> bytes:
  out = io.BytesIO()
  PIL.Image.fromarray(natural_image(np.random.default_rng(seed), height, width)).save(out, fmt)
  return out.getvalue()


def _image(data: bytes) -> PIL.Image.Image:
  image = PIL.Image.open(io.BytesIO(data))
  image.load()
  return image


def test_a_larger_image_is_resized_to_the_bound_and_a_smaller_one_kept():
  big = _encoded(300, 400)
  small = bounded_folder.bounded(big, 200, 90)
  image = _image(small)
  assert image.format == "JPEG" and image.size == (200, 150) and image.mode == "RGB"
  # The content at quality 100: PIL's Lanczos resize of the decoded image, to JPEG's rounding.
  want = np.asarray(_image(big).resize((200, 150), PIL.Image.Resampling.LANCZOS), np.float64)
  best = np.asarray(_image(bounded_folder.bounded(big, 200, 100)), np.float64)
  assert np.abs(best - want).mean() < 1.0
  assert np.abs(np.asarray(image, np.float64) - want).mean() > np.abs(best - want).mean()
  assert bounded_folder.bounded(big, 400, 90) is big  # longer side 400: as it is
  assert bounded_folder.bounded(big, 0, 90) is big
  tall = _image(bounded_folder.bounded(_encoded(333, 100, "PNG"), 100, 80))
  assert tall.format == "JPEG" and tall.size == (30, 100)


def test_a_folder_is_copied_with_its_tree_continued_and_other_settings_refused(tmp_path):
  src, out = tmp_path / "src", tmp_path / "out"
  files = {
      "train/c0/a.jpg": _encoded(240, 320, seed=1),
      "train/c1/b.png": _encoded(60, 80, "PNG", seed=2),
      "val/c0/c.JPEG": _encoded(100, 90, seed=3),
  }
  for rel, data in files.items():
    os.makedirs(src / os.path.dirname(rel), exist_ok=True)
    (src / rel).write_bytes(data)
  (src / "notes.txt").write_text("not an image")
  done = bounded_folder.copy_folder(str(src), str(out), 96, quality=85)
  assert done["images"] == 3 and done["resized"] == 2 and done["kept"] == 1
  assert _image((out / "train/c0/a.jpg").read_bytes()).size == (96, 72)
  assert _image((out / "val/c0/c.JPEG").read_bytes()).size == (86, 96)
  assert (out / "train/c1/b.png").read_bytes() == files["train/c1/b.png"]
  assert not (out / "notes.txt").exists()
  # Stopped after one image: the copy continues with the others.
  os.remove(out / "val/c0/c.JPEG")
  again = bounded_folder.copy_folder(str(src), str(out), 96, quality=85)
  assert again["images"] == 1 and (out / "val/c0/c.JPEG").exists()
  with pytest.raises(UsageError, match=r"--max_side=96 --quality=85, not with --max_side=128"):
    bounded_folder.copy_folder(str(src), str(out), 128, quality=85)
  os.makedirs(tmp_path / "full")
  (tmp_path / "full" / "x.jpg").write_bytes(files["train/c0/a.jpg"])
  with pytest.raises(UsageError, match="holds images stored as they are"):
    bounded_folder.copy_folder(str(src), str(tmp_path / "full"), 96)


def test_imagenet_is_prepared_at_a_bounded_resolution(tmp_path):
  """The fake archive's 16 x 12 images stored at a longer side of 8; continuing the folder at
  another bound, or as they are, is refused."""
  fake = fake_ilsvrc(tmp_path / "ilsvrc")
  out = str(tmp_path / "in100")
  imagenet_folder.prepare(
      fake["train"], fake["val"], out, val_labels=fake["labels"], log=lambda s: None, max_side=8
  )
  first = os.path.join(out, "train", IN100[0])
  for name in os.listdir(first):
    assert _image(open(os.path.join(first, name), "rb").read()).size == (8, 6)
  for bound in (0, 12):
    with pytest.raises(UsageError, match="holds images stored with --max_side=8"):
      imagenet_folder.prepare(
          fake["train"], fake["val"], out, val_labels=fake["labels"], max_side=bound
      )
