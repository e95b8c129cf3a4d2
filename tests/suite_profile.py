"""Where the test suite's time goes: per-test phase times and JAX compilation counts.

Active only when the environment variable CL_JAX_SUITE_PROFILE names a directory (a plain test
run is untouched):

  CL_JAX_SUITE_PROFILE=/tmp/prof python -m pytest -q tests
  python -m tests.suite_report /tmp/prof

Each test (tests/conftest.py) appends one JSON line to <dir>/tests.jsonl: its node id, the
seconds of its setup, call and teardown, and the in-process compilation counts during it. Every
Python subprocess a test starts (tests/subprocess_site/sitecustomize.py imports this module)
writes one JSON file to <dir>/proc/: its command line, wall seconds, the test that started it
(pytest's PYTEST_CURRENT_TEST) and its own compilation counts. The counts come from JAX's
monitoring events: compile requests that could use the persistent cache, cache
hits, cache writes (misses compiled for at least the cache's minimum time) and the seconds spent
tracing, lowering and compiling (a cache read counts as compiling). With pytest-xdist the
workers append to the same files.
"""

import atexit
import json
import os
import sys
import time

from tests import import_hook

ENV = "CL_JAX_SUITE_PROFILE"

# JAX monitoring event -> counter name.
_COUNT_EVENTS = {
    "/jax/compilation_cache/compile_requests_use_cache": "requests",
    "/jax/compilation_cache/cache_hits": "hits",
    "/jax/compilation_cache/cache_misses": "writes",
}
_DURATION_EVENTS = {
    "/jax/core/compile/backend_compile_duration": "compile_s",
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
}

COUNTS = {name: 0 for name in list(_COUNT_EVENTS.values()) + list(_DURATION_EVENTS.values())}
_listening = False


def listen(monitoring=None):
  """Registers the JAX monitoring listeners that fill COUNTS (once per process)."""
  global _listening
  if _listening:
    return
  if monitoring is None:
    from jax._src import monitoring

  def on_event(event, **kwargs):
    if event in _COUNT_EVENTS:
      COUNTS[_COUNT_EVENTS[event]] += 1

  def on_duration(event, duration, **kwargs):
    if event in _DURATION_EVENTS:
      COUNTS[_DURATION_EVENTS[event]] += duration

  monitoring.register_event_listener(on_event)
  monitoring.register_event_duration_secs_listener(on_duration)
  _listening = True


_RECORD = {}


def start_subprocess_record(out_dir):
  """In a subprocess: counts from startup and writes <out_dir>/proc/<pid>.json at exit."""
  _RECORD.update(
      start=time.time(), test=os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
  )

  def write():
    if not _RECORD["test"]:  # not started by a test (pytest itself, or an xdist worker)
      return
    os.makedirs(os.path.join(out_dir, "proc"), exist_ok=True)
    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": sys.argv,
        "test": _RECORD["test"],
        "start": _RECORD["start"],
        "wall_s": time.time() - _RECORD["start"],
        **COUNTS,
    }
    with open(os.path.join(out_dir, "proc", f"{os.getpid()}.json"), "w") as f:
      json.dump(record, f)

  atexit.register(write)
  import_hook.after_import("jax._src.monitoring", listen)


def restart_subprocess_record(test: str) -> None:
  """In a process forked from a profiled one (tests/forked_commands.py): its record starts
  now, with zero counts, for `test` (the PYTEST_CURRENT_TEST of the test that asked for it)."""
  if _RECORD:
    _RECORD.update(start=time.time(), test=test.rsplit(" (", 1)[0])
    for name in COUNTS:
      COUNTS[name] = 0
