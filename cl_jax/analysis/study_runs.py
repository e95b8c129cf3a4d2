"""Running a study's arm at a seed (cl_jax.analysis.study): cl_jax.main's pretraining and fast
probe, then the arm's analyses, each in a process of its own, and the record that is read when it
exists, else trained (or resumed, or only analysed) and written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from etils import epath

from cl_jax.analysis import fingerprint
from cl_jax.analysis.study_records import (
    arm_config,
    collect,
    config_differences,
    main_flags,
    plain_config,
    probe_report,
    record_path,
    refuse_changed,
    run_dir,
    total_steps,
)
from cl_jax.runtime import metrics, run_config
from cl_jax.runtime.errors import UsageError

if TYPE_CHECKING:
  from cl_jax.analysis.study import Arm

NORMSTD_FLAGS = ("--images=256", "--crop_scale=0.08,1")


class RunFailed(UsageError):
  """A run of the study (its training, probe or analysis) ended with an error."""


class StudyStopped(Exception):
  """The runner was asked to stop (Ctrl-C, SIGTERM) while a run's process worked; that process
  got the signal, saved what it had (cl_jax.main: a checkpoint) and ended. `code` is the exit
  status to end the study with: the child's, else 128 + the signal's number."""

  def __init__(self, message: str, code: int):
    super().__init__(message)
    self.code = code


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_child(cmd: list[str]) -> int:
  """Run `cmd` and return its exit status (run_children with one command)."""
  return run_children([cmd])[0]


def run_children(cmds: list[list[str]], env: dict | None = None) -> list[int]:
  """Run the commands `cmds` at once (with environment `env`, by default this process's) and
  return their exit statuses. Each child has its own process group, so a terminal's Ctrl-C
  reaches this process only; while they run, SIGINT and SIGTERM sent here are passed on to every
  child (cl_jax.main then stops at the end of its step with a checkpoint) and the wait goes on
  until all have ended. Raises StudyStopped after such a signal."""
  received, pending, children = [], [], []  # pending: came before the children started

  def forward(signum, frame):
    del frame
    received.append(signum)
    if children:
      for child in children:
        child.send_signal(signum)
    else:
      pending.append(signum)

  previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
  try:
    children.extend(subprocess.Popen(cmd, process_group=0, env=env) for cmd in cmds)
    while pending:
      signum = pending.pop(0)
      for child in children:
        child.send_signal(signum)
    codes = [child.wait() for child in children]
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  if received:
    name = signal.Signals(received[0]).name
    shown = "; ".join(" ".join(cmd[1:]) for cmd in cmds)
    worst = max(codes, key=lambda c: c if c > 0 else 128 + (-c or received[0]))
    raise StudyStopped(
        f"study stopped by {name}: {shown} ended with status {', '.join(map(str, codes))}; run "
        "the same command again to resume",
        worst if worst > 0 else 128 + (-worst or received[0]),
    )
  return codes


def same_source(arm_: Arm, seed: int, directory: epath.Path) -> None:
  """Store the source digest (cl_jax.analysis.fingerprint) in a run directory that has none
  yet, before its run starts; raise RunFailed when it holds another digest (the run started
  under other code, and a resumed run would mix two code versions)."""
  now = fingerprint.source_digest()
  path = directory / fingerprint.SOURCE_FILE
  if path.exists():
    started = json.loads(path.read_text())
    if started["sha256"] != now["sha256"]:
      raise RunFailed(
          f"arm {arm_.name} seed {seed}: {directory} started under other code "
          f"({started['commit']}, now {now['commit']}); delete it to train the run again"
      )
    return
  if (directory / "config.json").exists():
    raise RunFailed(
        f"arm {arm_.name} seed {seed}: {directory} holds a run started without a record of its "
        "code; delete it to train the run again"
    )
  directory.mkdir(parents=True, exist_ok=True)
  metrics.write_atomically(path, json.dumps(now, indent=1))


def train_subprocess(
    arm_: Arm, seed: int, extra, directory: epath.Path, analyses=()
) -> float | None:
  """Pretrain and probe (or resume) with cl_jax.main unless the final probe report exists,
  then the `analyses` (study.ANALYSES) not yet done and the code fingerprint
  (cl_jax.analysis.fingerprint), each in a process of its own (run_child); a command that fails
  raises RunFailed naming it, a stop signal StudyStopped. Returns cl_jax.main's
  wall time (None if it did not run): start-up, compilation, training and the probe; a resumed
  run's time counts only the part after the resume."""
  where = os.path.abspath(str(directory)) if "://" not in str(directory) else str(directory)
  main = [sys.executable, "-m", "cl_jax.main", *main_flags(arm_, seed, extra)]
  step = total_steps(arm_config(arm_, seed, extra))
  commands = [] if probe_report(epath.Path(where), step) else [main + [f"--workdir={where}"]]
  if (
      "normstd" in analyses
      and not (epath.Path(where) / "normstd" / f"normstd_step{step}.json").exists()
  ):
    commands.append(
        [sys.executable, "-m", "cl_jax.analysis.normstd", f"--workdir={where}", *NORMSTD_FLAGS]
    )
  if not (epath.Path(where) / fingerprint.FILE).exists():
    commands.append([sys.executable, "-m", "cl_jax.analysis.fingerprint", f"--workdir={where}"])
  wall_s = None
  for cmd in commands:
    start = time.perf_counter()
    if run_child(cmd) != 0:
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
  trained (or resumed, or only analysed) and written, under the source its run started with
  (same_source). A record without a code fingerprint (older code) is trained again."""
  config = arm_config(arm_, seed, extra)
  path = record_path(results, arm_.name, seed)
  record = None
  if path.exists():
    record = json.loads(path.read_text())
    refuse_changed(arm_, seed, str(path), config_differences(record["config"], config))
    if "code" not in record:
      log(f"{path} was written by older code (no fingerprint): training it again")
      record = None
    elif set(analyses) <= set(record["analyses"]):
      return record
  directory = run_dir(workdir, arm_.name, seed)
  if (directory / "config.json").exists():
    stored = plain_config(run_config.read(str(directory)))
    refuse_changed(arm_, seed, str(directory), config_differences(stored, config))
  elif record is not None:
    raise UsageError(
        f"{path} lacks the analyses {sorted(set(analyses) - set(record['analyses']))} and its "
        f"run {directory} is gone; delete the record to train the run again"
    )
  same_source(arm_, seed, directory)
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
