"""Worker processes that end with the process that started them, however it ends.

Input workers (grain's mp_prefetch) and texture workers are separate processes;
a trainer killed with SIGKILL, or by an uncaught signal, cannot stop them itself.
Each worker watches its parent instead: a daemon thread checks every half second that
the parent is still its parent (a dead parent's children are re-parented) and ends the
worker when it is not. The kernel's own PR_SET_PDEATHSIG cannot serve: it fires when
the *thread* that started the worker ends, and grain starts its workers from a prefetch
thread that ends when the iterator closes, so the workers were killed while closing,
possibly holding a lock their parent then waits on forever. No library offers this.
"""

import os
import threading
import time

POLL_S = 0.5


def die_with_parent(parent_pid: int) -> None:
  """In a worker: exit (os._exit(1), no clean-up: the parent is gone) within POLL_S seconds
  of the process `parent_pid` dying; at once if it has died already (between the start of
  the worker and this call)."""
  if os.getppid() != parent_pid:
    os._exit(1)

  def watch():
    while os.getppid() == parent_pid:
      time.sleep(POLL_S)
    os._exit(1)

  threading.Thread(target=watch, daemon=True, name="die-with-parent").start()
