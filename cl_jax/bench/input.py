"""The training loop end to end on JPEG decoding: can the host input pipeline feed the step?

python -m cl_jax.bench.step --config=configs/NAME.py[:preset] --input=jpeg [--jpeg_dir=DIR]
    [--jpeg_images=512] [--steps=10] [--warmup=2] [--json]

The pretraining images are a generated ImageNet-like folder (`make_jpeg_folder`,
`<root>/<class>/<i>.JPEG`, 10 classes, cached): widths 300-600 px, aspect ratios 3:4 to 4:3,
smooth 1/f content with a few textured objects, PIL quality 90, so that the files are about as
large as ImageNet's (50-150 KB) and about as costly to decode. Three decodings (DECODES,
`JpegSource`): exact (full size, as ImageFolderSource), reduced (libjpeg's DCT-domain 1/2, 1/4
or 1/8, the largest that keeps every possible crop at least twice the view's side; the
faithful default) and reduced-max (at least the view's side: the largest reduction that never
upsamples); and, where simplejpeg and torch are installed, fast (data.decoder="fast": full size by
libjpeg-turbo, the views resampled by PyTorch, cl_jax.data.fast_views); and where JAX runs on a
GPU with nvImageCodec installed, gpu (data.decoder="gpu": the host reads the bytes and draws the
crops, the GPU decodes the crops and resamples the views, cl_jax.data.gpu_views). Printed:

  decode    ms per image of PIL's decoding at full size and at 1/2, 1/4, 1/8; per reduced
            decoding its mean reduction and how far its views are from exact decoding's
            (`view_difference`, beside a one-pixel move of the crop for scale);
  pipeline  img/s of cl_jax.data.pipeline.pretrain_dataset alone (decode, the views' random
            resized crops and flips, batching) through pipeline.make_iterator with 0, 1, 2, 4,
            ... grain workers (`worker_counts`), and per worker, for each decoding (gpu: the
            host's part); gpu's device side alone (`device_decode_rate`), per device;
  loop      img/s of train.pretrain's loop (pipeline -> parallel.global_batch -> the jitted
            lean train step; no checkpoints, metrics or logging) on the JPEG folder for each
            decoding with 0 and N (the CPU count) workers, and of the same loop on two batches
            of the pipeline held in memory, which runs before the first JPEG loop and after
            each; ratio = JPEG loop img/s / the mean of the in-memory runs beside it (1: the
            pipeline keeps up with the step); per decoding, the img/s of one decoding process
            (per host core), the host cores that would feed the in-memory loop, and for gpu
            the img/s per device (`feeding`); and a verdict on the fastest faithful decoding.

Worker start-up and compilation are kept out of every rate: the timing starts after warmup
batches (or steps) taken from the started iterator.

The folder is made by cl_jax.bench.jpeg_folder and decoded by cl_jax.bench.jpeg_decode; this
module times the pipeline and the loop, prints the tables and runs the command.
"""

import dataclasses
import json
import math
import os
import time

import jax
import numpy as np

from cl_jax import config_check, train
from cl_jax import train_step as step_lib
from cl_jax.bench.jpeg_decode import (
    DECODES,
    FAITHFUL,
    decode_ms,
    decoder_config,
    reduces,
    sources,
    view_difference,
)
from cl_jax.bench.jpeg_folder import default_root, make_jpeg_folder
from cl_jax.data import pipeline
from cl_jax.runtime import parallel


def steady_rate(arrivals: list[float], batch: int) -> float:
  """img/s of a pipeline in its steady state, from the times at which consecutive batches
  arrived (arrivals[0]: the time the timed run began, arrivals[k]: batch k's arrival): the rate
  over the later half of the run's time. Batches that the workers had ready when the run began
  arrive at once, and a rate over the whole run would count them as produced in no time; they
  all arrive in the earlier half where the run is long enough to hold more batches than they
  (pipeline_rate times at least 4 per process that decodes). Falls back to the whole run where
  fewer than two batches arrived in the later half."""
  middle = (arrivals[0] + arrivals[-1]) / 2
  first = next(k for k, t in enumerate(arrivals) if t >= middle)
  if len(arrivals) - 1 - first < 2:
    first = 0
  return batch * (len(arrivals) - 1 - first) / (arrivals[-1] - arrivals[first])


