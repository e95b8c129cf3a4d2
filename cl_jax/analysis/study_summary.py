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


def _same_source(r: dict, q: dict) -> bool:
  """Records trained from the same source (its digest) with the same JAX: the same code,
  whatever processor ran them."""
  same_jax = r.get("environment", {}).get("jax") == q.get("environment", {}).get("jax")
  return same_jax and r["code"].get("source_sha256") == q["code"].get("source_sha256")


def code_refusal(records: dict, arm_names: Sequence[str], seeds: Sequence[int]) -> str | None:
  """One line naming two records of `arm_names` x `seeds` that may come from different code, or
  a record without a fingerprint (written by older code); None when they agree. Two records
  agree when they were trained from the same source (digest and JAX version), or, from other
  source on the same processor, when every fingerprint component both hold is equal
  (cl_jax.analysis.fingerprint). Fingerprints from different processors differ in their last
  bits whatever the code, so records from other source on other processors are refused."""
  from cl_jax.analysis import fingerprint

  used = [(a, s, records[a][s]) for a in dict.fromkeys(arm_names) for s in seeds]
  for a, s, r in used:
    if not r.get("code", {}).get("fingerprint"):
      return f"record {a} seed {s} has no code fingerprint (older code): run it again"
  for i, (a, s, r) in enumerate(used):
    for b, t, q in used[i + 1 :]:
      if _same_source(r, q):
        continue
      named = (
          f"records {a} seed {s} ({r['code']['commit']}) and {b} seed {t} ({q['code']['commit']})"
      )
      # The environment (cl_jax.analysis.study_records.environment: JAX, XLA_FLAGS, the
      # processor) decides a fingerprint's bits beside the code.
      if r.get("environment") != q.get("environment"):
        return (
            f"{named} come from other source on other processors, so their code fingerprints "
            "cannot be compared: run the study again from one commit or on one processor"
        )
      differ = fingerprint.differing(r["code"]["fingerprint"], q["code"]["fingerprint"])
      if differ:
        return (
            f"{named} come from different code ({differ[0]} differs): delete the older record "
            "and run the study again"
        )
  return None


def compare(c: Comparison, records: dict, sweep_analysis: str = "per_seed") -> dict:
  """The comparison over the seeds every one of its arms has: its primary estimate with the
  95% interval and p-value of its test (a slope's primary analysis is `sweep_analysis`, the
  other one its "sensitivity" interval), or refused (records of different code). The
  verdict and the adjusted interval are the claim's (summarise: Holm over its comparisons)."""
  per_arm = [_by_seed(records, a, c.metric) for a in c.arms]
  baselines = [_by_seed(records, a, c.metric) for a in c.minus]
  seeds = sorted(set.intersection(*(set(p) for p in per_arm + baselines)))
  out = {"label": c.label, "metric": c.metric, "kind": c.kind, "arms": list(c.arms)}
  out.update({"minus": list(c.minus), "x": list(c.x), "expect": c.expect, "seeds": seeds})
  out.update(margin=c.margin, quote=c.quote, where=c.where, p=None, sensitivity=None)
  out.update(interval=None, estimate=None, refused=None)
  if not seeds:
    return out
  refusal = code_refusal(records, (*c.arms, *c.minus), seeds)
  if refusal:
    out["refused"] = refusal
    return out
  y = np.array([[p[s] for p in per_arm] for s in seeds])
  if baselines:
    y = y - np.array([[p[s] for p in baselines] for s in seeds])
  if c.kind == "difference":
    estimate = intervals.mean_estimate(y[:, 0] - y[:, 1])
  else:
    per_seed = intervals.mean_estimate(intervals.slopes(c.x, y))
    pooled = intervals.pooled_slope(c.x, y)
    estimate, other = (per_seed, pooled) if sweep_analysis == "per_seed" else (pooled, per_seed)
    other_name = "pooled" if sweep_analysis == "per_seed" else "per_seed"
    out["sensitivity"] = {"analysis": other_name, **dataclasses.asdict(other.interval())}
  out["estimate"] = dataclasses.asdict(estimate)
  out["interval"] = dataclasses.asdict(estimate.interval())
  if c.expect is not None:
    out["p"] = estimate.p_value(c.expect, c.margin)
  return out


