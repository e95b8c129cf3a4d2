"""Summarises a profiled test run (tests/suite_profile.py): seconds by test file and by kind of
work, how much of it is compilation, and the persistent compilation cache's hits and misses.

  CL_JAX_SUITE_PROFILE=/tmp/prof python -m pytest -q tests
  python -m tests.suite_report /tmp/prof

Kinds (each test gets the first that applies): "multi-process run" (it started cl_jax.main as
several processes joined by a coordinator), "subprocess: cl_jax.main", "subprocess: other
command" (another cl_jax module, a launch script's Python, a ``python -c`` child), "in-process
JAX" (it compiled at least one function in the test process) and "Python only". A test's
seconds are its setup + call + teardown; setup is also shown apart, as the fixtures' share.
Compilation seconds are JAX's own timers (tracing, lowering, XLA compilation or a cache read).
"""

import collections
import glob
import json
import os
import sys

KINDS = (
    "multi-process run",
    "subprocess: cl_jax.main",
    "subprocess: other command",
    "in-process JAX",
    "Python only",
)
COMPILE_KEYS = ("compile_s", "trace_s", "lower_s")


def command_of(argv: list[str]) -> str:
  """A subprocess's command as a short name: the cl_jax module, a script's name, or "-c"."""
  if not argv:
    return "?"
  first = argv[0]
  if first in ("-c", "-m"):
    return first
  parts = first.replace(os.sep, "/").split("/")
  if "cl_jax" in parts:
    module = parts[parts.index("cl_jax") :]
    return ".".join(module)[: -len(".py")] if first.endswith(".py") else ".".join(module)
  return parts[-1]


def kind_of(test: dict, procs: list[dict]) -> str:
  """The test's kind (see the module docstring)."""
  commands = [command_of(p["argv"]) for p in procs]
  if any(
      c == "cl_jax.main" and any(a.startswith("--num_processes=") for a in p["argv"])
      for c, p in zip(commands, procs)
  ):
    return KINDS[0]
  if "cl_jax.main" in commands:
    return KINDS[1]
  if procs:
    return KINDS[2]
  if test.get("requests", 0) > 0:
    return KINDS[3]
  return KINDS[4]


def load(out_dir: str) -> tuple[list[dict], dict[str, list[dict]]]:
  """The per-test records and, per test id, the records of the subprocesses it started."""
  with open(os.path.join(out_dir, "tests.jsonl")) as f:
    tests = [json.loads(line) for line in f if line.strip()]
  procs = collections.defaultdict(list)
  for path in glob.glob(os.path.join(out_dir, "proc", "*.json")):
    with open(path) as f:
      record = json.load(f)
    procs[record["test"]].append(record)
  return tests, procs


def seconds(test: dict) -> float:
  return sum(test.get(phase, 0.0) for phase in ("setup", "call", "teardown"))


def summarise(tests: list[dict], procs: dict[str, list[dict]], key) -> list[dict]:
  """One row per key(test, its subprocesses), biggest total first."""
  rows = {}
  for test in tests:
    own = procs.get(test["test"], [])
    name = key(test, own)
    row = rows.setdefault(
        name,
        collections.Counter(),
    )
    row["tests"] += 1
    row["seconds"] += seconds(test)
    row["setup"] += test.get("setup", 0.0)
    row["compile"] += sum(test.get(k, 0.0) for k in COMPILE_KEYS)
    row["subprocesses"] += len(own)
    row["subprocess compile"] += sum(p.get(k, 0.0) for p in own for k in COMPILE_KEYS)
    for where, records in (("in-process", [test]), ("subprocess", own)):
      for k in ("requests", "hits", "writes"):
        row[f"{where} {k}"] += sum(r.get(k, 0) for r in records)
  return sorted(({"name": name, **row} for name, row in rows.items()), key=lambda r: -r["seconds"])


def table(rows: list[dict], title: str) -> str:
  """A markdown table of summarise()'s rows with a total row."""
  cols = [
      ("tests", "tests", "{:.0f}"),
      ("seconds", "s", "{:.0f}"),
      ("setup", "fixture setup s", "{:.0f}"),
      ("compile", "in-process compile s", "{:.0f}"),
      ("subprocesses", "subprocesses", "{:.0f}"),
      ("subprocess compile", "subprocess compile s", "{:.0f}"),
      ("in-process requests", "in-process cache requests", "{:.0f}"),
      ("in-process hits", "hits", "{:.0f}"),
      ("subprocess requests", "subprocess cache requests", "{:.0f}"),
      ("subprocess hits", "hits", "{:.0f}"),
  ]
  total = collections.Counter()
  for row in rows:
    total.update({k: row.get(k, 0) for k, _, _ in cols})
  lines = [
      f"| {title} | " + " | ".join(head for _, head, _ in cols) + " |",
      "|---|" + "---:|" * len(cols),
  ]
  for row in [*rows, {"name": "**total**", **total}]:
    lines.append(
        f"| {row['name']} | " + " | ".join(fmt.format(row.get(k, 0)) for k, _, fmt in cols) + " |"
    )
  return "\n".join(lines)


def commands(procs: dict[str, list[dict]]) -> str:
  """A markdown table of the subprocesses by command: count, wall seconds, compilation."""
  rows = collections.defaultdict(collections.Counter)
  for records in procs.values():
    for p in records:
      row = rows[command_of(p["argv"])]
      row["n"] += 1
      row["wall"] += p["wall_s"]
      row["compile"] += sum(p.get(k, 0.0) for k in COMPILE_KEYS)
      for k in ("requests", "hits", "writes"):
        row[k] += p.get(k, 0)
  lines = [
      "| command | processes | wall s | compile s | cache requests | hits | writes |",
      "|---|---:|---:|---:|---:|---:|---:|",
  ]
  for name, row in sorted(rows.items(), key=lambda kv: -kv[1]["wall"]):
    lines.append(
        f"| {name} | {row['n']} | {row['wall']:.0f} | {row['compile']:.0f} | {row['requests']}"
        f" | {row['hits']} | {row['writes']} |"
    )
  return "\n".join(lines)


def report(out_dir: str) -> str:
  tests, procs = load(out_dir)
  by_file = summarise(tests, procs, lambda t, p: t["test"].split("::")[0])
  by_kind = summarise(tests, procs, kind_of)
  slowest = sorted(tests, key=seconds, reverse=True)[:25]
  lines = [
      table(by_kind, "kind"),
      "",
      table(by_file, "file"),
      "",
      commands(procs),
      "",
      "| slowest tests | s | setup s | subprocesses |",
      "|---|---:|---:|---:|",
  ]
  for t in slowest:
    lines.append(
        f"| {t['test']} | {seconds(t):.0f} | {t.get('setup', 0):.0f} |"
        f" {len(procs.get(t['test'], []))} |"
    )
  return "\n".join(lines)


if __name__ == "__main__":
  print(report(sys.argv[1]))
