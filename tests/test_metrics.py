"""MetricWriter: one row per step across resumes, both layouts, bounded writes, TensorBoard."""

import json
import os
import time

import jax
import pytest

from cl_jax.runtime import metrics


def _log(workdir, steps, offset, start_step=0, appendable=None):
  """Open a writer at `start_step`, log loss = step + offset at `steps`, close it."""
  writer = metrics.MetricWriter(str(workdir), start_step=start_step, appendable=appendable)
  for step in steps:
    writer.write(step, {"loss": float(step + offset)})
  writer.close()


def _losses(workdir):
  """(step, loss) of every row read back, in order."""
  return [(r["step"], r["loss"]) for r in metrics.read_metrics(str(workdir))]


def _segments(workdir):
  """Segment name -> steps of its rows."""
  return {
      p.name: [r["step"] for r in metrics.read_jsonl(p)]
      for p in sorted((workdir / metrics.SEGMENTS_DIR).iterdir())
  }


def _next_second():
  """Sleep into the next wall-clock second (event file names hold the second they open in)."""
  time.sleep(1.01 - time.time() % 1)


@pytest.mark.parametrize("appendable", [True, False])
def test_resume_keeps_one_row_per_step(tmp_path, monkeypatch, appendable):
  monkeypatch.setattr(metrics, "SEGMENT_ROWS", 4)
  _log(tmp_path, range(1, 11), 0, appendable=appendable)
  _log(tmp_path, range(7, 13), 100, start_step=6, appendable=appendable)
  want = [(s, float(s)) for s in range(1, 7)] + [(s, s + 100.0) for s in range(7, 13)]
  assert _losses(tmp_path) == want
  if appendable:
    assert [r["step"] for r in metrics.read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 13))
    assert not (tmp_path / metrics.SEGMENTS_DIR).exists()
  else:
    # First run: 1-4, 5-8, 9-10. The resume at 6 deletes the segment of 9, cuts that of 5
    # to 5-6 and fills it up to 8; 9-12 begin a new segment.
    assert _segments(tmp_path) == {
        "0000000001.jsonl": [1, 2, 3, 4],
        "0000000005.jsonl": [5, 6, 7, 8],
        "0000000009.jsonl": [9, 10, 11, 12],
    }
    assert not (tmp_path / "metrics.jsonl").exists()
  assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("appendable", [True, False])
def test_fresh_start_on_a_logged_workdir_drops_every_row(tmp_path, monkeypatch, appendable):
  monkeypatch.setattr(metrics, "SEGMENT_ROWS", 4)
  _log(tmp_path, range(1, 11), 0, appendable=appendable)
  _log(tmp_path, range(1, 4), 50, start_step=0, appendable=appendable)
  assert _losses(tmp_path) == [(1, 51.0), (2, 52.0), (3, 53.0)]


def test_fresh_workdir_is_unchanged_by_opening(tmp_path):
  assert not metrics.has_metrics(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="no logged metrics"):
    metrics.read_metrics(str(tmp_path))
  metrics.MetricWriter(str(tmp_path)).close()
  assert metrics.has_metrics(str(tmp_path)) and metrics.read_metrics(str(tmp_path)) == []


def test_a_crash_while_cutting_the_log_keeps_its_rows(tmp_path, monkeypatch):
  _log(tmp_path, range(1, 11), 0)
  before = (tmp_path / "metrics.jsonl").read_text()

  def crash(src, dst):
    raise OSError("killed")

  monkeypatch.setattr(metrics.os, "replace", crash)
  with pytest.raises(OSError, match="killed"):
    metrics.MetricWriter(str(tmp_path), start_step=6)
  assert (tmp_path / "metrics.jsonl").read_text() == before


def test_segment_writes_are_bounded(tmp_path, monkeypatch):
  monkeypatch.setattr(metrics, "SEGMENT_ROWS", 5)
  written = []
  write = metrics.write_atomically
  monkeypatch.setattr(
      metrics,
      "write_atomically",
      lambda path, text: written.append((path.name, text.count("\n"))) or write(path, text),
  )
  _log(tmp_path, range(1, 24), 0, appendable=False)
  # One write of the current segment per step, never more than 5 rows.
  want = [(f"{first:010d}.jsonl", n) for first in (1, 6, 11, 16) for n in range(1, 6)]
  want += [("0000000021.jsonl", n) for n in range(1, 4)]
  assert written == want
  assert _losses(tmp_path) == [(s, float(s)) for s in range(1, 24)]


def test_read_metrics_orders_both_layouts_by_step(tmp_path):
  _log(tmp_path, [3, 4], 0, appendable=False)
  (tmp_path / "metrics.jsonl").write_text(
      "".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in (1, 2))
  )
  assert _losses(tmp_path) == [(s, float(s)) for s in (1, 2, 3, 4)]


def test_only_process_zero_writes_or_cuts(tmp_path, monkeypatch):
  _log(tmp_path, range(1, 4), 0)
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  _log(tmp_path, range(1, 3), 50, start_step=0)
  assert _losses(tmp_path) == [(1, 1.0), (2, 2.0), (3, 3.0)]


