"""Tests for the texture-based negatives of Ge et al. (2021, Sec. 2.2): image quilting
(Efros & Freeman 2001, cl_jax.data.quilting), the offline job (cl_jax.data.make_texture) and
TextureSource.

References are independent of the code under test: brute-force minimum paths and overlap errors,
exact window searches in the exemplars, the periodic continuation of a periodic exemplar, and
linear probes (sklearn) on fixed features of Trifeature images and their textures.
"""

import itertools
import os
import pickle
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from cl_jax.data import make_texture, quilting, trifeature
from cl_jax.data import texture_source as ts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A tiny Trifeature job: 24 images of 16 px in shards of 5 (the last one holds 4).
TINY = dict(dataset="trifeature", image_size=16, num_images=24, shard_size=5)
TINY_FLAGS = ["--dataset=trifeature", "--image_size=16", "--num_images=24", "--shard_size=5"]


def _palette_exemplar(rng, size, palette, blob=3):
  """(size, size, 3) uint8 exemplar: blob x blob blocks of random palette colours plus noise."""
  blocks = rng.integers(len(palette), size=(-(-size // blob),) * 2)
  image = palette[np.kron(blocks, np.ones((blob, blob), int))[:size, :size]]
  return np.clip(image + rng.integers(-8, 9, size=image.shape), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Quilting.


@pytest.mark.parametrize("shape", [(6, 3), (5, 1), (4, 4), (1, 5), (7, 2)])
def test_min_error_boundary_is_the_brute_force_minimum_path(shape):
  rng = np.random.default_rng(sum(shape))
  errors = rng.random(shape)
  length, width = shape
  best = min(
      (errors[np.arange(length), path].sum(), path)
      for path in itertools.product(range(width), repeat=length)
      if all(abs(a - b) <= 1 for a, b in zip(path, path[1:]))
  )
  path = quilting.min_error_boundary(errors)
  assert path.shape == (length,)
  assert np.all(np.abs(np.diff(path)) <= 1) and path.min() >= 0 and path.max() < width
  np.testing.assert_array_equal(path, best[1])
  np.testing.assert_allclose(errors[np.arange(length), path].sum(), best[0])


@pytest.mark.parametrize("top, left", [(True, False), (False, True), (True, True)])
def test_overlap_errors_equal_brute_force_ssd(top, left):
  rng = np.random.default_rng(1)
  exemplar = rng.integers(0, 256, size=(13, 11, 3), dtype=np.uint8)
  patch, overlap = 5, 2
  placed = rng.integers(0, 256, size=(patch, patch, 3)).astype(np.float64)
  mask = np.zeros((patch, patch))
  mask[:overlap] = top
  mask[:, :overlap] = np.maximum(mask[:, :overlap], left)
  expected = [
      (((exemplar[y : y + patch, x : x + patch] - placed) ** 2).sum(-1) * mask).sum()
      for y in range(13 - patch + 1)
      for x in range(11 - patch + 1)
  ]
  candidates = quilting._Candidates(exemplar[None], patch)  # pylint: disable=protected-access
  np.testing.assert_array_equal(candidates.errors(placed, mask, (top, left)), expected)


def test_periodic_exemplar_is_continued_without_seams_at_zero_tolerance():
  """With a periodic exemplar the perfect continuation (error 0) always exists, so at
  tolerance 0 every patch continues the period and the output is that periodic texture."""
  rng = np.random.default_rng(2)
  period = 5
  tile = rng.integers(0, 256, size=(period, period, 3), dtype=np.uint8)
  exemplar = np.tile(tile, (6, 6, 1))  # 30 x 30
  out = quilting.synthesize([exemplar], 41, 37, rng, patch=9, overlap=3, tolerance=0.0)
  assert out.shape == (41, 37, 3) and out.dtype == np.uint8
  matches = [
      (dy, dx)
      for dy in range(period)
      for dx in range(period)
      if np.array_equal(out, np.tile(np.roll(tile, (-dy, -dx), (0, 1)), (9, 8, 1))[:41, :37])
  ]
  assert len(matches) == 1


def test_quilting_copies_exemplar_windows_and_keeps_colour_statistics():
  rng = np.random.default_rng(3)
  palette = np.array([[200, 30, 30], [30, 160, 40], [20, 40, 220], [230, 230, 60]])
  exemplars = [
      _palette_exemplar(rng, 40, palette[:3]),
      _palette_exemplar(rng, 40, palette[1:]),
  ]
  patch, overlap = 10, 2
  out = quilting.synthesize(exemplars, 90, 90, rng, patch=patch, overlap=overlap)
  assert out.shape == (90, 90, 3) and out.dtype == np.uint8

  # Every patch's inner part (which no later patch overlaps) is a window of an exemplar.
  inner = slice(overlap, patch - overlap)
  step = patch - overlap
  windows = {
      e[y : y + patch, x : x + patch][inner, inner].tobytes()
      for e in exemplars
      for y in range(40 - patch + 1)
      for x in range(40 - patch + 1)
  }
  for y in range(0, 90 - patch + 1, step):
    for x in range(0, 90 - patch + 1, step):
      assert out[y : y + patch, x : x + patch][inner, inner].tobytes() in windows, (y, x)
  # Every pixel comes from the exemplars.
  colours = {tuple(p) for e in exemplars for p in e.reshape(-1, 3)}
  assert all(tuple(p) in colours for p in out.reshape(-1, 3))
  # Colour statistics: per-channel mean and palette frequencies close to the exemplars'.
  pooled = np.concatenate([e.reshape(-1, 3) for e in exemplars]).astype(np.float64)
  np.testing.assert_allclose(out.reshape(-1, 3).mean(0), pooled.mean(0), atol=20)

  def palette_histogram(pixels):
    nearest = np.argmin(((pixels[:, None, :] - palette[None]) ** 2).sum(-1), axis=1)
    return np.bincount(nearest, minlength=len(palette)) / len(pixels)

  histogram = palette_histogram(out.reshape(-1, 3).astype(np.float64))
  np.testing.assert_allclose(histogram, palette_histogram(pooled), atol=0.15)


def test_texture_image_is_deterministic_in_the_generator():
  image = trifeature.load("train", image_size=32, num_images=4, seed=0).images[3]
  a = quilting.texture_image(image, 32, np.random.default_rng([0, 3]))
  b = quilting.texture_image(image, 32, np.random.default_rng([0, 3]))
  c = quilting.texture_image(image, 32, np.random.default_rng([1, 3]))
  assert a.shape == (32, 32, 3) and a.dtype == np.uint8
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    "shape, side",
    [((32, 32), 16), ((16, 20), 8), ((96, 96), 48), ((191, 500), 48), ((192, 192), 96)]
    + [((375, 500), 96), ((8, 8), 4)],
)
def test_exemplar_size_rule(shape, side):
  assert quilting.exemplar_size(*shape) == side


def test_exemplars_are_the_centred_and_a_random_crop():
  rng = np.random.default_rng(4)
  image = rng.integers(0, 256, size=(30, 41, 3), dtype=np.uint8)
  centred, random = quilting.exemplars(image, np.random.default_rng(5), 12)
  np.testing.assert_array_equal(centred, image[9:21, 14:26])
  draw = np.random.default_rng(5)
  y, x = int(draw.integers(0, 19)), int(draw.integers(0, 30))
  np.testing.assert_array_equal(random, image[y : y + 12, x : x + 12])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: quilting.exemplar_size(7, 100), "at least 8x8"),
        (lambda: quilting.exemplars(np.zeros((8, 8, 3), np.uint8), None, 9), "exemplar size"),
        (lambda: quilting.synthesize([], 8, 8, None), "at least one exemplar"),
        (lambda: quilting.synthesize([np.zeros((8, 8, 3))], 8, 8, None), "uint8"),
        (
            lambda: quilting.synthesize([np.zeros((8, 8, 3), np.uint8)], 8, 8, None, patch=9),
            "patch",
        ),
        (
            lambda: quilting.synthesize([np.zeros((8, 8, 3), np.uint8)], 8, 8, None, overlap=4),
            "overlap",
        ),
        (lambda: quilting.synthesize([np.zeros((8, 8, 3), np.uint8)], 0, 8, None), "height"),
    ],
)
def test_quilting_rejects_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()


