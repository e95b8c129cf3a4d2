"""Every command meets bad input with one line and a non-zero exit, never a traceback; the cases
that must work (a workdir path with spaces and non-ASCII characters) work. The cases and their
table: tests/bad_inputs.py."""

import shutil

import pytest

from tests import bad_inputs, forked_commands, tiny_run

pytestmark = pytest.mark.slow  # some 45 commands: minutes


def test_every_bad_input_gets_one_line(finished_run, tmp_path):
  """The cases that need a finished run read a copy of the shared one (tests/tiny_run.py).
  Each command is a process of its own, forked from one that has imported the libraries
  (tests/forked_commands.py)."""
  shutil.copytree(finished_run.workdir, tmp_path / "good")
  failed = []
  with forked_commands.Server(tiny_run.env()) as server:
    for name, command, phrase in bad_inputs.cases(str(tmp_path)):
      proc = server.run(command, bad_inputs.devices(name))
      if not bad_inputs.judge(proc, phrase):
        failed.append(f"{name}: exit {proc.returncode}: {proc.stderr[-600:]}")
  assert not failed, "\n".join(failed)