def judge(comparisons: list[dict], min_seeds: int) -> None:
  """The verdicts of a claim's decisive comparisons (those with an expected direction), in
  place: Holm's adjusted p-value over all m of them ("p_holm"; a comparison without data,
  refused, or over fewer than `min_seeds` seeds counts with p = 1), the interval at the level
  Holm's step tests it ("adjusted_interval", "adjusted_level") and the verdict
  (intervals.verdict; not resolved below `min_seeds` seeds, with "too_few_seeds" set)."""
  decisive = [c for c in comparisons if c["expect"] is not None]
  for c in decisive:
    c["too_few_seeds"] = c["estimate"] is not None and len(c["seeds"]) < min_seeds
  p = [1.0 if c["p"] is None or c["too_few_seeds"] else c["p"] for c in decisive]
  for c, p_holm, level in zip(decisive, intervals.holm(p), intervals.holm_levels(p)):
    c.update(p_holm=p_holm, adjusted_level=level, adjusted_interval=None)
    if c["refused"]:
      c["verdict"] = intervals.REFUSED
    elif c["estimate"] is None or c["too_few_seeds"]:
      c["verdict"] = intervals.NOT_RESOLVED
    else:
      estimate = intervals.Estimate(**c["estimate"])
      c["adjusted_interval"] = dataclasses.asdict(estimate.interval(level))
      c["verdict"] = intervals.verdict(estimate, c["expect"], p_holm, c["margin"], level)
  for c in comparisons:
    c.setdefault("verdict", None)


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
  comparisons = [compare(c, records, study.sweep_analysis) for c in study.comparisons]
  judge(comparisons, study.min_seeds)
  decided = [c["verdict"] for c in comparisons if c["verdict"] is not None]
  return {
      "study": study.name,
      "title": study.title,
      "paper": study.paper,
      "where": study.where,
      "claim": study.claim,
      "paper_result": study.paper_result,
      "sweep_analysis": study.sweep_analysis,
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


def _expected(c: dict) -> str:
  """The expected direction, with its margin for a non-inferiority comparison."""
  if c["expect"] in intervals.NON_INFERIORITY:
    return f"{c['expect']} (margin {c['margin']:g})"
  return c["expect"] or "-"


def _estimates(c: dict) -> tuple[str, str]:
  """ "estimate [95% interval]" and "[adjusted interval]" of a comparison (refused or "-")."""
  digits = 3 if c["kind"] == "slope" else metric_digits(c["metric"])
  if c["refused"]:
    return "refused", "-"
  adjusted = c.get("adjusted_interval")
  if adjusted is None or adjusted["n"] < 2:
    return _cell(c["interval"], digits), "-"
  i = intervals.Interval(**adjusted)
  return _cell(c["interval"], digits), f"[{i.low:.{digits}f}, {i.high:.{digits}f}]"


def _p(value: float | None) -> str:
  return "-" if value is None or value != value else f"{value:.3g}"


def markdown(study: Study, summary: dict) -> str:
  """The study's tables: per arm the mean [95% interval] of each metric, then the comparisons
  (raw and Holm-adjusted intervals, p-values, verdicts), the paper's sentence behind each
  decisive comparison and any refusal."""
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
  comparisons = summary["comparisons"]
  if comparisons:
    lines += [
        "",
        "| comparison | metric | estimate [95% interval] | Holm-adjusted interval | p | "
        "p (Holm) | expected | verdict | seeds |",
        "|---|---|---:|---:|---:|---:|---|---|---:|",
    ]
    for c in comparisons:
      what = "slope" if c["kind"] == "slope" else "difference"
      raw, adjusted = _estimates(c)
      lines.append(
          f"| {c['label']} | {c['metric']} ({what}) | {raw} | {adjusted} | {_p(c['p'])} | "
          f"{_p(c.get('p_holm'))} | {_expected(c)} | {_verdict(c, study.min_seeds)} | "
          f"{len(c['seeds'])} |"
      )
    sweeps = [c for c in comparisons if c["sensitivity"]]
    if sweeps:
      primary = summary["sweep_analysis"].replace("_", "-")
      lines += ["", f"Slopes: the primary analysis is the {primary} one; the other, beside it:"]
      for c in sweeps:
        other = c["sensitivity"]
        shown = intervals.Interval(other["mean"], other["low"], other["high"], other["n"]).text(3)
        lines.append(f"- {c['label']}: {other['analysis'].replace('_', '-')} {shown}")
    quoted = [c for c in comparisons if c["expect"] is not None]
    if quoted:
      lines += ["", "What the paper says, for each decisive comparison:"]
      for c in quoted:
        margin = ""
        if c["expect"] in intervals.NON_INFERIORITY:
          reason = next(x.margin_reason for x in study.comparisons if x.label == c["label"])
          margin = f" Margin {c['margin']:g}: {reason}"
        lines.append(f"- {c['label']}: \u201c{c['quote']}\u201d ({c['where']}).{margin}")
    refusals = {c["refused"]: c["label"] for c in comparisons if c["refused"]}
    for line in refusals:
      labels = ", ".join(c["label"] for c in comparisons if c["refused"] == line)
      lines += ["", f"Refused ({labels}): {line}"]
  if summary["verdict"] is not None:
    lines += ["", f"Verdict: **{summary['verdict']}**"]
  if study.notes:
    lines += ["", study.notes]
  return "\n".join(lines) + "\n"


def _verdict(c: dict, min_seeds: int) -> str:
  """A comparison's verdict ("-" without one), saying when it had too few seeds for one."""
  if c["verdict"] is None:
    return "-"
  return f"{c['verdict']} (fewer than {min_seeds} seeds)" if c["too_few_seeds"] else c["verdict"]


def _claim_verdict(study: Study, summary: dict) -> tuple[int, str]:
  """(records the claim rests on, its verdict in bold, or "not run yet" without a record)."""
  done = sum(len(summary["arms"][a.name]["seeds"]) for a in study.arms)
  return done, f"**{summary['verdict']}**" if done else "not run yet"


def claims_table(studies: Sequence[Study], summaries: Sequence[dict], seeds: int) -> str:
  """One markdown row per claim: the paper's words, every decisive comparison's estimate
  [95% interval], Holm-adjusted interval and verdict, the claim's verdict ("not run yet"
  without a record), the records it rests on (of arms x seeds) and the command that reruns
  it."""
  lines = [
      "| claim (the paper's words) | the paper's numbers | measured here: estimate [95%] "
      "[Holm-adjusted], verdict | verdict | runs | command |",
      "|---|---|---|---|---:|---|",
  ]
  for s, summary in zip(studies, summaries):
    parts = []
    for c in summary["comparisons"]:
      if c["expect"] is None:
        continue
      raw, adjusted = _estimates(c)
      what = f"{c['label']} ({c['kind']}, expected {_expected(c)})"
      parts.append(
          f"{what}: refused"
          if c["refused"]
          else f"{what}: {raw} {adjusted}, {_verdict(c, s.min_seeds)}"
      )
    done, verdict = _claim_verdict(s, summary)
    lines.append(
        f"| {s.paper}, {s.where}: {s.claim} | {s.paper_result} | {'; '.join(parts)} | "
        f"{verdict} | {done} of {len(s.arms) * seeds} | "
        f"`python -m cl_jax.study --study={s.name}` |"
    )
  return "\n".join(lines) + "\n"


def verdicts_table(studies: Sequence[Study], summaries: Sequence[dict]) -> str:
  """The README's short table of claims: per claim the paper's words, the verdict ("not run
  yet" without a record), its decisive comparisons counted by verdict (or "N not run"), and
  the study with a link to its plot (from the repository root)."""
  lines = [
      "| claim (the paper's words) | verdict | decisive comparisons | study |",
      "|---|---|---|---|",
  ]
  order = (intervals.REPRODUCED, intervals.OPPOSITE, intervals.NOT_RESOLVED, intervals.REFUSED)
  for s, summary in zip(studies, summaries):
    decisive = [
        intervals.REFUSED if c["refused"] else c["verdict"]
        for c in summary["comparisons"]
        if c["expect"] is not None
    ]
    done, verdict = _claim_verdict(s, summary)
    counts = (
        ", ".join(f"{decisive.count(v)} {v}" for v in order if v in decisive)
        if done
        else f"{len(decisive)} not run"
    )
    lines.append(
        f"| {s.paper}, {s.where}: {s.claim} | {verdict} | {counts} (of {len(decisive)}) | "
        f"`{s.name}` ([plot](results/studies/{s.name}.png)) |"
    )
  return "\n".join(lines) + "\n"
