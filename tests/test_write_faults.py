"""Write faults become one line naming what, where, why and the free space; others pass; a
failed save leaves no warning behind its line."""

import errno
import os
import subprocess
import sys
import threading

import pytest

from cl_jax.runtime import write_faults


def test_reason_reads_errno_and_the_systems_words():
  assert write_faults.reason(OSError(errno.ENOSPC, "No space")) == "no space left on the device"
  assert write_faults.reason(OSError(errno.EROFS, "x")) == "the file system is read-only"
  tensorstore = ValueError(
      'RESOURCE_EXHAUSTED: Error writing "params/0": Failed to write 501907 bytes to file 9: '
      "No space left on device [os_error_code='28']"
  )
  assert write_faults.reason(tensorstore) == "no space left on the device"
  try:  # a fault raised from inside another exception's handling
    try:
      raise OSError(errno.EACCES, "Permission denied")
    except OSError:
      raise RuntimeError("the save failed")
  except RuntimeError as wrapped:
    assert write_faults.reason(wrapped) == "permission denied"
  forbidden = type("Forbidden", (Exception,), {})  # google.api_core.exceptions.Forbidden's name
  assert "403 Forbidden" in write_faults.reason(forbidden("POST https://storage...: 403"))
  assert write_faults.reason(ValueError("shapes (3,) and (4,) differ")) is None
  assert write_faults.reason(OSError(errno.ENOENT, "No such file")) is None


def test_guard_names_what_where_why_and_the_free_space(tmp_path):
  target = tmp_path / "metrics.jsonl"
  with pytest.raises(write_faults.WriteFault) as caught:
    with write_faults.guard("the metrics log", str(tmp_path), lambda: "Resume later"):
      raise OSError(errno.ENOSPC, "No space left on device", str(target))
  line = str(caught.value)
  assert line.startswith(f"could not write the metrics log to {target}: no space left on the")
  assert " free of " in line and line.endswith(". Resume later") and "\n" not in line


def test_guard_lets_other_errors_through_and_adds_advice_to_an_inner_fault(tmp_path):
  with pytest.raises(KeyError):
    with write_faults.guard("x", str(tmp_path)):
      raise KeyError("a defect keeps its traceback")
  called = []
  with pytest.raises(write_faults.WriteFault, match=r"checkpoint 8 .*\. The last is 4$"):
    with write_faults.guard("the run", str(tmp_path), lambda: called.append(1) or "The last is 4"):
      with write_faults.guard(lambda e: "checkpoint 8", str(tmp_path)):
        raise ValueError("Failed writing: No space left on device")
  assert called == [1]


def test_free_space_in_words_and_none_where_it_cannot_be_read(tmp_path, monkeypatch):
  """The nearest existing parent's file system; a URL or an unreadable one give None."""
  sizes = {"free": 999, "total": 1_234_567_890_123_456}
  monkeypatch.setattr(write_faults.shutil, "disk_usage", lambda path: type("Usage", (), sizes))
  assert write_faults.free_space(str(tmp_path / "not" / "yet")) == "999 B free of 1234.6 TB"
  sizes.update(free=1_500_000, total=2_000_000_000)
  assert write_faults.free_space(str(tmp_path)) == "1.5 MB free of 2.0 GB"
  assert write_faults.free_space("gs://bucket/run") is None

  def unreadable(path):
    raise OSError(errno.EACCES, "Permission denied", path)

  monkeypatch.setattr(write_faults.shutil, "disk_usage", unreadable)
  assert write_faults.free_space(str(tmp_path)) is None
  write_faults.check_writable("gs://bucket/run", "the report")  # URLs are not checked


def test_check_writable_fails_before_any_work(tmp_path, monkeypatch):
  write_faults.check_writable(str(tmp_path / "new"), "the report")  # creates it, leaves no file
  assert os.listdir(tmp_path / "new") == []

  def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system", args[0])

  monkeypatch.setattr("builtins.open", read_only)
  with pytest.raises(write_faults.WriteFault, match="could not write the report to .*read-only"):
    write_faults.check_writable(str(tmp_path), "the report")


def test_thread_write_faults_are_kept_and_others_passed_on(monkeypatch):
  passed_on = []
  monkeypatch.setattr(threading, "excepthook", lambda args: passed_on.append(args.exc_value))

  def fail(error):
    raise error

  with write_faults.in_threads() as faults:
    for error in (OSError(errno.ENOSPC, "No space left on device"), ValueError("a defect")):
      thread = threading.Thread(target=fail, args=(error,))
      thread.start()
      thread.join()
  assert len(faults) == 1 and faults[0].errno == errno.ENOSPC
  assert [str(e) for e in passed_on] == ["a defect"]  # printed by the usual hook


def test_thread_write_faults_after_a_failed_block_are_dropped(monkeypatch):
  """A writer thread that fails on the full disk after the block failed on it repeats the
  reported fault: nothing more is printed. Other exceptions are still printed."""
  passed_on = []
  monkeypatch.setattr(threading, "excepthook", lambda args: passed_on.append(args.exc_value))

  def fail(error):
    raise error

  with pytest.raises(OSError):
    with write_faults.in_threads():
      raise OSError(errno.ENOSPC, "No space left on device")
  for error in (OSError(errno.ENOSPC, "No space left on device"), ValueError("a defect")):
    thread = threading.Thread(target=fail, args=(error,))
    thread.start()
    thread.join()
  assert [str(e) for e in passed_on] == ["a defect"]


def test_a_block_that_ends_cleanly_restores_the_thread_hook(monkeypatch):
  usual = lambda args: None
  monkeypatch.setattr(threading, "excepthook", usual)
  with write_faults.in_threads():
    assert threading.excepthook is not usual
  assert threading.excepthook is usual


# A save whose write coroutines were made but never run, in a block that fails (or not).
_ABANDONED_WRITE = """
import sys
from cl_jax.runtime import checkpoint

async def write_fragment():
  pass

try:
  with checkpoint.quiet_failed_saves():
    pending = [write_fragment()]
    if sys.argv[1] == "fails":
      raise OSError(28, "No space left on device")
except OSError:
  pass
del pending
"""


@pytest.mark.parametrize("outcome", ["fails", "succeeds"])
@pytest.mark.slow
def test_a_failed_save_leaves_no_coroutine_warning(outcome):
  out = subprocess.run(
      [sys.executable, "-c", _ABANDONED_WRITE, outcome], capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr[-2000:]
  # After a failure the fault's own line is all; otherwise the warning is still shown.
  assert ("was never awaited" in out.stderr) == (outcome == "succeeds"), out.stderr[-2000:]
