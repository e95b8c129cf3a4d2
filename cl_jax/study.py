"""Run a study: its arms times seeds, then the tables, the plot and, for a claim, the verdict.

python -m cl_jax.study --study=NAME[,NAME...]|claims [--seeds=5] [--workdir=runs/studies]
    [--results=results/studies] [--arms=ARM,...] [--set=FIELD=VALUE ...] [--report_only]
    [--rerun_crossed] [--launcher=local] [--workers=N] [--deadline_s=S]
python -m cl_jax.study --study=... --launcher=slurm [--slurm_partition=P] [--slurm_account=A]
    [--slurm_qos=Q] [--slurm_time_min=60] [--slurm_cpus_per_task=1] [--slurm_gpus_per_task=0]
    [--slurm_mem=16G] [--slurm_array_parallelism=256] [--dry_run]
python -m cl_jax.study --study=... --status
python -m cl_jax.study --list

Run from anywhere (relative config paths resolve against the repository). Studies: the
papers' claims (cl_jax/studies/, "claims" runs them all), "looc_rotation_setting" (where
Trifeature's rotation can be read, for LooC's claim), "suppression" (Robinson et al. Figs. 3
and 6) and "recipe_check" (every quick default beside random init). Each run is
cl_jax.main in <workdir>/<arm>/seed<s>; what it measured is kept in
<results>/runs/<arm>/seed<s>.json, small files meant to be committed: a seed with a record is
read, not retrained, an interrupted run resumes, and a record or run whose config differs from
the arm's is refused (cl_jax.analysis.study). Outputs, rewritten after every new record:
<results>/<study>.md (per arm the mean and 95% t-interval over seeds of each metric, the
comparisons with their intervals and verdicts), <study>.json and <study>.png; with several
claims, <results>/claims.md, one row per claim with its verdict, its short form for the
README, <results>/verdicts.md, and <results>/quick_runs.md, one row per record of a quick
default (cl_jax.studies.recipe).

Arms run seed-major (every arm of seed 0, then of seed 1, ...), so that the arms a paired
comparison sets side by side run on one machine. A comparison whose members ran on different
processors or devices is marked in the tables; --rerun_crossed sets aside the records of those
members that ran elsewhere (under <results>/replaced/, their runs under <workdir>/replaced/) and
trains them again on this machine: run it from a worktree of the records' commit, so that the
new records pair with the old ones.

Launchers (cl_jax.analysis.study_launch). --launcher=local (the default) trains here;
--workers=N as N worker processes, each pinned to its share of this process's cores (and of the
GPUs where there are N or more; else each with 1/N of their memory), each taking the next pending
arm-seed that no other process holds (a lock per run directory, which a killed worker does not
leave held); the outputs are rebuilt from the records at the end. --launcher=slurm submits the
pending arm-seeds as one SLURM job array through submitit, one task per arm-seed, with the
--slurm_* options (--dry_run prints the sbatch script and submits nothing); a task stopped by
SLURM's warning signal or a preemption saves a checkpoint, is requeued and resumes. Run
--report_only when the array has ended. --status lists each arm-seed as done, running, failed
(with its error and its log's last line) or pending, from the records, the run directories and
the scheduler. --deadline_s=S starts no run that would end more than S seconds after the study
began (by the longest run of its records on this machine): the rest wait for the next call, so
that a fixed-length session on a device ends with whole records.

--set applies FIELD=VALUE (a Python literal, else a string) to every arm, e.g. a smaller model
for a smoke test; such runs need their own --workdir and --results. --report_only rebuilds the
outputs from the records without training.

Ctrl-C or SIGTERM (a scheduler's preemption) is passed on to the run in progress, which stops at
the end of its step with a checkpoint; the study then ends with that run's exit status
(130 Ctrl-C, 143 SIGTERM) and the same command resumes it.
"""

import ast
import sys
import time

from absl import app, flags, logging
from etils import epath

from cl_jax.analysis import study as study_lib
from cl_jax.analysis import study_launch, study_runs, study_summary
from cl_jax.runtime import cli, metrics
from cl_jax.runtime.errors import UsageError

_STUDY = flags.DEFINE_list("study", None, "Studies to run (see --list), or 'claims'.")
_LIST = flags.DEFINE_bool("list", False, "List the studies with their arms and stop.")
_SEEDS = flags.DEFINE_integer("seeds", 5, "Seeds per arm (0 .. seeds - 1).", lower_bound=1)
_WORKDIR = flags.DEFINE_string("workdir", "runs/studies", "Root of the run directories.")
_RESULTS = flags.DEFINE_string(
    "results", "results/studies", "Root of the per-run records and the tables."
)
_ARMS = flags.DEFINE_list("arms", None, "Train only these arms (default: all of the study's).")
_SET = flags.DEFINE_multi_string("set", [], "FIELD=VALUE for every arm's config.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Rebuild the outputs; train nothing.")
_RERUN_CROSSED = flags.DEFINE_bool(
    "rerun_crossed",
    False,
    "Retrain, on this machine, the members of paired comparisons that ran on another machine "
    "than their partners (run it from the records' commit).",
)


