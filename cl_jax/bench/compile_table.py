"""Every preset compiled ahead of time for every chip family: the table of docs/benchmarks.md.

python -m cl_jax.bench.compile_table --out=results/compile [--configs=A --configs=B]
    [--targets=X,Y] [--render_only]

Each cell (a config with its preset, a target) runs `python -m cl_jax.bench.compile
--config=CONFIG --target=TARGET --max_batch --json` in its own process: the step compiled at
the preset's batch per chip and at twice it, and at the largest per-chip batch their linear
fit allows (cl_jax.bench.compile.max_batch). The compilers come from requirements-compile.txt,
named in PYTHONPATH (docs/benchmarks.md). A cell's record, written to OUT/<cell>.json as soon as
it ends, holds the commit (`git describe --always`, "-dirty" for changed code outside
results/), the processor that compiled it, the command, its wall time and the compile's JSON,
or the last line of its error. Every config is loaded before anything compiles (a config file
or preset that does not exist is a one-line error naming it). A cell whose record of the same
config and target exists is kept, failed or not, so a stopped queue resumes where it stopped; a
record of another spelling with the same file stem (`dicr.py:simclr_cifar10` for
`dicr.py:simclr,cifar10`) is compiled again and replaced. Then OUT/table.md
is written from every record in OUT (docs/benchmarks.md includes it): per cell, whether it
compiles (a TPU compiler refuses a program larger than the chip's HBM: "no: out of HBM"), the
peak memory per chip at the preset's batch against the chip's, the largest per-chip batch that
fits (its compile's peak), the collectives of one step with their bytes per chip (any not needed
by data parallelism counted as unexpected), and FLOPs per image, compiled and analytic; the last
two at the preset's batch, or at the largest batch that fits where the preset's does not. Where
the largest batch costs more FLOPs per image than the preset's, relative to the analytic count
(over 1%: a TPU compiler recomputes activations to fit its HBM), its cell says how many; and
the commit that compiled it (the table keeps cells from several commits).
"""

import json
import os
import platform
import subprocess
import sys
import time

from absl import app, flags

from cl_jax.bench import report as bench_report
from cl_jax.runtime import cli, config_files, metrics
from cl_jax.runtime.errors import UsageError

# The presets of every method (configs/*.py) and the quick default, the acceptance cells first.
CONFIGS = (
    "configs/mocov2_patchns.py:imagenet100",
    "configs/mocov2_patchns.py",
    "configs/mocov2_patchns.py:cifar10",
    "configs/mocov2_patchns.py:stl10",
    "configs/mocov1.py:imagenet100",
    "configs/mocov2.py:imagenet100",
    "configs/simclr.py:imagenet100",
    "configs/byol.py:imagenet100",
    "configs/simsiam.py:imagenet100",
    "configs/barlow_twins.py:imagenet100",
    "configs/mocov2_patchns_ft_ifm.py:imagenet100",
    "configs/mocov2_texturens.py:imagenet100",
    "configs/looc.py:imagenet100",
    "configs/loocpp.py:imagenet100",
    "configs/dicr.py:simclr,cifar10",  # DICR's presets are its paper's datasets (Sec. 4.1)
)
# One slice of each family (four chips; eight H100s on one host).
TARGETS = ("v5e:2x2", "h100:8", "v4:2x2x1", "v5p:2x2x1", "v6e:2x2")
GIB = 2**30


def cell_name(config: str, target: str) -> str:
  """The record's file stem: configs/mocov2.py:imagenet100 on v5e:2x2 ->
  mocov2-imagenet100-v5e_2x2 (configs/dicr.py:simclr,cifar10 -> dicr-simclr_cifar10-...)."""
  name, _, preset = config.replace(",", "_").partition(":")
  stem = os.path.splitext(os.path.basename(name))[0]
  return "-".join(p for p in (stem, preset or "quick", target.replace(":", "_")) if p)


def cell_command(config: str, target: str) -> list[str]:
  """The compile command of one cell."""
  return [
      sys.executable,
      "-m",
      "cl_jax.bench.compile",
      f"--config={config}",
      f"--target={target}",
      "--max_batch",
      "--json",
  ]


