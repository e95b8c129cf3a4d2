"""Per-step scalars to TensorBoard event files and a JSON-lines file.

Only process 0 writes; on other processes the writer discards everything.
Event files are written with tensorboardX, which needs no TensorFlow (on a
gs:// workdir it needs the google-cloud-storage package). The workdir may be a
local path or a URL (etils.epath); object stores cannot append, so there the
JSON-lines file is rewritten whole at every write.
"""
import json

import jax
from etils import epath


class MetricWriter:
  """Writes scalars to `workdir`/tb (TensorBoard) and `workdir`/metrics.jsonl."""

  def __init__(self, workdir: str):
    self._active = jax.process_index() == 0
    if self._active:
      from tensorboardX import SummaryWriter
      root = epath.Path(workdir)
      root.mkdir(parents=True, exist_ok=True)
      self._tb = SummaryWriter(str(root / "tb"))
      self._path = root / "metrics.jsonl"
      self._remote = "://" in str(workdir)
      if self._remote:
        self._lines = self._path.read_text().splitlines() if self._path.exists() else []
      else:
        self._jsonl = self._path.open("a", encoding="utf-8")

  def write(self, step: int, scalars: dict[str, float]) -> None:
    """Record `scalars` (name -> float) at `step`."""
    if not self._active:
      return
    for name, value in scalars.items():
      self._tb.add_scalar(name, value, step)
    line = json.dumps({"step": step, **scalars})
    if self._remote:
      self._lines.append(line)
      self._path.write_text("\n".join(self._lines) + "\n")
    else:
      self._jsonl.write(line + "\n")
      self._jsonl.flush()

  def close(self) -> None:
    if self._active:
      self._tb.close()
      if not self._remote:
        self._jsonl.close()


def read_jsonl(path: str) -> list[dict]:
  """All records of a metrics.jsonl file, in order."""
  return [json.loads(line) for line in epath.Path(path).read_text().splitlines() if line.strip()]
