"""The test processes compile at XLA's backend optimisation level 1 and their Python subprocesses
with the XLA_FLAGS the suite started with (tests/conftest.py, tests/subprocess_site); a
subprocess given XLA_FLAGS of its own keeps them."""

import ast
import os
import subprocess
import sys

from tests import conftest

_CHILD = "import os; print(repr(os.environ.get('XLA_FLAGS')))"


def _flags_in_child(env: dict) -> str | None:
  """The XLA_FLAGS a Python subprocess started with `env` sees once it has started."""
  out = subprocess.run(
      [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
  ).stdout
  return ast.literal_eval(out)


def test_subprocesses_get_the_suites_flags_and_the_test_process_level_1():
  started_with_a_level = conftest.IN_PROCESS_XLA_FLAGS_ENV not in os.environ
  if started_with_a_level:  # the suite was started with a level of its own: every process has it
    assert _flags_in_child(dict(os.environ)) == os.environ["XLA_FLAGS"]
    return
  assert conftest.OPT_LEVEL_FLAG in os.environ["XLA_FLAGS"].split()
  child = _flags_in_child(dict(os.environ))
  assert child == os.environ.get(conftest.SUBPROCESS_XLA_FLAGS_ENV)
  assert conftest.OPT_LEVEL_FLAG not in (child or "").split()
  # XLA_FLAGS a test gives its subprocess (other than the test process's own value) are kept.
  assert _flags_in_child({**os.environ, "XLA_FLAGS": "--xla_dump_to=/x"}) == "--xla_dump_to=/x"
  without = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  assert _flags_in_child(without) is None
