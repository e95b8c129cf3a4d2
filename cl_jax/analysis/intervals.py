"""Means over seeds with 95% t-intervals, paired differences and per-seed slopes, and the
verdict of an expected direction.

Every interval is Student's t over independent replicates: for values x_1..x_n,
mean +- t_{0.975, n-1} s / sqrt(n), s the sample standard deviation (ddof 1) (scipy.stats.t).
Replicates are seeds. A comparison of two arms is paired: the difference is taken seed by seed
(the same seed gives both arms the same data order and initialisation) and the interval is that
of the differences. A sweep over a value x is summarised by its slope: for each seed the
least-squares slope of the metric on x over the sweep's arms, then the interval of the seeds'
slopes. One replicate has no interval (its bounds are NaN).
"""

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import scipy.stats

LEVEL = 0.95
# Expected directions of a comparison: the value rises, falls, or at least does not fall.
DIRECTIONS = ("increase", "decrease", "no_decrease")
REPRODUCED, OPPOSITE, NOT_RESOLVED = "reproduced", "opposite", "not resolved"


@dataclasses.dataclass(frozen=True)
class Interval:
  """mean of n replicates and its two-sided t-interval [low, high] (NaN for n = 1)."""

  mean: float
  low: float
  high: float
  n: int

  def text(self, digits: int = 1) -> str:
    """ "m [low, high]" (or "m" alone for one replicate)."""
    if self.n < 2:
      return f"{self.mean:.{digits}f}"
    return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
  """Mean of `values` (n,) and mean +- t_{(1+level)/2, n-1} s / sqrt(n)."""
  x = np.asarray(values, dtype=np.float64)
  if x.ndim != 1 or x.size == 0:
    raise ValueError(f"t_interval needs a non-empty 1-d sequence, got shape {x.shape}")
  mean = float(x.mean())
  if x.size < 2:
    return Interval(mean, math.nan, math.nan, 1)
  half = float(scipy.stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
  return Interval(mean, mean - half, mean + half, int(x.size))


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
  """Interval of a_i - b_i over replicates i (a and b (n,), paired by index)."""
  a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  if a.shape != b.shape:
    raise ValueError(f"paired values must have one shape, got {a.shape} and {b.shape}")
  return t_interval(a - b, level)


def slopes(x: Sequence[float], y: np.ndarray) -> np.ndarray:
  """Least-squares slope of each row of y (n, m) on x (m,): sum (x - x̄)(y - ȳ) / sum (x - x̄)^2."""
  x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
  if y.ndim != 2 or y.shape[1] != x.size or x.size < 2 or np.ptp(x) == 0:
    raise ValueError(f"slopes need y (n, {x.size}) over at least two distinct x, got {y.shape}")
  dx = x - x.mean()
  return (y - y.mean(axis=1, keepdims=True)) @ dx / (dx @ dx)


def slope_interval(x: Sequence[float], y: np.ndarray, level: float = LEVEL) -> Interval:
  """Interval of the per-replicate slopes of y (n replicates, m swept values) on x (m,)."""
  return t_interval(slopes(x, y), level)


def verdict(interval: Interval, expect: str) -> str:
  """The verdict of `interval` for the expected direction `expect` (DIRECTIONS):

  increase / decrease: reproduced when the interval excludes 0 on the expected side,
  opposite when it excludes 0 on the other side, else not resolved.
  no_decrease (a value that should not fall): opposite when the interval lies wholly
  below 0, else reproduced; with one replicate (no interval) it is not resolved.
  """
  if expect not in DIRECTIONS:
    raise ValueError(f"expected direction must be one of {DIRECTIONS}, got {expect!r}")
  if interval.n < 2:
    return NOT_RESOLVED
  above, below = interval.low > 0, interval.high < 0
  if expect == "no_decrease":
    return OPPOSITE if below else REPRODUCED
  if expect == "decrease":
    above, below = below, above
  return REPRODUCED if above else OPPOSITE if below else NOT_RESOLVED


def combined_verdict(verdicts: Sequence[str]) -> str:
  """A claim's verdict from its parts': reproduced when every part is, opposite when any
  part is opposite, else not resolved."""
  if not verdicts:
    raise ValueError("a claim needs at least one part with an expected direction")
  if any(v == OPPOSITE for v in verdicts):
    return OPPOSITE
  return REPRODUCED if all(v == REPRODUCED for v in verdicts) else NOT_RESOLVED