def pipeline_rate(source, config, workers: int, batches: int) -> dict:
  """img/s of the pretraining pipeline alone over `source` with `workers` grain workers.

  After max(2, workers + 1) untimed batches (worker start-up), max(batches, 4 (workers + 1))
  batches are timed and steady_rate gives their rate (batches the workers held ready do not
  count). Returns a row: workers, img_per_s, img_per_s_per_worker (per process that decodes:
  the main one when workers is 0), timed_batches, startup_s (iterator creation to the first
  batch).
  """
  batch = config.optim.batch_size
  timed = max(batches, 4 * (workers + 1))
  start = time.perf_counter()
  it = pipeline.make_iterator(train.pretrain_data(config, source), workers)
  try:
    next(it)
    startup = time.perf_counter() - start
    for _ in range(max(2, workers + 1) - 1):
      next(it)
    arrivals = [time.perf_counter()]
    for _ in range(timed):
      next(it)
      arrivals.append(time.perf_counter())
    rate = steady_rate(arrivals, batch)
  finally:
    it.close()
  return {
      "workers": workers,
      "img_per_s": round(rate, 1),
      "img_per_s_per_worker": round(rate / max(1, workers), 1),
      "timed_batches": timed,
      "startup_s": round(startup, 2),
  }


@dataclasses.dataclass
class Loop:
  """A config's jitted train step on a mesh and its state, which every timed loop advances."""

  config: object
  mesh: object
  step: object
  state: object


def make_loop(config, num_records: int, mesh) -> Loop:
  """The train state and jitted step of `config` on `mesh`, as train.pretrain builds them (its
  lean step, without the statistics that only logging steps compute)."""
  config_check.validate(config, num_devices=mesh.devices.size, reads_data=False)
  spe = train.steps_per_epoch(num_records, config.optim.batch_size)
  encoder, tx, schedule, make_state, _ = train.build(config, num_records, mesh)
  state = make_state()
  step = step_lib.jit_on_mesh(
      step_lib.make_train_step(config, encoder, tx, schedule, mesh, spe, statistics=False),
      state,
      mesh,
  )
  return Loop(config, mesh, step, state)


def loop_rate(loop: Loop, batches, steps: int, warmup: int, to_devices=None) -> dict:
  """img/s of train.pretrain's loop, `state, metrics = step(state, to_devices(next(batches)))`
  (to_devices: train.input_to_devices; default parallel.global_batch), over `steps` steps after
  `warmup` (at least 1) untimed ones.

  Returns a row: img_per_s, step_ms (wall time per step), loss (the last step's).
  """
  if to_devices is None:
    to_devices = lambda local: parallel.global_batch(local, loop.mesh)
  state = loop.state
  for _ in range(max(1, warmup)):
    state, metrics = loop.step(state, to_devices(next(batches)))
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = loop.step(state, to_devices(next(batches)))
  jax.block_until_ready((state, metrics))
  seconds = (time.perf_counter() - start) / steps
  loop.state = state
  return {
      "img_per_s": round(loop.config.optim.batch_size / seconds, 1),
      "step_ms": round(1e3 * seconds, 1),
      "loss": float(metrics["loss"]),
  }


def decoder_difference(config, exact, source, mode: str, mesh) -> dict:
  """How far the views of decoding `mode` ("fast" or "gpu", read from `source`) are from the
  default path's (PIL, from `exact`) on the pipeline's first batch, the same crops drawn from
  the same seed: mean_abs (grey levels) and above_1 (the fraction of pixels more than one grey
  level apart)."""
  batches = {}
  for name, src, cfg in (("pil", exact, config), (mode, source, decoder_config(config, mode))):
    local = train.pretrain_data(cfg, src)[0]
    batch = train.input_to_devices(cfg, mesh)(local)
    batches[name] = np.concatenate([np.asarray(batch["view1"]), np.asarray(batch["view2"])])
  diff = np.abs(batches[mode].astype(np.int32) - batches["pil"].astype(np.int32))
  return {"mean_abs": round(float(diff.mean()), 3), "above_1": round(float((diff > 1).mean()), 5)}


