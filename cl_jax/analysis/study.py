"""Studies: named arms (a config file plus overrides) times seeds, trained once, read many times.

A run of arm A with seed s is `python -m cl_jax.main --config=<A's file> --config.seed=s
--config.<field>=<value> ...` in <workdir>/<A>/seed<s> (the pretraining and its fast linear
probe, in a process of its own, so its wall time is what a user waits for), followed by the
arm's analyses (NormStd). What a finished run measured is kept in a small record,
<results>/runs/<A>/seed<s>.json: the run's whole config (flattened), the probe's top-1
accuracies and the random-init baseline, the final loss and health signals, the score
statistics of the last epoch, the analyses' numbers and the wall time. Arms are named by what
they are, so two studies that use the same arm share its runs and records.

- A seed with a record is read, not retrained; one whose run directory holds an unfinished run
  resumes it (cl_jax.main resumes from the newest checkpoint); a later call with more seeds
  adds seeds.
- A record or run directory whose config differs from the arm's in any field is refused with
  one line naming the field, before anything is trained (fields that one side lacks, from an
  older or newer config schema, are not compared).
- Per arm and metric: the mean over seeds and its 95% t-interval; per comparison the paired
  difference or the per-seed slope with its interval (cl_jax.analysis.intervals), and for a
  comparison with an expected direction its verdict.

The studies themselves live in cl_jax.studies; the command is cl_jax.study.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import ml_collections
import numpy as np
from etils import epath
from matplotlib.figure import Figure

from cl_jax.analysis import collapse as health
from cl_jax.analysis import intervals
from cl_jax.runtime import cli, metrics, run_config
from cl_jax.runtime.errors import UsageError

PROBE_LABELS = ("colour", "shape", "texture", "rotation")
# Score statistics averaged over the rows logged in the run's last epoch.
SCORE_METRICS = ("pos_mean", "neg_mean", "neg_var")
# NormStd of these augmentations at the last residual block (cl_jax.analysis.normstd).
NORMSTD_AUGMENTATIONS = ("crop", "flip", "jitter", "grayscale")
NORMSTD_FLAGS = ("--images=256", "--crop_scale=0.08,1")
ANALYSES = ("normstd",)


@dataclasses.dataclass(frozen=True)
class Arm:
  """A config file (PATH[:preset]) with `overrides` ((field, value), ...)."""

  name: str
  config: str
  overrides: tuple[tuple[str, object], ...] = ()


def arm(name: str, config: str, overrides: Mapping[str, object] | None = None) -> Arm:
  """Arm `name` of config file `config` with {field: value} overrides."""
  return Arm(name, config, tuple(sorted((overrides or {}).items())))


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A paired difference (arms = (treatment, baseline), no x) or a slope over a sweep (arms
  in the order of their swept values x) of one record metric; `expect` is its expected
  direction (intervals.DIRECTIONS) or None for a comparison reported without a verdict.
  A slope with `minus` (one baseline arm per swept arm) is the slope of the paired gains
  metric(arms[i]) - metric(minus[i])."""

  label: str
  metric: str
  arms: tuple[str, ...]
  x: tuple[float, ...] = ()
  expect: str | None = None
  minus: tuple[str, ...] = ()

  @property
  def kind(self) -> str:
    return "slope" if self.x else "difference"


