"""The fast CPU path for image files (cl_jax.data.fast_views, data.decoder="fast"): on JPEGs of
several sizes, chroma subsamplings, progressive and greyscale ones, and a CMYK one, its decode
against PIL's, and its views against geometric.apply_crop's on the same crops; the pipeline draws
the same crops with either decoder; a damaged file stops as with PIL; the config check names
what is missing. Needs simplejpeg (requirements.txt) and torch: skipped without torch unless
CL_JAX_REQUIRE_TORCH=1 (CI), which makes it fail."""

import math
import os

import numpy as np
import PIL.Image
import pytest

from cl_jax import config_check
from cl_jax.bench.jpeg_folder import natural_image
from cl_jax.data import fast_views, folder_source, geometric, image_folder, pipeline
from cl_jax.runtime import config_files
from tests import jpeg_samples

if os.environ.get("CL_JAX_REQUIRE_TORCH") == "1":
  import torch  # noqa: F401
else:
  pytest.importorskip("torch", reason="pip install torch (its CPU build) for the fast decoder")

SIZES = ((97, 130), (300, 451), (520, 388))  # (height, width)


def _write_jpegs(folder) -> list[str]:
  """Each size as 4:4:4, 4:2:2 and 4:2:0, baseline and progressive, greyscale and CMYK."""
  return jpeg_samples.write_jpegs(folder, SIZES)


def test_the_decode_gives_pils_pixels(tmp_path):
  """libjpeg-turbo with PIL's settings: the same pixels for every subsampling, progressive and
  greyscale JPEG; a CMYK JPEG, converted to RGB by TurboJPEG, within one grey level; a PNG
  through PIL."""
  for path in _write_jpegs(tmp_path):
    got, want = fast_views.decode(path), image_folder.decode(path)
    assert got.shape == want.shape and got.dtype == np.uint8
    tolerance = 1 if path.endswith("_CMYK.jpg") else 0
    assert np.abs(got.astype(int) - want.astype(int)).max() <= tolerance, path
  png = tmp_path / "x.png"
  PIL.Image.fromarray(natural_image(np.random.default_rng(1), 40, 50)).save(png)
  np.testing.assert_array_equal(fast_views.decode(str(png)), image_folder.decode(str(png)))


def test_the_views_are_pils_within_one_grey_level_but_at_their_border(tmp_path):
  """Views of 224, 64 and 32 px of random crops (area 0.08-1) of every test JPEG: away from the
  view's border, where PIL's filter also reads pixels outside the crop (1 + ceil(upscale) output
  pixels), at most 1 grey level apart but for a rare 2 (different fixed-point roundings), at
  most 1 in 1,000 such pixels; over whole views 0.3 grey levels on average at most."""
  rng = np.random.default_rng(0)
  inner_above_1 = inner_total = 0
  for path in _write_jpegs(tmp_path):
    image = image_folder.decode(path)
    for _ in range(6):
      params = geometric.sample_crop(rng, image.shape[0], image.shape[1], scale=(0.08, 1.0))
      y0, x0, y1, x1 = params.box
      for size in (224, 64, 32):
        fast = fast_views.apply_crop(image, params, size)
        ref = geometric.apply_crop(image, params, size)
        assert fast.shape == ref.shape == (size, size, 3) and fast.dtype == np.uint8
        diff = np.abs(fast.astype(int) - ref.astype(int))
        assert diff.mean() <= 0.3, (path, params, size)
        margin = 1 + math.ceil(size / min(y1 - y0, x1 - x0))
        inner = diff[margin : size - margin, margin : size - margin]
        assert inner.size == 0 or inner.max() <= 2, (path, params, size)
        inner_above_1 += int((inner > 1).sum())
        inner_total += inner.size
  assert inner_above_1 <= inner_total / 1000, (inner_above_1, inner_total)


