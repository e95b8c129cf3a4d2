"""Every speed number of one device in one command: the step, the PyTorch ratio, JPEGs, a profile.

python -m cl_jax.bench.report --out=DIR --config=configs/mocov2.py:imagenet100 \
    --config.optim.lr_recipe=custom --config.optim.batch_size=256 [--steps=20]

runs, each in its own process, on this machine's first device:
  1. step: `cl_jax.bench.step --devices=1 --profile=DIR/profile`: step time, img/s, GFLOP per
     image, TFLOP/s, MFU, peak memory, compile time, and where the step's time goes
     (cl_jax.bench.profile);
  2. torch: `cl_jax.bench.step --compare=torch`: the PyTorch reference of the same MoCo step,
     eager and compiled (cl_jax.bench.torch_reference; needs torch and torchvision), and the ratios;
  3. jpeg: `cl_jax.bench.step --input=jpeg`: the loop on generated ImageNet-size JPEGs beside the
     loop on batches in memory (cl_jax.bench.input);
  4. memory: `cl_jax.bench.memory`: the online backward's saved residuals per image by dtype
     and op, the compiled step's memory analysis, and the largest batch that fits 80 GiB;
  5. efficiency: `cl_jax.bench.efficiency`: the step's time over a plain supervised step of the
     same backbone, timed alternately, beside the ratio of their FLOPs;
  6. compile (only when named in --parts): `cl_jax.bench.compile --target=h100:1`: the same
     step compiled ahead of time for one H100 (JAX's CUDA plugin, there on a GPU machine), its
     predicted memory beside what the step and memory parts measured on this device;
and writes DIR/<part>.json (each command's JSON output), DIR/report.md (the tables below,
with the device's name) and prints the report. --config* flags go to every part unchanged;
--parts picks some of them. A part that fails is reported with its error and the others
still run; the exit status is then 1. --deadline_s bounds the whole report: a part still
running at the deadline is stopped and reported as failed, and later parts are not started.
"""

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from cl_jax.bench import input as bench_input
from cl_jax.bench import profile as step_profile
from cl_jax.runtime import cli

PARTS = ("step", "torch", "jpeg", "memory", "efficiency", "compile")
DEFAULT_PARTS = PARTS[:5]
# MoCo-v2 ResNet-50 224 px bf16 on one H100: the speed target in img/s, and the factor over
# the PyTorch step on the same device.
TARGET_IMG_PER_S = 3900
TARGET_TORCH_RATIO = 2.0

