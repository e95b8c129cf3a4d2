"""The one-command benchmark report: its parts' command lines, its tables and verdict from
hand-made results, and the whole command started on the CPU with a tiny config."""

import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from cl_jax.bench import jpeg_decode
from cl_jax.bench import report as bench_report
from tests import tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEP = {
    "setup": "moco: 50-layer ResNet, 224 px, bfloat16, global batch 256",
    "rows": [
        {
            "device_kind": "NVIDIA H100 80GB HBM3",
            "img_per_s": 4100.0,
            "step_ms": 62.44,
            "gflop_per_image": 32.8,
            "tflops_per_device": 134.5,
            "mfu": 0.136,
            "peak_mb_per_device": 30720.0,
            "compile_s": 41.0,
            "profile": {
                "op_ms_per_step": 60.0,
                "by_phase": {"backward": 30.0, "online forward": 15.0, "target forward": 15.0},
                "by_kind": {"convolution": 45.0, "fusion": 15.0},
            },
        }
    ],
}


def _torch(eager: float | None, compiled: float | None) -> dict:
  rows = {}
  for mode, ratio in (("eager", eager), ("compiled", compiled)):
    rows[f"torch_{mode}"] = (
        {"failed": "ImportError: no torch"}
        if ratio is None
        else {"img_per_s": 4100.0 / ratio, "step_ms": 1.0, "compile_s": 2.0}
    )
    rows[f"ratio_{mode}"] = ratio
  jax_row = {"img_per_s": 4100.0, "step_ms": 62.44, "compile_s": 41.0}
  return {"setup": "the same step", "compare": {"jax": jax_row, **rows}}


def test_part_commands():
  cmd = bench_report.part_command("step", "/o", ["--config=c.py"], 5, 1, 64, 768)
  assert cmd[1:] == [
      "-m",
      "cl_jax.bench.step",
      "--config=c.py",
      "--json",
      "--steps=5",
      "--warmup=1",
      "--devices=1",
      "--profile=/o/profile",
  ]
  assert bench_report.part_command("torch", "/o", [], 5, 1, 64, 768)[-1] == "--compare=torch"
  assert bench_report.part_command("jpeg", "/o", [], 5, 1, 64, 96)[-3:] == [
      "--input=jpeg",
      "--jpeg_images=64",
      "--jpeg_pipeline_images=96",
  ]
  assert bench_report.part_command("memory", "/o", ["--config=c.py"], 5, 1, 64, 768)[1:] == [
      "-m",
      "cl_jax.bench.memory",
      "--config=c.py",
      "--json",
  ]
  # 20 steps: 5 alternating rounds of 4 steps each; fewer steps still give 3 rounds.
  assert bench_report.part_command("efficiency", "/o", [], 20, 1, 64, 768)[-2:] == [
      "--rounds=5",
      "--steps=4",
  ]
  assert bench_report.part_command("efficiency", "/o", [], 1, 1, 64, 768)[-2:] == [
      "--rounds=3",
      "--steps=1",
  ]
  assert bench_report.part_command("compile", "/o", ["--config=c.py"], 5, 1, 64, 768)[1:] == [
      "-m",
      "cl_jax.bench.compile",
      "--config=c.py",
      "--target=h100:1",
      "--json",
  ]
  with pytest.raises(ValueError, match="part must be one of"):
    bench_report.part_command("disk", "/o", [], 5, 1, 64, 768)


MEMORY = {
    "device_kind": "cpu",
    "setup": "moco: 50-layer ResNet, 224 px",
    "residuals": {
        "per_image_bytes": 48.2e6,
        "by_dtype": {"bfloat16": 48.0e6, "float32": 0.2e6},
        "by_op": {"conv_general_dilated bfloat16": 22.2e6, "add float32": 1e3},
        "fixed_bytes": 50e6,
        "argument_bytes": 1e8,
    },
    "memory": {"argument": 2**30, "output": 2**30, "alias": 2**30, "temp": 3 * 2**30,
               "peak": 4 * 2**30},
    "largest_batch": {"batch": 1024, "budget_gib": 80.0, "fitted_batches": [128, 256],
                      "per_image_bytes": 1.0, "fixed_bytes": 1.0},
}  # fmt: skip
EFFICIENCY = {
    "device_kind": "cpu",
    "setup": "moco: 18-layer ResNet",
    "step_ms": 10.0,
    "supervised_ms": 7.5,
    "time_ratio": 1.333,
    "time_ratio_range": [1.3, 1.4],
    "flop_ratio": 1.346,
}


