"""Score statistics against the training step, several runs overlaid (Zhu et al. 2021, Sec. 3).

The statistics are those logged by the train step (cl_jax.losses.contrast.contrast_stats
of the MoCo and SimCLR objectives), similarities before the temperature:
pos_mean = mean_i q_i.k_i+, neg_mean = mean_i mean_j q_i.n_j, neg_var = mean_i
var_j q_i.n_j over the negatives n_j (MoCo's queue, SimCLR's other in-batch
features) and, with non-semantic negatives, ns_mean = mean_{i,m} q_i.t_im. Each run is labelled by
its directory name and the config fields in which the runs differ, so a sweep
over the EMA momentum reads "run (moco.momentum=0.9)" (their Figs. 3, 5).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure

from cl_jax.runtime import run_config

SCORE_KEYS = ("pos_mean", "neg_mean", "neg_var", "ns_mean")
_TITLES = {
    "pos_mean": "mean positive score  q·k+",
    "neg_mean": "mean negative score  q·n",
    "neg_var": "variance of negative scores",
    "ns_mean": "mean non-semantic score  q·t",
}
_MISSING = object()


def differing_fields(configs: Sequence[Mapping[str, Any]]) -> list[str]:
  """Sorted flattened field names whose value is not the same in every config.

  A field present in some configs and absent from others counts as differing.
  """
  flats = [run_config.flatten(c) for c in configs]
  names = sorted(set().union(*flats)) if flats else []
  return [n for n in names if len({repr(f.get(n, _MISSING)) for f in flats}) > 1]


def run_labels(names: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> list[str]:
  """Legend labels "name (field=value, ...)" listing the fields in which the runs differ.

  Args:
    names: one display name per run (its directory's basename).
    configs: the runs' nested config dicts, same order.
  Returns:
    One label per run; just the name when the configs are identical.
  """
  if len(names) != len(configs):
    raise ValueError(
        f"got {len(names)} run names for {len(configs)} configs; pass one " "config per run"
    )
  fields = differing_fields(configs)
  labels = []
  for name, config in zip(names, configs):
    flat = run_config.flatten(config)
    parts = [f"{f}={flat[f]}" if f in flat else f"{f} unset" for f in fields]
    labels.append(f"{name} ({', '.join(parts)})" if parts else name)
  return labels


def series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps (N,) int64, values (N,) float64) of the records that hold `key`, in file order."""
  rows = [(r["step"], r[key]) for r in records if key in r]
  steps = np.asarray([s for s, _ in rows], dtype=np.int64)
  return steps, np.asarray([v for _, v in rows], dtype=np.float64)


def plot_score_stats(labels: Sequence[str], runs: Sequence[Sequence[Mapping[str, Any]]]) -> Figure:
  """One panel per score statistic against step, one line per run.

  Args:
    labels: legend label of each run (run_labels).
    runs: each run's metrics.jsonl records (dicts with "step" and the SCORE_KEYS
      it logged; ns_mean only for runs with non-semantic negatives).
  Returns:
    The figure; ns_mean gets a panel only when some run logged it.
  """
  if not runs or len(labels) != len(runs):
    raise ValueError(
        f"need one label per run and at least one run; got {len(labels)} labels "
        f"for {len(runs)} runs"
    )
  keys = [k for k in SCORE_KEYS if any(k in r for recs in runs for r in recs)]
  missing = [k for k in SCORE_KEYS[:3] if k not in keys]
  if missing:
    raise ValueError(
        f"no run logged {missing}: these metrics.jsonl files hold no score "
        "statistics (the train step logs pos_mean, neg_mean and neg_var)"
    )
  fig = Figure(figsize=(4.2 * len(keys), 4.2), layout="constrained")
  axes = fig.subplots(1, len(keys), squeeze=False)[0]
  handles = {}
  for ax, key in zip(axes, keys):
    for i, (label, records) in enumerate(zip(labels, runs)):
      steps, values = series(records, key)
      if steps.size:
        (line,) = ax.plot(steps, values, color=f"C{i % 10}", linewidth=1.2)
        handles.setdefault(i, line)
    ax.set_title(_TITLES[key], fontsize=10)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
  order = sorted(handles)
  fig.legend(
      [handles[i] for i in order],
      [labels[i] for i in order],
      loc="outside lower center",
      ncols=min(len(order), 3),
      fontsize=9,
  )
  fig.suptitle("Score statistics of the query features (before the temperature)")
  return fig