_LAUNCHER = flags.DEFINE_enum(
    "launcher", "local", study_launch.LAUNCHERS, "Where the runs train: here, or a SLURM array."
)
_WORKERS = flags.DEFINE_integer(
    "workers",
    1,
    "--launcher=local: runs at once, as N worker processes pinned to shares of the cores (and "
    "GPUs), each taking the next pending arm-seed that no other process holds.",
    lower_bound=1,
)
_WORKER_CORES = flags.DEFINE_list(
    "worker_cores", None, "The cores of one local worker (set by --workers)."
)
_STATUS = flags.DEFINE_bool("status", False, "List each arm-seed's state and stop.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "--launcher=slurm: print the sbatch script; submit nothing."
)
# --slurm_<field>: each field of study_launch.SlurmOptions.
_SLURM = {
    "partition": flags.DEFINE_string("slurm_partition", None, "SLURM partition."),
    "account": flags.DEFINE_string("slurm_account", None, "SLURM account."),
    "qos": flags.DEFINE_string("slurm_qos", None, "SLURM quality of service."),
    "time_min": flags.DEFINE_integer(
        "slurm_time_min", 60, "Time limit of each task in minutes.", lower_bound=1
    ),
    "cpus_per_task": flags.DEFINE_integer(
        "slurm_cpus_per_task", 1, "CPUs per task.", lower_bound=1
    ),
    "gpus_per_task": flags.DEFINE_integer(
        "slurm_gpus_per_task", 0, "GPUs per task.", lower_bound=0
    ),
    "mem": flags.DEFINE_string("slurm_mem", None, "Memory per task, e.g. 16G."),
    "array_parallelism": flags.DEFINE_integer(
        "slurm_array_parallelism", 256, "Tasks of the array running at once.", lower_bound=1
    ),
}
_DEADLINE = flags.DEFINE_float(
    "deadline_s",
    None,
    "Start no run that would end later than this many seconds after the study began (by the "
    "longest run of its records on this machine); the rest wait for the next call.",
)


def run_workers(n: int) -> list[str]:
  """This command's study as n local worker processes (study_launch.local_worker_commands, the
  other flags as given); returns one line per worker that failed (its runs' errors are in its
  output above). A stop signal is passed on to every worker and ends the study."""
  argv = [a for a in sys.argv[1:] if not a.startswith(("--workers", "--noworkers"))]
  cmds, envs = study_launch.local_worker_commands(argv, n)
  try:
    codes = study_runs.run_children(cmds, envs)
  except study_runs.StudyStopped as e:
    print(e, file=sys.stderr)
    sys.exit(e.code)
  return [f"worker {i} of {n} ended with status {c}" for i, c in enumerate(codes) if c]


def slurm_options() -> study_launch.SlurmOptions:
  return study_launch.SlurmOptions(**{field: flag.value for field, flag in _SLURM.items()})


def launch_slurm(studies: list, extra: tuple) -> None:
  """--launcher=slurm: each study's pending arm-seeds (no record, no live claim) as one job
  array, or with --dry_run its sbatch script."""
  for s in studies:
    study_lib.read_records(s, _SEEDS.value, _RESULTS.value, extra)  # refuse a changed arm first
    items = [
        (seed, a)
        for seed, a in study_launch.arm_seeds(s, _SEEDS.value, _ARMS.value)
        if not study_launch.recorded(_RESULTS.value, a.name, seed)
        and not study_runs.is_claimed(study_lib.run_dir(_WORKDIR.value, a.name, seed))
    ]
    if not items:
      print(f"{s.name}: no pending arm-seed")
      continue
    if _DRY_RUN.value:
      print(f"{s.name}: {len(items)} tasks: {', '.join(f'{a.name} seed {n}' for n, a in items)}")
      print(study_launch.sbatch_script(s.name, _WORKDIR.value, slurm_options(), len(items)))
      continue
    jobs = study_launch.submit_slurm(
        s, items, _WORKDIR.value, _RESULTS.value, extra, slurm_options()
    )
    print(f"{s.name}: submitted {len(jobs)} tasks as SLURM array {jobs[0]['job_id'].split('_')[0]}")
  print(
      "follow them with --status; when they have ended, --report_only writes the tables "
      f"(logs under {study_launch.slurm_folder(_WORKDIR.value, '<study>')})"
  )


