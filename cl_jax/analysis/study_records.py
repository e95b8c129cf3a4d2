"""A study's configs and records (cl_jax.analysis.study): the config and cl_jax.main flags of an
arm at a seed, the comparison of a stored config with the arm's (refused with one line naming the
fields that differ), where runs and records live, and the record of a finished run (its probe
accuracies, final loss and health signals, last-epoch score statistics, analyses' numbers, wall
time, the environment that decides its arithmetic and the code version with its numerics
fingerprint, cl_jax.analysis.fingerprint).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import ml_collections
import numpy as np
from etils import epath

from cl_jax.analysis.study_types import Arm
from cl_jax.objectives import health
from cl_jax.runtime import cli, metrics, run_config
from cl_jax.runtime.errors import UsageError

PROBE_LABELS = ("colour", "shape", "texture", "rotation")
# Score statistics averaged over the rows logged in the run's last epoch.
SCORE_METRICS = ("pos_mean", "neg_mean", "neg_var")
# NormStd of these augmentations at the last residual block (cl_jax.analysis.normstd).
NORMSTD_AUGMENTATIONS = ("crop", "flip", "jitter", "grayscale")


def _flag_value(value: object) -> str:
  """A config value as cl_jax.main's --config.FIELD flag parses it back."""
  return value if isinstance(value, str) else repr(value)


def main_flags(arm_: Arm, seed: int, extra: Sequence[tuple[str, object]] = ()) -> list[str]:
  """cl_jax.main's config flags of `arm_` at `seed`, with the study-wide overrides `extra`."""
  fields = [*arm_.overrides, *extra, ("seed", seed)]
  return [f"--config={arm_.config}"] + [f"--config.{k}={_flag_value(v)}" for k, v in fields]


def arm_config(
    arm_: Arm, seed: int, extra: Sequence[tuple[str, object]] = ()
) -> ml_collections.ConfigDict:
  """The config cl_jax.main builds from main_flags(arm_, seed, extra); UsageError for an
  override of a field the config lacks."""
  config = cli._load_config(cli.resolve_config_path(arm_.config))
  fields = run_config.flatten(config)
  for field, value in [*arm_.overrides, *extra, ("seed", seed)]:
    if field not in fields:
      raise UsageError(
          f"arm {arm_.name}: unknown config field {field}" f"{run_config.suggest(field, config)}"
      )
    *blocks, last = field.split(".")
    node = config
    for b in blocks:
      node = node[b]
    with node.ignore_type():
      node[last] = tuple(value) if isinstance(value, list) else value
  return config


def plain_config(config) -> dict:
  """The flattened config as JSON values (tuples become lists)."""
  return json.loads(json.dumps(run_config.flatten(config)))


def config_differences(stored: Mapping, config) -> list[tuple[str, object, object]]:
  """(field, stored, arm's) for every field both hold with another value."""
  new = plain_config(config)
  return [(k, stored[k], new[k]) for k in sorted(set(stored) & set(new)) if stored[k] != new[k]]


def refuse_changed(arm_: Arm, seed: int, where: str, differ: list) -> None:
  if differ:
    shown = ", ".join(f"{k}: {a!r} there, {b!r} in the arm" for k, a, b in differ[:3])
    more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
    raise UsageError(
        f"{where} holds arm {arm_.name} seed {seed} with another config ({shown}{more}); "
        "a study at other settings needs its own --workdir and --results, or delete that run"
    )


def record_path(results: str, arm_name: str, seed: int) -> epath.Path:
  return epath.Path(results) / "runs" / arm_name / f"seed{seed}.json"


def run_dir(workdir: str, arm_name: str, seed: int) -> epath.Path:
  return epath.Path(workdir) / arm_name / f"seed{seed}"


def set_aside(results: str, workdir: str, arm_name: str, seed: int) -> list[str]:
  """Moves the record of arm_name at seed to <results>/replaced/<arm>/seed<s>[.<n>].json and
  its run directory, if any, to <workdir>/replaced/<arm>/seed<s>[.<n>], so that the study
  trains the seed again (nothing is deleted); returns the new paths."""
  moved = []
  for source, root, suffix in (
      (record_path(results, arm_name, seed), epath.Path(results), ".json"),
      (run_dir(workdir, arm_name, seed), epath.Path(workdir), ""),
  ):
    if not source.exists():
      continue
    target = root / "replaced" / arm_name / f"seed{seed}{suffix}"
    n = 1
    while target.exists():
      target = root / "replaced" / arm_name / f"seed{seed}.{n}{suffix}"
      n += 1
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)
    moved.append(str(target))
  return moved


def total_steps(config: ml_collections.ConfigDict) -> int:
  """The step of the run's last checkpoint (and so of its final probe report)."""
  from cl_jax import train
  from cl_jax.data import sources

  num = len(sources.open_source(config.data, "pretrain"))
  return config.optim.epochs * train.steps_per_epoch(num, config.optim.batch_size)


def probe_report(directory: epath.Path, step: int) -> dict | None:
  path = directory / f"probe_step{step}_fast.json"
  return json.loads(path.read_text()) if path.exists() else None