def part_command(part: str, out: str, config_args: list[str], steps: int, warmup: int,
                 jpeg_images: int, jpeg_pipeline_images: int) -> list[str]:  # fmt: skip
  """The command line of one part (cl_jax.bench.step, memory or efficiency)."""
  if part == "memory":
    return [sys.executable, "-m", "cl_jax.bench.memory", *config_args, "--json"]
  if part == "compile":
    return [sys.executable, "-m", "cl_jax.bench.compile", *config_args, "--target=h100:1",
            "--json"]  # fmt: skip
  if part == "efficiency":
    rounds = max(3, steps // 4)
    return [sys.executable, "-m", "cl_jax.bench.efficiency", *config_args, "--json",
            f"--rounds={rounds}", f"--steps={max(1, steps // rounds)}"]  # fmt: skip
  command = [sys.executable, "-m", "cl_jax.bench.step", *config_args, "--json"]
  command += [f"--steps={steps}", f"--warmup={warmup}"]
  if part == "step":
    return command + ["--devices=1", f"--profile={os.path.join(out, 'profile')}"]
  if part == "torch":
    return command + ["--compare=torch"]
  if part == "jpeg":
    return command + ["--input=jpeg", f"--jpeg_images={jpeg_images}",
                      f"--jpeg_pipeline_images={jpeg_pipeline_images}"]  # fmt: skip
  raise ValueError(f"part must be one of {', '.join(PARTS)}; got {part!r}")


def run_part(command: list[str], timeout_s: float | None = None) -> dict:
  """The JSON object a bench command prints last, or {"failed": its last error line, or that
  it ran out of its timeout_s}."""
  try:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired:
    return {"failed": f"stopped at the report's deadline, after {timeout_s:.0f} s"}
  objects = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode or not objects:
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return {"failed": (lines[-1] if lines else f"exit status {proc.returncode}")[:500]}
  return json.loads(objects[-1])


def step_section(result: dict) -> list[str]:
  """The step's table and its profile."""
  if "failed" in result:
    return ["### Step", "", f"failed: {result['failed']}", ""]
  row = result["rows"][0]
  peak = row.get("peak_mb_per_device")
  mfu = "n/a" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
  peak_gib = "n/a" if peak is None else f"{peak / 1024:.2f}"
  lines = [
      "### Step",
      "",
      result["setup"],
      "",
      "| img/s | step ms | GFLOP/img | TFLOP/s | MFU | peak memory GiB | compile s |",
      "|---:|---:|---:|---:|---:|---:|---:|",
      f"| {row['img_per_s']:.1f} | {row['step_ms']:.2f} | {row['gflop_per_image']:.4g} | "
      f"{row['tflops_per_device']:.4g} | {mfu} | {peak_gib} | {row['compile_s']:.1f} |",
      "",
  ]
  profile = row.get("profile")
  if profile:
    total = profile["op_ms_per_step"] or 1.0
    lines += [f"Where the step's time goes (op time {total:.2f} ms per step):", ""]
    lines += ["| phase | ms/step | share |", "|---|---:|---:|"]
    for name, ms in sorted(profile["by_phase"].items(), key=lambda item: -item[1]):
      lines.append(f"| {name} | {ms:.2f} | {100 * ms / total:.1f}% |")
    lines += ["", "| op kind | ms/step | share | GB/step | GB/s |", "|---|---:|---:|---:|---:|"]
    for name, ms, share, gb, rate in step_profile.kind_rows(profile):
      lines.append(f"| {name} | {ms:.2f} | {share:.1f}% | {gb} | {rate} |")
    lines.append("")
  return lines


def torch_section(result: dict) -> list[str]:
  """JAX beside the PyTorch reference, eager and compiled."""
  if "failed" in result:
    return ["### PyTorch reference", "", f"failed: {result['failed']}", ""]
  compare = result["compare"]
  lines = [
      "### PyTorch reference",
      "",
      result["setup"],
      "",
      "| step | img/s | step ms | compile s | JAX / this |",
      "|---|---:|---:|---:|---:|",
      f"| JAX | {compare['jax']['img_per_s']:.1f} | {compare['jax']['step_ms']:.2f} | "
      f"{compare['jax']['compile_s']:.1f} | |",
  ]
  for mode in ("eager", "compiled"):
    row, ratio = compare[f"torch_{mode}"], compare[f"ratio_{mode}"]
    if "failed" in row:
      lines.append(f"| torch {mode} | failed: {row['failed']} | | | |")
    else:
      lines.append(
          f"| torch {mode} | {row['img_per_s']:.1f} | {row['step_ms']:.2f} | "
          f"{row['compile_s']:.1f} | {ratio:.2f} |"
      )
  return lines + [""]


def jpeg_section(result: dict) -> list[str]:
  """The loop on JPEGs against the loop on batches in memory, the pipeline alone, and
  cl_jax.bench.input's verdict (the fastest faithful decoding: exact or reduced)."""
  if "failed" in result:
    return ["### JPEG end to end", "", f"failed: {result['failed']}", ""]
  lines = [
      "### JPEG end to end",
      "",
      result["setup"],
      "",
      "| decoding | workers | loop img/s | in-memory img/s | ratio |",
      "|---|---:|---:|---:|---:|",
  ]
  for r in result["loop"]:
    lines.append(
        f"| {r['decode']} | {r['workers']} | {r['img_per_s']:.1f} | "
        f"{r['memory_img_per_s']:.1f} | {r['ratio']:.3f} |"
    )
  lines += ["", "| pipeline alone | workers | img/s | img/s per worker |", "|---|---:|---:|---:|"]
  for r in result["pipeline"]:
    lines.append(
        f"| {r['decode']} | {r['workers']} | {r['img_per_s']:.1f} | "
        f"{r['img_per_s_per_worker']:.1f} |"
    )
  lines += [
      "",
      "| feeding the in-memory loop | img/s per host core | host cores | img/s per device |",
      "|---|---:|---:|---:|",
  ]
  for r in bench_input.feeding(result):
    device = f"{r['img_per_s_per_device']:.1f}" if "img_per_s_per_device" in r else ""
    lines.append(
        f"| {r['decode']} | {r['img_per_s_per_core']:.1f} | {r['cores_to_feed']:.2f} | {device} |"
    )
  return lines + ["", bench_input.verdict(result), ""]


def memory_section(result: dict) -> list[str]:
  """The online backward's residuals, the compiled step's buffers, the largest batch."""
  if "failed" in result:
    return ["### Memory", "", f"failed: {result['failed']}", ""]
  res, mem, fit = result["residuals"], result["memory"], result["largest_batch"]
  lines = [
      "### Memory",
      "",
      result["setup"],
      "",
      f"Saved residuals of the online backward: {res['per_image_bytes'] / 1e6:.1f} MB per image "
      f"(+ {res['fixed_bytes'] / 1e6:.1f} MB per step).",
      "",
      "| residuals by | MB per image |",
      "|---|---:|",
  ]
  lines += [f"| {k} | {v / 1e6:.2f} |" for k, v in res["by_dtype"].items()]
  lines += [f"| {k} | {v / 1e6:.2f} |" for k, v in res["by_op"].items() if v >= 5e4]
  lines += [
      "",
      "| argument GiB | output GiB | aliased GiB | temp GiB | peak GiB |",
      "|---:|---:|---:|---:|---:|",
      "| " + " | ".join(f"{mem[k] / 2**30:.3f}" for k in ("argument", "output", "alias",
                                                         "temp", "peak")) + " |",
      "",
      f"Largest batch in {fit['budget_gib']:g} GiB (estimate from the compiled step at batches "
      f"{fit['fitted_batches']} on this device): {fit['batch']}.",
      "",
  ]  # fmt: skip
  return lines


def efficiency_section(result: dict) -> list[str]:
  """The step's time and FLOPs over a plain supervised step's."""
  if "failed" in result:
    return ["### Step efficiency", "", f"failed: {result['failed']}", ""]
  low, high = result["time_ratio_range"]
  return [
      "### Step efficiency",
      "",
      result["setup"],
      "",
      "| step ms | supervised ms | time ratio | FLOP ratio |",
      "|---:|---:|---:|---:|",
      f"| {result['step_ms']:.2f} | {result['supervised_ms']:.2f} | "
      f"{result['time_ratio']:.3f} ({low:.3f}-{high:.3f}) | {result['flop_ratio']:.3f} |",
      "",
  ]


def compile_section(result: dict, results: dict) -> list[str]:
  """The step compiled ahead of time for one H100 beside this device's measured peak (the
  step part) and its own compile's memory analysis (the memory part)."""
  if "failed" in result:
    return ["### Compiled for one H100", "", f"failed: {result['failed']}", ""]
  gib = 2**30
  m = result["memory"]
  lines = [
      "### Compiled for one H100",
      "",
      f"`cl_jax.bench.compile --target=h100:1`: global batch {result['global_batch']}, compiled "
      f"ahead of time in {result['compile_s']:.1f} s; cuDNN's workspace is not included.",
      "",
      "| peak GiB | source |",
      "|---:|---|",
      f"| {m['peak'] / gib:.2f} | compiled for an H100 (arguments {m['argument'] / gib:.2f}, "
      f"temporaries {m['temp'] / gib:.2f}) |",
  ]
  memory = results.get("memory", {})
  if "memory" in memory:
    lines.append(f"| {memory['memory']['peak'] / gib:.2f} | memory part: this device's compile |")
  rows = results.get("step", {}).get("rows", [])
  if rows and rows[0].get("peak_mb_per_device") is not None:
    lines.append(f"| {rows[0]['peak_mb_per_device'] / 1024:.2f} | step part: measured peak |")
  return lines + [""]


def verdict(results: dict) -> list[str]:
  """The speed target against what was measured (on any device; the target is an H100's)."""
  step, torch = results.get("step", {}), results.get("torch", {})
  lines = []
  if "rows" in step:
    img_per_s, device = step["rows"][0]["img_per_s"], step["rows"][0]["device_kind"]
    reached = img_per_s >= TARGET_IMG_PER_S
    judged = (
        f"{'met' if reached else 'not met'} on this device and config"
        if "H100" in device
        else f"{'reached' if reached else 'not reached'} on {device}, which is not an H100: the "
        "target is not judged here"
    )
    lines.append(
        f"- img/s: {img_per_s:.1f} against the target {TARGET_IMG_PER_S} (MoCo-v2 ResNet-50, "
        f"224 px, bf16, one H100): {judged}."
    )
  if "compare" in torch:
    ratios = [
        torch["compare"][f"ratio_{m}"]
        for m in ("eager", "compiled")
        if torch["compare"][f"ratio_{m}"] is not None
    ]
    if ratios:
      met = "met" if min(ratios) >= TARGET_TORCH_RATIO else "not met"
      lines.append(
          f"- JAX / torch (slowest ratio over eager and compiled): {min(ratios):.2f} against "
          f"{TARGET_TORCH_RATIO:g}: {met}."
      )
  return lines


def report(results: dict, device: str) -> str:
  """report.md: the device, then a section per part that ran, then the verdict."""
  sections = {
      "step": step_section,
      "torch": torch_section,
      "jpeg": jpeg_section,
      "memory": memory_section,
      "efficiency": efficiency_section,
  }
  lines = [f"## cl_jax benchmark on {device}", ""]
  for part, result in results.items():
    lines += compile_section(result, results) if part == "compile" else sections[part](result)
  lines += verdict(results)
  return "\n".join(lines) + "\n"


def _device_name(results: dict) -> str:
  for result in results.values():
    for row in result.get("rows", []):
      return row["device_kind"]
  for result in results.values():
    if "device_kind" in result:
      return result["device_kind"]
  return "an unknown device (every part failed)"


def _define_flags():
  """The command's flags (defined only when it runs as a program, so that importing this module
  next to cl_jax.bench.step defines no flag twice)."""
  cli.define_config_flag()
  flags.DEFINE_string("out", None, "Folder for the JSON outputs, the profile and report.md.")
  flags.DEFINE_integer("steps", 20, "Timed steps of each measurement.", lower_bound=1)
  flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.", lower_bound=0)
  flags.DEFINE_list(
      "parts",
      list(DEFAULT_PARTS),
      f"Which of {', '.join(PARTS)} to run (compile only when named).",
  )
  flags.DEFINE_integer(
      "deadline_s",
      0,
      "Seconds for all the parts together (0: no limit): a part still running then is stopped "
      "and reported as failed, and the parts after it are not started.",
      lower_bound=0,
  )
  flags.DEFINE_integer("jpeg_images", 512, "Images in the generated JPEG folder.", lower_bound=1)
  flags.DEFINE_integer(
      "jpeg_pipeline_images", 768, "Images timed per row of the JPEG pipeline.", lower_bound=1
  )
  flags.mark_flags_as_required(["config", "out"])


def main(argv):
  del argv
  f = flags.FLAGS
  unknown = [p for p in f.parts if p not in PARTS]
  if unknown:
    sys.exit(f"error: --parts: {', '.join(unknown)} unknown; choose from {', '.join(PARTS)}")
  f.config  # parsed here, so that a bad config stops before any part runs
  out = os.path.abspath(f.out)
  os.makedirs(out, exist_ok=True)
  config_args = [a for a in sys.argv[1:] if a.startswith("--config")]
  results = {}
  deadline = time.monotonic() + f.deadline_s if f.deadline_s else None
  for part in PARTS:
    if part not in f.parts:
      continue
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
      results[part] = {"failed": f"not started: the report's {f.deadline_s} s were spent"}
    else:
      print(f"running {part} ...", flush=True)
      command = part_command(
          part, out, config_args, f.steps, f.warmup, f.jpeg_images, f.jpeg_pipeline_images
      )
      results[part] = run_part(command, left)
    with open(os.path.join(out, f"{part}.json"), "w") as handle:
      json.dump(results[part], handle, indent=1)
  text = report(results, _device_name(results))
  with open(os.path.join(out, "report.md"), "w") as handle:
    handle.write(text)
  print(text)
  if any("failed" in r for r in results.values()):
    sys.exit(1)


def run() -> None:
  """The command line (python -m cl_jax.bench.report)."""
  _define_flags()
  cli.list_in_help(__name__)
  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
