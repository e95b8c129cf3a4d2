"""Per-step scalars to TensorBoard event files and JSON lines, one row per logged step.

Only process 0 writes; on other processes the writer discards everything.
Event files are written with tensorboardX, which needs no TensorFlow (on a
gs:// workdir it needs the google-cloud-storage package). The workdir may be a
local path or a URL (etils.epath). The rows, {"step": ..., name: value, ...},
are stored in one of two layouts:

  <workdir>/metrics.jsonl                    on a local workdir: one file, appended to;
  <workdir>/metrics.jsonl.d/<step>.jsonl     on a URL workdir (object stores cannot
                                             append): segments of at most SEGMENT_ROWS
                                             rows, each named by its first step as 10
                                             zero-padded digits, so name order is step
                                             order; a write rewrites only the last one.

read_metrics reads either (or both), skipping with a warning a line that a crash
or a full disk cut short (a resumed run removes it). A run resumed from the checkpoint at step S
re-runs the steps after S, so the writer first drops the rows and TensorBoard
events logged after S, and each step keeps exactly one training row.

Evaluation jobs that run beside or after training (the linear probe, the kNN and
robustness/transfer suites) add their scalars with `append_row`: one more row at
the checkpoint's step, appended to metrics.jsonl (an O_APPEND write of one line,
safe while the trainer appends), or on a URL workdir a one-row segment
<step>.<tag>.jsonl, plus a new TensorBoard event file in <workdir>/tb.
read_metrics merges the rows of one step into one (later rows add or replace
keys).
"""

import json
import os
import sys

import jax
from etils import epath

METRICS_FILE = "metrics.jsonl"
SEGMENTS_DIR = "metrics.jsonl.d"
SEGMENT_ROWS = 500


class MetricWriter:
  """Writes scalars to `workdir`/tb (TensorBoard) and to the JSON-lines rows of `workdir`.

  Args:
    workdir: the run directory, a local path or a URL.
    start_step: the step the run starts from (its checkpoint's step, 0 for a fresh
      start); rows and TensorBoard events at later steps are dropped on opening.
    appendable: True for the single appended metrics.jsonl, False for segments;
      None decides from `workdir` (segments on a URL).
  """

  def __init__(self, workdir: str, start_step: int = 0, appendable: bool | None = None):
    self._active = jax.process_index() == 0
    self._tracker = None
    self._root = epath.Path(workdir)
    self._appendable = "://" not in str(workdir) if appendable is None else appendable
    if not self._active:
      return
    from tensorboardX import SummaryWriter

    root = self._root
    root.mkdir(parents=True, exist_ok=True)
    _drop_rows_after(root, start_step)
    # A SessionLog.START event at purge_step: TensorBoard drops the events of the earlier
    # event files at steps >= purge_step (on a fresh start, all of them).
    # A queue that never fills: if the writer thread dies (a full disk), add_scalar must
    # not block; the trainer reports the thread's fault at its next logging step.
    self._tb = SummaryWriter(str(root / "tb"), purge_step=start_step + 1, max_queue=1 << 30)
    if self._appendable:
      self._jsonl = (root / METRICS_FILE).open("a", encoding="utf-8")
    else:
      self._segment_dir = root / SEGMENTS_DIR
      self._segment_dir.mkdir(exist_ok=True)
      segments = [s for s in _segment_paths(root) if s.stem.isdigit()]  # not append_row's
      self._segment = segments[-1] if segments else None
      self._lines = _lines(self._segment) if self._segment else []

  @property
  def path(self) -> str:
    """Where the rows go: metrics.jsonl, or the segments folder."""
    return str(self._root / (METRICS_FILE if self._appendable else SEGMENTS_DIR))

  def track(self, tracker) -> None:
    """Send every later row to `tracker` too (write(step, scalars), close(): a
    cl_jax.runtime.wandb_tracker.Tracker)."""
    self._tracker = tracker

  def write(self, step: int, scalars: dict[str, float]) -> None:
    """Record `scalars` (name -> float) at `step`."""
    if not self._active:
      return
    if self._tracker is not None:
      self._tracker.write(step, scalars)
    for name, value in scalars.items():
      self._tb.add_scalar(name, value, step)
    line = json.dumps({"step": step, **scalars})
    if self._appendable:
      self._jsonl.write(line + "\n")
      self._jsonl.flush()
      return
    if self._segment is None or len(self._lines) >= SEGMENT_ROWS:
      self._segment, self._lines = self._segment_dir / f"{step:010d}.jsonl", []
    self._lines.append(line)
    write_atomically(self._segment, "".join(l + "\n" for l in self._lines))

  def write_text(self, tag: str, text: str, step: int) -> None:
    """Record `text` under `tag` at `step` in TensorBoard (its Text tab)."""
    if self._active:
      self._tb.add_text(tag, text, step)

  def close(self) -> None:
    """Flush and close the event file, metrics.jsonl and the tracker."""
    if self._active:
      if self._tracker is not None:
        self._tracker.close()
      self._tb.close()
      if self._appendable:
        self._jsonl.close()


