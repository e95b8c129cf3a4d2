"""The GPU path for JPEG folders (cl_jax.data.gpu_views, data.decoder="gpu"), everything but the
GPU's own calls, on CPU devices with nvImageCodec's CPU backend: the resize weights against a
NumPy re-derivation of PIL's antialiased bilinear filter; region decodes against PIL's pixels;
the views against the fast path's on the same crops; the same crops, batches and resume state as
the CPU paths; the views on eight devices equal to one device's; the config check's refusals; and
a run of the training loop on the path."""

import json
import os

import jax
import numpy as np
import PIL.Image
import pytest

from cl_jax import config_check
from cl_jax.bench.jpeg_folder import natural_image
from cl_jax.data import fast_views, folder_source, geometric, gpu_views, image_folder, pipeline
from cl_jax.runtime import config_files, parallel
from tests import jpeg_samples

if os.environ.get("CL_JAX_REQUIRE_TORCH") == "1":
  import torch  # noqa: F401
else:
  pytest.importorskip("torch", reason="pip install torch (its CPU build): the fast path's views")

SIZES = ((97, 130), (300, 451), (64, 48))  # (height, width)


def _write_jpegs(folder) -> list[str]:
  """Each size as 4:4:4 and 4:2:0, baseline and progressive, greyscale and CMYK."""
  return jpeg_samples.write_jpegs(folder, SIZES, (0, 2))


def _folder(tmp_path) -> str:
  """The test JPEGs in two class folders."""
  os.makedirs(tmp_path / "src")
  for i, path in enumerate(_write_jpegs(tmp_path / "src")):
    os.makedirs(tmp_path / "imgs" / f"c{i % 2}", exist_ok=True)
    os.replace(path, tmp_path / "imgs" / f"c{i % 2}" / f"{i:02d}.jpg")
  return str(tmp_path / "imgs")


def _reference_weights(length: int, out_size: int) -> np.ndarray:
  """(out_size, length) float64: PIL's antialiased bilinear coefficients (ImagingResample's
  precompute_coeffs), computed as PIL does: a window [xmin, xmax) around each output pixel's
  centre in the input, the triangle filter of support max(1, scale), normalised."""
  scale = length / out_size
  support = max(scale, 1.0)
  weights = np.zeros((out_size, length))
  for o in range(out_size):
    centre = (o + 0.5) * scale
    xmin = max(int(centre - support + 0.5), 0)
    xmax = min(int(centre + support + 0.5), length)
    taps = [max(0.0, 1.0 - abs((x - centre + 0.5) / support)) for x in range(xmin, xmax)]
    weights[o, xmin:xmax] = np.asarray(taps) / sum(taps)
  return weights


def test_the_resize_weights_are_pils_filter():
  """Down- and upscaling, lengths padded in a longer line: PIL's coefficients, zero beyond."""
  lengths = np.array([1, 7, 32, 33, 100, 451], np.int32)
  for out_size in (32, 64, 224):
    got = np.asarray(gpu_views.resize_weights(jax.numpy.asarray(lengths), 480, out_size))
    assert got.shape == (len(lengths), out_size, 480)
    for row, length in enumerate(lengths):
      np.testing.assert_allclose(
          got[row, :, :length], _reference_weights(length, out_size), atol=1e-5
      )
      assert not got[row, :, length:].any()


def test_region_decodes_give_pils_pixels_of_the_crop(tmp_path):
  """nvImageCodec's CPU backend (libjpeg-turbo): each crop exactly PIL's decode of the image cut
  to the box, for every subsampling, progressive, greyscale and CMYK JPEG."""
  decoder = gpu_views.make_decoder(jax.devices("cpu")[0])
  rng = np.random.default_rng(0)
  records, boxes, wants = [], [], []
  for path in _write_jpegs(tmp_path):
    with open(path, "rb") as f:
      record = gpu_views.jpeg_record(f.read(), path)
    image = image_folder.decode(path)
    assert (record["height"], record["width"]) == image.shape[:2]
    box = geometric.sample_crop(rng, *image.shape[:2], scale=(0.08, 1.0)).box
    y0, x0, y1, x1 = box.astype(int)
    records.append(record), boxes.append(box), wants.append(image[y0:y1, x0:x1])
  batch = gpu_views.batch_records([{"jpeg": r["jpeg"]} for r in records])
  images = gpu_views.decode_crops(decoder, batch["jpeg"], batch["jpeg_size"], np.stack(boxes))
  for image, want in zip(images, wants):
    np.testing.assert_array_equal(np.asarray(image), want)


