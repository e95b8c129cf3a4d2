"""Test-wide settings: 8 simulated CPU devices, XLA's backend optimisation level 1 in the test
processes (their subprocesses at XLA's default), private caches shared by the session, its
pytest-xdist workers and their subprocesses, and the repository on sys.path.

Tests that are not about sharding build their mesh over one device; the
8 devices serve the one-device-vs-many equivalence tests.
The device count is set through jax.config, not XLA_FLAGS, so subprocesses
(the end-to-end runs) start with the machine's own single CPU device.
"""

import atexit
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile

# The test processes (pytest and its xdist workers) compile at XLA's backend optimisation level 1:
# LLVM's -O1 instead of XLA's default -O3 for the generated CPU kernels, a third less compilation
# time for their many small programs, each run a few times (a tiny train step: 23 s -> 16 s on a
# 2-core AMD EPYC), the same operations, and results that differ from the default's by float32
# rounding (the order of a vectorised sum), within every tolerance here. Their subprocesses (the
# runs of cl_jax.main and the other commands) compile at the default level, as a user's do: they
# read most of their programs from the shared compilation cache and run them for many steps,
# which -O1's kernels run several times slower (the stop trials' 48-step tiny run, its programs
# cached: 33 s at -O1, 11 s at -O3 on a 2-core AMD EPYC Zen 4). So XLA_FLAGS is set here for this
# process only and kept for its subprocesses in SUBPROCESS_XLA_FLAGS_ENV: every Python
# subprocess starts with tests/subprocess_site/sitecustomize.py, which puts back the XLA_FLAGS the
# suite started with where it finds IN_PROCESS_XLA_FLAGS_ENV's value. Where the suite starts with
# no XLA_FLAGS, both compute on the convolution path cl_jax chooses for the processor
# (cl_jax.runtime.xla_cpu, applied when cl_jax is imported). The persistent cache's keys include
# XLA_FLAGS, so the two levels never read each other's programs. The one bit-for-bit comparison
# with a stored output (tests/test_atomic_augment.py) runs in a process with XLA's defaults.
OPT_LEVEL_FLAG = "--xla_backend_optimization_level=1"
DEFAULT_LEVEL_FLAG = "--xla_backend_optimization_level=3"  # XLA's default
IN_PROCESS_XLA_FLAGS_ENV = "CL_JAX_TEST_IN_PROCESS_XLA_FLAGS"
SUBPROCESS_XLA_FLAGS_ENV = "CL_JAX_TEST_SUBPROCESS_XLA_FLAGS"  # absent: no XLA_FLAGS
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  if "XLA_FLAGS" in os.environ:
    os.environ[SUBPROCESS_XLA_FLAGS_ENV] = os.environ["XLA_FLAGS"]
  from cl_jax.runtime import xla_cpu  # noqa: E402, F401  (cl_jax's choice, where none is set)

  os.environ["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS"), OPT_LEVEL_FLAG) if f)
  os.environ[IN_PROCESS_XLA_FLAGS_ENV] = os.environ["XLA_FLAGS"]

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

# One private directory per test run, made by the process pytest was started as and inherited
# by its xdist workers (they start after this module is imported there), removed at its exit:
#   xla_cache/  JAX's persistent compilation cache. Every compiled function is written (no
#               minimum compile time), so the many subprocess runs of the same tiny config
#               read their ~100 small functions and their train step instead of compiling
#               them again (cl_jax itself sets no cache). No size limit: a limit makes JAX
#               list and stat the whole cache at every write.
#   cl_jax/     $CL_JAX_CACHE: Trifeature renders and random-init probe baselines, not the
#               user's cache.
_RUN_DIR_ENV = "CL_JAX_TEST_RUN_DIR"
if not os.environ.get(_RUN_DIR_ENV):
  os.environ[_RUN_DIR_ENV] = tempfile.mkdtemp(prefix="cl_jax_test_")
  atexit.register(shutil.rmtree, os.environ[_RUN_DIR_ENV], True)
