"""Run a study: its arms times seeds, then the tables, the plot and, for a claim, the verdict.

python -m cl_jax.study --study=NAME[,NAME...]|claims [--seeds=5] [--workdir=runs/studies]
    [--results=results/studies] [--arms=ARM,...] [--set=FIELD=VALUE ...] [--report_only]
    [--rerun_crossed] [--workers=N] [--deadline_s=S]
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

--workers=N trains N arm-seeds at once, as N processes (on a GPU, each with 1/N of its
memory); --deadline_s=S starts no run that would end more than S seconds after the study began
(by the longest run of its records on this machine): the rest wait for the next call, so that a
fixed-length session on a device ends with whole records.

--set applies FIELD=VALUE (a Python literal, else a string) to every arm, e.g. a smaller model
for a smoke test; such runs need their own --workdir and --results. --report_only rebuilds the
outputs from the records without training.

Ctrl-C or SIGTERM (a scheduler's preemption) is passed on to the run in progress, which stops at
the end of its step with a checkpoint; the study then ends with that run's exit status
(130 Ctrl-C, 143 SIGTERM) and the same command resumes it.
"""

import ast
import os
import sys
import time

from absl import app, flags, logging
from etils import epath

from cl_jax.analysis import study as study_lib
from cl_jax.analysis import study_runs, study_summary
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


_WORKERS = flags.DEFINE_integer(
    "workers",
    1,
    "Runs at once: N worker processes, each training every N-th pending arm-seed in seed-major "
    "order (on a GPU they share it, each with 1/N of its memory).",
    lower_bound=1,
)
_PART = flags.DEFINE_string("part", None, "I/N: train as worker I of N (set by --workers).")
_DEADLINE = flags.DEFINE_float(
    "deadline_s",
    None,
    "Start no run that would end later than this many seconds after the study began (by the "
    "longest run of its records on this machine); the rest wait for the next call.",
)


def parse_part(text: str | None) -> tuple[int, int]:
  """(i, n) of --part=I/N (0 <= I < N); (0, 1) without it."""
  if text is None:
    return 0, 1
  i, slash, n = text.partition("/")
  if not (slash and i.isdigit() and n.isdigit() and int(i) < int(n)):
    raise UsageError(f"--part={text}: give I/N with 0 <= I < N, e.g. --part=0/4")
  return int(i), int(n)


def run_workers(n: int) -> list[str]:
  """This command's study as n worker processes (--part=i/n each, the other flags as given),
  sharing a GPU's memory equally; returns one line per worker that failed (its runs' errors
  are in its output above). A stop signal is passed on to every worker and ends the study."""
  argv = [a for a in sys.argv[1:] if not a.startswith(("--workers", "--noworkers"))]
  cmds = [[sys.executable, "-m", "cl_jax.study", *argv, f"--part={i}/{n}"] for i in range(n)]
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / n:.3f}")
  try:
    codes = study_runs.run_children(cmds, env)
  except study_runs.StudyStopped as e:
    print(e, file=sys.stderr)
    sys.exit(e.code)
  return [f"worker {i} of {n} ended with status {c}" for i, c in enumerate(codes) if c]


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
    studies, summaries = chosen(_STUDY.value), []
    part, workers_failed = parse_part(_PART.value), []
    if _WORKERS.value > 1 and not _REPORT_ONLY.value:
      if _PART.value:
        raise UsageError("give --workers or --part, not both")
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
              part=part,
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
