"""Train-step benchmark over 1..N devices: step time, img/s, FLOPs and MFU, memory, compile time.

python -m cl_jax.bench.step --config=configs/mocov2_patchns.py[:preset] --devices=1,2,4,8 [--json]

Each device count runs in its own process. On CPU the devices are simulated
(JAX_NUM_CPU_DEVICES), so they share the machine's cores: the numbers show the
cost of the sharded step, not a speed-up. On GPUs and TPUs the first n real
devices are used. The step is the full jitted train step (on-device photometric
augmentation, EMA, key and NS forwards, loss, update, enqueue) on a synthetic
global batch of host-cropped uint8 views with their crop boxes; the host input
pipeline is not timed. The timed step is the lean one that training runs between logging
steps (loss and lr; --logging_step times the step that also computes every logged statistic).
FLOPs come from XLA's cost analysis of the lowered step (step_flops); the MFU divides the
achieved FLOP rate by the device's peak (cl_jax.bench.device_peaks). --profile=DIR traces a few more
steps with jax.profiler and prints where the step's time goes (cl_jax.bench.profile).

--compare=torch times, instead, the JAX step on one device beside the PyTorch reference of
the same MoCo-v2 step (cl_jax.bench.torch_reference, eager and torch.compile; needs torch and
torchvision) on the same device, and prints the ratios JAX img/s / torch img/s.
"""

import json
import os
import subprocess
import sys
import time

import jax
from absl import app, flags

from cl_jax import config_check, train
from cl_jax.bench import device_peaks, flops
from cl_jax.bench import profile as step_profile
from cl_jax.objectives import looc, moco
from cl_jax.runtime import cli

_CONFIG = cli.define_config_flag()
_DEVICES = flags.DEFINE_list("devices", ["1", "2", "4", "8"], "Device counts to measure.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per device count.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.", lower_bound=0)
_CHILD = flags.DEFINE_integer("child", None, "Internal: measure this device count in-process.")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object (setup and rows) and no table.")
_COMPARE = flags.DEFINE_enum(
    "compare",
    None,
    ["torch"],
    "torch: time the JAX step and the PyTorch reference of cl_jax.bench.torch_reference (eager and "
    "compiled) on one device instead of the device counts (--devices is not used).",
)
_LOGGING_STEP = flags.DEFINE_bool(
    "logging_step",
    False,
    "Time the logging step (every statistic: score statistics, health signals, per-layer "
    "gradient norms) instead of the lean step that training runs between logging steps.",
)
_PROFILE = flags.DEFINE_string(
    "profile",
    None,
    "Trace --profile_steps more steps with jax.profiler into DIR/devices_<n> (for TensorBoard's "
    "profile plugin or ui.perfetto.dev) and print where the step's time goes, by phase and by "
    "op kind (cl_jax.bench.profile); the step's optimized HLO goes to "
    "DIR/devices_<n>/step_hlo.txt.",
)
_PROFILE_STEPS = flags.DEFINE_integer(
    "profile_steps", 3, "Steps traced with --profile.", lower_bound=1
)
flags.mark_flag_as_required("config")


