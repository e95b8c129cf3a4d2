"""A study's summary and tables (cl_jax.analysis.study): per arm and metric the mean over seeds
and its 95% t-interval with the arm's health (seeds whose run was flagged as collapsing, the
final std * sqrt(d)); per comparison the paired difference or the per-seed slope with its
interval and verdict (cl_jax.analysis.intervals), the seeds whose members ran on different
machines or were flagged, and for a part left unresolved its minimum detectable effect; per
claim the headline verdict of its primary parts, the first campaign's rule beside it, whether
the headline survives leaving any one seed out, and the setting of its records beside the
paper's; the study's markdown tables and the tables of claims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from cl_jax.analysis import intervals
from cl_jax.analysis.study_records import PROBE_LABELS
from cl_jax.analysis.study_types import Comparison, Study


def _by_seed(records: dict, arm_name: str, metric: str) -> dict[int, float]:
  return {
      s: r["metrics"][metric]
      for s, r in records.get(arm_name, {}).items()
      if metric in r["metrics"]
  }


def machine(record: dict) -> str:
  """Where a record's run computed: the device kind on an accelerator, else the processor's
  model and vector instructions; with the JAX version and any XLA_FLAGS. The members of a
  paired comparison are paired bit for bit only when they computed on one machine (records
  written before records named their device ran on processors)."""
  env = record.get("environment", {})
  device = env.get("device", "cpu")
  where = device if device.lower() != "cpu" else f"{env.get('cpu', '?')} ({env.get('isa', '?')})"
  where += f", jax {env.get('jax', '?')}"
  return where + (f", XLA_FLAGS={env['xla_flags']}" if env.get("xla_flags") else "")


def flagged(record: dict) -> bool:
  """Whether the run's health statistics flagged a collapse at any logged step."""
  return bool(record.get("collapse_flagged_steps"))


def _same_source(r: dict, q: dict) -> bool:
  """Records trained from the same source (its digest) with the same JAX: the same code,
  whatever processor ran them."""
  same_jax = r.get("environment", {}).get("jax") == q.get("environment", {}).get("jax")
  return same_jax and r["code"].get("source_sha256") == q["code"].get("source_sha256")


def code_refusal(records: dict, arm_names: Sequence[str], seeds: Sequence[int]) -> str | None:
  """One line naming two records of `arm_names` x `seeds` that may come from different code or
  computed on different device kinds (a GPU and a processor, two GPU models), or a record
  without a fingerprint (written by older code); None when they agree. Two records
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
      kinds = {x.get("environment", {}).get("device", "cpu") for x in (r, q)}
      if len(kinds) > 1:
        return (
            f"records {a} seed {s} and {b} seed {t} computed on different device kinds "
            f"({', '.join(sorted(kinds))}): a comparison stays within one device kind; train "
            "both arms on one"
        )
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
  out.update(interval=None, estimate=None, refused=None, primary=c.primary)
  members = list(dict.fromkeys((*c.arms, *c.minus)))
  # Seeds whose members computed on more than one machine, or whose runs were flagged.
  out["crossed"] = [s for s in seeds if len({machine(records[a][s]) for a in members}) > 1]
  out["flagged"] = [s for s in seeds if any(flagged(records[a][s]) for a in members)]
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
  (intervals.verdict; not resolved below `min_seeds` seeds, with "too_few_seeds" set); a part
  left unresolved over enough seeds gets "mde", the smallest effect its test detects with 80%
  power at its Holm level (intervals.min_detectable_effect)."""
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
      c["verdict"] = intervals.verdict(
          estimate, c["expect"], p_holm, margin=c["margin"], level=level
      )
    c["mde"] = None
    if c["verdict"] == intervals.NOT_RESOLVED and not c["too_few_seeds"] and c["estimate"]:
      c["mde"] = intervals.min_detectable_effect(intervals.Estimate(**c["estimate"]), level)
  for c in comparisons:
    c.setdefault("verdict", None)
    c.setdefault("mde", None)