@dataclasses.dataclass(frozen=True)
class Study:
  """Arms, the analyses run on each finished run (ANALYSES), the record metrics tabulated per
  arm, comparisons, and for a claim of a paper: where it stands (paper, figure or table), the
  claim in one sentence and what the paper reports. `outputs`, when given, writes the study's
  own tables (study, records -> {file name: text}) beside the standard ones."""

  name: str
  title: str
  arms: tuple[Arm, ...]
  analyses: tuple[str, ...] = ()
  metrics: tuple[str, ...] = ("colour", "shape", "texture")
  comparisons: tuple[Comparison, ...] = ()
  paper: str = ""
  where: str = ""
  claim: str = ""
  paper_result: str = ""
  notes: str = ""
  outputs: Callable[["Study", dict], dict] | None = None

  def __post_init__(self):
    names = [a.name for a in self.arms]
    unknown = [a for a in self.analyses if a not in ANALYSES]
    if unknown:
      raise ValueError(f"study {self.name}: unknown analyses {unknown}; known: {ANALYSES}")
    if len(set(names)) != len(names):
      raise ValueError(f"study {self.name}: arm names repeat: {names}")
    for c in self.comparisons:
      missing = [a for a in (*c.arms, *c.minus) if a not in names]
      if missing:
        raise ValueError(f"study {self.name}: comparison {c.label} names unknown arms {missing}")
      if c.kind == "difference" and len(c.arms) != 2:
        raise ValueError(f"study {self.name}: {c.label} must compare two arms")
      if c.kind == "slope" and len(c.x) != len(c.arms):
        raise ValueError(f"study {self.name}: {c.label} needs one x per arm")
      if c.minus and (c.kind != "slope" or len(c.minus) != len(c.arms)):
        raise ValueError(f"study {self.name}: {c.label}: minus needs a slope, one arm per x")
      if c.expect is not None and c.expect not in intervals.DIRECTIONS:
        raise ValueError(f"study {self.name}: {c.label} expects {c.expect!r}")

  @property
  def is_claim(self) -> bool:
    return any(c.expect is not None for c in self.comparisons)


# ---------------------------------------------------------------------------------------------
# Configs and records.


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


def _plain(config) -> dict:
  """The flattened config as JSON values (tuples become lists)."""
  return json.loads(json.dumps(run_config.flatten(config)))


def config_differences(stored: Mapping, config) -> list[tuple[str, object, object]]:
  """(field, stored, arm's) for every field both hold with another value."""
  new = _plain(config)
  return [(k, stored[k], new[k]) for k in sorted(set(stored) & set(new)) if stored[k] != new[k]]


def _refuse(arm_: Arm, seed: int, where: str, differ: list) -> None:
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


def total_steps(config: ml_collections.ConfigDict) -> int:
  """The step of the run's last checkpoint (and so of its final probe report)."""
  from cl_jax import train
  from cl_jax.data import sources

  num = len(sources.open_source(config.data, "pretrain"))
  return config.optim.epochs * train.steps_per_epoch(num, config.optim.batch_size)


def _probe_report(directory: epath.Path, step: int) -> dict | None:
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


def collect(
    arm_: Arm, seed: int, config, directory: epath.Path, step: int, wall_s: float | None, analyses
) -> dict:
  """The record of the finished run in `directory` (its probe report at `step`, its metrics,
  the `analyses`' numbers)."""
  report = _probe_report(directory, step)
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
  h = config.health
  return {
      "arm": arm_.name,
      "seed": seed,
      "config_file": arm_.config,
      "overrides": {k: v for k, v in arm_.overrides},
      "step": step,
      "wall_s": wall_s,
      "analyses": sorted(analyses),
      "environment": environment(),
      "metrics": values,
      "collapse_flagged_steps": [
          r["step"] for r in rows if health.collapse_warning(r, h.min_std_sqrt_d, h.min_rank)
      ],
      "config": _plain(config),
  }


# ---------------------------------------------------------------------------------------------
# Training.


class RunFailed(UsageError):
  """A run of the study (its training, probe or analysis) ended with an error."""


def environment() -> dict:
  """What decides a run's arithmetic beside its config: the JAX version, XLA_FLAGS and the
  processor (its model and widest vector instructions): README "Reproducibility"."""
  import jax

  flags = ""
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      info = f.read()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln), ""
    )
    flags = (
        " ".join(x for x in ("avx512f", "avx2") if f" {x} " in info) or "neither avx2 nor avx512f"
    )
  else:
    import platform

    model = platform.processor()
  return {
      "jax": jax.__version__,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "cpu": model,
      "isa": flags,
      "cpus": os.cpu_count(),
  }


