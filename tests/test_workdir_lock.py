"""The workdir's writer lock: one trainer at a time, a dead holder never blocks, URLs unlocked."""

import os
import signal
import subprocess
import sys
import time

import pytest

from cl_jax.runtime import workdir_lock


def test_second_writer_is_refused_naming_the_holder(tmp_path):
  notes = []
  with workdir_lock.hold(str(tmp_path), warn=notes.append):
    assert workdir_lock.holder(str(tmp_path)).startswith(f"pid {os.getpid()} on host ")
    with pytest.raises(workdir_lock.WorkdirLocked) as refused:
      with workdir_lock.hold(str(tmp_path), warn=notes.append):
        pytest.fail("a second writer entered the block")
    message = str(refused.value)
    assert "\n" not in message
    assert f"is in use by another training run (pid {os.getpid()} on host " in message
    assert "--workdir" in message
  assert notes == []  # a first lock of a fresh workdir warns of nothing
  assert workdir_lock.holder(str(tmp_path)) is None
  assert (tmp_path / workdir_lock.LOCK_FILE).read_text() == ""  # released cleanly
  with workdir_lock.hold(str(tmp_path), warn=notes.append):  # free again, no warning
    pass
  assert notes == []


def test_lock_of_a_killed_holder_is_taken_over_with_a_warning(tmp_path):
  holder = subprocess.Popen(
      [
          sys.executable,
          "-c",
          "import sys, time\n"
          "from cl_jax.runtime import workdir_lock\n"
          "with workdir_lock.hold(sys.argv[1]):\n"
          "  print('held', flush=True)\n"
          "  time.sleep(600)\n",
          str(tmp_path),
      ],
      stdout=subprocess.PIPE,
      text=True,
  )
  assert holder.stdout.readline().strip() == "held"
  who = workdir_lock.holder(str(tmp_path))
  assert who is not None and who.startswith(f"pid {holder.pid} on host ")
  with pytest.raises(workdir_lock.WorkdirLocked, match=f"pid {holder.pid} on host "):
    with workdir_lock.hold(str(tmp_path)):
      pass
  holder.send_signal(signal.SIGKILL)
  holder.wait(timeout=60)
  assert workdir_lock.holder(str(tmp_path)) is None  # the kernel dropped the lock
  notes = []
  with workdir_lock.hold(str(tmp_path), warn=notes.append):
    assert workdir_lock.holder(str(tmp_path)).startswith(f"pid {os.getpid()} ")
  assert len(notes) == 1
  assert notes[0].startswith(f"took over the writer lock of {tmp_path} from pid {holder.pid} ")
  assert "ended without releasing it" in notes[0]


def test_url_workdir_is_not_locked_and_says_so(tmp_path):
  notes = []
  with workdir_lock.hold("gs://bucket/run", warn=notes.append):
    with workdir_lock.hold("gs://bucket/run", warn=notes.append):
      pass
  assert len(notes) == 2 and all("is not locked against a second trainer" in n for n in notes)
  assert workdir_lock.holder("gs://bucket/run") is None


def test_read_only_jobs_are_told_the_run_is_training(tmp_path, capsys):
  workdir_lock.note_if_training(str(tmp_path))
  assert capsys.readouterr().err == ""
  with workdir_lock.hold(str(tmp_path)):
    workdir_lock.note_if_training(str(tmp_path))
    workdir_lock.note_if_training(str(tmp_path), step=12)
  newest, given = capsys.readouterr().err.strip().splitlines()
  assert newest.startswith(f"note: the run in {tmp_path} is still training (pid {os.getpid()} ")
  assert newest.endswith("reading its newest finished checkpoint")
  assert given.endswith("reading its checkpoint 12")
  workdir_lock.note_if_training(str(tmp_path))  # released: silent again
  assert capsys.readouterr().err == ""


def test_lock_is_held_until_the_block_ends_even_on_error(tmp_path):
  with pytest.raises(RuntimeError):
    with workdir_lock.hold(str(tmp_path)):
      raise RuntimeError("the run failed")
  started = time.time()
  with workdir_lock.hold(str(tmp_path)):  # released by the failed block, at once
    pass
  assert time.time() - started < 5