def check_config(config: str) -> None:
  """UsageError, in one line, unless `config` (PATH[:preset]) names a config file that builds
  with that preset."""
  path, _, preset = cli.resolve_config_path(config).partition(":")
  module = config_files.load_config_file(path)
  try:
    module.get_config(preset) if preset else module.get_config()
  except (ValueError, KeyError, TypeError) as e:
    raise UsageError(f"--configs={config}: {e}") from e


def _kept(path: str, config: str, target: str) -> bool:
  """Whether OUT's record at `path` is this cell's (same config and target), so it is kept."""
  if not os.path.exists(path):
    return False
  with open(path) as f:
    record = json.load(f)
  if (record.get("config"), record.get("target")) == (config, target):
    return True
  print(f"{os.path.basename(path)}: replacing the record of {record.get('config')}", flush=True)
  return False


def _commit() -> str:
  """The checkout's commit, "-dirty" when a tracked file outside results/ differs from it (the
  queue's own records and table there do not change the compiled code)."""
  describe = subprocess.run(
      ["git", "describe", "--always"], capture_output=True, text=True, check=False
  ).stdout.strip()
  changed = subprocess.run(
      ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
      capture_output=True,
      text=True,
      check=False,
  ).stdout.strip()
  return (describe or "unknown") + ("-dirty" if describe and changed else "")


def _processor() -> str:
  """The CPU's model name with its family and model numbers (one name covers several
  generations) and core count, e.g. "AMD EPYC (family 26 model 2), 2 cores"."""
  fields = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  name = fields.get("model name") or platform.processor() or platform.machine()
  if "cpu family" in fields and "model" in fields:
    name += f" (family {fields['cpu family']} model {fields['model']})"
  return f"{name}, {os.cpu_count()} cores"


def run_cell(config: str, target: str) -> dict:
  """Compile one cell in its own process: its record (module docstring)."""
  command = cell_command(config, target)
  start = time.perf_counter()
  output = bench_report.run_part(command)
  record = {
      "config": config,
      "target": target,
      "commit": _commit(),
      "processor": _processor(),
      "command": " ".join(["python"] + command[1:]),
      "wall_s": round(time.perf_counter() - start, 1),
  }
  if "failed" in output:
    record["failed"] = output["failed"]
  else:
    record["result"] = output
  return record


def _over_count(analysis: dict) -> float:
  """Compiled FLOPs per image over the analytic count (the compiled FLOPs without a count)."""
  return analysis["flops_per_image"] / (analysis["analytic_flops_per_image"] or 1.0)


def row(record: dict) -> str:
  """One cell's row of the table (module docstring)."""
  cells = [f"`{record['config'].removeprefix('configs/')}`", record["target"]]
  commit = f"`{record['commit']}`" if record.get("commit") else ""
  if "failed" in record:
    return "| " + " | ".join(cells + [f"no: {record['failed']}"] + [""] * 5 + [commit]) + " |"
  result = record["result"]
  first, checked, fit = result["first"], result["checked"], result["fit"] or {}
  m = first["memory"]
  if m is None:  # the TPU compiler refused it: out of HBM
    fits = "no: out of HBM"
    peak = f"over {first['hbm_bytes'] / GIB:.1f} (batch {first['batch_per_chip']})"
  else:
    fits = "yes" if first["fits"] else "compiles, does not fit"
    peak = (
        f"{m['peak'] / GIB:.2f} of {first['hbm_bytes'] / GIB:.1f} "
        f"(batch {first['batch_per_chip']})"
    )
  largest = (
      f"{checked['batch_per_chip']} ({checked['memory']['peak'] / GIB:.1f} GiB, "
      f"{'fits' if checked['fits'] else 'does not fit'})"
      if checked
      else "none"
  )
  if fit.get("refits"):
    largest += f"; {fit['refits']} refits"
  elif fit.get("batch") and fit["batch"] != fit["config_batch"]:
    largest += f"; memory alone {fit['batch']}"
  # Communication and FLOPs at the preset's batch, or at the largest that fits where the
  # preset's does not compile.
  if m is None and checked is None:
    return "| " + " | ".join(cells + [fits, peak, largest, "", "", "", commit]) + " |"
  shown = first if m is not None else checked
  # A TPU compiler near the HBM limit recomputes activations rather than keep them: the largest
  # batch then costs more FLOPs per image than the preset's, over the analytic count (which
  # follows a batch contrast's growth with the batch).
  if checked is not shown and _over_count(checked) > 1.01 * _over_count(shown):
    largest += f"; {checked['flops_per_image'] / 1e9:.1f} GFLOP per image (recomputed to fit)"
  comms = shown["collectives"]
  count = sum(c["count"] for c in comms)
  megabytes = sum(c["bytes"] for c in comms) / 1e6
  unexpected = sum(c["count"] for c in comms if c["purpose"] == "unexpected")
  analytic = shown["analytic_flops_per_image"]
  gflops = f"{shown['flops_per_image'] / 1e9:.1f}" + (
      f" ({analytic / 1e9:.1f})" if analytic else " (no count)"
  )
  return (
      "| "
      + " | ".join(
          cells
          + [
              fits,
              peak,
              largest,
              f"{count}, {megabytes:.1f} MB"
              + ("" if shown is first else f" (batch {shown['batch_per_chip']})"),
              str(unexpected),
              gflops,
              commit,
          ]
      )
      + " |"
  )


