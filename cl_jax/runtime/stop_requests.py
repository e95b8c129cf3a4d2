"""Stop requests of a training run: Ctrl-C, SIGTERM and a chosen extra signal end the run at the
end of its step with a checkpoint (cl_jax.train), on every process at the same step."""

import contextlib
import os
import signal
import threading

import jax

from cl_jax.runtime import logs


class Interrupted(KeyboardInterrupt):
  """A stop request ended the run after step `step`, saved as a checkpoint; `signum` is the
  signal that asked for it (SIGINT for Ctrl-C, SIGTERM or the extra preemption signal).
  A KeyboardInterrupt, so callers that do not report it still stop as on Ctrl-C."""

  def __init__(self, step: int, signum: int = signal.SIGINT):
    super().__init__(step)
    self.step = step
    self.signum = signum


def _multiprocess() -> bool:
  """Whether this process is one of several joined by jax.distributed."""
  return jax.process_count() > 1


@contextlib.contextmanager
def stop_requests(extra_signal: int | None = None):
  """Inside, a stop request only records its signal in the yielded list; the loop then
  stops at the end of its step with a checkpoint (see stop_due).

  SIGINT (Ctrl-C): the first is recorded, a second raises KeyboardInterrupt. SIGTERM
  (what schedulers send first on preemption, scancel, a time limit) and
  `extra_signal` (e.g. SIGUSR1 for SLURM's --signal): recorded, repeats ignored.
  In a multi-process run SIGTERM belongs to JAX's preemption service, which agrees
  on one step for all processes whichever was signalled; SIGINT and `extra_signal`
  are handed to it as SIGTERM. Outside the main thread, where handlers cannot be
  set, signals are left alone.
  """
  requested = []
  if threading.current_thread() is not threading.main_thread():
    yield requested
    return

  def handler(signum, frame):
    del frame
    if signum == signal.SIGINT and signal.SIGINT in requested:
      raise KeyboardInterrupt
    if signum not in requested:
      requested.append(signum)
      if _multiprocess():
        os.kill(os.getpid(), signal.SIGTERM)  # to JAX's preemption notifier

  if _multiprocess():
    logs.drop("Reached preemption sync point")  # orbax's note; the stop line says it
  handled = [signal.SIGINT] + ([] if _multiprocess() else [signal.SIGTERM])
  if extra_signal is not None and extra_signal not in handled:
    handled.append(extra_signal)
  previous = {s: signal.signal(s, handler) for s in handled}
  try:
    yield requested
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def stop_due(requested: list[int], step: int) -> int | None:
  """The signal to stop for after `step`, or None to go on. One process stops at its next
  step end; in a multi-process run every process stops at the step JAX's preemption
  service agreed on (it must be asked at every step), answering SIGTERM for the
  processes that were not signalled themselves."""
  if not _multiprocess():
    return requested[0] if requested else None
  from jax.experimental import multihost_utils

  if multihost_utils.reached_preemption_sync_point(step):
    return requested[0] if requested else signal.SIGTERM
  return None
