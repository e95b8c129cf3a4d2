"""Means over seeds with 95% t-intervals, paired differences and slopes, and the verdicts of a
claim's comparisons under Holm's correction.

Every interval is Student's t over independent replicates: for values x_1..x_n,
mean +- t_{0.975, n-1} s / sqrt(n), s the sample standard deviation (ddof 1) (scipy.stats.t).
Replicates are seeds. A comparison of two arms is paired: the difference is taken seed by seed
(the same seed gives both arms the same data order and initialisation) and the interval is that
of the differences. A sweep over a value x is summarised by its slope: for each seed the
least-squares slope of the metric on x over the sweep's arms, then the interval of the seeds'
slopes. One replicate has no interval (its bounds are NaN). The same sweep's pooled regression
with seed effects, y_si = a_s + b x_i + e_si (one intercept per seed, one slope b), estimates b
with a t-interval on n m - n - 1 degrees of freedom (pooled_slope); a claim names which of the
two is its primary analysis.

A comparison with an expected direction is a test (an Estimate's p_value):
  increase / decrease: H0 "no difference" (theta = 0), two-sided; reproduced when it is
    rejected with theta on the expected side, opposite when on the other;
  no_decrease / no_increase, "is kept": a non-inferiority test with a margin M > 0 fixed
    before the runs, H0 theta <= -M (no_decrease) or theta >= M (no_increase); its p-value is
    twice the one-sided one, so p < alpha exactly when the two-sided (1 - alpha) interval lies
    above -M (below M); reproduced ("kept") when H0 is rejected, opposite when the interval lies
    wholly beyond the margin on the wrong side.
A claim's m decisive comparisons are tested together at family-wise level alpha = 0.05 by
Holm's step-down procedure (Holm 1979, Scand. J. Statist. 6: 65-70): with the p-values sorted,
p_(1) <= ... <= p_(m), the adjusted p_(j)^Holm = max_{i <= j} min(1, (m - i + 1) p_(i)); a
comparison's H0 is rejected when its adjusted p-value is at most alpha. Its adjusted interval
is the (1 - alpha / (m - j + 1)) interval, the level at which Holm's step j tests it. (scipy
and the project's dependencies have no Holm procedure; it is these few lines.)

A claim's headline verdict comes from its primary parts only (headline_verdict): reproduced,
opposite, mixed or not resolved; Holm's family is still every decisive part. A part that is not
resolved shows its minimum detectable effect at 80% power (min_detectable_effect).
"""

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import scipy.stats

LEVEL = 0.95
ALPHA = 1 - LEVEL
# Expected directions of a comparison: the value rises, falls, or is kept (does not fall, does
# not rise: non-inferiority within a margin).
DIRECTIONS = ("increase", "decrease", "no_decrease", "no_increase")
NON_INFERIORITY = ("no_decrease", "no_increase")
REPRODUCED, OPPOSITE, NOT_RESOLVED = "reproduced", "opposite", "not resolved"
# A headline whose decided primary parts disagree (headline_verdict).
MIXED = "mixed"
POWER = 0.8
# A comparison whose records come from different code (cl_jax.analysis.fingerprint).
REFUSED = "refused"


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


@dataclasses.dataclass(frozen=True)
class Estimate:
  """An estimate `value` with standard error `se` on `df` degrees of freedom from `n` seeds
  (se and df NaN for one seed)."""

  value: float
  se: float
  df: float
  n: int

  def interval(self, level: float = LEVEL) -> Interval:
    """value +- t_{(1+level)/2, df} se."""
    if self.n < 2:
      return Interval(self.value, math.nan, math.nan, self.n)
    half = float(scipy.stats.t.ppf((1 + level) / 2, self.df) * self.se)
    return Interval(self.value, self.value - half, self.value + half, self.n)

  def p_value(self, expect: str, margin: float | None = None) -> float:
    """The p-value of the test of `expect` (module docstring): two-sided for H0 theta = 0, or
    twice the one-sided one for the non-inferiority H0 beyond `margin`; NaN for one seed."""
    if self.n < 2:
      return math.nan
    if expect in NON_INFERIORITY:
      distance = self.value + margin if expect == "no_decrease" else margin - self.value
      if self.se == 0:
        return 0.0 if distance > 0 else 1.0
      return min(1.0, 2 * float(scipy.stats.t.sf(distance / self.se, self.df)))
    if self.se == 0:
      return 0.0 if self.value != 0 else 1.0
    return float(2 * scipy.stats.t.sf(abs(self.value) / self.se, self.df))


def mean_estimate(values: Sequence[float]) -> Estimate:
  """The mean of independent replicates `values` (n,): se s / sqrt(n), df n - 1."""
  x = np.asarray(values, dtype=np.float64)
  if x.ndim != 1 or x.size == 0:
    raise ValueError(f"t_interval needs a non-empty 1-d sequence, got shape {x.shape}")
  if x.size < 2:
    return Estimate(float(x.mean()), math.nan, math.nan, 1)
  return Estimate(float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size)), x.size - 1, x.size)


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
  """Mean of `values` (n,) and mean +- t_{(1+level)/2, n-1} s / sqrt(n)."""
  return mean_estimate(values).interval(level)


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


