"""The stall watchdog (cl_jax.runtime.stall_watchdog) on its own, with real threads and short
timeouts: beats and paused stretches keep it quiet, silence past the timeout calls its handler
once with the last step, 0 switches it off, and the stack file names where each thread waits.
The end of a stalled training run is in tests/test_cluster_faults.py."""

import os
import threading
import time

from cl_jax.runtime import stall_watchdog


def _watch(timeout_s: float):
  calls = []
  return (
      stall_watchdog.StallWatchdog(timeout_s, lambda step, idle: calls.append((step, idle))),
      calls,
  )


def test_beats_keep_it_quiet_and_silence_calls_it_once_with_the_last_step():
  watch, calls = _watch(0.5)
  with watch:
    for step in range(30):  # 1.5 s of beats, 0.05 s apart
      watch.beat(step)
      time.sleep(0.05)
    assert calls == []
    time.sleep(1.5)  # silence: > 0.5 s
  assert len(calls) == 1, calls
  step, idle = calls[0]
  assert step == 29 and 0.5 < idle < 1.5, calls


def test_a_paused_stretch_does_not_count_and_restarts_the_clock():
  watch, calls = _watch(0.5)
  with watch:
    watch.beat(3)
    with watch.paused():
      time.sleep(1.5)
    time.sleep(0.1)  # a fifth of the timeout after the pause
    assert calls == []
    time.sleep(1.0)
  assert [step for step, _ in calls] == [3]


def test_zero_switches_it_off():
  watch, calls = _watch(0.0)
  with watch:
    watch.beat(1)
    time.sleep(0.5)
  assert calls == [] and watch._thread is None


def test_the_stack_file_names_where_each_thread_waits(tmp_path):
  release = threading.Event()

  def waiting_for_a_batch_that_never_comes():
    release.wait()

  helper = threading.Thread(target=waiting_for_a_batch_that_never_comes)
  helper.start()
  try:
    path = stall_watchdog.write_stacks(str(tmp_path), 3)
  finally:
    release.set()
    helper.join()
  assert path == os.path.join(tmp_path, "stall_stacks_p3.txt")
  text = open(path).read()
  assert "waiting_for_a_batch_that_never_comes" in text
  assert "test_the_stack_file_names_where_each_thread_waits" in text  # the calling thread too


def test_a_workdir_that_is_not_a_local_folder_gets_the_stacks_in_the_temporary_folder(
    tmp_path, monkeypatch
):
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  monkeypatch.setattr(stall_watchdog.tempfile, "tempdir", None)  # re-read TMPDIR
  path = stall_watchdog.write_stacks("gs://bucket/runs/x", 0)
  assert path == os.path.join(tmp_path, "stall_stacks_p0.txt") and os.path.getsize(path) > 0