def measure(
    config,
    devices: int,
    steps: int,
    warmup: int,
    statistics: bool = False,
    profile_dir: str | None = None,
    profile_steps: int = 3,
) -> dict:
  """Times `steps` train steps of `config` on the first `devices` devices.

  statistics=False times the lean step that training runs between logging steps (loss and
  lr only), True the logging step with every statistic (cl_jax.train_step.make_train_step).
  With profile_dir, `profile_steps` more steps run under the profiler after the timed ones,
  and the row gains "profile", their op time per step by phase and by kind
  (cl_jax.bench.profile.profile_compiled).

  Returns a dict: devices, backend, device_kind, step ("lean" or "logging"), global_batch,
  compile_s, step_ms (mean wall time per step), img_per_s (global batch / step time),
  queue_mb_per_device (bytes of the queue shard on one device / 2^20), queue_mb_total, loss,
  gflop_per_image (step_flops x devices / global batch), tflops_per_device (step_flops / step
  time), mfu (tflops_per_device / the device's peak, cl_jax.bench.device_peaks; None where
  unknown), and peak_mb_per_device where the backend reports it.
  """
  batch = config.optim.batch_size
  step, state, data = train.synthetic_step(config, devices, statistics)

  start = time.perf_counter()
  lowered = step.lower(state, data)
  compiled = step.record(lowered.compile())
  compile_s = time.perf_counter() - start
  state = step.place(state)
  flops_per_device = flops.step_flops(lowered, devices)
  for _ in range(warmup + 1):
    state, metrics = compiled(state, data)
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = compiled(state, data)
  jax.block_until_ready((state, metrics))
  step_s = (time.perf_counter() - start) / steps
  loss = float(metrics["loss"])
  profile = None
  if profile_dir:
    state, profile = step_profile.profile_compiled(
        compiled, state, data, profile_steps, profile_dir
    )

  queue_bytes = 0 if state.queue is None else state.queue.nbytes
  shard_bytes = 0 if state.queue is None else state.queue.addressable_shards[0].data.nbytes
  out = {
      "devices": devices,
      "backend": jax.default_backend(),
      "device_kind": jax.devices()[0].device_kind,
      "step": "logging" if statistics else "lean",
      "global_batch": batch,
      "compile_s": round(compile_s, 2),
      "step_ms": round(1e3 * step_s, 2),
      "img_per_s": round(batch / step_s, 1),
      "queue_mb_per_device": shard_bytes / 2**20,
      "queue_mb_total": queue_bytes / 2**20,
      "loss": loss,
      "gflop_per_image": float(f"{flops_per_device * devices / batch / 1e9:.4g}"),
      "tflops_per_device": float(f"{flops_per_device / step_s / 1e12:.4g}"),
  }
  peak = device_peaks.peak_tflops(out["device_kind"])
  out["mfu"] = None if peak is None else round(out["tflops_per_device"] / peak, 4)
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    out["peak_mb_per_device"] = round(stats["peak_bytes_in_use"] / 2**20, 1)
  if profile is not None:
    out["profile"] = profile
  return out


def _without_device_count(xla_flags: str) -> str:
  """XLA_FLAGS less --xla_force_host_platform_device_count, which would override the child's
  JAX_NUM_CPU_DEVICES; the other flags (optimisation level, dumps) pass through."""
  return " ".join(
      f for f in xla_flags.split() if not f.startswith("--xla_force_host_platform_device_count")
  )


def _child_command(n: int) -> list[str]:
  """This module's command line for device count n (flags passed through)."""
  args = [a for a in sys.argv[1:] if not a.startswith(("--devices", "--child"))]
  return [sys.executable, "-m", "cl_jax.bench.step", *args, f"--child={n}"]


def _table(rows: list[dict]) -> str:
  head = (
      f"{'devices':>7} {'step ms':>9} {'img/s':>9} {'GFLOP/img':>10} {'TFLOP/s/dev':>12} "
      f"{'MFU':>6} {'peak MiB/dev':>13} {'queue MiB/dev':>14} {'compile s':>10}"
  )
  lines = [head]
  for r in rows:
    mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    peak = r.get("peak_mb_per_device")
    lines.append(
        f"{r['devices']:>7} {r['step_ms']:>9.2f} {r['img_per_s']:>9.1f} "
        f"{r['gflop_per_image']:>10.4g} {r['tflops_per_device']:>12.4g} {mfu:>6} "
        f"{'n/a' if peak is None else f'{peak:.0f}':>13} {r['queue_mb_per_device']:>14.3f} "
        f"{r['compile_s']:>10.1f}"
    )
  return "\n".join(lines)


