"""The image-folder input path against the ArrayRecord path, on the same JPEGs.

python -m cl_jax.bench --config=configs/NAME.py[:preset] --input=folder [--jpeg_dir=DIR]
    [--jpeg_images=512] [--jpeg_pipeline_images=768] [--json]

The images are the generated ImageNet-like JPEG folder of `--input=jpeg` (cl_jax.bench.jpeg_folder,
cached). Two sources of the same files, both decoded at full size by PIL:
  folder       cl_jax.data.folder_source: one file opened and read per image, through the
               cached file index (the path of data.name=folder);
  array_record the same JPEG bytes written once, one record per image, to an ArrayRecord file
               (the container TFDS prepares with --file_format=array_record) and read by
               array_record's random-access reader (kept beside the folder).
For each, the pretraining pipeline alone (decode, the views' random resized crops and flips,
batching; cl_jax.bench.input.pipeline_rate) with 0 grain workers (the main process decodes: its
rate is the rate per host core) and with one worker per CPU; printed as img/s and img/s per
decoding process, and the folder path's rate over the ArrayRecord path's.
"""

import json
import os
import time

import numpy as np
import PIL.Image

from cl_jax.bench import input as bench_input
from cl_jax.bench.jpeg_folder import default_root, make_jpeg_folder
from cl_jax.data import folder_source
from cl_jax.data.tfds_source import UNLABELLED
from cl_jax.runtime.errors import UsageError

RECORDS_FILE = "images.array_record"


def write_array_record(files: list[str], path: str) -> str:
  """Write each file's bytes as one record of the ArrayRecord file `path` (group size 1, so
  every record is read on its own) unless it exists; returns `path`."""
  from array_record.python import array_record_module

  if os.path.exists(path):
    return path
  writer = array_record_module.ArrayRecordWriter(path + ".tmp", "group_size:1")
  for f in files:
    with open(f, "rb") as handle:
      writer.write(handle.read())
  writer.close()
  os.replace(path + ".tmp", path)
  return path


class ArrayRecordJpegSource:
  """Random-access source over an ArrayRecord file of JPEG bytes: record i is {"image": (H, W,
  3) uint8 RGB decoded by PIL, "label": UNLABELLED}. Picklable (the reader opens in each
  process)."""

  def __init__(self, path: str):
    self.path = path
    self._reader = None

  def _records(self):
    if self._reader is None:
      from array_record.python import array_record_data_source

      self._reader = array_record_data_source.ArrayRecordDataSource([self.path])
    return self._reader

  def __len__(self) -> int:
    return len(self._records())

  def __getitem__(self, i: int) -> dict:
    import io

    with PIL.Image.open(io.BytesIO(self._records()[int(i)])) as image:
      pixels = np.asarray(image.convert("RGB"), np.uint8)
    return {"image": pixels, "label": UNLABELLED}

  def __getstate__(self) -> dict:
    return {"path": self.path, "_reader": None}


def measure(config, root: str, pipeline_images: int, workers: list[int] | None = None) -> dict:
  """The two paths' pipeline rates over the JPEG folder `root` (module docstring): {"images",
  "rows": [{"path", "workers", "img_per_s", "img_per_s_per_worker", "startup_s"}],
  "folder_over_array_record": {workers: ratio}}."""
  index = folder_source.build_index(root)
  folder = folder_source.FolderSource(index)
  records = ArrayRecordJpegSource(
      write_array_record(folder.files, os.path.join(root, RECORDS_FILE))
  )
  if len(records) != len(folder):
    raise ValueError(
        f"{records.path} holds {len(records)} records, the folder {len(folder)} images"
    )
  batches = max(3, -(-pipeline_images // config.optim.batch_size))
  counts = workers if workers is not None else [0, os.cpu_count() or 1]
  rows = [
      {"path": name, **bench_input.pipeline_rate(source, config, w, batches)}
      for w in counts
      for name, source in (("folder", folder), ("array_record", records))
  ]
  rate = {(r["path"], r["workers"]): r["img_per_s"] for r in rows}
  return {
      "images": len(folder),
      "rows": rows,
      "folder_over_array_record": {
          w: round(rate["folder", w] / rate["array_record", w], 3) for w in counts
      },
  }


def table(out: dict) -> str:
  """The measurements as a text table."""
  lines = [
      f"pipeline alone over {out['images']} JPEGs ({out['root']}), cpus {os.cpu_count()}:",
      f"{'path':<14}{'workers':>8}{'img/s':>10}{'img/s per process':>20}{'start-up s':>12}",
  ]
  lines += [
      f"{r['path']:<14}{r['workers']:>8}{r['img_per_s']:>10.1f}"
      f"{r['img_per_s_per_worker']:>20.1f}{r['startup_s']:>12.2f}"
      for r in out["rows"]
  ]
  ratios = ", ".join(f"{w} workers {v:.2f}" for w, v in out["folder_over_array_record"].items())
  lines.append(f"folder / array_record img/s: {ratios}")
  return "\n".join(lines)


def run(config, *, jpeg_dir: str, jpeg_images: int, pipeline_images: int, as_json: bool) -> dict:
  """The --input=folder command: makes (or reuses) the folder, measures, prints."""
  if config.nonsemantic.enabled and config.nonsemantic.kind == "texture":
    raise UsageError("texture negatives read texture images, which the JPEG folder lacks")
  root = jpeg_dir or default_root(jpeg_images, seed=0)
  start = time.perf_counter()
  make_jpeg_folder(root, jpeg_images, seed=0)
  out = {"root": root, "ready_s": round(time.perf_counter() - start, 1)}
  out.update(measure(config, root, pipeline_images))
  print(json.dumps(out) if as_json else table(out), flush=True)
  return out
