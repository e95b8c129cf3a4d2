"""Per-step scalars to TensorBoard event files and a JSON-lines file.

Only process 0 writes; on other processes the writer discards everything.
Event files are written with tensorboardX, which needs no TensorFlow.
"""
import json
import os

import jax


class MetricWriter:
  """Writes scalars to `workdir`/tb (TensorBoard) and `workdir`/metrics.jsonl."""

  def __init__(self, workdir: str):
    self._active = jax.process_index() == 0
    if self._active:
      from tensorboardX import SummaryWriter
      os.makedirs(workdir, exist_ok=True)
      self._tb = SummaryWriter(os.path.join(workdir, "tb"))
      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")

  def write(self, step: int, scalars: dict[str, float]) -> None:
    """Record `scalars` (name -> float) at `step`."""
    if not self._active:
      return
    for name, value in scalars.items():
      self._tb.add_scalar(name, value, step)
    self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self._jsonl.flush()

  def close(self) -> None:
    if self._active:
      self._tb.close()
      self._jsonl.close()


def read_jsonl(path: str) -> list[dict]:
  """All records of a metrics.jsonl file, in order."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
