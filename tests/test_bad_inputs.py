"""Every command meets bad input with one line and a non-zero exit, never a traceback; the cases
that must work (a workdir path with spaces and non-ASCII characters) work. The cases and their
table: tests/bad_inputs.py."""

import shutil

import pytest

from tests import bad_inputs

pytestmark = pytest.mark.slow  # some 45 subprocess starts: minutes


def test_every_bad_input_gets_one_line(finished_run, tmp_path):
  """The cases that need a finished run read a copy of the shared one (tests/tiny_run.py)."""
  shutil.copytree(finished_run.workdir, tmp_path / "good")
  failed = []
  for name, command, phrase in bad_inputs.cases(str(tmp_path)):
    proc = bad_inputs.try_case(command, bad_inputs.devices(name))
    if not bad_inputs.judge(proc, phrase):
      failed.append(f"{name}: exit {proc.returncode}: {proc.stderr[-600:]}")
  assert not failed, "\n".join(failed)
