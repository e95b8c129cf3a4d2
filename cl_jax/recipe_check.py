"""Do the quick recipes learn? Every quick Trifeature default, several seeds, beside random init.

python -m cl_jax.recipe_check [--workdir=runs/recipe_check] [--seeds=3]
    [--only=mocov2_patchns,simclr,...] [--flag=--config.optim.epochs=4 ...]

Run from the repository root. Each config of QUICK_CONFIGS is pretrained with
`python -m cl_jax.main` in its own process (so the wall time is what a user
waits for: start-up, compilation, training and the probe) for seeds 0 .. N-1
in <workdir>/<config>/seed<i>/, and read out by the fast probe beside the same
probe on the network at random initialisation (cl_jax.linear_probe). A seed
whose report exists is read, not retrained. Results, rewritten after every run:

  <workdir>/recipe_check.md    one row per config and seed: colour, shape and
                               texture top-1 (random init -> trained), the final
                               loss, the final embedding std x sqrt(d)
                               (cl_jax.health; about 1 healthy, 0 collapsed),
                               the logged steps that show a collapse under the
                               default health thresholds ("end" when the run ends
                               collapsed), and the wall time;
  <workdir>/recipe_check.json  the same numbers.
"""

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from absl import app, flags

from cl_jax import health, metrics
from configs import default

QUICK_CONFIGS = (
    "mocov1",
    "mocov2",
    "mocov2_patchns",
    "mocov2_patchns_ft_ifm",
    "looc",
    "dicr",
    "simclr",
    "byol",
    "simsiam",
)
LABELS = ("colour", "shape", "texture")

_WORKDIR = flags.DEFINE_string("workdir", "runs/recipe_check", "Root of the runs and tables.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds per config (0 .. seeds - 1).", lower_bound=1)
_ONLY = flags.DEFINE_list("only", None, f"Configs to run (default: {', '.join(QUICK_CONFIGS)}).")
_FLAG = flags.DEFINE_multi_string("flag", [], "Extra flag passed to every cl_jax.main run.")


def summarise_run(run_dir: str, wall_s: float | None) -> dict | None:
  """One table row from a finished run directory, or None before its probe report exists."""
  reports = sorted(
      (f for f in os.listdir(run_dir) if f.startswith("probe_step") and f.endswith("_fast.json")),
      key=lambda f: int(f[len("probe_step") : -len("_fast.json")]),
  )
  if not reports:
    return None
  report = json.loads(open(os.path.join(run_dir, reports[-1])).read())
  if "random_init" not in report:
    raise ValueError(
        f"{run_dir}/{reports[-1]} has no random-init baseline; delete it and "
        "probe again with python -m cl_jax.probe --workdir=" + run_dir
    )
  records = metrics.read_metrics(run_dir)
  h = default.base_config().health
  last = records[-1]
  return {
      "step": report["step"],
      "trained": {k: 100 * report["accuracy"][k]["top1"] for k in LABELS},
      "random_init": {k: 100 * report["random_init"][k]["top1"] for k in LABELS},
      "loss": last["loss"],
      "std_sqrt_d": last.get("health/std_sqrt_d"),
      "flagged_steps": [
          r["step"] for r in records if health.collapse_warning(r, h.min_std_sqrt_d, h.min_rank)
      ],
      "wall_s": wall_s,
  }


def _steps_text(steps: Sequence[int], last: int) -> str:
  """ "-" for none, else the first and last flagged logging step ("end" if it is the last)."""
  if not steps:
    return "-"
  end = "end" if steps[-1] == last else str(steps[-1])
  return f"steps {steps[0]}-{end} ({len(steps)} log{'s' if len(steps) > 1 else ''})"


def markdown_table(rows: Sequence[tuple[str, int, dict]]) -> str:
  """Rows (config, seed, summarise_run's dict) as a markdown table."""
  head = (
      "| config | seed | colour | shape | texture | final loss | std x sqrt(d) | collapse "
      "flagged at | wall s |\n|---|---:|---:|---:|---:|---:|---:|---|---:|"
  )
  lines = [head]
  for name, seed, r in rows:
    cells = [
        f"{r['random_init'][k]:.1f} -> {r['trained'][k]:.1f} "
        f"({r['trained'][k] - r['random_init'][k]:+.1f})"
        for k in LABELS
    ]
    std = "-" if r["std_sqrt_d"] is None else f"{r['std_sqrt_d']:.2f}"
    wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f}"
    lines.append(
        f"| {name} | {seed} | {' | '.join(cells)} | {r['loss']:.3f} | {std} | "
        f"{_steps_text(r['flagged_steps'], r['step'])} | {wall} |"
    )
  return "\n".join(lines) + "\n"


def _train(name: str, run_dir: str, seed: int, extra: Sequence[str]) -> float:
  cmd = [
      sys.executable,
      "-m",
      "cl_jax.main",
      f"--config=configs/{name}.py",
      f"--workdir={run_dir}",
      f"--config.seed={seed}",
      *extra,
  ]
  start = time.perf_counter()
  subprocess.run(cmd, check=True)
  return time.perf_counter() - start


def main(argv):
  del argv
  names = _ONLY.value or list(QUICK_CONFIGS)
  unknown = [n for n in names if n not in QUICK_CONFIGS]
  if unknown:
    sys.exit(f"error: --only names {unknown}; the quick configs are {', '.join(QUICK_CONFIGS)}")
  root = _WORKDIR.value
  os.makedirs(root, exist_ok=True)
  times_path = os.path.join(root, "wall_s.json")
  times = json.loads(open(times_path).read()) if os.path.exists(times_path) else {}
  rows = []
  for name in names:
    for seed in range(_SEEDS.value):
      run_dir = os.path.join(root, name, f"seed{seed}")
      key = f"{name}/seed{seed}"
      row = summarise_run(run_dir, times.get(key)) if os.path.isdir(run_dir) else None
      if row is None:
        times[key] = _train(name, run_dir, seed, _FLAG.value)
        with open(times_path, "w") as f:
          json.dump(times, f, indent=2)
        row = summarise_run(run_dir, times[key])
      rows.append((name, seed, row))
      with open(os.path.join(root, "recipe_check.md"), "w") as f:
        f.write(markdown_table(rows))
      with open(os.path.join(root, "recipe_check.json"), "w") as f:
        json.dump([{"config": n, "seed": s, **r} for n, s, r in rows], f, indent=2)
  print(markdown_table(rows))


if __name__ == "__main__":
  app.run(main)
