"""The test run's subprocesses write the compilation cache from every process
(tests/subprocess_cache.py); JAX alone writes from process 0 only."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # fresh interpreters importing jax: seconds

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "subprocess_site")
_CHILD = """
import jax, jax.numpy as jnp
from jax._src import distributed
distributed.global_state.process_id = {process_id}
jax.jit(lambda x: jnp.sin(x) * {constant})(jnp.ones(3)).block_until_ready()
"""


def _writes(cache, process_id: int, constant: float, site: bool) -> bool:
  """Whether a fresh interpreter that claims to be process `process_id` writes its compiled
  function into `cache`, started as the suite starts subprocesses (site=True) or without
  tests/subprocess_site on PYTHONPATH."""
  paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE]
  env = dict(
      os.environ,
      PYTHONPATH=os.pathsep.join([SITE, *paths] if site else paths),
      JAX_COMPILATION_CACHE_DIR=str(cache),
      JAX_PLATFORMS="cpu",
  )
  code = _CHILD.format(process_id=process_id, constant=constant)
  proc = subprocess.run(
      [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  return cache.exists() and any("jit__lambda" in name for name in os.listdir(cache))


def test_every_process_writes_the_cache(tmp_path):
  assert _writes(tmp_path / "one", 1, 2.0, site=True)
  assert _writes(tmp_path / "zero", 0, 3.0, site=True)
  # The rule the site lifts: without it, process 1 writes nothing.
  assert not _writes(tmp_path / "plain", 1, 4.0, site=False)
