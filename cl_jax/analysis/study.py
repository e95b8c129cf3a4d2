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

This module runs studies; their types (Arm, Comparison, Study) are in
cl_jax.analysis.study_types. Configs and records are in
cl_jax.analysis.study_records, a run's training in cl_jax.analysis.study_runs, summaries and
tables in cl_jax.analysis.study_summary. The studies themselves live in cl_jax.studies; the
command is cl_jax.study.
"""

import contextlib
import json
import time
from collections.abc import Callable, Sequence

from etils import epath
from matplotlib.figure import Figure

from cl_jax.analysis.study_records import (
    arm_config,
    config_differences,
    device_kind,
    environment,
    record_path,
    refuse_changed,
    run_dir,
    set_aside,
)
from cl_jax.analysis.study_runs import (
    RunFailed,
    claim,
    ensure_record,
    train_subprocess,
    write_failure,
)
from cl_jax.analysis.study_summary import machine, markdown, metric_digits, summarise
from cl_jax.analysis.study_types import Arm, Study
from cl_jax.runtime import metrics
from cl_jax.runtime.errors import UsageError

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
        refuse_changed(
            a, s, str(path), config_differences(record["config"], arm_config(a, s, extra))
        )
        out.setdefault(a.name, {})[s] = record
  return out


def crossed_members(
    study: Study, records: dict, here: str, only: Sequence[str] | None = None
) -> list[tuple[str, int]]:
  """(arm, seed) of every record that shares a seed of one of the study's comparisons with a
  record computed on another machine (study_summary.machine) and was not computed on `here`,
  the machine at hand (of the arms in `only`, when given): retraining those here leaves every
  such pair on one machine."""
  out = set()
  for c in study.comparisons:
    members = list(dict.fromkeys((*c.arms, *c.minus)))
    seeds = set.intersection(*(set(records.get(a, {})) for a in members))
    for s in seeds:
      if len({machine(records[a][s]) for a in members}) > 1:
        out |= {
            (a, s)
            for a in members
            if machine(records[a][s]) != here and (only is None or a in only)
        }
  return sorted(out, key=lambda item: (item[1], item[0]))


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
    rerun_crossed: bool = False,
    here: str | None = None,
    deadline_s: float | None = None,
) -> dict:
  """Records for every arm (or those in `only`) and seed 0 .. seeds - 1, trained where missing, with
  the outputs rewritten after each new record. With `rerun_crossed`, the records of crossed pairs
  that were computed on another machine than `here` (by default this one: study_summary.machine of
  its environment and device) are set aside first (study_records.set_aside) and trained again. A run
  that fails (RunFailed) is reported and the others go on (its run directory keeps the error,
  study_runs.write_failure). An arm-seed whose run directory another live process has claimed
  (study_runs.claim: a worker of cl_jax.study --workers, a SLURM task, another session) is left to
  it. `deadline_s`: start no run that would end more than deadline_s seconds after this call began,
  by the longest wall time of the study's records on this machine (a fixed-length device session);
  those are left for the next call. Returns summarise()'s dict over every record of the study's
  arms, with "failed": one line per failed run, and "left": one per arm-seed left for the next
  call."""
  names = [a.name for a in study.arms]
  unknown = [n for n in (only or ()) if n not in names]
  if unknown:
    raise UsageError(f"study {study.name} has no arm {unknown[0]}; its arms: {', '.join(names)}")
  chosen = [a for a in study.arms if only is None or a.name in only]
  began = time.monotonic()
  existing = read_records(study, seeds, results, extra)  # refuse a changed arm first
  if here is None and (rerun_crossed or deadline_s is not None):
    here = machine({"environment": {**environment(), "device": device_kind()}})
  walls = [
      r["wall_s"]
      for by in existing.values()
      for r in by.values()
      if r.get("wall_s") and machine(r) == here
  ]
  if rerun_crossed:
    for a, s in crossed_members(study, existing, here, only):
      moved = ", ".join(set_aside(results, workdir, a, s))
      log(f"{study.name}: {a} seed {s} ran on another machine than its partners; moved to {moved}")
  failed, left = [], []

  # Seed-major: every arm of seed s before seed s + 1, so that the arms of a seed, which its
  # paired comparisons set side by side, run on one machine even when a study is split
  # across sessions or machines.
  def recorded(s: int, a: Arm) -> bool:
    path = record_path(results, a.name, s)
    return path.exists() and "code" in json.loads(path.read_text())

  items = [(s, a) for s in range(seeds) for a in chosen]
  pending = [item for item in items if not recorded(*item)]
  for s, a in items:
    existed = (s, a) not in pending
    if not existed and deadline_s is not None:
      elapsed, longest = time.monotonic() - began, max(walls, default=0.0)
      if elapsed + longest > deadline_s:
        left.append(f"{a.name} seed {s}")
        log(
            f"{study.name}: {a.name} seed {s} left for the next call ({elapsed:.0f} s "
            f"elapsed, runs take up to {longest:.0f} s here, deadline {deadline_s:.0f} s)"
        )
        continue
    # A recorded arm-seed is read (its run directory need not exist): only a pending one is
    # claimed.
    held = contextlib.nullcontext(True) if existed else claim(run_dir(workdir, a.name, s))
    with held as mine:
      if not mine:
        log(f"{study.name}: {a.name} seed {s} is being trained by another process: left to it")
        continue
      try:
        record = ensure_record(a, s, workdir, results, extra, study.analyses, train, log)
      except RunFailed as e:
        failed.append(str(e))
        log(f"{study.name}: {e}")
        write_failure(run_dir(workdir, a.name, s), str(e))
        continue
    if not existed:
      if record.get("wall_s"):
        walls.append(record["wall_s"])
      shown = ", ".join(
          f"{m} {record['metrics'][m]:.{metric_digits(m)}f}"
          for m in study.metrics
          if m in record["metrics"]
      )
      log(f"{study.name}: {a.name} seed {s}: {shown}")
      write_outputs(study, read_records(study, seeds, results, extra), results)
  records = read_records(study, seeds, results, extra)
  write_outputs(study, records, results)
  return {**summarise(study, records), "failed": failed, "left": left}
