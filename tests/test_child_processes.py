"""Workers end with their parent process, and only then: a worker started from a thread
outlives that thread (grain starts its input workers from a prefetch thread)."""

import os
import signal
import subprocess
import sys
import time

from cl_jax.runtime import child_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A parent that starts one worker from a thread and lets the thread end. The worker polls
# an Event, taking its lock as grain's workers do. "close": the parent checks the worker
# is alive 4 polls later, then stops it and reports its exit code. "kill": the parent
# prints the worker's pid and waits to be killed.
_PARENT = """
import multiprocessing, os, sys, threading, time
from cl_jax.runtime import child_processes

def worker(parent, stop):
  child_processes.die_with_parent(parent)
  while not stop.is_set():
    time.sleep(0.001)

if __name__ == "__main__":
  context = multiprocessing.get_context("fork")
  stop, started = context.Event(), []
  def start():
    started.append(context.Process(target=worker, args=(os.getpid(), stop)))
    started[0].start()
  thread = threading.Thread(target=start)
  thread.start()
  thread.join()
  print(started[0].pid, flush=True)
  if sys.argv[1] == "kill":
    time.sleep(600)
  time.sleep(4 * child_processes.POLL_S)
  print("alive" if started[0].is_alive() else "dead", flush=True)
  stop.set()
  started[0].join(10)
  print(started[0].exitcode, flush=True)
"""


def _parent(mode: str) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "-c", _PARENT, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True
  )


def _running(pid: int) -> bool:
  """Whether `pid` exists and is not a zombie."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def test_a_worker_started_from_a_thread_outlives_the_thread():
  parent = _parent("close")
  out, _ = parent.communicate(timeout=60)
  assert parent.returncode == 0
  assert out.split()[1:] == ["alive", "0"]  # alive after its thread ended; stopped cleanly


def test_a_worker_ends_within_a_poll_of_its_parent_killed():
  parent = _parent("kill")
  try:
    pid = int(parent.stdout.readline())
    assert _running(pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.time() + 10 * child_processes.POLL_S
    while _running(pid) and time.time() < deadline:
      time.sleep(0.05)
    assert not _running(pid), "the worker outlived its killed parent"
  finally:
    parent.kill()