def device_decode_rate(config, source, mesh, batches: int) -> dict:
  """img/s of the gpu path's device side alone (gpu_views.DeviceViews: decoding the crops,
  filling the canvas, resampling) on two batches of its pipeline held in memory, over `batches`
  calls after one untimed call. Returns a row: img_per_s, img_per_s_per_device, ms_per_batch."""
  config = decoder_config(config, "gpu")
  held = _held_batches(config, source)
  to_devices = train.input_to_devices(config, mesh)
  jax.block_until_ready(to_devices(held[0]))
  start = time.perf_counter()
  for k in range(batches):
    out = to_devices(held[k % 2])
  jax.block_until_ready(out)
  seconds = (time.perf_counter() - start) / batches
  rate = config.optim.batch_size / seconds
  return {
      "img_per_s": round(rate, 1),
      "img_per_s_per_device": round(rate / mesh.devices.size, 1),
      "ms_per_batch": round(1e3 * seconds, 2),
  }


def _cycle(items: list):
  while True:
    yield from items


def worker_counts(config, cpus: int | None = None) -> list[int]:
  """0, then 1, 2, 4, ... up to the CPU count, the CPU count, and config.data.workers where
  it is below it (more worker processes than cores cannot decode faster)."""
  cpus = cpus or os.cpu_count() or 1
  counts, n = {0, cpus, min(config.data.workers, cpus)}, 1
  while n < cpus:
    counts.add(n)
    n *= 2
  return sorted(counts)


def _decodings(config, root: str) -> tuple[dict, list[str], dict]:
  """The decodings of the folder `root` for `config`'s views, checked for this benchmark.

  Returns (modes, same, timed): `sources(root, config)`; the reduced decodings that reduce no
  image of the folder (the exact one, which is not timed again); and the sources to time.

  Raises:
    ValueError: texture negatives (they read texture images, which the folder lacks), or a
      folder of fewer images than a batch.
  """
  if config.nonsemantic.enabled and config.nonsemantic.kind == "texture":
    raise ValueError("texture negatives read texture images, which the JPEG folder lacks")
  batch = config.optim.batch_size
  modes = sources(root, config)
  files = modes["exact"].files
  if len(files) < batch:
    raise ValueError(f"the folder's {len(files)} images are fewer than a batch of {batch}")
  # A reduced decoding that reduces no image of the folder is the exact one: not timed again.
  same = [
      mode for mode, source in modes.items() if source.view_size is not None and not reduces(source)
  ]
  timed = {mode: source for mode, source in modes.items() if mode not in same}
  return modes, same, timed


