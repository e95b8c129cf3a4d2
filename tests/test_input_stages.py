"""The per-stage table of one core's JPEG input (cl_jax.bench.input_stages) on a small folder:
every stage timed on both decoding paths (the fast one where torch is installed), the stages
within the pipeline's own time, the table's rows."""

import os

import numpy as np
import PIL.Image

from cl_jax.bench import input_stages
from cl_jax.data import fast_views, folder_source
from cl_jax.runtime import config_files


def test_each_stage_is_timed_and_the_pipeline_holds_them(tmp_path):
  rng = np.random.default_rng(0)
  for i in range(24):
    size = (40 + 4 * (i % 5), 56 - 2 * (i % 3))
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    os.makedirs(tmp_path / f"c{i % 2}", exist_ok=True)
    PIL.Image.fromarray(pixels).save(tmp_path / f"c{i % 2}" / f"{i}.jpg", quality=90)
  config = config_files.load_config_file(input_stages.DEFAULT_CONFIG).get_config(None)
  config.optim.batch_size = 8
  config.data.image_size = 16
  source = folder_source.FolderSource(folder_source.build_index(str(tmp_path)))
  # The fast path where torch is installed (CI: CL_JAX_REQUIRE_TORCH=1 requires it).
  fast = os.environ.get("CL_JAX_REQUIRE_TORCH") == "1" or not fast_views.missing_packages()
  decoders = ("pil", "fast") if fast else ("pil",)
  for decoder in decoders:
    spent = input_stages.stage_times(source.files, 16, (0.2, 1.0), batch=8, decoder=decoder)
    assert set(spent) == set(input_stages.STAGES) and all(t > 0 for t in spent.values())
  result = input_stages.measure(config, source, batches=2, decoder=decoders[-1])
  assert result["decoder"] == decoders[-1]
  ms = result["ms_per_image"]
  assert list(ms) == [*input_stages.STAGES, "transport"] and ms["transport"] >= 0
  assert result["images"] == 16 and result["pipeline_img_per_s"] > 0
  # Crops of 16 px views from 40-56 px images: never under the view's side at area 0.2-1, by
  # hand the shorter side of the smallest crop is about sqrt(0.2 * 40 * 52 * 3/4) = 18 px.
  assert result["crops"]["upsampled"] == 0 and result["crops"]["crop_over_view"] > 1.1
  # Views of 64 px from images of at most 56: every one upsampled.
  assert input_stages.crop_statistics(source.files, 64, (0.2, 1.0))["upsampled"] == 1.0
  rows = input_stages.table(result).splitlines()
  assert rows[0].startswith(f"data.decoder={decoders[-1]}: one core, 16 images")
  assert rows[2] == "| stage | ms per image | share |" and rows[-3].startswith("| pipeline |")
  assert len(rows) == 4 + len(ms) + 3
  cores = -(-input_stages.H200_STEP_IMG_PER_S // result["pipeline_img_per_s"])
  assert result["cores_for_step"] == cores and rows[-1].endswith(f": {int(cores)}")