# ---------------------------------------------------------------------------------------------
# Texture versions lose the layout: linear probes on Trifeature.


def _features(images: np.ndarray) -> np.ndarray:
  """(N, 128) fixed features: the 8 x 8 layout of the foreground (the fraction of non-grey
  pixels in each 4 x 4 block) and a 64-bin colour histogram of the foreground."""
  foreground = (images != 128).any(-1).astype(np.float64)
  layout = foreground.reshape(len(images), 8, 4, 8, 4).mean((2, 4)).reshape(len(images), -1)
  quantised = images // 64
  bins = (quantised[..., 0] * 16 + quantised[..., 1] * 4 + quantised[..., 2]).astype(np.int64)
  colour = np.stack(
      [np.bincount(b.ravel(), weights=f.ravel(), minlength=64) for b, f in zip(bins, foreground)]
  ) / (foreground.sum((1, 2))[:, None] + 1)
  return np.concatenate([layout, colour], axis=1)


def _probe_accuracy(features: np.ndarray, labels: np.ndarray, train: int) -> float:
  probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
  probe.fit(features[:train], labels[:train])
  return probe.score(features[train:], labels[train:])


@pytest.mark.slow  # about 15 s of synthesis
def test_texture_versions_lose_shape_but_keep_colour(tmp_path):
  num, train = 1000, 750
  data = trifeature.load("train", image_size=32, num_images=num, seed=0, cache_dir=str(tmp_path))
  textures = np.stack(
      [
          quilting.texture_image(im, 32, np.random.default_rng([0, i]))
          for i, im in enumerate(data.images)
      ]
  )
  accuracy = {
      (kind, factor): _probe_accuracy(_features(images), data.labels[factor], train)
      for kind, images in (("original", data.images), ("texture", textures))
      for factor in trifeature.FACTORS
  }
  assert accuracy["original", "shape"] > 0.4, accuracy  # chance 0.1
  assert accuracy["texture", "shape"] < 0.22, accuracy
  assert accuracy["original", "colour"] > 0.95, accuracy
  assert accuracy["texture", "colour"] > 0.85, accuracy