def append_row(
    workdir: str, step: int, scalars: dict[str, float], tag: str, appendable: bool | None = None
) -> None:
  """Add the row {"step": step, **scalars} of an evaluation job named `tag` (e.g. "probe") to
  the run's metrics and TensorBoard, beside a trainer that may still be writing (see the
  module docstring); `appendable` as in MetricWriter. Only process 0 writes."""
  if jax.process_index() != 0:
    return
  if not tag.isidentifier():
    raise ValueError(f"tag must be a plain name such as 'probe', got {tag!r}")
  from tensorboardX import SummaryWriter

  root = epath.Path(workdir)
  line = json.dumps({"step": step, **scalars}) + "\n"
  if not ("://" not in str(workdir) if appendable is None else appendable):
    segments = root / SEGMENTS_DIR
    segments.mkdir(parents=True, exist_ok=True)
    write_atomically(segments / f"{step:010d}.{tag}.jsonl", line)
  else:
    fd = os.open(root / METRICS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, line.encode())
    finally:
      os.close(fd)
  writer = SummaryWriter(str(root / "tb"), filename_suffix=f".{tag}")
  for name, value in scalars.items():
    writer.add_scalar(name, value, step)
  writer.close()
  from cl_jax.runtime import wandb_tracker

  wandb_tracker.log_row(str(workdir), step, scalars)


def read_jsonl(path: str) -> list[dict]:
  """All records of one JSON-lines file, in order."""
  return [json.loads(line) for line in _lines(epath.Path(path))]


def has_metrics(workdir: str) -> bool:
  """Whether `workdir` holds a metrics log: metrics.jsonl (possibly empty) or a segment."""
  root = epath.Path(workdir)
  return (root / METRICS_FILE).exists() or bool(_segment_paths(root))


def read_metrics(workdir: str) -> list[dict]:
  """Every logged step of the run in `workdir`, in step order, from either layout; the rows
  of one step (training and append_row's) merged into one, later rows adding or replacing keys.

  Raises FileNotFoundError when `workdir` holds no metrics log.
  """
  root = epath.Path(workdir)
  if not has_metrics(workdir):
    raise FileNotFoundError(f"{root / METRICS_FILE} not found: {workdir} has no logged metrics")
  path = root / METRICS_FILE
  rows = read_jsonl(path) if path.exists() else []
  for segment in _segment_paths(root):
    rows += read_jsonl(segment)
  merged = {}
  for row in sorted(rows, key=lambda r: r["step"]):  # stable: file order within a step
    merged.setdefault(row["step"], {}).update(row)
  return list(merged.values())


def _complete(line: str) -> bool:
  """Whether `line` is a whole metrics row: a JSON object with a step."""
  try:
    row = json.loads(line)
  except json.JSONDecodeError:
    return False
  return isinstance(row, dict) and isinstance(row.get("step"), int)


def _lines(path: epath.Path) -> list[str]:
  """The rows of `path` as lines. A line that is not a whole row (the last write of a run
  that crashed or ran out of space mid-line) is left out with a warning on stderr naming
  the file and line, so readers go on and a resumed run rewrites the file without it."""
  lines = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    if _complete(line):
      lines.append(line)
    else:
      print(
          f"warning: {path}, line {number}: not a whole metrics row (a write cut short by a "
          f"crash or a full disk): {line[:60]!r}; skipped",
          file=sys.stderr,
      )
  return lines


def _first_step(segment: epath.Path) -> int:
  """The step a segment's name starts with (<step>.jsonl or append_row's <step>.<tag>.jsonl)."""
  return int(segment.name.split(".")[0])


def _segment_paths(root: epath.Path) -> list[epath.Path]:
  """The segments under `root`/metrics.jsonl.d, in step order."""
  segments = root / SEGMENTS_DIR
  return sorted(segments.glob("*.jsonl"), key=lambda p: p.name) if segments.exists() else []


def _drop_rows_after(root: epath.Path, step: int) -> None:
  """Remove every row with a step > `step`, and any torn line, from both layouts under `root`.

  Later segments are deleted newest first and the straddling file is replaced
  atomically, so a crash at any point keeps every row up to `step`.
  """
  segments = _segment_paths(root)
  kept = [s for s in segments if _first_step(s) <= step]
  for segment in reversed(segments[len(kept) :]):
    segment.unlink()
  training = [s for s in kept if s.stem.isdigit()]  # append_row's one-row segments never straddle
  for path in [root / METRICS_FILE] + training[-1:]:
    if path.exists():
      keep = [l for l in _lines(path) if json.loads(l)["step"] <= step]
      if "".join(l + "\n" for l in keep) != path.read_text():  # later rows, or a torn one
        write_atomically(path, "".join(l + "\n" for l in keep))


def write_atomically(path: epath.Path, data: str | bytes) -> None:
  """Replace the contents of `path` by `data` (text, written as UTF-8, or bytes); a crash or a
  failed write leaves the old or the new contents.

  An object store replaces an object in one step; a local file is written to a
  temporary file beside it, synced, and renamed over it (the temporary file is removed
  when the write fails).
  """
  path = epath.Path(path)
  raw = data.encode("utf-8") if isinstance(data, str) else data
  if "://" in str(path):
    path.write_bytes(raw)
    return
  tmp = path.with_name(path.name + ".tmp")
  try:
    with open(tmp, "wb") as f:
      f.write(raw)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