def _run_child(command: list[str], env: dict) -> tuple[dict | None, str]:
  """(the row a child command prints after "RESULT ", or None where it failed; its stderr)."""
  proc = subprocess.run(command, env=env, capture_output=True, text=True)
  results = [line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
  if proc.returncode or not results:
    return None, proc.stderr
  return json.loads(results[0]), proc.stderr


def _setup(config) -> str:
  """The measured step in words: method, network, resolution, dtype, batch, queue, NS."""
  queue = (
      f"queue {config.moco.queue_size} x {config.model.head_out_dim}, "
      if config.method == "moco"
      else "no queue, "
  )
  return (
      f"{config.method}: {config.model.depth}-layer ResNet, {config.data.image_size} px, "
      f"{config.model.dtype}, global batch {config.optim.batch_size}, {queue}"
      f"NS {'on' if config.nonsemantic.enabled else 'off'}"
  )


def _step_words() -> str:
  """Which step is timed, in words."""
  if _LOGGING_STEP.value:
    return "logging step (every statistic)"
  return "lean step (loss and lr; training's step between logging steps)"


# The PyTorch reference is MoCo's step without add-ons or LooC (cl_jax.bench.torch_reference.ADDONS;
# not imported from there, which needs torch): --compare=torch switches them off in both steps.
_TORCH_ADDONS = moco.METHOD.addons + (looc.METHOD.block,)


def _torch_command(compiled: bool) -> list[str]:
  """cl_jax.bench.torch_reference's command line with this run's config flags, --steps and
  --warmup."""
  drop = ("--devices", "--child", "--compare", "--json", "--nojson", "--profile", "--logging_step",
          "--nologging_step")  # fmt: skip
  args = [a for a in sys.argv[1:] if not a.startswith(drop)]
  return [sys.executable, "-m", "cl_jax.bench.torch_reference", *args, f"--compile={compiled}"]


def _failure_reason(stderr: str) -> str:
  """The last non-empty line of a failed child's stderr (its exception), at most 300 chars."""
  lines = [line.strip() for line in stderr.splitlines() if line.strip()]
  return (lines[-1] if lines else "no error output")[:300]


def _ratio(jax_row: dict, torch_row: dict) -> float | None:
  """JAX img/s / torch img/s, None where the torch step failed."""
  if "failed" in torch_row:
    return None
  return round(jax_row["img_per_s"] / torch_row["img_per_s"], 3)


def _compare_table(dtype: str, jax_row: dict, eager: dict, compiled: dict) -> str:
  """The comparison's rows: step time, img/s, compile time, peak memory, JAX / torch."""
  cells = [("jax (jit, 1 device)", jax_row, dtype, jax_row.get("peak_mb_per_device"), None)]
  for row in (eager, compiled):
    cells.append(
        (f"torch {row['mode']}", row, row.get("dtype"), row.get("peak_mb"), _ratio(jax_row, row))
    )
  lines = [
      f"{'step':<34} {'dtype':>8} {'step ms':>9} {'img/s':>9} {'compile s':>10} "
      f"{'peak MiB':>9} {'JAX/this':>9}"
  ]
  for label, row, row_dtype, peak, ratio in cells:
    if "failed" in row:
      lines.append(f"{label:<34} failed: {row['failed']}")
      continue
    lines.append(
        f"{label:<34} {row_dtype:>8} {row['step_ms']:>9.2f} {row['img_per_s']:>9.1f} "
        f"{row['compile_s']:>10.1f} {'n/a' if peak is None else f'{peak:.0f}':>9} "
        f"{'' if ratio is None else f'{ratio:.3f}':>9}"
    )
  return "\n".join(lines)


def torch_comparable(config) -> tuple:
  """(a copy of `config` with the MoCo add-ons that the PyTorch reference lacks switched off,
  their names): the step that --compare=torch times on both sides."""
  addons = [name for name in _TORCH_ADDONS if config[name].enabled]
  reference = config.copy_and_resolve_references()
  for name in addons:
    reference[name].enabled = False
  return reference, addons


def _compare_torch(config) -> None:
  """--compare=torch: the JAX step on one device beside the PyTorch reference of
  cl_jax.bench.torch_reference, eager and compiled, on the same device (CUDA if torch sees one, else
  the CPU), each in its own process; a torch mode that fails (e.g. torch.compile without a C
  compiler) is reported with its reason. The MoCo add-ons the reference lacks are switched
  off in both steps. Prints the rows and the ratios JAX img/s / torch img/s, or with --json
  one object: setup, rows (the JAX row), compare (jax, torch_eager, torch_compiled,
  ratio_eager, ratio_compiled) and switched_off (the add-ons)."""
  if config.method != "moco":
    sys.exit(
        f"error: --compare=torch compares MoCo steps; the config's method is {config.method!r}"
    )
  reference, addons = torch_comparable(config)
  overrides = [f"--config.{name}.enabled=False" for name in addons]
  # The parent leaves JAX's backend alone, so that it holds no accelerator memory.
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1")
  jax_row, stderr = _run_child(_child_command(1) + overrides, env)
  if jax_row is None:
    sys.exit(f"error: the JAX measurement failed:\n{stderr[-3000:]}")
  if not _JSON.value:
    print(json.dumps(jax_row), flush=True)
  torch_rows = []
  for compiled in (False, True):
    row, stderr = _run_child(_torch_command(compiled) + overrides, env)
    if row is None:
      row = {"mode": "compiled" if compiled else "eager", "failed": _failure_reason(stderr)}
    torch_rows.append(row)
    if not _JSON.value:
      print(json.dumps(row), flush=True)
  eager, compiled = torch_rows
  torch_device = next((r["device"] for r in torch_rows if "device" in r), "n/a")
  devices = f"JAX on {jax_row['device_kind']}, torch on {torch_device}"
  off = f"; switched off in both: {', '.join(addons)}" if addons else ""
  setup = (
      f"{_setup(reference)}, JAX {_step_words()}; {devices}{off}; equal work: both steps "
      "augment their uint8 views photometrically with the same ops and parameters"
  )
  ratios = {"ratio_eager": _ratio(jax_row, eager), "ratio_compiled": _ratio(jax_row, compiled)}
  if _JSON.value:
    compare = {"jax": jax_row, "torch_eager": eager, "torch_compiled": compiled, **ratios}
    print(
        json.dumps({"setup": setup, "rows": [jax_row], "compare": compare, "switched_off": addons})
    )
    return
  print(f"\n{setup}")
  print(_compare_table(config.model.dtype, jax_row, eager, compiled))
  words = [
      f"{mode} {'failed' if r is None else f'{r:.3f}'}"
      for mode, r in (("eager", ratios["ratio_eager"]), ("compiled", ratios["ratio_compiled"]))
  ]
  print(f"JAX img/s / torch img/s: {', '.join(words)}")
  print(
      "compile s: JAX's lowering and compilation; torch's first step, compilation included. "
      "Both steps augment their views photometrically (cl_jax.bench.torch_augment)."
  )


def main(argv):
  del argv
  config = _CONFIG.value
  if _CHILD.value is not None:
    profile_dir = None
    if _PROFILE.value:
      profile_dir = os.path.join(os.path.abspath(_PROFILE.value), f"devices_{_CHILD.value}")
    row = measure(
        config,
        _CHILD.value,
        _STEPS.value,
        _WARMUP.value,
        statistics=_LOGGING_STEP.value,
        profile_dir=profile_dir,
        profile_steps=_PROFILE_STEPS.value,
    )
    print("RESULT " + json.dumps(row))
    return
  if _COMPARE.value == "torch":
    _compare_torch(config)
    return
  counts = [int(n) for n in _DEVICES.value]
  with cli.report():  # bad input in one line here, before any child process starts
    for n in counts:
      config_check.validate(config, num_devices=n, reads_data=False)
  backend = jax.default_backend()
  available = jax.device_count()
  rows = []
  for n in counts:
    env = dict(os.environ)
    if backend == "cpu":
      env["JAX_NUM_CPU_DEVICES"] = str(n)
      env["XLA_FLAGS"] = _without_device_count(env.get("XLA_FLAGS", ""))
    elif n > available:
      print(f"skipping {n} devices: only {available} {backend} devices")
      continue
    row, stderr = _run_child(_child_command(n), env)
    if row is None:
      sys.exit(f"error: the {n}-device measurement failed:\n{stderr[-3000:]}")
    rows.append(row)
    if not _JSON.value:
      print(json.dumps(rows[-1]), flush=True)
  kind = rows[0]["device_kind"] if rows else backend
  simulated = " (simulated CPU devices sharing the host's cores)" if backend == "cpu" else ""
  setup = f"{_setup(config)}, {_step_words()}; {kind}{simulated}"
  if _JSON.value:
    print(json.dumps({"setup": setup, "rows": rows}))
    return
  print(f"\n{setup}")
  print(_table(rows))
  for row in rows:
    if "profile" in row:
      print(f"\nprofile, {row['devices']} device(s), trace in {row['profile']['trace']}")
      print(step_profile.format_summary(row["profile"]))


_INPUT = flags.DEFINE_enum(
    "input",
    "synthetic",
    ["synthetic", "jpeg", "folder"],
    "synthetic: time the step on a synthetic batch (above). jpeg: time the training loop end "
    "to end on a generated ImageNet-like JPEG folder (input pipeline alone with 0, 1, 2, ... "
    "workers, exact and reduced-size decoding; loop on JPEGs / loop on batches in memory; "
    "cl_jax.bench.input) on this process's devices (--devices is not used). folder: the input "
    "pipeline alone on the same folder read as data.name=folder reads it and from an "
    "ArrayRecord file of its JPEGs (cl_jax.bench.folder_input).",
)
_JPEG_DIR = flags.DEFINE_string(
    "jpeg_dir",
    "",
    "--input=jpeg or folder: the folder (default: in $CL_JAX_CACHE or ~/.cache/cl_jax).",
)
_JPEG_IMAGES = flags.DEFINE_integer(
    "jpeg_images", 512, "--input=jpeg or folder: images in the generated folder.", lower_bound=1
)
_JPEG_PIPELINE_IMAGES = flags.DEFINE_integer(
    "jpeg_pipeline_images",
    768,
    "--input=jpeg or folder: images timed per row of the input pipeline alone (at least 3 "
    "batches).",
    lower_bound=1,
)


def _main_with_input(argv):
  """main, or with --input=jpeg the JPEG loop benchmark of cl_jax.bench.input, or with
  --input=folder the folder-against-ArrayRecord benchmark of cl_jax.bench.folder_input."""
  if _INPUT.value == "synthetic" or _CHILD.value is not None:
    return main(argv)
  jpegs = {
      "jpeg_dir": _JPEG_DIR.value,
      "jpeg_images": _JPEG_IMAGES.value,
      "pipeline_images": _JPEG_PIPELINE_IMAGES.value,
      "as_json": _JSON.value,
  }
  if _INPUT.value == "folder":
    from cl_jax.bench import folder_input

    with cli.report():
      folder_input.run(_CONFIG.value, **jpegs)
    return None
  from cl_jax.bench import input as bench_input  # only this mode needs it

  with cli.report():
    bench_input.run(_CONFIG.value, steps=_STEPS.value, warmup=_WARMUP.value, **jpegs)


def run() -> None:
  """The command line (python -m cl_jax.bench or cl_jax.bench.step)."""
  cli.list_in_help(__name__)
  app.run(_main_with_input, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