# ---------------------------------------------------------------------------------------------
# The offline job.


def _shards(out_dir) -> np.ndarray:
  meta = ts.read_meta(str(out_dir))
  count = ts.num_shards(meta["num_images"], meta["shard_size"])
  return np.concatenate([np.load(os.path.join(out_dir, ts.shard_name(j))) for j in range(count)])


def _stats(out_dir) -> dict:
  return {
      name: (
          os.stat(os.path.join(out_dir, name)).st_ino,
          os.stat(os.path.join(out_dir, name)).st_mtime_ns,
      )
      for name in os.listdir(out_dir)
  }


def _cli(*args, timeout=120):
  return subprocess.run(
      [sys.executable, "-m", "cl_jax.data.make_texture", *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=timeout,
  )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The tiny job run uninterrupted in this process: its directory."""
  out = tmp_path_factory.mktemp("reference")
  assert make_texture.make(out_dir=str(out), progress=False, **TINY) == list(range(5))
  return out


def test_job_output_layout_and_content(reference):
  meta = ts.read_meta(str(reference))
  assert {k: meta[k] for k in ("dataset", "split", "num_images", "size", "shard_size", "seed")} == {
      "dataset": "trifeature",
      "split": "train",
      "num_images": 24,
      "size": 16,
      "shard_size": 5,
      "seed": 0,
  }
  assert set(meta) == set(ts.META_FIELDS)
  assert meta["source"] == {"image_size": 16, "num_images": 24, "trifeature_seed": 0}
  assert sorted(os.listdir(reference)) == ["meta.json"] + [ts.shard_name(j) for j in range(5)]
  assert [np.load(reference / ts.shard_name(j)).shape[0] for j in range(5)] == [5, 5, 5, 5, 4]
  images = trifeature.load("train", image_size=16, num_images=24, seed=0).images
  textures = _shards(reference)
  assert textures.shape == (24, 16, 16, 3) and textures.dtype == np.uint8
  for i in (0, 7, 23):
    expected = quilting.texture_image(images[i], 16, np.random.default_rng([0, i]))
    np.testing.assert_array_equal(textures[i], expected)


def test_job_resumes_without_redoing_finished_shards(reference, tmp_path):
  out = tmp_path / "textures"
  make_texture.make(out_dir=str(out), progress=False, **TINY)
  for j in (1, 3):  # shards an interrupted job had not finished
    os.remove(out / ts.shard_name(j))
  (out / ".shard_00001.npy.0123.tmp").write_bytes(b"partial")
  kept = _stats(out)
  del kept[".shard_00001.npy.0123.tmp"]
  assert make_texture.make(out_dir=str(out), progress=False, **TINY) == [1, 3]
  after = _stats(out)
  assert {name: after[name] for name in kept} == kept
  assert sorted(after) == sorted(os.listdir(reference))
  np.testing.assert_array_equal(_shards(out), _shards(reference))
  assert make_texture.make(out_dir=str(out), progress=False, **TINY) == []
  assert _stats(out) == after


@pytest.mark.slow
def test_job_result_does_not_depend_on_workers(reference, tmp_path):
  """Two spawned workers, started by the command in a fresh process."""
  out = tmp_path / "textures"
  proc = _cli(f"--out={out}", "--workers=2", *TINY_FLAGS)
  assert proc.returncode == 0, proc.stderr
  np.testing.assert_array_equal(_shards(out), _shards(reference))


@pytest.mark.slow  # kills a subprocess mid-run (timing-dependent), then resumes it: about 5 s
def test_job_killed_midway_resumes_to_the_uninterrupted_result(tmp_path):
  flags = ["--dataset=trifeature", "--num_images=240", "--shard_size=20", "--workers=1"]
  full, out = tmp_path / "full", tmp_path / "killed"
  make_texture.make(
      "trifeature", str(full), num_images=240, shard_size=20, workers=1, progress=False
  )
  proc = subprocess.Popen(
      [sys.executable, "-m", "cl_jax.data.make_texture", f"--out={out}", *flags],
      cwd=ROOT,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  deadline = time.monotonic() + 120
  while not (out / ts.shard_name(2)).exists() and time.monotonic() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  finished = {n: s for n, s in _stats(out).items() if n.startswith("shard_")}
  assert 3 <= len(finished) < 12
  proc = _cli(f"--out={out}", *flags)
  assert proc.returncode == 0, proc.stderr
  after = _stats(out)
  assert {name: after[name] for name in finished} == finished
  assert sorted(after) == sorted(os.listdir(full))
  np.testing.assert_array_equal(_shards(out), _shards(full))


def test_job_refuses_other_arguments_in_the_same_directory(reference):
  with pytest.raises(make_texture.TextureDirMismatchError, match=r"seed 0 there, 1 now"):
    make_texture.make(out_dir=str(reference), seed=1, progress=False, **TINY)
  with pytest.raises(make_texture.TextureDirMismatchError, match=r"size 16 there, 12 now"):
    make_texture.make(out_dir=str(reference), size=12, progress=False, **TINY)
  args = {**TINY, "num_images": 20}
  with pytest.raises(make_texture.TextureDirMismatchError, match=r"num_images 24 there, 20 now"):
    make_texture.make(out_dir=str(reference), progress=False, **args)


def test_job_refuses_a_directory_of_other_files(tmp_path):
  (tmp_path / "notes.txt").write_text("mine")
  with pytest.raises(make_texture.TextureDirMismatchError, match="no meta.json"):
    make_texture.make(out_dir=str(tmp_path), progress=False, **TINY)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset=mnist", "--out=OUT"], "unknown dataset 'mnist'; choose one of trifeature"),
        (["--dataset=trifeature", "--out=OUT", "--size=0"], "--size must be a positive integer"),
        (
            ["--dataset=cifar10", "--out=OUT", "--data_dir=DATA"],
            "--size .* is required for cifar10",
        ),
        (["--dataset=cifar10", "--out=OUT", "--size=32"], "--data_dir .* is required for cifar10"),
        (["--dataset=trifeature", "--out=OUT", "--data_dir=DATA"], "TFDS datasets only"),
        (["--dataset=trifeature", "--out=OUT", "--image_size=8"], "image_size must be"),
        ([*TINY_FLAGS, "--out=REFERENCE", "--seed=3"], "seed 0 there, 3 now"),
        (["--out=OUT"], "--dataset"),
    ],
)
def test_cli_reports_bad_input_in_one_line(args, message, reference, tmp_path):
  args = [
      a.replace("OUT", str(tmp_path / "out"))
      .replace("DATA", str(tmp_path))
      .replace("REFERENCE", str(reference))
      for a in args
  ]
  proc = _cli(*args)
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
  assert re.search(message, lines[0]), lines[0]


@pytest.mark.slow
def test_cli_reports_missing_tfds_data_in_one_line(tmp_path):
  proc = _cli(
      "--dataset=cifar10", f"--out={tmp_path / 'out'}", f"--data_dir={tmp_path}", "--size=32"
  )
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "not prepared" in lines[0] and "tfds build cifar10" in lines[0]
  assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# TextureSource.


def _source(num_images=24):
  data = make_texture.data_config("trifeature", "train", image_size=16, num_images=num_images)
  return make_texture.open_source(data, "train")


def test_texture_source_returns_aligned_records(reference):
  base = _source()
  source = ts.TextureSource(base, str(reference), dataset="trifeature", split="train", size=16)
  assert len(source) == len(base) == 24
  assert source.num_classes == base.num_classes
  textures = _shards(reference)
  for i in (0, 5, 23):
    record = source[i]
    assert set(record) == {"image", "shape", "texture", "colour", ts.KEY}
    for key, value in base[i].items():
      np.testing.assert_array_equal(record[key], value)
    np.testing.assert_array_equal(record[ts.KEY], textures[i])
    assert record[ts.KEY].shape == (16, 16, 3) and record[ts.KEY].dtype == np.uint8
  with pytest.raises(IndexError):
    source[24]
  clone = pickle.loads(pickle.dumps(source))
  np.testing.assert_array_equal(clone[12][ts.KEY], textures[12])


def _command(error) -> list[str]:
  return shlex.split(str(error.value).split("with: ", 1)[1])


@pytest.mark.slow
def test_texture_source_gives_the_command_for_a_missing_directory(tmp_path):
  out = tmp_path / "textures"
  with pytest.raises(ts.TextureDatasetError, match="no texture dataset") as error:
    ts.TextureSource(_source(), str(out), dataset="trifeature", split="train")
  command = _command(error)
  assert command == [
      "python",
      "-m",
      "cl_jax.data.make_texture",
      "--dataset=trifeature",
      "--split=train",
      f"--out={out}",
      "--image_size=16",
      "--num_images=24",
  ]
  proc = _cli(*command[3:])
  assert proc.returncode == 0, proc.stderr
  ts.TextureSource(_source(), str(out), dataset="trifeature", split="train")


def test_texture_source_gives_the_command_for_an_incomplete_directory(reference, tmp_path):
  out = tmp_path / "textures"
  make_texture.make(out_dir=str(out), progress=False, **TINY)
  os.remove(out / ts.shard_name(2))
  with pytest.raises(ts.TextureDatasetError, match="incomplete: 1 of 5 shards") as error:
    ts.TextureSource(_source(), str(out), dataset="trifeature", split="train")
  command = _command(error)
  assert "--shard_size=5" in command and "--size=16" in command
  before = _stats(out)
  proc = _cli(*command[3:])
  assert proc.returncode == 0, proc.stderr
  after = _stats(out)
  assert sorted(set(after) - set(before)) == [ts.shard_name(2)]
  assert {name: after[name] for name in before} == before
  source = ts.TextureSource(_source(), str(out), dataset="trifeature", split="train")
  np.testing.assert_array_equal(source[11][ts.KEY], _shards(reference)[11])


def test_texture_source_refuses_textures_of_other_images(reference):
  with pytest.raises(ts.TextureDatasetError, match=r"num_images 24 \(expected 20\)") as error:
    ts.TextureSource(_source(20), str(reference), dataset="trifeature", split="train")
  assert "--num_images=20" in _command(error)
  with pytest.raises(ts.TextureDatasetError, match=r"split 'train' \(expected 'test'\)"):
    ts.TextureSource(_source(), str(reference), dataset="trifeature", split="test")
  with pytest.raises(ts.TextureDatasetError, match=r"size 16 \(expected 32\)"):
    ts.TextureSource(_source(), str(reference), dataset="trifeature", split="train", size=32)
  other = make_texture.open_source(
      make_texture.data_config(
          "trifeature", "train", image_size=16, num_images=24, trifeature_seed=1
      ),
      "train",
  )
  with pytest.raises(ts.TextureDatasetError, match="image_digest"):
    ts.TextureSource(other, str(reference), dataset="trifeature", split="train")
