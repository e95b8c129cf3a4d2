"""One writer per workdir: the trainer holds an OS lock on <workdir>/writer.lock.

A training run takes the lock before it writes anything and keeps it until it
ends, so a second trainer on the same workdir (a requeued job while the old one
still runs, a repeated launch) stops at once with one line naming the holder.
The lock is `flock` on an open file: the kernel drops it when the holder exits,
however it ends (kill -9 included), so a holder that died never blocks a new
run. The file keeps the holder's host, pid and start time; a new run that finds
it non-empty (the holder ended without releasing it) takes the lock over with a
warning naming the old holder. On NFS, Linux implements flock with NFS byte-range
locks, so the lock holds across hosts; a host that dies holding it releases it
when its NFS lease expires (about 90 s on NFSv4).

Object stores (gs://) have no lock that a process's death releases, so a URL
workdir is not locked: the trainer says so once at start. Only one job at a time
may write there; `launch/slurm_gpu.sh` serialises jobs of one name
(--dependency=singleton) for that reason.

Read-only jobs (probe, kNN, evaluate, export, viz) take no lock; `holder` tells
them that the run they read is still training.
"""

import contextlib
import datetime
import errno
import fcntl
import os
import socket
import sys

import jax
import numpy as np

from cl_jax.runtime.errors import UsageError

LOCK_FILE = "writer.lock"


class WorkdirLocked(UsageError):
  """Another live process holds the workdir's writer lock."""


def is_url(workdir: str) -> bool:
  """Whether `workdir` is an object-store URL (gs://...), which is not locked."""
  return "://" in str(workdir)


def _describe(record: str) -> str:
  """'pid P on host H since T' from the lock file's one-line record (or the raw text)."""
  fields = dict(part.split("=", 1) for part in record.split() if "=" in part)
  if {"host", "pid", "since"} <= set(fields):
    return f"pid {fields['pid']} on host {fields['host']} since {fields['since']}"
  return record.strip() or "an unknown process"


def _record() -> str:
  """This process's one-line lock record."""
  since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
  return f"host={socket.gethostname()} pid={os.getpid()} since={since}\n"


def holder(workdir: str) -> str | None:
  """'pid P on host H since T' of the live trainer holding `workdir`'s lock, or None (no
  lock file, nobody holds it, or a URL workdir). Takes no lock itself."""
  path = os.path.join(str(workdir), LOCK_FILE)
  if is_url(workdir) or not os.path.exists(path):
    return None
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except OSError:
    with open(path, encoding="utf-8", errors="replace") as f:
      return _describe(f.read())
  else:
    fcntl.flock(fd, fcntl.LOCK_UN)
    return None
  finally:
    os.close(fd)


def _acquire(workdir: str) -> tuple[int | None, str | None, str | None]:
  """(file descriptor holding the lock or None, the refusal message or None, the previous
  holder's description if it ended without releasing the lock, else None)."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    os.close(fd)
    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      raise
    with open(path, encoding="utf-8", errors="replace") as f:
      who = _describe(f.read())
    return (
        None,
        (
            f"{workdir} is in use by another training run ({who}); wait for it to end or stop "
            f"it, or give another --workdir"
        ),
        None,
    )
  previous = os.pread(fd, 4096, 0).decode("utf-8", errors="replace")
  os.ftruncate(fd, 0)
  os.pwrite(fd, _record().encode(), 0)
  os.fsync(fd)
  return fd, None, (_describe(previous) if previous.strip() else None)


def _release(fd: int) -> None:
  """Empty the record (a clean end) and drop the lock."""
  try:
    os.ftruncate(fd, 0)
  except OSError:  # a full or read-only disk: the kernel still drops the lock below
    pass
  fcntl.flock(fd, fcntl.LOCK_UN)
  os.close(fd)


def _agree(message: str | None) -> str | None:
  """Process 0's refusal message on every process (None when process 0 got the lock)."""
  if jax.process_count() == 1:
    return message
  from jax.experimental import multihost_utils

  refused = multihost_utils.broadcast_one_to_all(np.asarray(message is not None))
  if not bool(refused):
    return None
  return message or "another training run holds this workdir's lock (see process 0's error)"


@contextlib.contextmanager
def hold(workdir: str, warn=lambda line: print(line, file=sys.stderr)):
  """Hold `workdir`'s writer lock inside the block (process 0 takes it; every process
  stops with the same WorkdirLocked when it is refused).

  Args:
    workdir: the run directory (created if missing); a URL is not locked.
    warn: called with one line when the lock is taken over from a holder that ended
      without releasing it, or once for a URL workdir.
  """
  workdir = str(workdir)
  lead = jax.process_index() == 0
  if is_url(workdir):
    if lead:
      warn(
          f"{workdir} is an object store: it is not locked against a second trainer "
          "(no lock there ends with its holder); run one job per workdir"
      )
    yield
    return
  fd, refused, previous = _acquire(workdir) if lead else (None, None, None)
  refused = _agree(refused)
  if refused is not None:
    if fd is not None:
      _release(fd)
    raise WorkdirLocked(refused)
  if previous is not None:
    warn(
        f"took over the writer lock of {workdir} from {previous}, which ended without "
        "releasing it"
    )
  try:
    yield
  finally:
    if fd is not None:
      _release(fd)


def note_if_training(workdir: str, step: int | None = None) -> None:
  """Print one line on stderr when a trainer still holds `workdir`: a read-only job then
  reads checkpoint `step`, or the newest finished one (None); nothing otherwise."""
  who = holder(workdir)
  if who is not None and jax.process_index() == 0:
    which = "its newest finished checkpoint" if step is None else f"its checkpoint {step}"
    print(
        f"note: the run in {workdir} is still training ({who}); reading {which}",
        file=sys.stderr,
    )
