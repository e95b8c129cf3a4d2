"""Started with every Python subprocess of a profiled test run (see tests/suite_profile.py)."""

import os
import sys

if os.environ.get("CL_JAX_SUITE_PROFILE"):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import suite_profile

  sys.path.pop(0)
  suite_profile.start_subprocess_record(os.environ["CL_JAX_SUITE_PROFILE"])
