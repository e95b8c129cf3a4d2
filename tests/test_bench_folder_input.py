"""The folder-against-ArrayRecord input benchmark (cl_jax.bench.folder_input): the ArrayRecord
file holds the folder's JPEGs byte for byte, both sources give the same images, and the
measurement has a row per path and worker count, and the command's one-line refusal."""

import os
import subprocess
import sys

import numpy as np
import pytest

from cl_jax.bench import folder_input, jpeg_folder
from cl_jax.data import folder_source
from tests import tiny_run
from tests.test_bench_input import _tiny_config


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("jpeg") / "folder")
  return jpeg_folder.make_jpeg_folder(root, 20, seed=4, workers=0)


def test_both_sources_give_the_same_images(folder):
  files = folder_source.FolderSource(folder_source.build_index(folder))
  path = folder_input.write_array_record(files.files, os.path.join(folder, "x.array_record"))
  records = folder_input.ArrayRecordJpegSource(path)
  assert len(records) == len(files) == 20
  for i in (0, 7, 19):
    np.testing.assert_array_equal(records[i]["image"], files[i]["image"])
  # Written once: a second call keeps the file.
  before = os.stat(path).st_mtime_ns
  folder_input.write_array_record(files.files, path)
  assert os.stat(path).st_mtime_ns == before


def test_the_measurement_has_both_paths_at_each_worker_count(folder):
  c = _tiny_config()
  c.optim.batch_size = 4
  out = folder_input.measure(c, folder, pipeline_images=12, workers=[0])
  assert out["images"] == 20
  assert [(r["path"], r["workers"]) for r in out["rows"]] == [("folder", 0), ("array_record", 0)]
  assert all(r["img_per_s"] > 0 for r in out["rows"])
  ratio = out["rows"][0]["img_per_s"] / out["rows"][1]["img_per_s"]
  assert out["folder_over_array_record"][0] == pytest.approx(ratio, abs=1e-3)
  assert "folder / array_record img/s: 0 workers" in folder_input.table({**out, "root": folder})


def test_texture_negatives_are_refused_in_one_line(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.bench",
          "--config=configs/mocov2_texturens.py",
          "--input=folder",
          f"--jpeg_dir={tmp_path / 'f'}",
          "--jpeg_images=4",
      ],
      cwd=tiny_run.ROOT,
      env=tiny_run.env(),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1].startswith("error: texture negatives read texture")
