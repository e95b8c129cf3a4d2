"""Where one host core's time goes when it feeds the pretraining step from JPEG files, on each
decoding path.

python -m cl_jax.bench.input_stages [--config=configs/NAME.py[:preset]] [--jpeg_dir=DIR]
    [--jpeg_images=512] [--batches=4] [--decoders=pil,fast] [--json]

On the generated ImageNet-like JPEG folder of `--input=jpeg` (cl_jax.bench.jpeg_folder, cached),
or the folder --jpeg_dir, and the config's views (data.image_size, data.crop_scale, two views
per image), one process times each stage of the CPU input path image by image, as
cl_jax.data.folder_source and cl_jax.data.pipeline run them, for each path of --decoders
(data.decoder) in turn on the same images:
  read       the file's bytes (open and read);
  decode     the full-size decode to an (H, W, 3) uint8 array (PIL, convert to RGB included; or
             libjpeg-turbo through simplejpeg, cl_jax.data.fast_views);
  crop       each view's random resized crop and flip parameters (geometric.sample_crop);
  resize     each view's crop, antialiased bilinear resize and flip (geometric.apply_crop, or
             fast_views.apply_crop);
  batch      stacking the views of optim.batch_size images into batch arrays;
then the same images through the pipeline itself with 0 grain workers (pipeline.make_iterator):
its time per image over the stages' sum is grain's own share (its dataset, transforms and
iterator), "transport" in the table. Printed per path as ms per image, share of the pipeline's
time, the rate one core reaches and the cores that rate needs to feed a step of --step_img_per_s
(default: the MoCo-v2 ResNet-50 step measured on one H200, results/bench/h200, commit ef9df6c),
then the fast path's pipeline rate over PIL's, with the files' mean size and how the views'
crops compare with the view size (crop_statistics: upsampled views), which a store at bounded
resolution (cl_jax.data.bounded_folder, --jpeg_dir) changes; --json prints the dict ({path:
result, "fast_over_pil": ratio}).
"""

import io
import json
import math
import os
import time

import numpy as np
import PIL.Image
from absl import app, flags

from cl_jax.bench import input as bench_input
from cl_jax.bench.jpeg_folder import default_root, make_jpeg_folder
from cl_jax.data import fast_views, folder_source, geometric
from cl_jax.runtime import cli, config_files
from cl_jax.runtime.errors import UsageError

HOST_DECODERS = ("pil", "fast")  # the data.decoder paths that decode on the host
STAGES = ("read", "decode", "crop", "resize", "batch")
# Without --config: MoCo-v2's ImageNet-100 views (224 px, crop scale 0.2-1, batch 128).
DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "configs",
    "mocov2.py",
)
VIEWS = 2


def stage_times(
    files: list[str], image_size: int, crop_scale, batch: int, seed: int = 0, decoder: str = "pil"
) -> dict:
  """{stage: seconds} over `files` (module docstring), one process, every view drawn as the
  pipeline draws them (two per image), decoded and resampled by `decoder`'s path (data.decoder:
  "pil", or "fast": cl_jax.data.fast_views)."""
  crop = fast_views.apply_crop if decoder == "fast" else geometric.apply_crop
  rng = np.random.default_rng(seed)
  spent = dict.fromkeys(STAGES, 0.0)
  views = []
  for path in files:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
      data = f.read()
    t1 = time.perf_counter()
    if decoder == "fast":
      pixels = fast_views.decode_data(data, path)
    else:
      with PIL.Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image.convert("RGB"), np.uint8)
    t2 = time.perf_counter()
    params = [
        geometric.sample_crop(rng, pixels.shape[0], pixels.shape[1], scale=crop_scale)
        for _ in range(VIEWS)
    ]
    t3 = time.perf_counter()
    views.append([crop(pixels, p, image_size) for p in params])
    t4 = time.perf_counter()
    spent["read"] += t1 - t0
    spent["decode"] += t2 - t1
    spent["crop"] += t3 - t2
    spent["resize"] += t4 - t3
    if len(views) == batch:
      t5 = time.perf_counter()
      [np.stack([v[k] for v in views]) for k in range(VIEWS)]
      spent["batch"] += time.perf_counter() - t5
      views = []
  return spent


def crop_statistics(files: list[str], image_size: int, crop_scale, seed: int = 0) -> dict:
  """How the views' crops compare with the view size on these files (two views per image, drawn
  as the pipeline draws them from the image sizes in the files' headers): {"upsampled": the
  fraction of views whose crop's shorter side is under image_size, "crop_over_view": the mean
  of the crop's shorter side over image_size}."""
  rng = np.random.default_rng(seed)
  ratios = []
  for path in files:
    with PIL.Image.open(path) as image:
      width, height = image.size
    for _ in range(VIEWS):
      y0, x0, y1, x1 = geometric.sample_crop(rng, height, width, scale=crop_scale).box
      ratios.append(min(y1 - y0, x1 - x0) / image_size)
  ratios = np.asarray(ratios)
  return {
      "upsampled": round(float(np.mean(ratios < 1)), 3),
      "crop_over_view": round(float(np.mean(ratios)), 3),
  }


H200_STEP_IMG_PER_S = 3959.0  # results/bench/h200/step.json, commit ef9df6c


