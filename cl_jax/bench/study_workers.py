"""Runs per hour of a study's local workers: the same arm-seeds trained by 1, 2, ... pinned
workers, and whether every worker count gives the same records.

python -m cl_jax.bench.study_workers [--study=ge_nojitter] [--seeds=2] [--workers=1,2]
    [--out=DIR] [--set=FIELD=VALUE ...] [--json]

For each count N of --workers, `python -m cl_jax.study --study=S --seeds=K --workers=N` trains
the study's arms x K seeds from scratch in a folder of its own (under --out, default a new
temporary folder), at the tiny size of the study tests by default (16 px Trifeature, a ResNet-10
at 1/8 width, 16 steps; --set replaces it). Printed per count: the wall time, runs per hour, and
whether its records have the same probe metrics and code fingerprints as the first count's.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from cl_jax.analysis import fingerprint, study_records
from cl_jax.runtime import cli

TINY = (
    "data.image_size=16",
    "data.trifeature_train=256",
    "data.trifeature_test=128",
    "model.depth=10",
    "model.width_multiplier=0.125",
    "model.head_hidden_dim=32",
    "model.head_out_dim=16",
    "moco.queue_size=128",
    "nonsemantic.patch_min=2",
    "nonsemantic.patch_max=6",
    "optim.batch_size=32",
    "optim.epochs=2",
    "eval.every=0",
)


def records(results: str, arms: list[str], seeds: int) -> dict:
  """{"arm/seed": {"metrics", "fingerprint"}} of the records under `results`."""
  out = {}
  for arm in arms:
    for seed in range(seeds):
      record = json.loads(study_records.record_path(results, arm, seed).read_text())
      out[f"{arm}/{seed}"] = {
          "metrics": record["metrics"],
          "fingerprint": record["code"]["fingerprint"],
      }
  return out


def measure(study: str, seeds: int, workers: list[int], out: str, sets: list[str]) -> dict:
  """Each worker count's run of the study in out/workers<N>: rows {"workers", "runs",
  "wall_s", "runs_per_hour", "same_records"} (same_records: the first count's probe metrics and
  fingerprints), with the processor and the command."""
  from cl_jax.studies import STUDIES

  arms = [a.name for a in STUDIES[study].arms]
  rows, first = [], None
  for n in workers:
    folder = os.path.join(out, f"workers{n}")
    cmd = [sys.executable, "-m", "cl_jax.study", f"--study={study}", f"--seeds={seeds}"]
    cmd += [f"--workers={n}", f"--workdir={folder}/runs", f"--results={folder}/results"]
    cmd += [f"--set={s}" for s in sets]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    got = records(f"{folder}/results", arms, seeds)
    first = got if first is None else first
    runs = len(arms) * seeds
    rows.append({
        "workers": n,
        "runs": runs,
        "wall_s": round(wall, 1),
        "runs_per_hour": round(3600 * runs / wall, 1),
        "same_records": got == first,
    })  # fmt: skip
  env = study_records.environment()
  processor = f"{env['cpu']} ({env['isa']}), {env['cpus']} CPUs, jax {env['jax']}"
  commit = fingerprint.source_digest()["commit"]
  return {
      "study": study,
      "seeds": seeds,
      "set": list(sets),
      "processor": processor,
      "commit": commit,
      "rows": rows,
  }


def table(result: dict) -> str:
  lines = [
      f"{result['study']}, {result['seeds']} seeds, {result['processor']}, {result['commit']}",
      f"{'workers':>7} {'runs':>5} {'wall s':>8} {'runs/h':>8}  same records as the first",
  ]
  for r in result["rows"]:
    lines.append(
        f"{r['workers']:>7} {r['runs']:>5} {r['wall_s']:>8.1f} {r['runs_per_hour']:>8.1f}  "
        f"{'yes' if r['same_records'] else 'NO'}"
    )
  return "\n".join(lines)


def _define_flags() -> None:
  flags.DEFINE_string("study", "ge_nojitter", "The study (python -m cl_jax.study --list).")
  flags.DEFINE_integer("seeds", 2, "Seeds per arm.", lower_bound=1)
  flags.DEFINE_list("workers", ["1", "2"], "The worker counts, in order.")
  flags.DEFINE_string("out", "", "Folder of the runs (default: a new temporary folder).")
  flags.DEFINE_multi_string("set", list(TINY), "FIELD=VALUE for every arm (default: tiny).")
  flags.DEFINE_bool("json", False, "Print the result as JSON.")


def main(argv):
  del argv
  f = flags.FLAGS
  with cli.report():
    out = f.out or tempfile.mkdtemp(prefix="cl_jax_study_workers_")
    result = measure(f.study, f.seeds, [int(n) for n in f.workers], out, f.set)
    print(json.dumps(result, indent=1) if f.json else table(result))


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