def test_memory_and_efficiency_sections():
  text = bench_report.report({"memory": MEMORY, "efficiency": EFFICIENCY}, "cpu")
  assert "Saved residuals of the online backward: 48.2 MB per image (+ 50.0 MB per step)." in text
  assert "| bfloat16 | 48.00 |" in text and "| conv_general_dilated bfloat16 | 22.20 |" in text
  assert "add float32" not in text  # below 0.05 MB per image
  assert "| 1.000 | 1.000 | 1.000 | 3.000 | 4.000 |" in text
  assert "Largest batch in 80 GiB (estimate from the compiled step at batches [128, 256]" in text
  assert "| 10.00 | 7.50 | 1.333 (1.300-1.400) | 1.346 |" in text
  assert bench_report._device_name({"memory": MEMORY}) == "cpu"


def test_compile_section_stands_beside_the_measured_peaks():
  compiled = {
      "global_batch": 256,
      "compile_s": 61.24,
      "memory": {"argument": 0.25 * 2**30, "temp": 10 * 2**30, "peak": 11.5 * 2**30},
  }
  text = bench_report.report({"step": STEP, "memory": MEMORY, "compile": compiled}, "H100")
  section = text[text.index("### Compiled for one H100") :]
  assert "global batch 256, compiled ahead of time in 61.2 s" in section
  assert "| 11.50 | compiled for an H100 (arguments 0.25, temporaries 10.00) |" in section
  assert "| 4.00 | memory part: this device's compile |" in section
  assert "| 30.00 | step part: measured peak |" in section
  failed = bench_report.report({"compile": {"failed": "error: needs the plugin"}}, "x")
  assert "### Compiled for one H100\n\nfailed: error: needs the plugin" in failed


def test_report_tables_and_verdict():
  text = bench_report.report({"step": STEP, "torch": _torch(2.5, 1.5)}, "NVIDIA H100")
  assert text.startswith("## cl_jax benchmark on NVIDIA H100")
  assert "| 4100.0 | 62.44 | 32.8 | 134.5 | 13.6% | 30.00 | 41.0 |" in text
  assert "| backward | 30.00 | 50.0% |" in text and "| convolution | 45.00 | 75.0% |" in text
  assert "| torch eager | 1640.0 | 1.00 | 2.0 | 2.50 |" in text
  assert "against the target 3900" in text and ": met on this device" in text
  # Another device reaches the number but does not judge the H100's target.
  other = {**STEP, "rows": [{**STEP["rows"][0], "device_kind": "NVIDIA H200"}]}
  assert "reached on NVIDIA H200, which is not an H100: the target is not judged here." in (
      bench_report.report({"step": other}, "NVIDIA H200")
  )
  # The slowest ratio decides: 1.5 < 2.
  assert "(slowest ratio over eager and compiled): 1.50 against 2: not met." in text


def test_report_names_failed_parts():
  text = bench_report.report(
      {"step": {"failed": "OOM"}, "torch": _torch(None, 2.2), "jpeg": {"failed": "no PIL"}}, "x"
  )
  assert "### Step\n\nfailed: OOM" in text
  assert "| torch eager | failed: ImportError: no torch | | | |" in text
  assert "2.20 against 2: met." in text and "### JPEG end to end\n\nfailed: no PIL" in text


def test_the_device_is_named_from_any_part():
  named = bench_report._device_name({"jpeg": {"failed": "x"}, "step": STEP})
  assert named == "NVIDIA H100 80GB HBM3"
  jpeg = {"setup": "moco ...", "device_kind": "NVIDIA H200", "pipeline": []}
  assert bench_report._device_name({"jpeg": jpeg}) == "NVIDIA H200"
  assert bench_report._device_name({"jpeg": {"failed": "x"}}).startswith("an unknown device")


