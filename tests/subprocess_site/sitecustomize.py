"""Started with every Python subprocess of a test run (tests/conftest.py puts this folder on
PYTHONPATH): every process writes the shared compilation cache (tests/subprocess_cache.py),
and with CL_JAX_SUITE_PROFILE set the process is profiled (tests/suite_profile.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests import subprocess_cache  # noqa: E402

if os.environ.get("CL_JAX_SUITE_PROFILE"):
  from tests import suite_profile  # noqa: E402

sys.path.pop(0)
subprocess_cache.every_process_writes()
if os.environ.get("CL_JAX_SUITE_PROFILE"):
  suite_profile.start_subprocess_record(os.environ["CL_JAX_SUITE_PROFILE"])