def test_the_flip_mirrors_the_view_and_a_bad_box_is_refused():
  image = natural_image(np.random.default_rng(2), 60, 80)
  box = np.array([5, 7, 45, 70], np.float32)
  plain = fast_views.apply_crop(image, geometric.CropParams(box=box, flip=False), 32)
  flipped = fast_views.apply_crop(image, geometric.CropParams(box=box, flip=True), 32)
  np.testing.assert_array_equal(flipped, plain[:, ::-1])
  for bad in ([5, 7, 45, 90], [5.5, 7, 45, 70]):
    with pytest.raises(ValueError, match="must hold integers"):
      fast_views.apply_crop(image, geometric.CropParams(np.array(bad, np.float32), False), 32)


def test_the_pipeline_draws_the_same_crops_with_either_decoder(tmp_path):
  """A folder source read with decoder "fast": the same boxes and flips as with "pil", views
  close to theirs; a truncated JPEG stops with the PIL path's BadImageError."""
  os.makedirs(tmp_path / "src")
  for i, path in enumerate(_write_jpegs(tmp_path / "src")):
    os.makedirs(tmp_path / "imgs" / f"c{i % 2}", exist_ok=True)
    os.replace(path, tmp_path / "imgs" / f"c{i % 2}" / f"{i:02d}.jpg")
  index = folder_source.build_index(str(tmp_path / "imgs"))
  batches = {}
  for decoder in ("pil", "fast"):
    source = folder_source.FolderSource(index, decoder=decoder)
    ds = pipeline.pretrain_dataset(
        source, batch_size=8, image_size=32, crop_scale=(0.2, 1.0), seed=3, decoder=decoder
    )
    batches[decoder] = ds[0]
  pil, fast = batches["pil"], batches["fast"]
  for key in ("box1", "box2", "flip1", "flip2"):
    np.testing.assert_array_equal(pil[key], fast[key])
  for key in ("view1", "view2"):
    assert np.abs(pil[key].astype(int) - fast[key].astype(int)).mean() <= 0.5
  broken = tmp_path / "broken" / "c0"
  os.makedirs(broken)
  with open(tmp_path / "imgs" / "c0" / "00.jpg", "rb") as f:
    (broken / "a.jpg").write_bytes(f.read()[:300])
  source = folder_source.FolderSource(
      folder_source.build_index(str(tmp_path / "broken")), decoder="fast"
  )
  with pytest.raises(image_folder.BadImageError, match="a.jpg"):
    source[0]


def test_the_config_check_names_a_missing_package(monkeypatch):
  config = config_files.load_config_file("configs/mocov2.py").get_config(None)
  config.data.decoder = "fast"
  config_check.validate(config)
  monkeypatch.setattr(fast_views, "missing_packages", lambda: ["torch"])
  with pytest.raises(config_check.ConfigError, match=r"data.decoder = 'fast'.*needs torch.*pip"):
    config_check.validate(config)
  config.data.decoder = "turbo"
  with pytest.raises(config_check.ConfigError, match="data.decoder"):
    config_check.validate(config)


def test_the_jpeg_benchmark_times_the_fast_path(tmp_path):
  """The loop benchmark's decodings include "fast" here (torch installed): its source decodes by
  libjpeg-turbo and its pipeline resamples with data.decoder "fast"."""
  from cl_jax import train
  from cl_jax.bench import jpeg_decode, jpeg_folder

  root = jpeg_folder.make_jpeg_folder(str(tmp_path / "jpegs"), 8, 0, workers=0)
  config = config_files.load_config_file("configs/mocov2.py").get_config(None)
  config.optim.batch_size, config.data.image_size = 4, 24
  assert jpeg_decode.decodings()[-1] == "fast"
  source = jpeg_decode.sources(root, config)["fast"]
  np.testing.assert_array_equal(source[3]["image"], image_folder.decode(source.files[3]))
  fast = jpeg_decode.decoder_config(config, "fast")
  assert fast.data.decoder == "fast" and config.data.decoder == "pil"
  batch = pipeline.pretrain_dataset(
      source, batch_size=4, image_size=24, crop_scale=(0.2, 1.0), seed=0, decoder="fast"
  )[0]
  assert batch["view1"].shape == (4, 24, 24, 3) and batch["view1"].dtype == np.uint8
  assert train.pretrain_data(fast, source)[0]["view1"].shape == (4, 24, 24, 3)
