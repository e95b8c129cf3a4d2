"""Started with every Python subprocess of a test run (tests/conftest.py puts this folder on
PYTHONPATH): the XLA_FLAGS the suite started with, where the process inherits the test
processes' own (their optimisation level: tests/conftest.py); every process writes the shared
compilation cache (tests/subprocess_cache.py), and with CL_JAX_SUITE_PROFILE set the process is
profiled (tests/suite_profile.py)."""

import os
import sys

# The names of tests/conftest.py's IN_PROCESS_XLA_FLAGS_ENV and SUBPROCESS_XLA_FLAGS_ENV.
_in_process = os.environ.get("CL_JAX_TEST_IN_PROCESS_XLA_FLAGS")
if _in_process is not None and os.environ.get("XLA_FLAGS") == _in_process:
  if "CL_JAX_TEST_SUBPROCESS_XLA_FLAGS" in os.environ:
    os.environ["XLA_FLAGS"] = os.environ["CL_JAX_TEST_SUBPROCESS_XLA_FLAGS"]
  else:
    del os.environ["XLA_FLAGS"]

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests import subprocess_cache  # noqa: E402

if os.environ.get("CL_JAX_SUITE_PROFILE"):
  from tests import suite_profile  # noqa: E402

sys.path.pop(0)
subprocess_cache.every_process_writes()
if os.environ.get("CL_JAX_SUITE_PROFILE"):
  suite_profile.start_subprocess_record(os.environ["CL_JAX_SUITE_PROFILE"])