def _folder_measurements(root: str, modes: dict, same: list[str], compare_images: int) -> dict:
  """The measurements of the folder itself; returns a dict: folder (root, images, mean_kb,
  min_kb, max_kb), decode_ms and view_difference (per reduced mode) over `compare_images`
  evenly spaced images, and same_as_exact (`same`)."""
  files = modes["exact"].files
  sizes_kb = [os.path.getsize(f) / 1024 for f in files]
  compare = list(range(0, len(files), max(1, len(files) // compare_images)))[:compare_images]
  return {
      "folder": {
          "root": root,
          "images": len(files),
          "mean_kb": round(float(np.mean(sizes_kb)), 1),
          "min_kb": round(float(np.min(sizes_kb)), 1),
          "max_kb": round(float(np.max(sizes_kb)), 1),
      },
      "decode_ms": decode_ms([files[i] for i in compare]),
      "view_difference": {
          mode: view_difference(modes["exact"], source, compare)
          for mode, source in modes.items()
          if source.view_size is not None
      },
      "same_as_exact": same,
  }


def _pipeline_rows(config, timed: dict, workers: list[int] | None, images: int) -> list[dict]:
  """The pipeline alone: returns a pipeline_rate row, with its decode, per decoding of `timed`
  and count of `workers` (default worker_counts), each over at least `images` images."""
  batches = max(3, math.ceil(images / config.optim.batch_size))
  counts = worker_counts(config) if workers is None else workers
  return [
      {
          "decode": mode,
          **pipeline_rate(source, decoder_config(config, mode), w, batches),
      }
      for mode, source in timed.items()
      for w in counts
  ]


def _held_batches(config, source) -> list[dict]:
  """Returns the first two batches of the pipeline over `source` (0 workers), to hold in
  memory."""
  it = pipeline.make_iterator(train.pretrain_data(config, source), 0)
  try:
    return [next(it), next(it)]
  finally:
    it.close()


def _compile_s(loop: Loop, held: list[dict]) -> float:
  """Runs the loop's first step (which compiles it) on held[0]; returns its seconds, rounded
  to 0.1."""
  start = time.perf_counter()
  loop.state, _ = loop.step(loop.state, parallel.global_batch(held[0], loop.mesh))
  jax.block_until_ready(loop.state)
  return round(time.perf_counter() - start, 1)


def _loop_rows(
    loop: Loop, timed: dict, held: list[dict], steps: int, warmup: int, workers: list[int] | None
) -> tuple[list[dict], list[dict]]:
  """The loop on JPEGs beside the loop on `held` in memory; returns (memory, rows).

  memory: loop_rate rows of the in-memory loop, one before the JPEG loops and one after each.
  rows: a loop_rate row per decoding of `timed` and count of `workers` (default 0 and the CPU
  count), with its decode, workers, memory_img_per_s (the mean img/s of the in-memory runs
  just before and just after it) and ratio (its img/s / memory_img_per_s).
  """
  # The in-memory loop runs before the first JPEG loop and after each one; each JPEG loop is
  # compared with the two runs beside it, so that other work slowing the machine for a while
  # (which the spread of the in-memory runs shows) weighs on both sides of its ratio.
  memory = [loop_rate(loop, _cycle(held), steps, warmup)]
  cpus = os.cpu_count() or 1
  rows = []
  for mode, source in timed.items():
    for w in sorted({0, cpus}) if workers is None else workers:
      config = decoder_config(loop.config, mode)
      to_devices = train.input_to_devices(config, loop.mesh)
      it = pipeline.make_iterator(train.pretrain_data(config, source), w)
      try:
        rate = loop_rate(loop, it, steps, max(warmup, w + 1), to_devices)
        row = {"decode": mode, "workers": w, **rate}
      finally:
        it.close()
      memory.append(loop_rate(loop, _cycle(held), steps, warmup))
      beside = (memory[-2]["img_per_s"] + memory[-1]["img_per_s"]) / 2
      row["memory_img_per_s"] = round(beside, 1)
      row["ratio"] = round(row["img_per_s"] / beside, 3)
      rows.append(row)
  return memory, rows


def _setup(config, mesh, load: float) -> str:
  """Returns the measured setup in words: method, network, views, dtype, batch, NS, devices,
  CPUs and the load average `load` at the start."""
  scale = tuple(config.data.crop_scale)
  cpus = os.cpu_count() or 1
  return (
      f"{config.method}: {config.model.depth}-layer ResNet, {config.data.image_size} px views "
      f"(crop scale {scale[0]:g}-{scale[1]:g}), {config.model.dtype}, global batch "
      f"{config.optim.batch_size}, NS {'on' if config.nonsemantic.enabled else 'off'}; "
      f"{mesh.devices.size} {jax.devices()[0].device_kind} device(s), {cpus} CPUs (load "
      f"average {load:.1f} at the start)"
  )


def measure(
    config,
    root: str,
    *,
    steps: int,
    warmup: int,
    pipeline_workers: list[int] | None = None,
    loop_workers: list[int] | None = None,
    pipeline_images: int = 768,
    compare_images: int = 32,
    mesh=None,
) -> dict:
  """Every measurement of this module on the JPEG folder `root` (make_jpeg_folder's layout).

  Returns a dict: setup (words); device_kind; folder (images, KB); decode_ms (decode_ms of
  compare_images files); view_difference (per reduced mode, view_difference over compare_images
  images); same_as_exact (the reduced modes that reduce no image of the folder, which are not
  timed); pipeline (a pipeline_rate row, with its decode, per timed mode and count of
  pipeline_workers, default worker_counts; at least pipeline_images images timed; for "gpu" the
  host's part: reading the bytes and drawing the crops); decoder_difference (per timed "fast"
  and "gpu": decoder_difference); device_decode (where "gpu" is timed:
  device_decode_rate over `steps` batches); compile_s;
  global_batch; memory (loop_rate rows of the loop on two batches held in memory: one before the
  JPEG loops and one after each); loop (a loop_rate row per timed mode and count of loop_workers,
  default 0 and the CPU count, with its decode, memory_img_per_s (the mean img/s of the in-memory
  runs just before and just after it) and ratio = its img/s / memory_img_per_s). The loop runs on
  `mesh` (default: all devices, as train.pretrain's).
  """
  load = os.getloadavg()[0]
  modes, same, timed = _decodings(config, root)
  out = _folder_measurements(root, modes, same, compare_images)
  out["pipeline"] = _pipeline_rows(config, timed, pipeline_workers, pipeline_images)
  mesh = parallel.make_mesh() if mesh is None else mesh
  out["decoder_difference"] = {
      mode: decoder_difference(config, modes["exact"], source, mode, mesh)
      for mode, source in timed.items()
      if mode in ("fast", "gpu")
  }
  if "gpu" in timed:
    out["device_decode"] = device_decode_rate(config, timed["gpu"], mesh, steps)
  loop = make_loop(config, len(modes["exact"].files), mesh)
  held = _held_batches(config, modes["exact"])
  out["compile_s"] = _compile_s(loop, held)
  out["global_batch"] = config.optim.batch_size
  out["memory"], out["loop"] = _loop_rows(loop, timed, held, steps, warmup, loop_workers)
  out["setup"] = _setup(config, mesh, load)
  out["device_kind"] = jax.devices()[0].device_kind
  return out


def _memory_rate(out: dict) -> float:
  """The in-memory loop's img/s: the median of its runs."""
  return float(np.median([r["img_per_s"] for r in out["memory"]]))


def feeding(out: dict) -> list[dict]:
  """Per decoding, what feeding the in-memory loop takes: rows {"decode", "img_per_s_per_core"
  (the pipeline's rate with one decoding process, 0 or 1 workers, the better; for gpu the
  host's part), "cores_to_feed"
  (the in-memory loop's img/s over it), and for gpu "img_per_s_per_device" (the device side
  alone)}."""
  memory = _memory_rate(out)
  rows = []
  for mode in dict.fromkeys(r["decode"] for r in out["pipeline"]):
    one = [r for r in out["pipeline"] if r["decode"] == mode and r["workers"] <= 1]
    per_core = max(r["img_per_s"] for r in one)
    row = {
        "decode": mode,
        "img_per_s_per_core": per_core,
        "cores_to_feed": round(memory / per_core, 2),
    }
    if mode == "gpu" and "device_decode" in out:
      row["img_per_s_per_device"] = out["device_decode"]["img_per_s_per_device"]
    rows.append(row)
  return rows


def verdict(out: dict) -> str:
  """The fastest loop of a faithful decoding (exact or reduced) and, where it falls short of
  the in-memory loop, by how much and what would close the gap."""
  faithful = [r for r in out["loop"] if r["decode"] in FAITHFUL]
  best = max(faithful, key=lambda r: r["ratio"])
  memory = best["memory_img_per_s"]
  line = (
      f"fastest faithful: {best['decode']} decoding, {best['workers']} workers, "
      f"{best['img_per_s']:.1f} img/s = {best['ratio']:.3f} x the in-memory loop beside it"
  )
  if best["ratio"] >= 0.95:
    return line + ": the pipeline keeps up with the step"
  alone = [r for r in out["pipeline"] if r["decode"] == best["decode"]]
  per_process = max(r["img_per_s_per_worker"] for r in alone)
  fastest = max(r["img_per_s"] for r in alone)
  serial = 1 / (1 / memory + 1 / fastest)
  return line + (
      f", {memory - best['img_per_s']:.1f} img/s short of {memory:.1f}. At {per_process:.1f} "
      f"img/s per decoding process, feeding the step takes {memory / per_process:.2f} cores "
      f"that the step does not use; where the step keeps every core busy, the pipeline's time "
      f"adds to the step's: 1 / (1/{memory:.1f} + 1/{fastest:.1f}) = {serial:.1f} img/s"
  )


def table(out: dict) -> str:
  """The measurements as text: folder, decode and view-difference lines, the pipeline's and
  the loop's tables, the ratio's definition and the verdict."""
  folder = out["folder"]
  lines = [
      out["setup"],
      f"JPEG folder: {folder['images']} images, {folder['mean_kb']:.0f} KB mean "
      f"({folder['min_kb']:.0f}-{folder['max_kb']:.0f}), {folder['root']}",
      "decode ms/image (PIL; DCT-domain reduction 1/k): "
      + ", ".join(f"1/{k} {ms:.2f}" for k, ms in out["decode_ms"].items()),
  ]
  for mode, v in out["view_difference"].items():
    shift = "n/a" if v["shift_1px"] is None else f"{v['shift_1px']:.2f}"
    lines.append(
        f"{mode} (margin {DECODES[mode]:g}): mean reduction {v['mean_reduction']:.2f}; views "
        f"differ from exact decoding's by {v['mean_abs']:.2f} grey levels (mean absolute; "
        f"moving the crop by 1 source pixel: {shift})"
    )
  for mode in out["same_as_exact"]:
    lines.append(f"{mode}: reduces no image at this view size and crop scale, the same as exact")
  for mode, v in out.get("decoder_difference", {}).items():
    lines.append(
        f"{mode}: views differ from the default (PIL) path's by {v['mean_abs']:.3f} grey levels "
        f"(mean absolute, the same crops), by more than 1 in {100 * v['above_1']:.2f}% of pixels"
    )
  lines += [
      "",
      "input pipeline alone",
      f"{'decode':<12} {'workers':>7} {'img/s':>9} {'img/s/worker':>13} {'start-up s':>11}",
  ]
  for r in out["pipeline"]:
    lines.append(
        f"{r['decode']:<12} {r['workers']:>7} {r['img_per_s']:>9.1f} "
        f"{r['img_per_s_per_worker']:>13.1f} {r['startup_s']:>11.2f}"
    )
  if "device_decode" in out:
    d = out["device_decode"]
    lines.append(
        f"gpu decoding on the devices alone (crops decoded, resampled): {d['img_per_s']:.1f} "
        f"img/s, {d['img_per_s_per_device']:.1f} per device, {d['ms_per_batch']:.2f} ms per batch"
    )
  runs = [r["img_per_s"] for r in out["memory"]]
  memory = _memory_rate(out)
  lines += [
      "",
      f"training loop (compile {out['compile_s']:.1f} s)",
      f"{'input':<17} {'workers':>7} {'step ms':>9} {'img/s':>9} {'in-memory img/s':>16} "
      f"{'ratio':>7}",
      f"{'in memory':<17} {'':>7} {1e3 * out['global_batch'] / memory:>9.1f} {memory:>9.1f} "
      f"{'':>16} {'':>7}",
  ]
  for r in out["loop"]:
    lines.append(
        f"{'jpeg ' + r['decode']:<17} {r['workers']:>7} {r['step_ms']:>9.1f} "
        f"{r['img_per_s']:>9.1f} {r['memory_img_per_s']:>16.1f} {r['ratio']:>7.3f}"
    )
  lines.append(
      f"in-memory loop: median of {len(runs)} runs, one before the JPEG loops and one after "
      f"each, {min(runs):.1f}-{max(runs):.1f} img/s"
  )
  if max(runs) - min(runs) > 0.1 * memory:
    lines.append(
        "note: the in-memory runs spread by more than 10%: other work competed for the cores; "
        "each ratio compares a JPEG loop with the in-memory runs just before and after it"
    )
  lines += [
      "ratio = JPEG loop img/s / in-memory loop img/s (the mean of the runs beside it)",
      "",
      f"feeding the in-memory loop's {memory:.1f} img/s",
      f"{'decode':<12} {'img/s per host core':>20} {'host cores':>11} {'img/s per device':>17}",
  ]
  for r in feeding(out):
    device = f"{r['img_per_s_per_device']:.1f}" if "img_per_s_per_device" in r else ""
    lines.append(
        f"{r['decode']:<12} {r['img_per_s_per_core']:>20.1f} {r['cores_to_feed']:>11.2f} "
        f"{device:>17}"
    )
  lines.append(verdict(out))
  return "\n".join(lines)


def run(
    config,
    *,
    jpeg_dir: str = "",
    jpeg_images: int = 512,
    steps: int = 10,
    warmup: int = 2,
    as_json: bool = False,
    **kwargs,
) -> dict:
  """The --input=jpeg command: makes (or reuses) the folder, measures (kwargs go to
  `measure`), prints the tables (or one JSON object with as_json) and returns the
  measurements."""
  root = jpeg_dir or default_root(jpeg_images, seed=0)
  start = time.perf_counter()
  make_jpeg_folder(root, jpeg_images, seed=0)
  made_s = time.perf_counter() - start
  out = measure(config, root, steps=steps, warmup=warmup, **kwargs)
  out["folder"]["ready_s"] = round(made_s, 1)
  print(json.dumps(out) if as_json else table(out), flush=True)
  return out
