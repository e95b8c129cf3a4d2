"""Worker processes that end with the process that started them, however it ends.

Input workers (grain's mp_prefetch) and texture workers are separate processes;
a trainer killed with SIGKILL, or by an uncaught signal, cannot stop them itself.
On Linux each worker asks the kernel to send it SIGKILL when its parent dies
(prctl PR_SET_PDEATHSIG); no library offers this, hence the few lines of ctypes.
Elsewhere the workers rely on their parent's clean shutdown.
"""

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
  """In a worker: be killed (SIGKILL) when the parent process `parent_pid` dies; exit at
  once if it has died already (between the fork and this call)."""
  if sys.platform != "linux":
    return
  libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
  if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
  if os.getppid() != parent_pid:
    os._exit(1)
