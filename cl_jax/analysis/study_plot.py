"""The PNG of a study (cl_jax.analysis.study): one panel per comparison, or per metric for a
study without comparisons. A panel shows each arm's seeds as dots and their mean with its 95%
t-interval as a bar (for a slope of gains, each seed's gain over its baseline arm); sweeps are
drawn against the swept value, pairs side by side. The panel's
title gives the comparison's estimate [interval] and verdict."""

import math

import numpy as np
from matplotlib.figure import Figure

from cl_jax.analysis import intervals
from cl_jax.viz.png import save

__all__ = ["plot", "save"]


def _values(records: dict, arm: str, metric: str, minus: str | None) -> list[float]:
  """The arm's metric per seed, less the `minus` arm's at the same seed (a paired gain)."""
  own = {s: r["metrics"][metric] for s, r in records.get(arm, {}).items() if metric in r["metrics"]}
  if minus is None:
    return list(own.values())
  base = {
      s: r["metrics"][metric] for s, r in records.get(minus, {}).items() if metric in r["metrics"]
  }
  return [v - base[s] for s, v in own.items() if s in base]


def _panel(ax, arms, xs, metric: str, records: dict, minus=None) -> None:
  for a, x, m in zip(arms, xs, minus or [None] * len(arms)):
    values = _values(records, a, metric, m)
    if not values:
      continue
    ax.plot([x] * len(values), values, "o", color="0.6", markersize=3)
    i = intervals.t_interval(values)
    err = None if math.isnan(i.low) else [[i.mean - i.low], [i.high - i.mean]]
    ax.errorbar([x], [i.mean], yerr=err, fmt="s", color="C0", capsize=4)
  ax.set_ylabel(f"{metric} gain" if minus else metric)
  ax.grid(alpha=0.3)


def plot(study, summary: dict, records: dict) -> Figure:
  """The study's figure from summarise()'s dict and the records {arm: {seed: record}}."""
  comparisons = summary["comparisons"]
  n = len(comparisons) or len(study.metrics)
  cols = min(n, 3)
  rows = math.ceil(n / cols)
  fig = Figure(figsize=(4.2 * cols, 3.4 * rows), layout="constrained")
  axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
  for ax in axes[n:]:
    ax.set_visible(False)
  if comparisons:
    for ax, c in zip(axes, comparisons):
      if c["kind"] == "slope":
        xs = c["x"]
        ax.set_xlabel("swept value")
      else:
        xs = [0.0, 1.0]
        ax.set_xticks(xs, c["arms"], fontsize=7)
        ax.set_xlim(-0.5, 1.5)
      _panel(ax, c["arms"], xs, c["metric"], records, c["minus"])
      est = "-" if c["interval"] is None else intervals.Interval(**c["interval"]).text(3)
      ax.set_title(f"{c['label']}\n{c['kind']} {est} {c['verdict'] or ''}", fontsize=8)
  else:
    names = [a.name for a in study.arms]
    for ax, m in zip(axes, study.metrics):
      _panel(ax, names, list(range(len(names))), m, records)
      ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=6)
  fig.suptitle(study.title, fontsize=10)
  return fig