def render(records: list[dict]) -> str:
  """table.md: the cells in the order of CONFIGS and TARGETS (others after), with the
  commits and processors that compiled them."""
  order = {(c, t): i for i, (c, t) in enumerate((c, t) for c in CONFIGS for t in TARGETS)}
  records = sorted(
      records, key=lambda r: (order.get((r["config"], r["target"]), len(order)), r["target"])
  )
  commits = sorted({r["commit"] for r in records})
  processors = sorted({r["processor"] for r in records})
  lines = [
      "| config | target | compiles | peak GiB per chip of HBM (preset's batch per chip) "
      "| largest batch per chip the config accepts (its peak) "
      "| collectives per step (bytes per chip) | unexpected | GFLOP per image (analytic) "
      "| commit |",
      "|---|---|---|---|---|---|---:|---|---|",
  ]
  lines += [row(r) for r in records]
  lines += [
      "",
      f"Compiled ahead of time with `python -m cl_jax.bench.compile_table` at commit "
      f"{', '.join(f'`{c}`' for c in commits) or '(none)'} on {'; '.join(processors) or '(none)'}"
      "; one record per cell in `results/compile/`.",
  ]
  return "\n".join(lines) + "\n"


def read_records(out: str) -> list[dict]:
  """Every cell record in `out`."""
  records = []
  for name in sorted(os.listdir(out)):
    if name.endswith(".json"):
      with open(os.path.join(out, name)) as f:
        records.append(json.load(f))
  return records


def _chosen(values: list[str] | None, default: tuple) -> tuple:
  """The names a flag gives, or the default."""
  return tuple(v.strip() for v in values or () if v.strip()) or default


def _define_flags():
  flags.DEFINE_string("out", "results/compile", "Folder of the cell records and table.md.")
  flags.DEFINE_multi_string(
      "configs", None, "A config with its preset, one per flag (default: CONFIGS)."
  )
  flags.DEFINE_list("targets", None, "Comma-separated targets (default: TARGETS).")
  flags.DEFINE_bool("render_only", False, "Write table.md from the records; compile nothing.")


def main(argv):
  del argv
  f = flags.FLAGS
  with cli.report():
    if f.render_only and not os.path.isdir(f.out):
      raise UsageError(f"--out={f.out} is not a folder of cell records")
    os.makedirs(f.out, exist_ok=True)
    if not f.render_only:
      configs = _chosen(f.configs, CONFIGS)
      for config in configs:
        check_config(config)
      for config in configs:
        for target in _chosen(f.targets, TARGETS):
          path = os.path.join(f.out, f"{cell_name(config, target)}.json")
          if _kept(path, config, target):
            continue
          record = run_cell(config, target)
          metrics.write_atomically(path, json.dumps(record, indent=1) + "\n")
          print(f"{cell_name(config, target)}: {record.get('failed', 'compiled')}", flush=True)
    metrics.write_atomically(os.path.join(f.out, "table.md"), render(read_records(f.out)))


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
