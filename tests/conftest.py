"""Test-wide settings: 8 simulated CPU devices, a private Trifeature cache, a compilation cache
shared by the session and its subprocesses, and the repository on sys.path.

Tests that are not about sharding build their mesh over one device; the
8 devices serve the one-device-vs-many equivalence tests.
The device count is set through jax.config, not XLA_FLAGS, so subprocesses
(the end-to-end runs) start with the machine's own single CPU device.
"""

import os
import sys
import tempfile

import jax
import pytest

jax.config.update("jax_num_cpu_devices", 8)
# JAX's persistent compilation cache, one per test session: the many tests and subprocess runs
# that compile the same tiny train step compile it once (cl_jax itself sets no cache).
_COMPILATION_CACHE = tempfile.mkdtemp(prefix="cl_jax_test_xla_cache_")
os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILATION_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
  """Trifeature renders go to a per-session directory, not the user's cache."""
  old = os.environ.get("CL_JAX_CACHE")
  os.environ["CL_JAX_CACHE"] = str(tmp_path_factory.mktemp("cl_jax_cache"))
  yield
  if old is None:
    os.environ.pop("CL_JAX_CACHE", None)
  else:
    os.environ["CL_JAX_CACHE"] = old
