"""The stall watchdog: a training loop that makes no progress for `train.stall_timeout_s` seconds
(an input pipeline that stopped delivering, a device or a collective that never returns) ends
the process with one line instead of holding its chips until a time limit.

The loop calls `beat(step)` once per step; a daemon thread compares the time since the last
beat with the timeout. The stretches the loop marks `paused()` (compiling, evaluating, starting
a checkpoint save) do not count, so the timeout bounds one step's wall time from the host's view:
its batch, its dispatch and, at a logging step, the wait for the steps queued before it. On a
stall, `on_stall(step, idle_s)` runs on the watchdog's thread (cl_jax.train: write every
thread's stack, print the line, exit with STALL_STATUS).
"""

import contextlib
import faulthandler
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

# The exit status of a stalled run: EX_TEMPFAIL of sysexits.h ("try again later"), apart from 1
# (bad input), 128 + a signal (a stop request) and 0 (finished).
STALL_STATUS = 75


class StallWatchdog:
  """Calls on_stall(last step, seconds since its beat) once, from its own thread, when no beat
  came for more than timeout_s seconds outside paused() stretches; timeout_s 0: never."""

  def __init__(self, timeout_s: float, on_stall: Callable[[int, float], None]):
    self.timeout_s = timeout_s
    self._on_stall = on_stall
    self._last = time.monotonic()
    self._step = 0
    self._paused = 0
    self._done = threading.Event()
    self._thread = None

  def beat(self, step: int) -> None:
    """The loop has finished step `step` (from the host's view) and goes on."""
    self._step, self._last = step, time.monotonic()

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    """Inside, time does not count; the clock restarts at its end."""
    self._paused += 1
    try:
      yield
    finally:
      self._paused -= 1
      self._last = time.monotonic()

  def _watch(self) -> None:
    poll = min(1.0, self.timeout_s / 4)
    while not self._done.wait(poll):
      idle = time.monotonic() - self._last
      if not self._paused and idle > self.timeout_s:
        self._on_stall(self._step, idle)
        return

  def __enter__(self) -> "StallWatchdog":
    self._last = time.monotonic()
    if self.timeout_s > 0:
      self._thread = threading.Thread(target=self._watch, name="cl_jax-stall-watchdog", daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._done.set()
    if self._thread is not None:
      self._thread.join()


def write_stacks(workdir: str, process_index: int) -> str:
  """Write every thread's Python stack (faulthandler) to <workdir>/stall_stacks_p<i>.txt, or to
  the system's temporary folder when the workdir is not a local folder (an object store could be
  what stalled); return the file's path."""
  folder = workdir if os.path.isdir(workdir) else tempfile.gettempdir()
  path = os.path.join(folder, f"stall_stacks_p{process_index}.txt")
  with open(path, "w") as f:
    faulthandler.dump_traceback(f, all_threads=True)
  return path