def pooled_slope(x: Sequence[float], y: np.ndarray) -> Estimate:
  """The slope b of the regression y_si = a_s + b x_i + e_si over y (n seeds, m values) on x
  (m,), one intercept per seed: b = sum_s sum_i (x_i - x̄)(y_si - ȳ_s) / (n sum_i (x_i - x̄)^2)
  (with every seed at the same x, the mean of the per-seed slopes), se^2 = RSS / (n m - n - 1)
  / (n sum_i (x_i - x̄)^2), on n m - n - 1 degrees of freedom."""
  x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
  per_seed = slopes(x, y)
  n, m = y.shape
  dx = x - x.mean()
  b = float(per_seed.mean())
  df = n * m - n - 1
  if df < 1:
    return Estimate(b, math.nan, math.nan, 1)
  residuals = y - y.mean(axis=1, keepdims=True) - b * dx
  se = math.sqrt(float((residuals**2).sum()) / df / (n * float(dx @ dx)))
  return Estimate(b, se, df, n)


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm's adjusted p-values (module docstring) in the order given; a NaN p-value (one seed)
  counts as 1."""
  p = np.nan_to_num(np.asarray(p_values, dtype=np.float64), nan=1.0)
  order = np.argsort(p, kind="stable")
  m = p.size
  adjusted = np.empty(m)
  running = 0.0
  for j, i in enumerate(order):
    running = max(running, min(1.0, (m - j) * p[i]))
    adjusted[i] = running
  return adjusted.tolist()


def holm_levels(p_values: Sequence[float], alpha: float = ALPHA) -> list[float]:
  """The confidence level at which Holm's procedure tests each comparison: 1 - alpha / (m - j)
  for the one at 0-based rank j of the sorted p-values."""
  p = np.nan_to_num(np.asarray(p_values, dtype=np.float64), nan=1.0)
  levels = np.empty(p.size)
  for j, i in enumerate(np.argsort(p, kind="stable")):
    levels[i] = 1 - alpha / (p.size - j)
  return levels.tolist()


def verdict(
    estimate: Estimate,
    expect: str,
    p_adjusted: float,
    margin: float | None = None,
    level: float = LEVEL,
    alpha: float = ALPHA,
) -> str:
  """The verdict of a comparison with expected direction `expect` (DIRECTIONS) from its
  estimate and its Holm-adjusted p-value (module docstring): reproduced, opposite or not
  resolved; with one seed not resolved. `level`: the adjusted interval's, which decides
  "opposite" for a non-inferiority comparison (wholly beyond the margin on the wrong side)."""
  if expect not in DIRECTIONS:
    raise ValueError(f"expected direction must be one of {DIRECTIONS}, got {expect!r}")
  if expect in NON_INFERIORITY and not (margin and margin > 0):
    raise ValueError(f"a {expect} comparison needs a margin > 0, got {margin!r}")
  if estimate.n < 2:
    return NOT_RESOLVED
  if expect in NON_INFERIORITY:
    if p_adjusted <= alpha:
      return REPRODUCED
    i = estimate.interval(level)
    beyond = i.high < -margin if expect == "no_decrease" else i.low > margin
    return OPPOSITE if beyond else NOT_RESOLVED
  if p_adjusted > alpha:
    return NOT_RESOLVED
  expected_side = estimate.value > 0 if expect == "increase" else estimate.value < 0
  return REPRODUCED if expected_side else OPPOSITE


def _refused_or_reproduced(verdicts: Sequence[str], part: str) -> str | None:
  """REFUSED when any of a claim's part verdicts is, REPRODUCED when every one is, else None;
  ValueError for a claim without a `part` that has an expected direction."""
  if not verdicts:
    raise ValueError(f"a claim needs at least one {part} with an expected direction")
  if REFUSED in verdicts:
    return REFUSED
  return REPRODUCED if all(v == REPRODUCED for v in verdicts) else None


def headline_verdict(primary: Sequence[str]) -> str:
  """A claim's headline verdict from the verdicts of its primary parts (the comparisons that test
  the quoted headline sentence itself): refused when any part is (records of different code);
  reproduced when every part is; opposite when at least one part is decided and every decided
  part (reproduced or opposite) is opposite; mixed when decided parts disagree; otherwise not
  resolved. Secondary parts are reported beside it and never decide it."""
  settled = _refused_or_reproduced(primary, "primary part")
  if settled:
    return settled
  decided = {v for v in primary if v in (REPRODUCED, OPPOSITE)}
  if decided == {OPPOSITE}:
    return OPPOSITE
  return MIXED if len(decided) == 2 else NOT_RESOLVED


def any_opposite_verdict(verdicts: Sequence[str]) -> str:
  """The claim-level rule of the first campaign (until 2026-12-05), over every decisive part,
  primary or secondary: refused when any part is, else reproduced when every part is, opposite
  when any part is opposite, else not resolved. Shown beside headline_verdict."""
  settled = _refused_or_reproduced(verdicts, "part")
  if settled:
    return settled
  return OPPOSITE if OPPOSITE in verdicts else NOT_RESOLVED


def min_detectable_effect(estimate: Estimate, level: float, power: float = POWER) -> float:
  """The smallest true effect that a two-sided t-test at `level` (Holm's level for the
  comparison, e.g. 1 - 0.05 / 3) would detect with probability `power`, at the estimate's
  standard error and degrees of freedom: (t_{(1+level)/2, df} + t_{power, df}) se (the
  normal-shift approximation of the t-test's power, the other tail neglected). For a
  non-inferiority test it is the distance inside the margin that the true change must lie at
  for "kept" to be shown with that power. NaN for one seed."""
  if estimate.n < 2:
    return math.nan
  quantiles = scipy.stats.t.ppf([(1 + level) / 2, power], estimate.df)
  return float(quantiles.sum() * estimate.se)