def train_subprocess(
    arm_: Arm, seed: int, extra, directory: epath.Path, analyses=()
) -> float | None:
  """Pretrain and probe (or resume) with cl_jax.main unless the final probe report exists,
  then the `analyses` (ANALYSES) not yet done, each in a process of its own; a failure stops
  the study with the command that failed. Returns cl_jax.main's wall time (None if it did
  not run): start-up, compilation, training and the probe."""
  where = os.path.abspath(str(directory)) if "://" not in str(directory) else str(directory)
  main = [sys.executable, "-m", "cl_jax.main", *main_flags(arm_, seed, extra)]
  step = total_steps(arm_config(arm_, seed, extra))
  commands = [] if _probe_report(epath.Path(where), step) else [main + [f"--workdir={where}"]]
  if (
      "normstd" in analyses
      and not (epath.Path(where) / "normstd" / f"normstd_step{step}.json").exists()
  ):
    commands.append(
        [sys.executable, "-m", "cl_jax.analysis.normstd", f"--workdir={where}", *NORMSTD_FLAGS]
    )
  wall_s = None
  for cmd in commands:
    start = time.perf_counter()
    if subprocess.run(cmd).returncode != 0:
      raise RunFailed(f"arm {arm_.name} seed {seed} failed: {' '.join(cmd[1:])}")
    if cmd[:3] == main[:3]:
      wall_s = time.perf_counter() - start
  return wall_s


def ensure_record(
    arm_: Arm,
    seed: int,
    workdir: str,
    results: str,
    extra=(),
    analyses=(),
    train: Callable = train_subprocess,
    log: Callable[[str], None] = print,
) -> dict:
  """The record of arm_ at seed with the `analyses`: read when it exists and holds them, else
  trained (or resumed, or only analysed) and written."""
  config = arm_config(arm_, seed, extra)
  path = record_path(results, arm_.name, seed)
  record = None
  if path.exists():
    record = json.loads(path.read_text())
    _refuse(arm_, seed, str(path), config_differences(record["config"], config))
    if set(analyses) <= set(record["analyses"]):
      return record
  directory = run_dir(workdir, arm_.name, seed)
  if (directory / "config.json").exists():
    stored = _plain(run_config.read(str(directory)))
    _refuse(arm_, seed, str(directory), config_differences(stored, config))
  elif record is not None:
    raise UsageError(
        f"{path} lacks the analyses {sorted(set(analyses) - set(record['analyses']))} and its "
        f"run {directory} is gone; delete the record to train the run again"
    )
  step = total_steps(config)
  wanted = sorted(set(analyses) | set(record["analyses"] if record else ()))
  log(f"{arm_.name} seed {seed}: {'analysing' if record else 'training'} in {directory}")
  wall_s = train(arm_, seed, extra, directory, wanted)
  previous = record
  record = collect(arm_, seed, config, directory, step, wall_s, wanted)
  if previous is not None:  # an analysis added to a run recorded before
    record.update(wall_s=previous["wall_s"], environment=previous["environment"])
  path.parent.mkdir(parents=True, exist_ok=True)
  metrics.write_atomically(path, json.dumps(record, indent=1))
  return record


# ---------------------------------------------------------------------------------------------
# Summaries.


def _by_seed(records: dict, arm_name: str, metric: str) -> dict[int, float]:
  return {
      s: r["metrics"][metric]
      for s, r in records.get(arm_name, {}).items()
      if metric in r["metrics"]
  }


def compare(c: Comparison, records: dict) -> dict:
  """The comparison's interval over the seeds every one of its arms has, and its verdict."""
  per_arm = [_by_seed(records, a, c.metric) for a in c.arms]
  baselines = [_by_seed(records, a, c.metric) for a in c.minus]
  seeds = sorted(set.intersection(*(set(p) for p in per_arm + baselines)))
  out = {"label": c.label, "metric": c.metric, "kind": c.kind, "arms": list(c.arms)}
  out.update({"minus": list(c.minus), "x": list(c.x), "expect": c.expect, "seeds": seeds})
  if not seeds:
    out.update(interval=None, verdict=None if c.expect is None else intervals.NOT_RESOLVED)
    return out
  y = np.array([[p[s] for p in per_arm] for s in seeds])
  if baselines:
    y = y - np.array([[p[s] for p in baselines] for s in seeds])
  if c.kind == "difference":
    interval = intervals.paired_difference(y[:, 0], y[:, 1])
  else:
    interval = intervals.slope_interval(c.x, y)
  out["interval"] = dataclasses.asdict(interval)
  out["verdict"] = None if c.expect is None else intervals.verdict(interval, c.expect)
  return out


