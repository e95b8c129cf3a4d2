"""The JPEG input benchmark: the generated folder, reduced-size decoding, the measurements and
their table (the command itself runs in tests/test_bench_report.py, as the report's jpeg part)."""

import inspect
import json
import os

import jax
import numpy as np
import PIL.Image
import pytest

from cl_jax import train
from cl_jax.bench import input as bench_input
from cl_jax.bench import jpeg_decode, jpeg_folder
from cl_jax.data import geometric, pipeline
from cl_jax.runtime import parallel
from cl_jax.runtime.errors import UsageError
from configs import mocov2_patchns

TINY = {
    "image_size": 16,
    "depth": 10,
    "width_multiplier": 0.125,
    "head_hidden_dim": 16,
    "head_out_dim": 8,
    "queue_size": 256,
    "batch_size": 16,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """A generated folder of 30 images."""
  root = str(tmp_path_factory.mktemp("jpeg") / "folder")
  return jpeg_folder.make_jpeg_folder(root, 30, seed=3, workers=0)


def _tiny_config():
  c = mocov2_patchns.get_config(None)
  c.data.image_size = TINY["image_size"]
  c.model.update(
      depth=TINY["depth"],
      width_multiplier=TINY["width_multiplier"],
      head_hidden_dim=TINY["head_hidden_dim"],
      head_out_dim=TINY["head_out_dim"],
  )
  c.moco.queue_size, c.optim.batch_size = TINY["queue_size"], TINY["batch_size"]
  return c


@pytest.mark.slow
def test_folder_holds_the_requested_decodable_imagenet_sized_jpegs(folder):
  names = jpeg_folder.class_names()
  assert sorted(os.listdir(folder)) == sorted([*names, jpeg_folder.MANIFEST])
  files = [os.path.join(folder, c, f) for c in names for f in os.listdir(os.path.join(folder, c))]
  assert len(files) == 30 and all(f.endswith(".JPEG") for f in files)
  assert sorted(len(os.listdir(os.path.join(folder, c))) for c in names) == [3] * 10
  sizes_kb = []
  for path in files:
    with PIL.Image.open(path) as image:
      assert image.format == "JPEG" and image.mode == "RGB"
      width, height = image.size
      pixels = np.asarray(image.convert("RGB"))
    assert 300 <= width <= 600
    assert 3 / 4 - 0.01 <= width / height <= 4 / 3 + 0.01
    assert pixels.shape == (height, width, 3) and pixels.std() > 5  # not a flat image
    sizes_kb.append(os.path.getsize(path) / 1024)
  # ImageNet-like file sizes: neither flat colour nor incompressible noise.
  assert 50 <= np.mean(sizes_kb) <= 150 and min(sizes_kb) > 10 and max(sizes_kb) < 400


def test_folder_is_reused_and_a_foreign_folder_refused(folder, tmp_path):
  mtimes = {f: os.path.getmtime(os.path.join(folder, "class00", f)) for f in ["000000.JPEG"]}
  assert jpeg_folder.make_jpeg_folder(folder, 30, seed=3, workers=0) == folder
  assert {f: os.path.getmtime(os.path.join(folder, "class00", f)) for f in mtimes} == mtimes
  with pytest.raises(UsageError, match="remove it or choose another folder"):
    jpeg_folder.make_jpeg_folder(folder, 31, seed=3, workers=0)
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("x")
  with pytest.raises(UsageError, match="does not hold the generated folder"):
    jpeg_folder.make_jpeg_folder(str(other), 2, seed=0, workers=0)
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  with pytest.raises(UsageError, match="is a file; give a folder"):
    jpeg_folder.make_jpeg_folder(str(a_file), 2, seed=0, workers=0)
  assert not list(tmp_path.glob("a_file.partial-*"))


def test_generation_is_deterministic_and_seeded():
  a = jpeg_folder.natural_image(np.random.default_rng([1, 2, 1]), 40, 50)
  b = jpeg_folder.natural_image(np.random.default_rng([1, 2, 1]), 40, 50)
  c = jpeg_folder.natural_image(np.random.default_rng([1, 3, 1]), 40, 50)
  assert a.shape == (40, 50, 3) and a.dtype == np.uint8
  np.testing.assert_array_equal(a, b)
  assert np.abs(a.astype(int) - c).mean() > 5


def test_crop_ratio_is_the_pipelines():
  default = inspect.signature(geometric.sample_crop).parameters["ratio"].default
  assert jpeg_decode.CROP_RATIO == default


@pytest.mark.parametrize("margin", [1.0, 2.0])
@pytest.mark.parametrize("size,scale", [(32, (0.5, 1.0)), (64, (0.2, 1.0)), (24, (0.08, 1.0))])
def test_reduction_keeps_every_crop_at_least_margin_views_wide(size, scale, margin):
  rng = np.random.default_rng(0)
  for height, width in [(375, 500), (500, 375), (333, 500), (600, 451), (120, 700), (64, 64)]:
    k = jpeg_decode.reduction(height, width, size, scale, margin)
    assert k in (1, 2, 4, 8)
    h, w = -(-height // k), -(-width // k)
    if k > 1:
      sides = [
          np.diff(geometric.sample_crop(rng, h, w, scale=scale).box.reshape(2, 2), axis=0).min()
          for _ in range(300)
      ]
      assert min(sides) >= margin * size, (height, width, k)
    if k < 8:  # the next reduction would break the rule
      h2, w2 = -(-height // (2 * k)), -(-width // (2 * k))
      q = 0.75
      assert min(h2, w2) < margin * size or (scale[0] * h2 * w2 * q) ** 0.5 < margin * size


def test_reduction_of_imagenet_sized_images():
  assert jpeg_decode.reduction(375, 500, 32, (0.5, 1.0), margin=1) == 8
  assert jpeg_decode.reduction(375, 500, 32, (0.5, 1.0), margin=2) == 4
  assert jpeg_decode.reduction(375, 500, 64, (0.2, 1.0), margin=1) == 2
  assert jpeg_decode.reduction(375, 500, 64, (0.2, 1.0), margin=2) == 1
  assert jpeg_decode.reduction(375, 500, 224, (0.2, 1.0), margin=1) == 1


def test_reduced_decoding_matches_exact_decoding(folder):
  names = jpeg_folder.class_names()
  exact = jpeg_decode.JpegSource(folder, names)
  for margin, most in ((2.0, 2.0), (1.0, 4.5)):
    reduced = jpeg_decode.JpegSource(
        folder, names, view_size=32, crop_scale=(0.5, 1.0), margin=margin
    )
    for i in range(len(exact)):
      full, small = exact[i]["image"], reduced[i]["image"]
      k = jpeg_decode.reduction(full.shape[0], full.shape[1], 32, (0.5, 1.0), margin)
      assert small.shape == (-(-full.shape[0] // k), -(-full.shape[1] // k), 3)
      assert reduced[i]["label"] == exact[i]["label"]
    diff = jpeg_decode.view_difference(exact, reduced, range(len(exact)))
    assert diff["mean_reduction"] > 2
    # Within grey levels of the exact views (of 255), about a one-pixel move of the crop.
    assert diff["mean_abs"] < most, diff
  # The margin-2 views differ from exact decoding's about as much as moving the crop by a pixel.
  assert diff["shift_1px"] > 0.5


def test_reduced_decoding_of_a_smooth_image_is_close_to_exact(tmp_path):
  y, x = np.mgrid[0:375, 0:500] / 500.0
  smooth = np.stack([128 + 60 * np.sin(6 * x + 3 * y), 100 + 80 * y, 150 - 70 * x], -1)
  path = tmp_path / "c" / "0.JPEG"
  path.parent.mkdir()
  PIL.Image.fromarray(np.uint8(np.round(smooth))).save(path, quality=90)
  exact = jpeg_decode.JpegSource(str(tmp_path), ["c"])
  reduced = jpeg_decode.JpegSource(
      str(tmp_path), ["c"], view_size=32, crop_scale=(0.5, 1), margin=1
  )
  assert reduced[0]["image"].shape == (47, 63, 3)  # 1/8
  diff = jpeg_decode.view_difference(exact, reduced, [0] * 20)
  assert diff["mean_abs"] < 1.0, diff


def test_a_decoding_that_reduces_no_image_is_recognised(folder):
  names = jpeg_folder.class_names()
  assert jpeg_decode.reduces(
      jpeg_decode.JpegSource(folder, names, view_size=32, crop_scale=(0.5, 1))
  )
  assert not jpeg_decode.reduces(jpeg_decode.JpegSource(folder, names))
  big = jpeg_decode.JpegSource(folder, names, view_size=224, crop_scale=(0.2, 1.0), margin=1)
  assert not jpeg_decode.reduces(big)


@pytest.mark.slow
def test_pipeline_of_reduced_decoding_gives_views_of_the_view_size(folder):
  c = _tiny_config()
  source = jpeg_decode.JpegSource(
      folder, jpeg_folder.class_names(), view_size=16, crop_scale=tuple(c.data.crop_scale)
  )
  it = pipeline.make_iterator(train.pretrain_data(c, source), 0)
  batch = next(it)
  it.close()
  assert batch["view1"].shape == batch["view2"].shape == (16, 16, 16, 3)
  assert batch["view1"].dtype == np.uint8 and batch["box1"].shape == (16, 4)


@pytest.mark.slow
def test_measure_times_pipeline_and_loops_and_prints_the_ratio(folder):
  c = _tiny_config()
  mesh = parallel.make_mesh(jax.devices()[:1])
  out = bench_input.measure(
      c,
      folder,
      steps=1,
      warmup=0,
      pipeline_workers=[0],
      loop_workers=[0],
      pipeline_images=32,
      compare_images=4,
      mesh=mesh,
  )
  assert [r["decode"] for r in out["pipeline"]] == jpeg_decode.decodings()
  assert all(r["img_per_s"] > 0 and r["workers"] == 0 for r in out["pipeline"])
  assert [(r["decode"], r["workers"]) for r in out["loop"]] == [
      (d, 0) for d in jpeg_decode.decodings()
  ]
  # The in-memory loop before the JPEG loops and after each; each ratio against its neighbours.
  memory = [r["img_per_s"] for r in out["memory"]]
  assert len(memory) == len(out["loop"]) + 1
  for i, r in enumerate(out["loop"]):
    beside = round((memory[i] + memory[i + 1]) / 2, 1)
    assert np.isfinite(r["loss"]) and r["memory_img_per_s"] == beside
    assert r["ratio"] == round(r["img_per_s"] / ((memory[i] + memory[i + 1]) / 2), 3)
  assert set(out["view_difference"]) == {"reduced", "reduced-max"}
  assert set(out["decoder_difference"]) == {"fast"} & set(jpeg_decode.decodings())
  # The fast path's views: PIL's within a grey level but at their border (tests/test_fast_views.py),
  # which is a large share of these small views' pixels.
  for v in out["decoder_difference"].values():
    assert 0 < v["mean_abs"] < 1 and 0 < v["above_1"] < 0.25
  assert out["same_as_exact"] == []
  assert out["folder"]["images"] == 30
  json.dumps(out)  # the --json output
  text = bench_input.table(out)
  assert "ratio = JPEG loop img/s / in-memory loop img/s" in text
  assert "fastest faithful:" in text
  # Per decoding: img/s of one decoding process (0 workers here), and the cores that feed the loop.
  memory_rate = float(np.median(memory))
  for row in bench_input.feeding(out):
    per_core = next(r["img_per_s"] for r in out["pipeline"] if r["decode"] == row["decode"])
    assert row["img_per_s_per_core"] == per_core
    assert row["cores_to_feed"] == round(memory_rate / per_core, 2)
    assert f"{row['decode']:<12} {per_core:>20.1f}" in text


def test_steady_rate_leaves_out_the_batches_held_ready():
  """Ten batches of 4 that the workers held ready arrive within 10 ms, then ten more one per
  second: 4 img/s, where the whole run's rate would say 80 / 10.01 s, about 8."""
  arrivals = [0.0] + [0.001 * k for k in range(1, 11)] + [0.01 + k for k in range(1, 11)]
  assert bench_input.steady_rate(arrivals, 4) == pytest.approx(4.0)
  # A pipeline that held nothing ready: the later half's rate is the whole run's.
  assert bench_input.steady_rate([0.0, 0.5, 1.0, 1.5, 2.0], 8) == pytest.approx(16.0)
  # Too few batches in the later half: the whole run.
  assert bench_input.steady_rate([0.0, 0.001, 10.0], 4) == pytest.approx(0.8)


def test_worker_counts():
  c = _tiny_config()
  assert bench_input.worker_counts(c, cpus=2) == [0, 1, 2]
  c.data.workers = 16
  assert bench_input.worker_counts(c, cpus=16) == [0, 1, 2, 4, 8, 16]
  c.data.workers = 3
  assert bench_input.worker_counts(c, cpus=8) == [0, 1, 2, 3, 4, 8]
