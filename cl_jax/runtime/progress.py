"""Progress of a run on the console: a bar on a terminal, plain lines in a log.

On a terminal (stderr is a TTY) a tqdm bar shows every step, with the loss and
lr of the last logging step. When the output goes to a file (nohup, SLURM,
a CI log) the bar's carriage-return updates would flood it, so one plain line
is printed per logging step instead. Warnings are printed above the bar.
"""

import sys
import time

import tqdm


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Progress:
  """Steps `initial` .. `total` of a run; silent when not `enabled` (processes > 0)."""

  def __init__(self, total: int, initial: int, enabled: bool, interactive: bool | None = None):
    self._enabled = enabled
    self._interactive = sys.stderr.isatty() if interactive is None else interactive
    self._total, self._initial = total, initial
    self._started = self._t0 = time.perf_counter()
    self._bar = (
        tqdm.tqdm(total=total, initial=initial, desc="pretrain", dynamic_ncols=True)
        if enabled and self._interactive
        else None
    )
    self._knn = ""

  def step(self) -> None:
    """One step taken."""
    if self._bar is not None:
      self._bar.update(1)

  def compiled(self, step: int, seconds: float) -> None:
    """The first step (`step`) took `seconds` with compilation: report it, and estimate
    the time left from the steps after it."""
    self.write(f"first step (with compilation): {seconds:.1f} s")
    self._t0, self._initial = time.perf_counter(), step

  def log(self, step: int, scalars: dict[str, float]) -> None:
    """The scalars of a logging step: on the bar, or one plain line."""
    if not self._enabled:
      return
    knn = {k[4:]: v for k, v in scalars.items() if k.startswith("knn/") and k != "knn/seconds"}
    if knn:
      self._knn = " ".join(f"{label} {100 * acc:.1f}" for label, acc in knn.items())
    if self._bar is not None:
      extra = {"knn": self._knn} if self._knn else {}
      self._bar.set_postfix(loss=f"{scalars['loss']:.4f}", lr=f"{scalars['lr']:.3g}", **extra)
      return
    now = time.perf_counter()
    left = (now - self._t0) / max(step - self._initial, 1) * (self._total - step)
    elapsed = now - self._started
    speed = f" {scalars['img_per_s']:.1f} img/s" if "img_per_s" in scalars else ""
    knn_text = f" kNN {self._knn}" if knn else ""
    print(
        f"step {step}/{self._total} loss {scalars['loss']:.4f} lr {scalars['lr']:.3g}"
        f"{speed}{knn_text} elapsed {_duration(elapsed)} left ~{_duration(left)}",
        flush=True,
    )

  def write(self, line: str) -> None:
    """Print `line` (above the bar when there is one)."""
    if not self._enabled:
      return
    if self._bar is not None:
      tqdm.tqdm.write(line)
    else:
      print(line, flush=True)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


class Throughput:
  """Images per second of training alone: the time of compilations and monitors is left out."""

  def __init__(self, step: int, batch_size: int):
    self.t, self.step, self.batch_size = time.perf_counter(), step, batch_size

  def exclude(self, seconds: float) -> None:
    """Leave `seconds` (a compilation, an evaluation) out of the next rate."""
    self.t += seconds

  def restart(self, step: int) -> float:
    """Start counting again after `step`; returns the seconds since the last start."""
    now = time.perf_counter()
    seconds, self.t, self.step = now - self.t, now, step
    return seconds

  def rate(self, step: int) -> float | None:
    """img/s from the last start to the end of `step` (None if no step was taken); restarts."""
    steps, seconds = step - self.step, self.restart(step)
    return steps * self.batch_size / seconds if steps > 0 else None