@pytest.mark.slow
def test_tensorboard_shows_one_scalar_per_step_after_resumes(tmp_path):
  event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

  def scalars():
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), purge_orphaned_data=True)
    return [(e.step, e.value) for e in acc.Reload().Scalars("loss")]

  _log(tmp_path, range(1, 11), 0)
  _next_second()
  _log(tmp_path, range(7, 13), 100, start_step=6)
  assert scalars() == [(s, float(s)) for s in range(1, 7)] + [(s, s + 100.0) for s in range(7, 13)]
  _next_second()
  _log(tmp_path, range(1, 3), 50, start_step=0)
  assert scalars() == [(1, 51.0), (2, 52.0)]


@pytest.mark.slow
def test_write_text_logs_a_text_event(tmp_path):
  event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write_text("config", "optim.lr: 0.06", 0)
  writer.close()
  acc = event_accumulator.EventAccumulator(str(tmp_path / "tb")).Reload()
  [event] = acc.Tensors("config/text_summary")
  assert event.step == 0 and event.tensor_proto.string_val == [b"optim.lr: 0.06"]


@pytest.mark.parametrize("appendable", [True, False])
def test_append_row_merges_into_the_step_and_survives_resume(tmp_path, monkeypatch, appendable):
  """An evaluation row at step 8 joins that step's training row when read; the trainer keeps
  writing its own segments; a resume from step 6 drops it with the training rows after 6."""
  monkeypatch.setattr(metrics, "SEGMENT_ROWS", 4)
  _log(tmp_path, range(1, 9), 0, appendable=appendable)
  metrics.append_row(str(tmp_path), 8, {"probe/label/top1": 0.5}, "probe", appendable=appendable)
  metrics.append_row(str(tmp_path), 8, {"probe/label/top1": 0.75}, "probe", appendable=appendable)
  _log(tmp_path, range(9, 11), 0, start_step=8, appendable=appendable)
  rows = metrics.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == list(range(1, 11))
  assert rows[7] == {"step": 8, "loss": 8.0, "probe/label/top1": 0.75}  # the later row wins
  if not appendable:
    assert "0000000008.probe.jsonl" in _segments(tmp_path)
    assert _segments(tmp_path)["0000000009.jsonl"] == [9, 10]
  _log(tmp_path, range(7, 9), 100, start_step=6, appendable=appendable)
  rows = metrics.read_metrics(str(tmp_path))
  assert [(r["step"], r["loss"]) for r in rows][-2:] == [(7, 107.0), (8, 108.0)]
  assert all("probe/label/top1" not in r for r in rows)
  with pytest.raises(ValueError, match="plain name"):
    metrics.append_row(str(tmp_path), 8, {}, "a/b")


@pytest.mark.slow
def test_append_row_adds_the_scalars_to_tensorboard(tmp_path):
  event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  _log(tmp_path, range(1, 4), 0)
  metrics.append_row(str(tmp_path), 3, {"knn/colour": 0.9}, "knn")
  acc = event_accumulator.EventAccumulator(str(tmp_path / "tb")).Reload()
  assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1.0), (2, 2.0), (3, 3.0)]
  assert [(e.step, pytest.approx(e.value)) for e in acc.Scalars("knn/colour")] == [(3, 0.9)]


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
  path = str(tmp_path / "backbone.safetensors")
  metrics.write_atomically(path, b"old")

  def broken_fsync(_):
    raise OSError("disk full")

  monkeypatch.setattr(os, "fsync", broken_fsync)
  with pytest.raises(OSError, match="disk full"):
    metrics.write_atomically(path, b"new")
  assert os.listdir(tmp_path) == ["backbone.safetensors"]
  with open(path, "rb") as f:
    assert f.read() == b"old"


@pytest.mark.parametrize("appendable", [True, False])
def test_torn_last_line_is_skipped_by_readers_and_dropped_on_resume(
    tmp_path, monkeypatch, capsys, appendable
):
  """A crash or a full disk in the middle of a write leaves a partial last line: every reader
  skips it with a warning naming the file and line, and the resumed writer removes it."""
  monkeypatch.setattr(metrics, "SEGMENT_ROWS", 100)
  writer = metrics.MetricWriter(str(tmp_path), start_step=0, appendable=appendable)
  for step in (1, 2, 3):
    writer.write(step, {"loss": float(step)})
  writer.close()
  path = (
      tmp_path / metrics.METRICS_FILE
      if appendable
      else tmp_path / metrics.SEGMENTS_DIR / "0000000001.jsonl"
  )
  with open(path, "a") as f:
    f.write('{"step": 4, "loss": 4.')  # cut off mid-number, no newline
  assert [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [1, 2, 3]
  err = capsys.readouterr().err
  assert f"warning: {path}, line 4: not a whole metrics row" in err and "skipped" in err
  # The resume from the checkpoint at step 2 cuts the later row and the torn line.
  writer = metrics.MetricWriter(str(tmp_path), start_step=2, appendable=appendable)
  writer.write(3, {"loss": 30.0})
  writer.write(4, {"loss": 40.0})
  writer.close()
  capsys.readouterr()
  rows = metrics.read_metrics(str(tmp_path))
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
  assert capsys.readouterr().err == ""  # nothing torn is left
  assert path.read_text().endswith("\n")