def judged(study: Study, records: dict, min_seeds: int | None = None) -> list[dict]:
  """Every comparison of `study` over `records`, judged (compare, then judge with `min_seeds`,
  the study's by default)."""
  comparisons = [compare(c, records, study.sweep_analysis) for c in study.comparisons]
  judge(comparisons, study.min_seeds if min_seeds is None else min_seeds)
  return comparisons


def headline(comparisons: list[dict]) -> tuple[str | None, str | None]:
  """(the headline verdict of the primary decisive parts, the first campaign's rule over every
  decisive part), or (None, None) for a study without expectations."""
  decisive = [c for c in comparisons if c["verdict"] is not None]
  if not decisive:
    return None, None
  return (
      intervals.headline_verdict([c["verdict"] for c in decisive if c["primary"]]),
      intervals.any_opposite_verdict([c["verdict"] for c in decisive]),
  )


def leave_one_out(study: Study, records: dict, full: str | None) -> dict | None:
  """The headline verdict with each seed left out in turn ({"verdicts": {seed: verdict},
  "survives": whether each equals `full`}), each decided over one seed fewer than the study's
  rule asks (min_seeds - 1, at least 2); None without a verdict or with fewer than 3 seeds."""
  seeds = sorted({s for a in study.arms for s in records.get(a.name, {})})
  if full is None or len(seeds) < 3:
    return None
  verdicts = {}
  for left in seeds:
    kept = {a: {s: r for s, r in by.items() if s != left} for a, by in records.items()}
    verdicts[left] = headline(judged(study, kept, max(2, study.min_seeds - 1)))[0]
  return {"verdicts": verdicts, "survives": all(v == full for v in verdicts.values())}


def _distinct(values) -> str:
  return " / ".join(str(v) for v in sorted(set(values), key=lambda v: (str(type(v)), v)))


def setting(records: dict) -> str | None:
  """One line naming the setting of `records` ({arm: {seed: record}}): backbone, width and
  stem, data and training-set size, image size, epochs, batch (where the records hold their
  configs), and the machines with their record counts (machine()); None without records."""
  used = [r for by in records.values() for r in by.values()]
  if not used:
    return None
  configs = [r["config"] for r in used if r.get("config")]

  def model(c):
    width = c.get("model.width_multiplier", 1)
    text = f"ResNet-{c.get('model.depth')}" + (f" x{width:g} width" if width != 1 else "")
    return text + (" (CIFAR stem)" if c.get("model.stem") == "cifar" else "")

  def data(c):
    if c.get("data.name") == "trifeature":
      return f"Trifeature, {c['data.trifeature_train']:,} training images"
    return c.get("data.name", "?")

  where = {}
  for r in used:
    where[machine(r)] = where.get(machine(r), 0) + 1
  machines = ", ".join(f"{m} ({n} runs)" for m, n in sorted(where.items()))
  if not configs:
    return f"on {machines}"
  field = lambda name: _distinct(c.get(name) for c in configs)
  parts = [_distinct(model(c) for c in configs), _distinct(data(c) for c in configs)]
  parts += [f"{field('data.image_size')} px", f"{field('optim.epochs')} epochs"]
  return ", ".join(parts) + f", batch {field('optim.batch_size')}; on {machines}"


