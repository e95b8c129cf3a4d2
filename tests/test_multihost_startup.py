"""Multi-host start-up that cannot succeed ends promptly with a one-line UsageError.

Each case runs `initialize_distributed` in its own process (as the entry points
do: the UsageError becomes `sys.exit("error: ...")`), with a timeout so that a
hang fails the test.
"""

import os
import subprocess
import sys
import time

import pytest

from tests import tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "TPU_", "MEGASCALE_", "KUBERNETES_", "JAX_")
CHILD = """
import sys
import jax
from cl_jax.runtime import distributed_startup as startup
from cl_jax.runtime.errors import UsageError

if {forbid_jax}:
  def forbidden(*args, **kwargs):
    raise AssertionError("jax.distributed.initialize was called")
  jax.distributed.initialize = forbidden
try:
  startup.initialize_distributed({args})
except UsageError as e:
  sys.exit(f"error: {{e}}")
"""


def _env() -> dict:
  """The test's environment without any cluster or coordinator settings, on CPU."""
  out = {k: v for k, v in os.environ.items() if not k.startswith(CLUSTER_PREFIXES)}
  out["JAX_PLATFORMS"] = "cpu"
  return out


def _start(args: str, forbid_jax: bool = False) -> tuple[str, float]:
  """Runs initialize_distributed(args) in a child that must fail; (its error line, seconds)."""
  start = time.monotonic()
  child = subprocess.run(
      [sys.executable, "-c", CHILD.format(args=args, forbid_jax=forbid_jax)],
      cwd=ROOT,
      env=_env(),
      capture_output=True,
      text=True,
      timeout=90,
  )
  seconds = time.monotonic() - start
  assert child.returncode == 1, child.stderr[-3000:]
  assert "Traceback" not in child.stderr, child.stderr[-3000:]
  line = child.stderr.strip().splitlines()[-1]
  assert line.startswith("error: "), child.stderr[-3000:]
  return line, seconds


def test_no_coordinator_names_the_flags():
  line, _ = _start("")
  assert "no coordinator address found" in line
  for flag in ("--coordinator_address", "--num_processes", "--process_id"):
    assert flag in line


@pytest.mark.slow
def test_missing_peer_is_named_after_the_timeout():
  port = tiny_run.free_port()
  line, seconds = _start(f"'localhost:{port}', 2, 0, timeout_s=5")
  assert 5 <= seconds < 5 + 60
  assert "process 1 did not join" in line
  assert f"localhost:{port}" in line and "5 s" in line


@pytest.mark.slow
def test_unreachable_coordinator_is_named():
  port = tiny_run.free_port()
  line, seconds = _start(f"'localhost:{port}', 2, 1, timeout_s=3")
  assert seconds < 3 + 60
  assert f"the coordinator (process 0) at localhost:{port} did not answer" in line


def test_process_id_out_of_range_is_rejected_before_jax():
  line, _ = _start(f"'localhost:{tiny_run.free_port()}', 2, 2", forbid_jax=True)
  assert "--process_id=2 is not in [0, 2)" in line
