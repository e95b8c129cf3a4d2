"""A study's summary and tables (cl_jax.analysis.study): per arm and metric the mean over seeds
and its 95% t-interval, per comparison the paired difference or the per-seed slope with its
interval and verdict (cl_jax.analysis.intervals), the study's markdown tables and the table of
claims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from cl_jax.analysis import intervals
from cl_jax.analysis.study_records import PROBE_LABELS

if TYPE_CHECKING:
  from cl_jax.analysis.study import Comparison, Study


def _by_seed(records: dict, arm_name: str, metric: str) -> dict[int, float]:
  return {
      s: r["metrics"][metric]
      for s, r in records.get(arm_name, {}).items()
      if metric in r["metrics"]
  }


def compare(c: Comparison, records: dict) -> dict:
  """The comparison's interval over the seeds every one of its arms has, and its verdict."""
  per_arm = [_by_seed(records, a, c.metric) for a in c.arms]
  baselines = [_by_seed(records, a, c.metric) for a in c.minus]
  seeds = sorted(set.intersection(*(set(p) for p in per_arm + baselines)))
  out = {"label": c.label, "metric": c.metric, "kind": c.kind, "arms": list(c.arms)}
  out.update({"minus": list(c.minus), "x": list(c.x), "expect": c.expect, "seeds": seeds})
  if not seeds:
    out.update(interval=None, verdict=None if c.expect is None else intervals.NOT_RESOLVED)
    return out
  y = np.array([[p[s] for p in per_arm] for s in seeds])
  if baselines:
    y = y - np.array([[p[s] for p in baselines] for s in seeds])
  if c.kind == "difference":
    interval = intervals.paired_difference(y[:, 0], y[:, 1])
  else:
    interval = intervals.slope_interval(c.x, y)
  out["interval"] = dataclasses.asdict(interval)
  out["verdict"] = None if c.expect is None else intervals.verdict(interval, c.expect)
  return out


def summarise(study: Study, records: dict) -> dict:
  """{"arms": {arm: {metric: interval dict, "seeds": [...]}}, "comparisons": [...],
  "verdict": the claim's combined verdict (None for a study without expectations)}."""
  arms = {}
  for a in study.arms:
    row = {"seeds": sorted(records.get(a.name, {}))}
    for m in study.metrics:
      values = list(_by_seed(records, a.name, m).values())
      row[m] = dataclasses.asdict(intervals.t_interval(values)) if values else None
    arms[a.name] = row
  comparisons = [compare(c, records) for c in study.comparisons]
  decided = [c["verdict"] for c in comparisons if c["verdict"] is not None]
  return {
      "study": study.name,
      "title": study.title,
      "paper": study.paper,
      "where": study.where,
      "claim": study.claim,
      "paper_result": study.paper_result,
      "arms": arms,
      "comparisons": comparisons,
      "verdict": intervals.combined_verdict(decided) if decided else None,
  }


def _cell(d: dict | None, digits: int = 1) -> str:
  if d is None:
    return "-"
  return intervals.Interval(**d).text(digits)


def metric_digits(metric: str) -> int:
  return 1 if metric in PROBE_LABELS or metric == "mean" or "random_init/" in metric else 3


def markdown(study: Study, summary: dict) -> str:
  """The study's tables: per arm the mean [95% interval] of each metric, then the comparisons."""
  lines = [f"## {study.title}", ""]
  if study.claim:
    lines += [f"{study.paper}, {study.where}: {study.claim}", ""]
    if study.paper_result:
      lines += [f"The paper: {study.paper_result}", ""]
  lines += [
      "| arm | " + " | ".join(study.metrics) + " | seeds |",
      "|---|" + "---:|" * (len(study.metrics) + 1),
  ]
  for a in study.arms:
    row = summary["arms"][a.name]
    cells = [_cell(row[m], metric_digits(m)) for m in study.metrics]
    lines.append(f"| {a.name} | " + " | ".join(cells) + f" | {len(row['seeds'])} |")
  if summary["comparisons"]:
    lines += ["", "| comparison | metric | estimate [95% interval] | expected | verdict | seeds |"]
    lines.append("|---|---|---:|---|---|---:|")
    for c in summary["comparisons"]:
      what = "slope" if c["kind"] == "slope" else "difference"
      est = _cell(c["interval"], 3 if c["kind"] == "slope" else metric_digits(c["metric"]))
      lines.append(
          f"| {c['label']} | {c['metric']} ({what}) | {est} | {c['expect'] or '-'} | "
          f"{c['verdict'] or '-'} | {len(c['seeds'])} |"
      )
  if summary["verdict"] is not None:
    lines += ["", f"Verdict: **{summary['verdict']}**"]
  if study.notes:
    lines += ["", study.notes]
  return "\n".join(lines) + "\n"


def claims_table(studies: Sequence[Study], summaries: Sequence[dict], seeds: int) -> str:
  """One markdown row per claim: the paper's result, every decisive comparison's estimate
  [95% interval] and verdict, the claim's verdict ("not run yet" without a record), the
  records it rests on (of arms x seeds) and the command that reruns it."""
  lines = [
      "| claim | the paper | measured here: estimate [95% interval], verdict | verdict | "
      "runs | command |",
      "|---|---|---|---|---:|---|",
  ]
  for s, summary in zip(studies, summaries):
    parts = []
    for c in summary["comparisons"]:
      if c["expect"] is None:
        continue
      est = _cell(c["interval"], 3 if c["kind"] == "slope" else metric_digits(c["metric"]))
      parts.append(f"{c['label']} ({c['kind']}): {est}, {c['verdict']}")
    done = sum(len(summary["arms"][a.name]["seeds"]) for a in s.arms)
    verdict = f"**{summary['verdict']}**" if done else "not run yet"
    lines.append(
        f"| {s.paper}, {s.where}: {s.claim} | {s.paper_result} | {'; '.join(parts)} | "
        f"{verdict} | {done} of {len(s.arms) * seeds} | "
        f"`python -m cl_jax.study --study={s.name}` |"
    )
  return "\n".join(lines) + "\n"