def summarise(study: Study, records: dict) -> dict:
  """{"arms": {arm: {metric: interval dict, "seeds": [...], "flagged_seeds": [...],
  "std_sqrt_d": interval dict or None}}, "comparisons": [...], "verdict": the headline verdict
  of the primary parts, "verdict_any_opposite": the first campaign's rule over every decisive
  part (both None for a study without expectations), "leave_one_out", "setting" (of the
  records) and "paper_setting"}."""
  arms = {}
  for a in study.arms:
    by_seed = records.get(a.name, {})
    row = {"seeds": sorted(by_seed)}
    for m in study.metrics:
      values = list(_by_seed(records, a.name, m).values())
      row[m] = dataclasses.asdict(intervals.t_interval(values)) if values else None
    row["flagged_seeds"] = sorted(s for s, r in by_seed.items() if flagged(r))
    health = list(_by_seed(records, a.name, "std_sqrt_d").values())
    row["std_sqrt_d"] = dataclasses.asdict(intervals.t_interval(health)) if health else None
    arms[a.name] = row
  comparisons = judged(study, records)
  verdict, any_opposite = headline(comparisons)
  return {
      "study": study.name,
      "title": study.title,
      "paper": study.paper,
      "where": study.where,
      "claim": study.claim,
      "paper_result": study.paper_result,
      "paper_setting": study.paper_setting,
      "setting": setting({a.name: records.get(a.name, {}) for a in study.arms}),
      "sweep_analysis": study.sweep_analysis,
      "arms": arms,
      "comparisons": comparisons,
      "verdict": verdict,
      "verdict_any_opposite": any_opposite,
      "leave_one_out": leave_one_out(study, records, verdict),
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


def _seeds(seeds: Sequence[int]) -> str:
  return ", ".join(str(s) for s in seeds)


def part(c: dict) -> str:
  """ "primary" or "secondary" for a decisive comparison, "-" for one without a verdict."""
  if c["expect"] is None:
    return "-"
  return "primary" if c["primary"] else "secondary"


def marks(c: dict) -> str:
  """The comparison's warnings: seeds whose members ran on different machines, seeds with a
  collapse-flagged run ("-" without any)."""
  out = []
  if c.get("crossed"):
    out.append(f"machines differ (seeds {_seeds(c['crossed'])})")
  if c.get("flagged"):
    out.append(f"collapse-flagged run (seeds {_seeds(c['flagged'])})")
  return "; ".join(out) or "-"


def _mde(c: dict) -> str:
  if c.get("mde") is None:
    return "-"
  digits = 3 if c["kind"] == "slope" else metric_digits(c["metric"])
  return f"{c['mde']:.{digits}f}"


def scale_line(study: Study, summary: dict) -> str:
  """ "Scale: here <the records' setting>. The paper: <its setting>." """
  here = summary.get("setting") or "no runs yet"
  return f"Scale: here {here}. The paper: {study.paper_setting or '-'}."


def loo_text(summary: dict) -> str:
  """Whether the headline survives leaving any one seed out, in words."""
  loo = summary.get("leave_one_out")
  if loo is None:
    return "-"
  if loo["survives"]:
    return "survives"
  moved = [f"seed {s} out: {v}" for s, v in loo["verdicts"].items() if v != summary["verdict"]]
  return "moves (" + "; ".join(moved) + ")"


def markdown(study: Study, summary: dict) -> str:
  """The study's tables: the scale line, per arm the mean [95% interval] of each metric and its
  health, then the comparisons (part, raw and Holm-adjusted intervals, p-values, verdicts, the
  minimum detectable effect of an unresolved part, marks for pairs across machines and for
  collapse-flagged runs), the headline verdict and the first campaign's rule beside it, the
  paper's sentence behind each decisive comparison and any refusal."""
  lines = [f"## {study.title}", ""]
  if study.claim:
    lines += [f"{study.paper}, {study.where}: {study.claim}", ""]
    if study.paper_result:
      lines += [f"The paper: {study.paper_result}", ""]
  lines += [scale_line(study, summary), ""]
  lines += [
      "| arm | "
      + " | ".join(study.metrics)
      + " | std * sqrt(d) | collapse-flagged seeds | seeds |",
      "|---|" + "---:|" * (len(study.metrics) + 3),
  ]
  for a in study.arms:
    row = summary["arms"][a.name]
    cells = [_cell(row[m], metric_digits(m)) for m in study.metrics]
    cells += [_cell(row["std_sqrt_d"], 3), _seeds(row["flagged_seeds"]) or "-"]
    lines.append(f"| {a.name} | " + " | ".join(cells) + f" | {len(row['seeds'])} |")
  comparisons = summary["comparisons"]
  if comparisons:
    lines += [
        "",
        "| comparison | part | metric | estimate [95% interval] | Holm-adjusted interval | p | "
        "p (Holm) | expected | verdict | detectable (80% power) | seeds | marks |",
        "|---|---|---|---:|---:|---:|---:|---|---|---:|---:|---|",
    ]
    for c in comparisons:
      what = "slope" if c["kind"] == "slope" else "difference"
      raw, adjusted = _estimates(c)
      lines.append(
          f"| {c['label']} | {part(c)} | {c['metric']} ({what}) | {raw} | {adjusted} | "
          f"{_p(c['p'])} | {_p(c.get('p_holm'))} | {_expected(c)} | "
          f"{_verdict(c, study.min_seeds)} | {_mde(c)} | {len(c['seeds'])} | {marks(c)} |"
      )
    sweeps = [c for c in comparisons if c["sensitivity"]]
    if sweeps:
      primary = summary["sweep_analysis"].replace("_", "-")
      lines += ["", f"Slopes: the primary analysis is the {primary} one; the other, beside it:"]
      for c in sweeps:
        other = c["sensitivity"]
        shown = intervals.Interval(other["mean"], other["low"], other["high"], other["n"]).text(3)
        lines.append(f"- {c['label']}: {other['analysis'].replace('_', '-')} {shown}")
    if any(c["mde"] is not None for c in comparisons):
      lines += [
          "",
          "Detectable: for a part left unresolved, the smallest true effect its test would "
          "detect with 80% power at the observed seed-to-seed spread and its Holm level "
          "(for a kept part: how far inside the margin the true change must lie).",
      ]
    if any(c.get("crossed") for c in comparisons):
      lines += [
          "",
          "Machines differ: a pair whose members computed on different processors or devices "
          "differs by their rounding as well as by the arms; `python -m cl_jax.study "
          f"--study={study.name} --rerun_crossed` retrains the members that ran elsewhere on "
          "the machine at hand, from the records' commit.",
      ]
    quoted = [c for c in comparisons if c["expect"] is not None]
    if quoted:
      lines += ["", "What the paper says, for each decisive comparison:"]
      for c in quoted:
        margin = ""
        if c["expect"] in intervals.NON_INFERIORITY:
          reason = next(x.margin_reason for x in study.comparisons if x.label == c["label"])
          margin = f" Margin {c['margin']:g}: {reason}"
        lines.append(
            f"- {c['label']} ({part(c)}): \u201c{c['quote']}\u201d ({c['where']}).{margin}"
        )
    refusals = {c["refused"]: c["label"] for c in comparisons if c["refused"]}
    for line in refusals:
      labels = ", ".join(c["label"] for c in comparisons if c["refused"] == line)
      lines += ["", f"Refused ({labels}): {line}"]
  if summary["verdict"] is not None:
    lines += [
        "",
        f"Verdict (primary parts): **{summary['verdict']}**; under the first campaign's rule "
        f"(opposite if any decisive part is): {summary['verdict_any_opposite']}. Leaving one "
        f"seed out: {loo_text(summary)}.",
    ]
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


def _counts(parts: list[dict], done: int) -> str:
  """Decisive parts counted by verdict ("N not run" before any record)."""
  order = (
      intervals.REPRODUCED,
      intervals.OPPOSITE,
      intervals.NOT_RESOLVED,
      intervals.REFUSED,
  )
  verdicts = [intervals.REFUSED if c["refused"] else c["verdict"] for c in parts]
  if not done:
    return f"{len(parts)} not run"
  return ", ".join(f"{verdicts.count(v)} {v}" for v in order if v in verdicts) + (
      f" (of {len(parts)})"
  )


def _warnings(parts: list[dict]) -> str:
  """How many decisive parts pair runs across machines or hold a collapse-flagged run."""
  crossed = sum(bool(c.get("crossed")) for c in parts)
  flagged = sum(bool(c.get("flagged")) for c in parts)
  out = [
      f"{crossed} across machines" if crossed else "",
      f"{flagged} collapse-flagged" if flagged else "",
  ]
  return ", ".join(x for x in out if x) or "-"


def claims_table(studies: Sequence[Study], summaries: Sequence[dict], seeds: int) -> str:
  """One markdown row per claim: the paper's words and numbers, every decisive comparison
  (primary or secondary) with its estimate [95% interval], Holm-adjusted interval, verdict and
  marks, the headline verdict of the primary parts ("not run yet" without a record) and the
  first campaign's rule beside it, whether the headline survives leaving one seed out, the
  scale here and the paper's, the records it rests on (of arms x seeds) and the command that
  reruns it."""
  lines = [
      "| claim (the paper's words) | the paper's numbers | measured here: estimate [95%] "
      "[Holm-adjusted], verdict | verdict (primary parts) | first campaign's rule | one seed "
      "left out | scale: here; the paper | runs | command |",
      "|---|---|---|---|---|---|---|---:|---|",
  ]
  for s, summary in zip(studies, summaries):
    parts = []
    for c in summary["comparisons"]:
      if c["expect"] is None:
        continue
      raw, adjusted = _estimates(c)
      what = f"{c['label']} ({part(c)} {c['kind']}, expected {_expected(c)})"
      shown = "refused" if c["refused"] else f"{raw} {adjusted}, {_verdict(c, s.min_seeds)}"
      warned = marks(c)
      parts.append(f"{what}: {shown}" + ("" if warned == "-" else f" [{warned}]"))
    done, verdict = _claim_verdict(s, summary)
    old = summary["verdict_any_opposite"] if done else "-"
    lines.append(
        f"| {s.paper}, {s.where}: {s.claim} | {s.paper_result} | {'; '.join(parts)} | "
        f"{verdict} | {old} | {loo_text(summary) if done else '-'} | "
        f"{summary['setting'] or 'no runs yet'}; the paper: {s.paper_setting} | "
        f"{done} of {len(s.arms) * seeds} | `python -m cl_jax.study --study={s.name}` |"
    )
  return "\n".join(lines) + "\n"


def verdicts_table(studies: Sequence[Study], summaries: Sequence[dict]) -> str:
  """The README's short table of claims: per claim the paper's words, the headline verdict of
  its primary parts ("not run yet" without a record) with the first campaign's rule beside
  it, its primary and secondary parts counted by verdict, the parts across machines or with a
  collapse-flagged run, whether the headline survives leaving one seed out, the scale (here;
  the paper) and the study with a link to its plot (from the repository root)."""
  lines = [
      "| claim (the paper's words) | verdict (primary parts) | first campaign's rule | "
      "primary parts | secondary parts | marked parts | one seed left out | scale: here; "
      "the paper | study |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for s, summary in zip(studies, summaries):
    decisive = [c for c in summary["comparisons"] if c["expect"] is not None]
    primary = [c for c in decisive if c["primary"]]
    secondary = [c for c in decisive if not c["primary"]]
    done, verdict = _claim_verdict(s, summary)
    lines.append(
        f"| {s.paper}, {s.where}: {s.claim} | {verdict} | "
        f"{summary['verdict_any_opposite'] if done else '-'} | {_counts(primary, done)} | "
        f"{_counts(secondary, done) if secondary else '-'} | {_warnings(decisive)} | "
        f"{loo_text(summary) if done else '-'} | {short_setting(summary)}; the paper: "
        f"{s.paper_setting} | `{s.name}` ([plot](results/studies/{s.name}.png)) |"
    )
  return "\n".join(lines) + "\n"


def short_setting(summary: dict) -> str:
  """The records' setting without its machines (the README table's scale column)."""
  here = summary.get("setting")
  return here.split("; on ")[0] if here else "no runs yet"