def summarise(study: Study, records: dict) -> dict:
  """{"arms": {arm: {metric: interval dict, "seeds": [...]}}, "comparisons": [...],
  "verdict": the claim's combined verdict (None for a study without expectations)}."""
  arms = {}
  for a in study.arms:
    row = {"seeds": sorted(records.get(a.name, {}))}
    for m in study.metrics:
      values = list(_by_seed(records, a.name, m).values())
      row[m] = dataclasses.asdict(intervals.t_interval(values)) if values else None
    arms[a.name] = row
  comparisons = [compare(c, records) for c in study.comparisons]
  decided = [c["verdict"] for c in comparisons if c["verdict"] is not None]
  return {
      "study": study.name,
      "title": study.title,
      "paper": study.paper,
      "where": study.where,
      "claim": study.claim,
      "paper_result": study.paper_result,
      "arms": arms,
      "comparisons": comparisons,
      "verdict": intervals.combined_verdict(decided) if decided else None,
  }


def _cell(d: dict | None, digits: int = 1) -> str:
  if d is None:
    return "-"
  return intervals.Interval(**d).text(digits)


def _digits(metric: str) -> int:
  return 1 if metric in PROBE_LABELS or metric == "mean" or "random_init/" in metric else 3


def markdown(study: Study, summary: dict) -> str:
  """The study's tables: per arm the mean [95% interval] of each metric, then the comparisons."""
  lines = [f"## {study.title}", ""]
  if study.claim:
    lines += [f"{study.paper}, {study.where}: {study.claim}", ""]
    if study.paper_result:
      lines += [f"The paper: {study.paper_result}", ""]
  lines += [
      "| arm | " + " | ".join(study.metrics) + " | seeds |",
      "|---|" + "---:|" * (len(study.metrics) + 1),
  ]
  for a in study.arms:
    row = summary["arms"][a.name]
    cells = [_cell(row[m], _digits(m)) for m in study.metrics]
    lines.append(f"| {a.name} | " + " | ".join(cells) + f" | {len(row['seeds'])} |")
  if summary["comparisons"]:
    lines += ["", "| comparison | metric | estimate [95% interval] | expected | verdict | seeds |"]
    lines.append("|---|---|---:|---|---|---:|")
    for c in summary["comparisons"]:
      what = "slope" if c["kind"] == "slope" else "difference"
      est = _cell(c["interval"], 3 if c["kind"] == "slope" else _digits(c["metric"]))
      lines.append(
          f"| {c['label']} | {c['metric']} ({what}) | {est} | {c['expect'] or '-'} | "
          f"{c['verdict'] or '-'} | {len(c['seeds'])} |"
      )
  if summary["verdict"] is not None:
    lines += ["", f"Verdict: **{summary['verdict']}**"]
  if study.notes:
    lines += ["", study.notes]
  return "\n".join(lines) + "\n"


