"""Ending the process at once, from a signal handler or a watchdog thread, where raising
would not reach the user: one line, the input workers killed, no wait for a save in flight."""

import multiprocessing
import os
import sys


def end_now(what: str, status: int) -> None:
  """Print `what`, then "; every checkpoint ... intact: ..." as one line, kill the input
  workers and exit with `status` at once, without waiting for an abandoned save."""
  print(
      f"{what}; every checkpoint that finished saving is intact: run the same command again "
      "to resume from the latest",
      file=sys.stderr,
      flush=True,
  )
  for child in multiprocessing.active_children():
    child.kill()
  sys.stdout.flush()
  os._exit(status)