def _normstd(directory: epath.Path, step: int) -> dict:
  """NormStd of NORMSTD_AUGMENTATIONS at the last residual block: trained and random init."""
  report = json.loads((directory / "normstd" / f"normstd_step{step}.json").read_text())
  block = report["layers"][-2]  # the residual blocks, then "embedding"
  out = {}
  for net, prefix in (("trained", "normstd"), ("random_init", "random_init/normstd")):
    for aug in NORMSTD_AUGMENTATIONS:
      out[f"{prefix}/{aug}"] = report[net]["normstd"][aug][block]
  return out


def _code(directory: epath.Path) -> dict:
  """The run's code version: the commit and source digest it started under and its numerics
  fingerprint (cl_jax.analysis.fingerprint); UsageError when the fingerprint was computed
  under other source than the run started with."""
  from cl_jax.analysis import fingerprint

  started = json.loads((directory / fingerprint.SOURCE_FILE).read_text())
  printed = json.loads((directory / fingerprint.FILE).read_text())
  if printed["source"]["sha256"] != started["sha256"]:
    raise UsageError(
        f"{directory}: its fingerprint was computed under other code "
        f"({printed['source']['commit']}) than the run started with ({started['commit']}); "
        f"delete {fingerprint.FILE} there and run the study again"
    )
  return {
      "commit": started["commit"],
      "clean": not started["commit"].endswith("-dirty"),
      "source_sha256": started["sha256"],
      "fingerprint": printed["components"],
      "device": printed.get("device", "cpu"),
  }


def collect(
    arm_: Arm, seed: int, config, directory: epath.Path, step: int, wall_s: float | None, analyses
) -> dict:
  """The record of the finished run in `directory` (its probe report at `step`, its metrics,
  the `analyses`' numbers)."""
  report = probe_report(directory, step)
  if report is None:
    raise UsageError(f"{directory} has no fast-probe report at step {step}: the run is unfinished")
  values = {k: 100.0 * v["top1"] for k, v in report["accuracy"].items()}
  values["mean"] = float(np.mean([values[k] for k in PROBE_LABELS[:3] if k in values]))
  for k, v in report.get("random_init", {}).items():
    values[f"random_init/{k}"] = 100.0 * v["top1"]
  rows = [r for r in metrics.read_metrics(str(directory)) if "loss" in r]
  last = rows[-1]
  values["loss"] = last["loss"]
  if "health/std_sqrt_d" in last:
    values["std_sqrt_d"] = last["health/std_sqrt_d"]
  tail_from = step - step // config.optim.epochs
  for k in SCORE_METRICS:
    tail = [r[k] for r in rows if k in r and r["step"] > tail_from]
    if tail:
      values[k] = float(np.mean(tail))
  if "normstd" in analyses:
    values.update(_normstd(directory, step))
  code = _code(directory)
  h = config.health
  return {
      "arm": arm_.name,
      "seed": seed,
      "config_file": arm_.config,
      "overrides": {k: v for k, v in arm_.overrides},
      "step": step,
      "wall_s": wall_s,
      "analyses": sorted(analyses),
      "environment": {**environment(), "device": code.pop("device")},
      "code": code,
      "metrics": values,
      "collapse_flagged_steps": [
          r["step"] for r in rows if health.collapse_warning(r, h.min_std_sqrt_d, h.min_rank)
      ],
      "config": plain_config(config),
  }


def processor(cpuinfo: str) -> tuple[str, str]:
  """(model, widest vector instructions) from the text of /proc/cpuinfo: the model name with
  its family and model numbers ("AMD EPYC (family 25, model 1)": a virtual machine's model name
  alone may not tell two processor generations apart), and which of "avx512f avx2" it has
  (widest first; "neither avx2 nor avx512f" for none)."""

  fields = {}
  for line in cpuinfo.splitlines():
    key, colon, value = line.partition(":")
    if colon:
      fields.setdefault(key.strip(), value.strip())  # the first processor's
  model = fields.get("model name", "")
  numbers = [
      f"{k} {fields[f]}" for k, f in (("family", "cpu family"), ("model", "model")) if f in fields
  ]
  if numbers:
    model += f" ({', '.join(numbers)})"
  flags = fields.get("flags", "").split()
  isa = " ".join(x for x in ("avx512f", "avx2") if x in flags) or "neither avx2 nor avx512f"
  return model, isa


def device_kind() -> str:
  """The kind of JAX's first device on this machine ("cpu" on a processor), asked of a child
  process, so that the calling process (a study, whose runs are children) holds no
  accelerator."""
  import subprocess
  import sys

  code = "import jax; print(jax.devices()[0].device_kind)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  return out.stdout.strip().splitlines()[-1]


def environment() -> dict:
  """What decides a run's arithmetic beside its config: the JAX version, XLA_FLAGS and the
  processor (its model and widest vector instructions, `processor`): README "Reproducibility".
  A record adds the device the run computed on ("device": JAX's device kind, "cpu" on a
  processor), read from the run's fingerprint file."""
  import jax

  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      model, flags = processor(f.read())
  else:
    import platform

    model, flags = platform.processor(), ""
  return {
      "jax": jax.__version__,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "cpu": model,
      "isa": flags,
      "cpus": os.cpu_count(),
  }