def test_the_views_are_the_fast_paths_within_one_grey_level(tmp_path):
  """Views of 224, 64 and 32 px of random crops (area 0.08-1), flipped or not, resampled on the
  device: the fast path's (PyTorch's uint8 kernel on the same crop) within one grey level, 0.3 on
  average at most."""
  mesh = parallel.make_mesh(jax.devices()[:1])
  rng = np.random.default_rng(1)
  records = []
  for path in _write_jpegs(tmp_path):
    with open(path, "rb") as f:
      records.append(
          gpu_views.crop_record(gpu_views.jpeg_record(f.read(), path), rng, (0.08, 1), 2)
      )
  batch = gpu_views.batch_records(records)
  for size in (224, 64, 32):
    out = gpu_views.DeviceViews(mesh, size, 2)(batch)
    for row, path in enumerate(_write_jpegs(tmp_path)):
      image = image_folder.decode(path)
      for v in (1, 2):
        params = geometric.CropParams(batch[f"box{v}"][row], bool(batch[f"flip{v}"][row]))
        want = fast_views.apply_crop(image, params, size)
        diff = np.abs(np.asarray(out[f"view{v}"][row]).astype(int) - want.astype(int))
        assert diff.max() <= 1 and diff.mean() <= 0.3, (path, params, size)


def test_the_pipeline_draws_the_cpu_paths_crops_and_resumes(tmp_path):
  """Decoder "gpu": the same boxes and flips as "pil" from the same seed, the files' bytes padded
  into the batch, and an iterator restored from its state gives the same next batch."""
  index = folder_source.build_index(_folder(tmp_path))
  batches = {}
  for decoder in ("pil", "gpu"):
    source = folder_source.FolderSource(index, decoder=decoder)
    ds = pipeline.pretrain_dataset(
        source, batch_size=6, image_size=32, crop_scale=(0.2, 1.0), seed=3, decoder=decoder
    )
    batches[decoder] = ds[1]
  pil, gpu = batches["pil"], batches["gpu"]
  for key in ("box1", "box2", "flip1", "flip2"):
    np.testing.assert_array_equal(pil[key], gpu[key])
  assert "view1" not in gpu and gpu["jpeg"].dtype == np.uint8 and gpu["jpeg"].shape[0] == 6
  assert gpu["jpeg"].shape[1] % gpu_views.BYTES_STEP == 0
  files = {}
  for path in folder_source.FolderSource(index).files:
    with open(path, "rb") as f:
      files[f.read()] = path
  for row in range(6):
    data = gpu["jpeg"][row, : gpu["jpeg_size"][row]].tobytes()
    assert data in files and not gpu["jpeg"][row, gpu["jpeg_size"][row] :].any()
  source = folder_source.FolderSource(index, decoder="gpu")
  ds = pipeline.pretrain_dataset(
      source, batch_size=6, image_size=32, crop_scale=(0.2, 1.0), seed=3, decoder="gpu"
  )
  it = pipeline.make_iterator(ds, 0)
  next(it)
  state = it.get_state()
  want = next(it)
  again = pipeline.make_iterator(ds, 0)
  again.set_state(state)
  got = next(again)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key])


@pytest.mark.slow
def test_eight_devices_give_one_devices_views(tmp_path):
  """The batch split over 8 devices, each decoding its rows: the views of one device's run, on
  the batch sharding's devices, with the other keys as parallel.global_batch puts them."""
  index = folder_source.build_index(_folder(tmp_path))
  ds = pipeline.pretrain_dataset(
      folder_source.FolderSource(index, decoder="gpu"),
      batch_size=16,
      image_size=24,
      crop_scale=(0.2, 1.0),
      seed=0,
      num_views=3,
      decoder="gpu",
  )
  batch = ds[0]
  one = gpu_views.DeviceViews(parallel.make_mesh(jax.devices()[:1]), 24, 3)(batch)
  mesh = parallel.make_mesh(jax.devices()[:8])
  eight = gpu_views.DeviceViews(mesh, 24, 3)(batch)
  assert set(eight) == {
      "view1",
      "view2",
      "view3",
      "box1",
      "box2",
      "box3",
      "flip1",
      "flip2",
      "flip3",
  }
  for key, value in eight.items():
    assert value.sharding == parallel.batch_sharding(mesh), key
    np.testing.assert_array_equal(np.asarray(value), np.asarray(one[key]))


def test_a_file_that_is_not_a_jpeg_is_named(tmp_path):
  png = tmp_path / "x.png"
  PIL.Image.fromarray(natural_image(np.random.default_rng(1), 40, 50)).save(png)
  with pytest.raises(image_folder.BadImageError, match=r"x.png is not a JPEG.*data.decoder=fast"):
    gpu_views.jpeg_record(png.read_bytes(), str(png))