def measure(
    config,
    source: folder_source.FolderSource,
    batches: int,
    step_img_per_s: float = H200_STEP_IMG_PER_S,
    decoder: str = "pil",
) -> dict:
  """The stage table of `decoder`'s path over `batches` batches of the folder `source` and the
  pipeline's own time per image over the same folder (0 workers; its images in its shuffled
  order)."""
  batch = config.optim.batch_size
  images = batch * batches
  files = (source.files * (1 + images // len(source.files)))[:images]
  # Untimed: the files into the page cache, the path's libraries loaded and warm.
  stage_times(files, config.data.image_size, tuple(config.data.crop_scale), batch, 1, decoder)
  spent = stage_times(
      files, config.data.image_size, tuple(config.data.crop_scale), batch, decoder=decoder
  )
  config = config.copy_and_resolve_references()
  config.data.decoder = decoder
  source = folder_source.FolderSource(folder_source.build_index(source.folder), decoder=decoder)
  pipeline = bench_input.pipeline_rate(source, config, 0, batches)
  per_image = {k: 1000 * v / images for k, v in spent.items()}
  total = 1000 / pipeline["img_per_s"]
  per_image["transport"] = max(0.0, total - sum(per_image.values()))
  return {
      "decoder": decoder,
      "images": images,
      "mean_kb": round(float(np.mean([os.path.getsize(f) for f in files])) / 1024, 1),
      "crops": crop_statistics(files, config.data.image_size, tuple(config.data.crop_scale)),
      "image_size": config.data.image_size,
      "ms_per_image": {k: round(v, 3) for k, v in per_image.items()},
      "pipeline_ms_per_image": round(total, 3),
      "pipeline_img_per_s": pipeline["img_per_s"],
      "stages_img_per_s": round(1000 / sum(v for k, v in per_image.items() if k in STAGES), 1),
      "step_img_per_s": step_img_per_s,
      "cores_for_step": math.ceil(step_img_per_s / pipeline["img_per_s"]),
  }


def table(result: dict) -> str:
  """The stage table in markdown."""
  total = result["pipeline_ms_per_image"]
  lines = [
      f"data.decoder={result['decoder']}: one core, {result['images']} images, "
      f"{result['image_size']} px view pairs: {result['pipeline_img_per_s']} img/s through the "
      f"pipeline (0 workers); files of {result['mean_kb']} KB on average; "
      f"{100 * result['crops']['upsampled']:.0f}% of the views upsampled, crops "
      f"{result['crops']['crop_over_view']:.2f} x the view's side on average",
      "",
      "| stage | ms per image | share |",
      "|---|---:|---:|",
  ]
  for stage, ms in result["ms_per_image"].items():
    lines.append(f"| {stage} | {ms:.2f} | {100 * ms / total:.0f}% |")
  lines.append(f"| pipeline | {total:.2f} | 100% |")
  lines += [
      "",
      f"cores to feed a step of {result['step_img_per_s']:,.0f} img/s at this rate: "
      f"{result['cores_for_step']}",
  ]
  return "\n".join(lines)


def _define_flags():
  cli.define_config_flag()
  flags.DEFINE_string(
      "jpeg_dir",
      None,
      "A folder of JPEGs to time, e.g. a bounded_folder store (default: the generated "
      "ImageNet-like folder of --jpeg_images images, cached).",
  )
  flags.DEFINE_integer("jpeg_images", 512, "Images of the generated folder.", lower_bound=1)
  flags.DEFINE_integer("batches", 4, "Batches of optim.batch_size timed.", lower_bound=1)
  flags.DEFINE_float(
      "step_img_per_s",
      H200_STEP_IMG_PER_S,
      "The step's rate to feed (default: MoCo-v2's ResNet-50 step on one H200, ef9df6c).",
  )
  flags.DEFINE_list(
      "decoders",
      list(HOST_DECODERS),
      "The host paths timed one after the other on the same images (data.decoder values; "
      "gpu decodes on the device: python -m cl_jax.bench.step --input=jpeg times it).",
  )
  flags.DEFINE_bool("json", False, "Print the result as JSON.")


def main(argv):
  del argv
  f = flags.FLAGS
  with cli.report():
    config = f.config or config_files.load_config_file(DEFAULT_CONFIG).get_config("imagenet100")
    root = f.jpeg_dir
    if not root:
      root = make_jpeg_folder(default_root(f.jpeg_images, 0), f.jpeg_images, 0)
    elif not os.path.isdir(root):
      raise UsageError(f"--jpeg_dir={root} is not a folder")
    unknown = sorted(set(f.decoders) - set(HOST_DECODERS))
    if unknown:
      raise UsageError(f"--decoders: {unknown} unknown; give some of {list(HOST_DECODERS)}")
    missing = fast_views.missing_packages() if "fast" in f.decoders else []
    if missing:
      raise UsageError(
          f"--decoders=fast needs {' and '.join(missing)}: {fast_views.INSTALL}, or --decoders=pil"
      )
    source = folder_source.FolderSource(folder_source.build_index(root))
    results = {d: measure(config, source, f.batches, f.step_img_per_s, d) for d in f.decoders}
    if {"pil", "fast"} <= set(results):
      ratio = results["fast"]["pipeline_img_per_s"] / results["pil"]["pipeline_img_per_s"]
      results["fast_over_pil"] = round(ratio, 2)
    if f.json:
      print(json.dumps(results, indent=1))
      return
    print("\n\n".join(table(results[d]) for d in f.decoders))
    if "fast_over_pil" in results:
      print(f"\nthrough the pipeline, fast / pil: {results['fast_over_pil']:.2f}x")


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
