"""Every command meets bad input with one line and a non-zero exit, never a traceback; the cases
that must work (a workdir path with spaces and non-ASCII characters) work. The cases and their
table: tests/bad_inputs.py."""

import pytest

from tests import bad_inputs

pytestmark = pytest.mark.slow  # some 35 subprocess starts and one tiny run: minutes


def test_every_bad_input_gets_one_line(tmp_path):
  failed = []
  for name, command, phrase in bad_inputs.cases(str(tmp_path)):
    proc = bad_inputs.try_case(command, bad_inputs.devices(name))
    if not bad_inputs.judge(proc, phrase):
      failed.append(f"{name}: exit {proc.returncode}: {proc.stderr[-600:]}")
  assert not failed, "\n".join(failed)
