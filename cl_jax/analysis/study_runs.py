"""Running a study's arm at a seed (cl_jax.analysis.study): cl_jax.main's pretraining and fast
probe, then the arm's analyses, each in a process of its own, and the record that is read when it
exists, else trained (or resumed, or only analysed) and written.

Several processes may work on one study at once (cl_jax.study's local workers, a SLURM job
array, two sessions): `claim` gives one of them a run directory at a time, by an OS lock that
the kernel drops when its holder dies, however it ends; a run that fails leaves FAILED_FILE (its
error and the last line of its log) beside its run, and every command's output is kept in
LOG_FILE there as well as shown.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

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
from cl_jax.analysis.study_types import Arm
from cl_jax.runtime import metrics, run_config
from cl_jax.runtime.errors import UsageError

NORMSTD_FLAGS = ("--images=256", "--crop_scale=0.08,1")
LOCK_FILE = "study.lock"  # in a run directory: held while a process trains it (claim)
FAILED_FILE = "failed.json"  # in a run directory: the last attempt's error (write_failure)
LOG_FILE = "study.log"  # in a run directory: the output of its commands, appended
# cl_jax.main's --stop_signal for the runs of this process (a SLURM task's warning signal).
STOP_SIGNAL_ENV = "CL_JAX_STUDY_STOP_SIGNAL"
# The claim's lock file descriptor, inherited by the commands a run starts, so that the claim
# lasts as long as any of them (a trainer still saving after its parent was killed).
_held_fds: list[int] = []


@contextlib.contextmanager
def claim(directory: epath.Path, wait_s: float = 0.0) -> Iterator[bool]:
  """Yields whether this process holds the run directory's study lock (LOCK_FILE, flock), held
  until the block ends (and by the commands it starts, whose descriptor it is); False when
  another live process holds it after waiting up to wait_s seconds. A URL directory (gs://)
  has no such lock: always True."""
  if "://" in str(directory):
    yield True
    return
  os.makedirs(str(directory), exist_ok=True)
  fd = os.open(os.path.join(str(directory), LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    deadline = time.monotonic() + wait_s
    while True:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except BlockingIOError:
        if time.monotonic() >= deadline:
          yield False
          return
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    _held_fds.append(fd)
    try:
      yield True
    finally:
      _held_fds.remove(fd)
      fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)


def is_claimed(directory: epath.Path) -> bool:
  """Whether a live process holds the run directory's study lock (claim)."""
  path = os.path.join(str(directory), LOCK_FILE)
  if "://" in str(directory) or not os.path.exists(path):
    return False
  fd = os.open(path, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
  except BlockingIOError:
    return True
  finally:
    os.close(fd)


def last_line(path: str) -> str:
  """The last non-empty line of the text file `path` ("" when there is none)."""
  try:
    with open(path, "rb") as f:
      f.seek(max(0, os.path.getsize(path) - 8192))
      lines = [x for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
  except OSError:
    return ""
  return lines[-1].strip() if lines else ""


def write_failure(directory: epath.Path, error: str) -> None:
  """FAILED_FILE in the run directory: the error and its log's last line."""
  log = os.path.join(str(directory), LOG_FILE)
  record = {"error": error, "log": log, "last_line": last_line(log), "time": time.time()}
  metrics.write_atomically(epath.Path(directory) / FAILED_FILE, json.dumps(record, indent=1))


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


def forwarded_signals() -> tuple[int, ...]:
  """The signals run_children passes on: SIGINT, SIGTERM and a scheduler's warning signal
  (STOP_SIGNAL_ENV, a SLURM task's), which the children's cl_jax.main stops on."""
  name = os.environ.get(STOP_SIGNAL_ENV)
  extra = getattr(signal, f"SIG{name}") if name else None
  return FORWARDED_SIGNALS + ((extra,) if extra and extra not in FORWARDED_SIGNALS else ())


def run_child(cmd: list[str], log: str | None = None) -> int:
  """Run `cmd` and return its exit status (run_children with one command); with `log`, its
  output is appended to that file as well as shown."""
  return run_children([cmd], logs=None if log is None else [log])[0]


def _tee(stream, out, path: str) -> threading.Thread:
  """A thread copying the pipe `stream` to the text stream `out` (this process's stdout or
  stderr) and to the file `path`, line by line."""

  def copy():
    with open(path, "ab") as f:
      for line in iter(stream.readline, b""):
        out.buffer.write(line)
        out.flush()
        f.write(line)
        f.flush()
    stream.close()

  thread = threading.Thread(target=copy, daemon=True)
  thread.start()
  return thread


def run_children(
    cmds: list[list[str]],
    env: dict | list[dict] | None = None,
    logs: list[str | None] | None = None,
) -> list[int]:
  """Run the commands `cmds` at once (with environment `env`, by default this process's; a list: one
  per command) and return their exit statuses. Each child has its own process group, so a terminal's
  Ctrl-C reaches this process only; while they run, SIGINT, SIGTERM and a scheduler's warning
  signal (forwarded_signals) sent here are passed on to every child (cl_jax.main then stops at the
  end of its step with a checkpoint) and the wait goes on until all have ended, whatever this
  process's own handler of that signal would have done. Raises StudyStopped after such a signal.
  logs[i], where given: a file that command i's output (stdout and stderr) is appended to, as well
  as shown. The children inherit the run directory's claim (claim)."""
  received, pending, children = [], [], []  # pending: came before the children started

  def forward(signum, frame):
    del frame
    received.append(signum)
    if children:
      for child in children:
        child.send_signal(signum)
    else:
      pending.append(signum)

  previous = {s: signal.signal(s, forward) for s in forwarded_signals()}
  try:
    tees = []
    envs = env if isinstance(env, list) else [env] * len(cmds)
    for cmd, log, child_env in zip(cmds, logs or [None] * len(cmds), envs):
      child = subprocess.Popen(
          cmd,
          process_group=0,
          env=child_env,
          pass_fds=tuple(_held_fds),
          stdout=None if log is None else subprocess.PIPE,
          stderr=None if log is None else subprocess.PIPE,
      )
      children.append(child)
      if log is not None:
        tees += [_tee(child.stdout, sys.stdout, log), _tee(child.stderr, sys.stderr, log)]
    while pending:
      signum = pending.pop(0)
      for child in children:
        child.send_signal(signum)
    codes = [child.wait() for child in children]
    for thread in tees:
      thread.join()
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
  then the `analyses` (study_types.ANALYSES) not yet done and the code fingerprint
  (cl_jax.analysis.fingerprint), each in a process of its own (run_child); a command that fails
  raises RunFailed naming it, a stop signal StudyStopped. Returns cl_jax.main's
  wall time (None if it did not run): start-up, compilation, training and the probe; a resumed
  run's time counts only the part after the resume."""
  where = os.path.abspath(str(directory)) if "://" not in str(directory) else str(directory)
  main = [sys.executable, "-m", "cl_jax.main", *main_flags(arm_, seed, extra)]
  if os.environ.get(STOP_SIGNAL_ENV):  # a scheduler's warning signal (study_launch's tasks)
    main.append(f"--stop_signal={os.environ[STOP_SIGNAL_ENV]}")
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
  log = None if "://" in where else os.path.join(where, LOG_FILE)
  for cmd in commands:
    start = time.perf_counter()
    if run_child(cmd, log) != 0:
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
  (directory / FAILED_FILE).unlink(missing_ok=True)  # an earlier attempt's
  return record