RUN_DIR = os.environ[_RUN_DIR_ENV]
_COMPILATION_CACHE = os.path.join(RUN_DIR, "xla_cache")
os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILATION_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
os.environ["CL_JAX_CACHE"] = os.path.join(RUN_DIR, "cl_jax")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every Python subprocess starts with tests/subprocess_site/sitecustomize.py: all processes of
# a multi-process run write the cache above (tests/subprocess_cache.py), and a profiled run
# (CL_JAX_SUITE_PROFILE) records each process.
_SITE = os.path.join(ROOT, "tests", "subprocess_site")
if _SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
  os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SITE, os.environ.get("PYTHONPATH")) if p)
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from tests import preemption_trials, suite_profile, tiny_run  # noqa: E402


class _SuiteProfile:
  """With CL_JAX_SUITE_PROFILE=<dir>: one line per test in <dir>/tests.jsonl (its phases'
  seconds and in-process compilation counts), and its Python subprocesses profiled (see
  tests/suite_profile.py)."""

  def __init__(self, out_dir):
    self.out_dir = out_dir
    self.phases = {}
    os.makedirs(out_dir, exist_ok=True)
    suite_profile.listen()

  def pytest_runtest_logreport(self, report):
    phases = self.phases.setdefault(report.nodeid, {})
    phases[report.when] = report.duration
    phases[f"{report.when}_outcome"] = report.outcome

  @pytest.hookimpl(wrapper=True)
  def pytest_runtest_protocol(self, item, nextitem):
    before = dict(suite_profile.COUNTS)
    result = yield
    record = {"test": item.nodeid, **self.phases.pop(item.nodeid, {})}
    record.update({k: suite_profile.COUNTS[k] - before[k] for k in before})
    with open(os.path.join(self.out_dir, "tests.jsonl"), "a") as f:
      f.write(json.dumps(record) + "\n")
    return result


def pytest_collection_modifyitems(config, items):
  """The tests marked slow first, each group in its collected order: with pytest-xdist's
  worksteal scheduling the workers then end on quick tests, and neither waits long for the
  other to finish a slow one."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config):
  if os.environ.get(suite_profile.ENV):
    config.pluginmanager.register(_SuiteProfile(os.environ[suite_profile.ENV]))


def _run_once(name: str, command: list[str]) -> subprocess.CompletedProcess:
  """`command` run to its end once per test run, by one xdist worker (the others wait on a
  lock and read what it left): its CompletedProcess."""
  with open(os.path.join(RUN_DIR, f"{name}.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = os.path.join(RUN_DIR, f"{name}.json")
    if not os.path.exists(done):
      proc = subprocess.run(
          command, cwd=ROOT, env=tiny_run.env(), capture_output=True, text=True, timeout=900
      )
      with open(done, "w") as f:
        json.dump(
            {
                "args": command,
                "returncode": proc.returncode,
                "stdout": proc.stdout,
                "stderr": proc.stderr,
            },
            f,
        )
    with open(done) as f:
      record = json.load(f)
  proc = subprocess.CompletedProcess(**record)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


@pytest.fixture(scope="session")
def finished_run() -> subprocess.CompletedProcess:
  """The shared finished tiny run (tests/tiny_run.py FINISHED), trained once per test run:
  its CompletedProcess, with `.args` the command and the workdir in `.workdir`. Read-only: a
  test that writes into a run takes `finished_run_copy`."""
  workdir = os.path.join(RUN_DIR, "finished_run")
  proc = _run_once("finished_run", tiny_run.command(workdir, tiny_run.FINISHED))
  proc.workdir = workdir
  return proc


@pytest.fixture(scope="session")
def straight_run() -> subprocess.CompletedProcess:
  """The run of the stop-and-resume trials (tests/preemption_trials.py, 48 steps) never
  stopped, trained once per test run: the reference of every stopped and resumed run. Its
  CompletedProcess with `.workdir`. Read-only."""
  workdir = os.path.join(RUN_DIR, "straight_run")
  proc = _run_once("straight_run", preemption_trials.command(workdir))
  proc.workdir = workdir
  return proc


@pytest.fixture
def finished_run_copy(finished_run, tmp_path) -> str:
  """A copy of the shared finished run's workdir in the test's own tmp_path (its path)."""
  return shutil.copytree(finished_run.workdir, tmp_path / "run")