def claims_table(studies: Sequence[Study], summaries: Sequence[dict], seeds: int) -> str:
  """One markdown row per claim: the paper's result, every decisive comparison's estimate
  [95% interval] and verdict, the claim's verdict ("not run yet" without a record), the
  records it rests on (of arms x seeds) and the command that reruns it."""
  lines = [
      "| claim | the paper | measured here: estimate [95% interval], verdict | verdict | "
      "runs | command |",
      "|---|---|---|---|---:|---|",
  ]
  for s, summary in zip(studies, summaries):
    parts = []
    for c in summary["comparisons"]:
      if c["expect"] is None:
        continue
      est = _cell(c["interval"], 3 if c["kind"] == "slope" else _digits(c["metric"]))
      parts.append(f"{c['label']} ({c['kind']}): {est}, {c['verdict']}")
    done = sum(len(summary["arms"][a.name]["seeds"]) for a in s.arms)
    verdict = f"**{summary['verdict']}**" if done else "not run yet"
    lines.append(
        f"| {s.paper}, {s.where}: {s.claim} | {s.paper_result} | {'; '.join(parts)} | "
        f"{verdict} | {done} of {len(s.arms) * seeds} | "
        f"`python -m cl_jax.study --study={s.name}` |"
    )
  return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The runner.


def read_records(study: Study, seeds: int, results: str, extra=()) -> dict:
  """{arm: {seed: record}} of the records that exist for seeds 0 .. seeds - 1 (refusing a
  record whose config differs from its arm's)."""
  out = {}
  for a in study.arms:
    for s in range(seeds):
      path = record_path(results, a.name, s)
      if path.exists():
        record = json.loads(path.read_text())
        _refuse(a, s, str(path), config_differences(record["config"], arm_config(a, s, extra)))
        out.setdefault(a.name, {})[s] = record
  return out


def write_outputs(study: Study, records: dict, results: str) -> list[str]:
  """<results>/<study>.md, .json and .png and the study's own outputs (text, dicts as JSON,
  figures as PNG); returns the paths."""
  from cl_jax.analysis import study_plot

  root = epath.Path(results)
  root.mkdir(parents=True, exist_ok=True)
  summary = summarise(study, records)
  files = {f"{study.name}.md": markdown(study, summary), f"{study.name}.json": summary}
  files[f"{study.name}.png"] = study_plot.plot(study, summary, records)
  if study.outputs is not None:
    own = study.outputs(study, records)
    clash = sorted(set(own) & set(files))
    if clash:
      raise ValueError(f"study {study.name}: its own outputs {clash} clash with the standard ones")
    files.update(own)
  paths = []
  for name, content in files.items():
    if isinstance(content, Figure):
      study_plot.save(content, root / name)
    else:
      text = json.dumps(content, indent=1) if isinstance(content, dict) else content
      metrics.write_atomically(root / name, text)
    paths.append(str(root / name))
  return paths


def run(
    study: Study,
    seeds: int,
    workdir: str,
    results: str,
    extra: Sequence[tuple[str, object]] = (),
    only: Sequence[str] | None = None,
    train: Callable = train_subprocess,
    log: Callable[[str], None] = print,
) -> dict:
  """Records for every arm (or those in `only`) and seed 0 .. seeds - 1, trained where
  missing, with the outputs rewritten after each new record. A run that fails (RunFailed) is
  reported and the others go on. Returns summarise()'s dict over every record of the study's
  arms, with "failed": one line per failed run."""
  names = [a.name for a in study.arms]
  unknown = [n for n in (only or ()) if n not in names]
  if unknown:
    raise UsageError(f"study {study.name} has no arm {unknown[0]}; its arms: {', '.join(names)}")
  chosen = [a for a in study.arms if only is None or a.name in only]
  read_records(study, seeds, results, extra)  # refuse a changed arm before any training
  failed = []
  for a in chosen:
    for s in range(seeds):
      existed = record_path(results, a.name, s).exists()
      try:
        record = ensure_record(a, s, workdir, results, extra, study.analyses, train, log)
      except RunFailed as e:
        failed.append(str(e))
        log(f"{study.name}: {e}")
        continue
      if not existed:
        shown = ", ".join(
            f"{m} {record['metrics'][m]:.{_digits(m)}f}"
            for m in study.metrics
            if m in record["metrics"]
        )
        log(f"{study.name}: {a.name} seed {s}: {shown}")
        write_outputs(study, read_records(study, seeds, results, extra), results)
  records = read_records(study, seeds, results, extra)
  write_outputs(study, records, results)
  return {**summarise(study, records), "failed": failed}
