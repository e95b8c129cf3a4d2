"""Test-wide settings: a private Trifeature cache, and the repository on sys.path."""
import os
import sys

import pytest

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