@pytest.mark.slow
def test_the_one_command_runs_every_part_on_cpu(tmp_path):
  env = dict(os.environ)
  env["CL_JAX_CACHE"] = str(tmp_path / "cache")
  out = tmp_path / "report"
  proc = subprocess.run(
      [sys.executable, "-m", "cl_jax.bench.report", f"--out={out}", *tiny_run.BENCH_FLAGS]
      + ["--steps=1", "--warmup=0", "--jpeg_images=24", "--jpeg_pipeline_images=48"],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=1200,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  step = json.loads((out / "step.json").read_text())
  assert step["rows"][0]["img_per_s"] > 0 and step["rows"][0]["profile"]["by_phase"]
  # The jpeg part is `cl_jax.bench.step --input=jpeg --json`: a loop per decode with 0 input
  # workers and with one per CPU (grain worker processes), each with its ratio, on a generated
  # folder of 24 images in 8 classes under $CL_JAX_CACHE (the printed table: test_bench_input).
  jpeg = json.loads((out / "jpeg.json").read_text())
  workers = sorted({0, os.cpu_count() or 1})
  assert [(r["decode"], r["workers"]) for r in jpeg["loop"]] == [
      (d, w) for d in jpeg_decode.decodings() for w in workers
  ]
  assert all(r["ratio"] > 0 for r in jpeg["loop"])
  assert jpeg["folder"]["images"] == 24
  assert jpeg["folder"]["root"].startswith(env["CL_JAX_CACHE"])
  assert len(os.listdir(os.path.join(jpeg["folder"]["root"], "class00"))) == 3
  torch = json.loads((out / "torch.json").read_text())
  assert torch["compare"]["jax"]["img_per_s"] > 0
  text = (out / "report.md").read_text()
  assert text.startswith("## cl_jax benchmark on cpu") and text in proc.stdout
  for section in ("### Step", "### PyTorch reference", "### JPEG end to end", "### Memory",
                  "### Step efficiency"):  # fmt: skip
    assert section in text
  memory = json.loads((out / "memory.json").read_text())
  assert memory["residuals"]["per_image_bytes"] > 0 and memory["largest_batch"]["batch"] > 0
  efficiency = json.loads((out / "efficiency.json").read_text())
  assert efficiency["flop_ratio"] > 1 and efficiency["time_ratio"] > 0
  # Without torch installed the torch rows say why they failed; with it they are timed.
  for mode in ("eager", "compiled"):
    row = torch["compare"][f"torch_{mode}"]
    assert "failed" in row or row["img_per_s"] > 0


def test_a_part_past_the_deadline_is_stopped_and_named():
  took = time.monotonic()
  result = bench_report.run_part([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
  assert time.monotonic() - took < 10
  assert result == {"failed": "stopped at the report's deadline, after 0 s"}


@pytest.mark.slow
def test_the_gpu_script_keeps_its_deadline_and_packs_what_it_has(tmp_path):
  """launch/gpu_report.sh with a 1 s deadline: the step part is stopped, the others are not
  started, each is named in the report, and report.md, environment.txt and bench.tar.gz (the
  parts' JSON) are in OUT; the exit status says a part failed."""
  env = {**os.environ, "CL_JAX_REPORT_DEADLINE_S": "1", "PYTHON": sys.executable}
  proc = subprocess.run(
      ["bash", os.path.join(ROOT, "launch", "gpu_report.sh"), str(tmp_path / "o"),
       *tiny_run.BENCH_FLAGS, "--parts=step,memory"],  # fmt: skip
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 1, proc.stderr[-2000:]
  out = tmp_path / "o"
  text = (out / "report.md").read_text()
  assert "stopped at the report's deadline" in text and "not started" in text
  assert "jax " in (out / "environment.txt").read_text()
  with tarfile.open(out / "bench.tar.gz") as tar:
    assert {"step.json", "memory.json", "report.md"} <= set(tar.getnames())