def test_the_config_check_refuses_what_the_path_cannot_do(monkeypatch):
  """Here (CPU JAX): no GPU, named; a missing nvImageCodec, named with its install command;
  a dataset that is not a folder of JPEGs, and texture negatives, refused."""
  config = config_files.load_config_file("configs/mocov2.py").get_config("folder")
  config.data.folder = "/images"
  config.data.decoder = "gpu"
  with pytest.raises(config_check.ConfigError, match=r"data.decoder = 'gpu'.*JAX sees none.*fast"):
    config_check.validate(config)
  config_check.validate(config, reads_data=False)
  monkeypatch.setattr(gpu_views, "missing_packages", lambda: ["nvidia-nvimgcodec-cu13"])
  with pytest.raises(config_check.ConfigError, match=r"needs nvidia-nvimgcodec-cu13.*pip install"):
    config_check.validate(config)
  monkeypatch.setattr(gpu_views, "unavailable", lambda: None)
  config_check.validate(config)
  config.nonsemantic.update(enabled=True, kind="texture", num_ns=1)
  config.data.texture_dir = "/textures"
  with pytest.raises(config_check.ConfigError, match=r"texture negatives.*data.decoder=fast"):
    config_check.validate(config)
  config = config_files.load_config_file("configs/mocov2.py").get_config(None)
  config.data.decoder = "gpu"
  with pytest.raises(config_check.ConfigError, match=r"data.name=folder, not trifeature"):
    config_check.validate(config, reads_data=False)


@pytest.mark.slow
def test_the_training_loop_runs_on_the_path(tmp_path, monkeypatch):
  """train.pretrain on a folder of JPEGs with data.decoder gpu (on the 8 CPU devices, the GPU
  check set aside): its losses are the fast path's to within the views' one grey level."""
  from cl_jax import train

  monkeypatch.setattr(gpu_views, "unavailable", lambda: None)
  rng = np.random.default_rng(0)
  for i in range(72):
    height, width = rng.integers(40, 90, 2)
    os.makedirs(tmp_path / "imgs" / f"c{i % 2}", exist_ok=True)
    PIL.Image.fromarray(natural_image(rng, height, width)).save(
        tmp_path / "imgs" / f"c{i % 2}" / f"{i:02d}.jpg", quality=90
    )
  root = str(tmp_path / "imgs")
  losses = {}
  for decoder in ("fast", "gpu"):
    config = config_files.load_config_file("configs/mocov2.py").get_config("folder")
    config.data.update(
        folder=root, cache_dir=str(tmp_path / "cache"), decoder=decoder, image_size=32, workers=0
    )
    config.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
    config.moco.queue_size = 64
    config.optim.update(batch_per_chip=8, epochs=2)  # 8 devices: batches of 64
    config.probe.after_pretrain = False
    config.eval.every = 0
    config.train.log_every = 1
    workdir = tmp_path / decoder
    train.pretrain(config, str(workdir))
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses[decoder] = [r["loss"] for r in rows if "loss" in r]
  assert len(losses["gpu"]) == len(losses["fast"]) == 2  # 72 images: 1 step per epoch
  np.testing.assert_allclose(losses["gpu"], losses["fast"], rtol=1e-2)


@pytest.mark.slow
def test_the_jpeg_benchmark_times_the_path(tmp_path, monkeypatch):
  """Where the path can run (set so here), the loop benchmark's decodings include "gpu": its
  source reads the bytes, its device side is timed alone and its loop feeds the step."""
  from cl_jax.bench import input as input_bench
  from cl_jax.bench import jpeg_decode, jpeg_folder

  monkeypatch.setattr(gpu_views, "unavailable", lambda: None)
  root = jpeg_folder.make_jpeg_folder(str(tmp_path / "jpegs"), 16, 0, workers=0)
  config = config_files.load_config_file("configs/mocov2.py").get_config(None)
  config.data.image_size = 16
  config.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  config.moco.queue_size = 64
  config.optim.batch_size = 8
  assert jpeg_decode.decodings()[-1] == "gpu"
  source = jpeg_decode.sources(root, config)["gpu"]
  with open(source.files[3], "rb") as f:
    assert source[3]["jpeg"].tobytes() == f.read()
  assert jpeg_decode.decoder_config(config, "gpu").data.decoder == "gpu"
  mesh = parallel.make_mesh(jax.devices()[:1])
  rate = input_bench.device_decode_rate(config, source, mesh, 2)
  assert rate["img_per_s"] > 0 and rate["img_per_s_per_device"] == rate["img_per_s"]
  gpu = jpeg_decode.decoder_config(config, "gpu")
  loop = input_bench.make_loop(config, len(source), mesh)
  it = pipeline.make_iterator(input_bench.train.pretrain_data(gpu, source), 0)
  row = input_bench.loop_rate(loop, it, 2, 1, input_bench.train.input_to_devices(gpu, mesh))
  assert row["img_per_s"] > 0 and np.isfinite(row["loss"])