def parse_set(items: list[str]) -> tuple[tuple[str, object], ...]:
  """("field", value) pairs of --set FIELD=VALUE (VALUE a Python literal, else a string)."""
  out = []
  for item in items:
    field, eq, text = item.partition("=")
    if not eq or not field:
      raise UsageError(f"--set={item}: give FIELD=VALUE, e.g. --set=optim.epochs=4")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    out.append((field, value))
  return tuple(out)


def chosen(names: list[str] | None) -> list:
  """The studies named (or every claim for "claims")."""
  from cl_jax.studies import CLAIMS, STUDIES

  if not names:
    raise UsageError(f"give --study=NAME; studies: claims, {', '.join(STUDIES)}")
  out = []
  for n in names:
    if n == "claims":
      out.extend(CLAIMS)
    elif n in STUDIES:
      out.append(STUDIES[n])
    else:
      raise UsageError(f"no study {n!r}; studies: claims, {', '.join(STUDIES)}")
  return out


def verdict_line(summary: dict) -> str:
  return f"{summary['study']}: {summary['verdict'] or 'no expectation'} ({summary['where']})"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; see --help")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  start = time.perf_counter()
  with cli.report():
    if _LIST.value:
      from cl_jax.studies import STUDIES

      for s in STUDIES.values():
        print(f"{s.name}: {s.title}\n  arms: {', '.join(a.name for a in s.arms)}")
      return
    extra = parse_set(_SET.value)
    studies, summaries, workers_failed = chosen(_STUDY.value), [], []
    if _STATUS.value:
      for s in studies:
        rows = study_launch.status(s, _SEEDS.value, _WORKDIR.value, _RESULTS.value, _ARMS.value)
        print(study_launch.status_table(s.name, rows))
      return
    if _LAUNCHER.value == "slurm" and not _REPORT_ONLY.value:
      launch_slurm(studies, extra)
      return
    if _WORKER_CORES.value:
      study_launch.pin([int(c) for c in _WORKER_CORES.value])
    elif _WORKERS.value > 1 and not _REPORT_ONLY.value:
      workers_failed = run_workers(_WORKERS.value)  # then the tables, from their records
    if _REPORT_ONLY.value:
      found = [study_lib.read_records(s, _SEEDS.value, _RESULTS.value, extra) for s in studies]
      if not any(found):
        raise UsageError(
            f"--report_only: no records of {','.join(_STUDY.value)} under {_RESULTS.value}/runs; "
            "train the study first (without --report_only), or give the --results that "
            "holds its records"
        )
    for s in studies:
      if _REPORT_ONLY.value or _WORKERS.value > 1:
        records = study_lib.read_records(s, _SEEDS.value, _RESULTS.value, extra)
        study_lib.write_outputs(s, records, _RESULTS.value)
        summary = study_summary.summarise(s, records)
      else:
        try:
          summary = study_lib.run(
              s,
              _SEEDS.value,
              _WORKDIR.value,
              _RESULTS.value,
              extra,
              _ARMS.value,
              rerun_crossed=_RERUN_CROSSED.value,
              deadline_s=_DEADLINE.value,
          )
        except study_runs.StudyStopped as e:
          print(e, file=sys.stderr)
          sys.exit(e.code)
      print("\n" + study_summary.markdown(s, summary))
      summaries.append(summary)
  claims = [(s, m) for s, m in zip(studies, summaries) if s.is_claim]
  if claims:
    table = study_summary.claims_table(*zip(*claims), _SEEDS.value)
    if len(claims) > 1:
      metrics.write_atomically(epath.Path(_RESULTS.value) / "claims.md", table)
      metrics.write_atomically(
          epath.Path(_RESULTS.value) / "verdicts.md", study_summary.verdicts_table(*zip(*claims))
      )
      from cl_jax.studies import recipe

      quick = study_lib.read_records(recipe.STUDY, _SEEDS.value, _RESULTS.value, extra)
      metrics.write_atomically(
          epath.Path(_RESULTS.value) / "quick_runs.md", recipe.markdown_table(recipe.STUDY, quick)
      )
    print("Verdicts:\n" + "\n".join("  " + verdict_line(m) for _, m in claims))
  print(f"study wall time {time.perf_counter() - start:.0f} s")
  left = [line for m in summaries for line in m.get("left", ())]
  if left:
    print(f"left for the next call (--deadline_s): {', '.join(left)}")
  failed = [line for m in summaries for line in m.get("failed", ())] + workers_failed
  if failed:
    sys.exit(
        "runs that failed (their logs are above; the rest of the study went on):\n  "
        + "\n  ".join(failed)
    )


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
