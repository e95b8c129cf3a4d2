"""cl_jax.analysis.intervals against scipy and hand-computed numbers; the verdict rules on
hand-made intervals; the study runner's resume, added seeds and refusals on fake runs; its
stop signals passed on to a fake child; the claims registry; and a tiny study end to end through
the command."""

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats

from cl_jax import config_check
from cl_jax.analysis import (
    fingerprint,
    intervals,
    study,
    study_launch,
    study_plot,
    study_records,
    study_runs,
    study_summary,
    study_types,
)
from cl_jax.analysis.intervals import NOT_RESOLVED, OPPOSITE, REFUSED, REPRODUCED
from cl_jax.runtime.errors import UsageError
from cl_jax.studies import CLAIMS, STUDIES, scale_ladder
from tests import forked_commands, study_fakes, tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_t_interval_matches_a_hand_computed_case_and_scipy():
  # 1, 2, 4: mean 7/3, s = sqrt(((−4/3)^2 + (−1/3)^2 + (5/3)^2) / 2) = sqrt(7/3),
  # t_{0.975, 2} = 4.302653 (tables), half width 4.302653 sqrt(7/3) / sqrt(3) = 3.79458.
  i = intervals.t_interval([1.0, 2.0, 4.0])
  assert i.n == 3
  np.testing.assert_allclose(i.mean, 7 / 3, rtol=1e-12)
  np.testing.assert_allclose([i.low, i.high], [7 / 3 - 3.794583, 7 / 3 + 3.794583], atol=1e-5)
  rng = np.random.default_rng(0)
  for n in (2, 3, 5, 11):
    x = rng.normal(size=n)
    want = scipy.stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    got = intervals.t_interval(x)
    np.testing.assert_allclose([got.low, got.high], [want.low, want.high], rtol=1e-10)
  one = intervals.t_interval([3.5])
  assert one.n == 1 and one.mean == 3.5 and math.isnan(one.low) and math.isnan(one.high)
  assert one.text() == "3.5" and i.text() == "2.3 [-1.5, 6.1]"
  with pytest.raises(ValueError):
    intervals.t_interval([])


def test_paired_difference_matches_scipy_ttest_rel():
  rng = np.random.default_rng(1)
  a, b = rng.normal(size=4), rng.normal(size=4)
  want = scipy.stats.ttest_rel(a, b).confidence_interval(0.95)
  got = intervals.paired_difference(a, b)
  np.testing.assert_allclose([got.low, got.high], [want.low, want.high], rtol=1e-10)
  np.testing.assert_allclose(got.mean, np.mean(a - b), rtol=1e-12)
  with pytest.raises(ValueError, match="one shape"):
    intervals.paired_difference([1.0, 2.0], [1.0])


def test_slopes_match_scipy_linregress_per_seed():
  rng = np.random.default_rng(2)
  x = np.array([0.0, 1.0, 2.0, 3.0, 5.0])
  y = rng.normal(size=(3, 5)) + 0.7 * x
  per_seed = [scipy.stats.linregress(x, row).slope for row in y]
  np.testing.assert_allclose(intervals.slopes(x, y), per_seed, rtol=1e-10)
  got = intervals.slope_interval(x, y)
  want = scipy.stats.ttest_1samp(per_seed, 0.0).confidence_interval(0.95)
  np.testing.assert_allclose([got.low, got.high], [want.low, want.high], rtol=1e-10)
  with pytest.raises(ValueError):
    intervals.slopes([1.0, 1.0], np.zeros((2, 2)))


def _estimate(low: float, high: float, n: int = 3) -> intervals.Estimate:
  """The estimate whose 95% t-interval on n - 1 degrees of freedom is [low, high]."""
  half = scipy.stats.t.ppf(0.975, n - 1)
  return intervals.Estimate((low + high) / 2, (high - low) / 2 / half, n - 1, n)


@pytest.mark.parametrize(
    "low, high, expect, verdict",
    [
        (0.5, 2.0, "increase", REPRODUCED),
        (-2.0, -0.5, "increase", OPPOSITE),
        (-0.5, 2.0, "increase", NOT_RESOLVED),
        (-2.0, -0.5, "decrease", REPRODUCED),
        (0.5, 2.0, "decrease", OPPOSITE),
        (-0.5, 0.5, "decrease", NOT_RESOLVED),
        # Kept within a margin of 1: the interval must lie above -1 (below 1).
        (-0.5, 2.0, "no_decrease", REPRODUCED),
        (-1.5, 2.0, "no_decrease", NOT_RESOLVED),
        (-3.0, -1.5, "no_decrease", OPPOSITE),
        (-2.0, 0.5, "no_increase", REPRODUCED),
        (0.5, 3.0, "no_increase", NOT_RESOLVED),
        (1.5, 3.0, "no_increase", OPPOSITE),
    ],
)
def test_a_single_comparison_is_decided_by_its_95_percent_interval(low, high, expect, verdict):
  """With one decisive comparison Holm's adjusted p is the raw p: the verdict is the 95%
  interval's against 0 or the margin."""
  e = _estimate(low, high)
  p = e.p_value(expect, 1.0)
  assert intervals.verdict(e, expect, p, margin=1.0) == verdict


def test_the_p_value_matches_the_interval_and_scipy():
  x = np.array([1.2, 0.4, 2.1, 0.9, 1.6])
  e = intervals.mean_estimate(x)
  assert e.p_value("increase") == pytest.approx(scipy.stats.ttest_1samp(x, 0.0).pvalue)
  # Non-inferiority at margin M: twice the one-sided p of H0 theta <= -M.
  one_sided = scipy.stats.ttest_1samp(x + 0.5, 0.0, alternative="greater").pvalue
  assert e.p_value("no_decrease", 0.5) == pytest.approx(2 * one_sided)
  # p < 0.05 exactly when the 95% interval's lower end lies above -M: at M = -low, p = 0.05.
  low = e.interval().low
  assert e.p_value("no_decrease", -low) == pytest.approx(0.05)


def test_holm_by_hand():
  """p = (0.01, 0.04, 0.03), m = 3: sorted 0.01, 0.03, 0.04 -> 3 x 0.01 = 0.03, 2 x 0.03 =
  0.06, max(0.06, 1 x 0.04) = 0.06; levels 1 - 0.05/3, 1 - 0.05/1, 1 - 0.05/2."""
  assert intervals.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
  assert intervals.holm_levels([0.01, 0.04, 0.03]) == pytest.approx([1 - 0.05 / 3, 0.95, 0.975])
  assert intervals.holm([0.2, math.nan]) == pytest.approx([0.4, 1.0])


def test_pooled_slope_is_the_regression_with_one_intercept_per_seed():
  x = np.array([0.0, 1.0, 3.0])
  y = np.array([[0.1, 1.2, 2.8], [1.0, 1.7, 4.1], [-0.5, 0.9, 2.2], [0.3, 1.0, 3.3]])
  n, m = y.shape
  design = np.hstack([np.kron(np.eye(n), np.ones((m, 1))), np.tile(x, n)[:, None]])
  coef, rss, *_ = np.linalg.lstsq(design, y.reshape(-1), rcond=None)
  df = n * m - n - 1
  cov = rss[0] / df * np.linalg.inv(design.T @ design)
  got = intervals.pooled_slope(x, y)
  assert got.value == pytest.approx(coef[-1]) and got.df == df
  assert got.se == pytest.approx(math.sqrt(cov[-1, -1]))


def test_one_seed_and_the_direction_checks():
  one = intervals.mean_estimate([5.0])
  for expect in intervals.DIRECTIONS:
    assert intervals.verdict(one, expect, math.nan, margin=1.0) == NOT_RESOLVED
  with pytest.raises(ValueError):
    intervals.verdict(one, "up", 0.01)
  with pytest.raises(ValueError, match="needs a margin"):
    intervals.verdict(one, "no_decrease", 0.01)


def test_the_headline_rule_on_hand_made_part_verdicts():
  R, O, N, M = REPRODUCED, OPPOSITE, NOT_RESOLVED, intervals.MIXED
  headline = intervals.headline_verdict
  assert headline([R, R]) == R
  assert headline([O]) == O and headline([O, N]) == O  # every decided part opposite
  assert headline([R, O]) == M and headline([R, O, N]) == M  # decided parts disagree
  assert headline([R, N]) == N and headline([N, N]) == N
  assert headline([R, O, REFUSED]) == REFUSED
  with pytest.raises(ValueError):
    headline([])
  # The first campaign's rule: opposite as soon as any part is.
  old = intervals.any_opposite_verdict
  assert old([R, R]) == R and old([R, N]) == N and old([R, O, N]) == O
  assert old([R, O, REFUSED]) == REFUSED


def test_secondary_parts_never_decide_the_headline():
  # A reproduced primary part and an opposite secondary one: reproduced under the headline
  # rule, opposite under the first campaign's.
  records = {
      "base": {s: _record({"shape": v, "colour": 90.0 + s}) for s, v in enumerate((40, 42, 41))},
      "ns": {s: _record({"shape": v, "colour": 80.0 + s}) for s, v in enumerate((45, 46, 47))},
  }
  claim = study_types.Study(
      name="pair",
      title="pair",
      arms=(BASE, NS),
      metrics=("shape", "colour"),
      comparisons=(
          study_types.Comparison("shape", "shape", ("ns", "base"), expect="increase", quote="q"),
          study_types.Comparison(
              "colour", "colour", ("ns", "base"), expect="increase", quote="r", primary=False
          ),
      ),
      min_seeds=3,
  )
  summary = study_summary.summarise(claim, records)
  assert [c["verdict"] for c in summary["comparisons"]] == [REPRODUCED, OPPOSITE]
  assert summary["verdict"] == REPRODUCED and summary["verdict_any_opposite"] == OPPOSITE
  assert [study_summary.part(c) for c in summary["comparisons"]] == ["primary", "secondary"]
  with pytest.raises(ValueError, match="no decisive comparison is primary"):
    dataclasses.replace(
        claim, comparisons=(dataclasses.replace(claim.comparisons[0], primary=False),)
    )


def test_the_minimum_detectable_effect_by_hand():
  # se 1 on 4 degrees of freedom, tested at 95%: t_{0.975, 4} = 2.776445 and t_{0.8, 4} =
  # 0.940965 (tables), so 80% power needs a true effect of 3.717410.
  e = intervals.Estimate(value=0.3, se=1.0, df=4, n=5)
  assert intervals.min_detectable_effect(e, 0.95) == pytest.approx(3.717410, abs=1e-5)
  # At Holm's first step of three comparisons (level 1 - 0.05 / 3): t_{1 - 0.05/6, 4} =
  # 4.851146 (scipy's t.isf(0.05 / 6, 4)), + 0.940965, times se 0.5.
  half = intervals.Estimate(value=0.3, se=0.5, df=4, n=5)
  want = 0.5 * (scipy.stats.t.isf(0.05 / 6, 4) + 0.940965)
  assert intervals.min_detectable_effect(half, 1 - 0.05 / 3) == pytest.approx(want, abs=1e-5)
  assert math.isnan(intervals.min_detectable_effect(intervals.mean_estimate([1.0]), 0.95))
  # Power by simulation at that effect: about 80% of t-tests reject (normal errors, n 5).
  rng = np.random.default_rng(0)
  sd = 1.0 * math.sqrt(5)  # se 1 with 5 seeds
  draws = rng.normal(intervals.min_detectable_effect(e, 0.95), sd, size=(20000, 5))
  p = scipy.stats.ttest_1samp(draws, 0.0, axis=1).pvalue
  assert 0.77 < float(np.mean(p < 0.05)) < 0.83
  # A part left unresolved shows it; a decided one does not.
  records = {
      "base": {s: _record({"shape": v}) for s, v in enumerate((40.0, 42.0, 41.0))},
      "ns": {s: _record({"shape": v}) for s, v in enumerate((41.0, 40.0, 43.0))},
  }
  three = dataclasses.replace(STUDY, min_seeds=3)
  c = study_summary.summarise(three, records)["comparisons"][0]
  diffs = np.array([1.0, -2.0, 2.0])
  se = diffs.std(ddof=1) / math.sqrt(3)
  assert c["verdict"] == NOT_RESOLVED
  assert c["mde"] == pytest.approx(se * (4.302653 + 1.060660), abs=1e-4)  # t_{0.975,2}, t_{0.8,2}


def test_a_pair_across_machines_is_marked_and_its_members_elsewhere_are_rerun(tmp_path):
  # Seed 0: both arms on ZEN; seed 1: ns on another processor; seed 2: base on a GPU.
  AVX2, H200 = {**ZEN, "isa": "avx2"}, {**ZEN, "device": "NVIDIA H200"}  # noqa: N806
  where = {("base", 0): ZEN, ("ns", 0): ZEN, ("base", 1): ZEN, ("ns", 1): AVX2}
  where.update({("base", 2): H200, ("ns", 2): ZEN})
  records = {
      a: {s: _record({"shape": 40.0 + s + (a == "ns")}, environment=where[a, s]) for s in range(3)}
      for a in ("base", "ns")
  }
  assert study_summary.machine(records["ns"][1]) == "AMD EPYC (avx2), jax 0.10.2"
  assert study_summary.machine(records["base"][2]) == "NVIDIA H200, jax 0.10.2"
  three = dataclasses.replace(STUDY, min_seeds=3)
  summary = study_summary.summarise(three, records)
  c = summary["comparisons"][0]
  assert c["crossed"] == [1, 2]
  # A GPU's record never pairs with a processor's.
  assert "different device kinds (AMD EPYC" not in c["refused"]
  assert "computed on different device kinds (NVIDIA H200, cpu)" in c["refused"]
  assert "machines differ (seeds 1, 2)" in study_summary.markdown(three, summary)
  here = study_summary.machine(records["base"][0])
  assert study.crossed_members(three, records, here) == [("ns", 1), ("base", 2)]
  assert study.crossed_members(three, records, here, only=["ns"]) == [("ns", 1)]
  # --rerun_crossed: the records of members that ran elsewhere are moved aside (not deleted)
  # and trained again; their partners are read, not retrained.
  work, results, calls = str(tmp_path / "runs"), str(tmp_path / "results"), []
  for a in ("base", "ns"):
    for s in range(3):
      config = study_records.arm_config({"base": BASE, "ns": NS}[a], s, study_fakes.TINY)
      record = {**records[a][s], "config": study_records.plain_config(config)}
      record["analyses"] = []
      path = study_records.record_path(results, a, s)
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(record))
  study.run(
      three,
      3,
      work,
      results,
      study_fakes.TINY,
      train=_fake_trainer(calls),
      log=lambda s: None,
      rerun_crossed=True,
      here=here,
  )
  assert [c[:2] for c in calls] == [("ns", 1), ("base", 2)]  # seed-major
  moved = json.loads((tmp_path / "results/replaced/ns/seed1.json").read_text())
  assert moved["environment"]["isa"] == "avx2"
  assert (tmp_path / "results/replaced/base/seed2.json").exists()


def test_the_runner_trains_seed_major(tmp_path):
  calls = []
  study.run(
      STUDY,
      2,
      str(tmp_path / "runs"),
      str(tmp_path / "results"),
      study_fakes.TINY,
      train=_fake_trainer(calls),
      log=lambda s: None,
  )
  assert [c[:2] for c in calls] == [("base", 0), ("ns", 0), ("base", 1), ("ns", 1)]


def test_health_and_leaving_one_seed_out():
  flagged = {**_record({"shape": 47.0, "std_sqrt_d": 0.1}), "collapse_flagged_steps": [10, 20]}
  records = {
      "base": {s: _record({"shape": v, "std_sqrt_d": 0.8}) for s, v in enumerate((40, 42, 41, 40))},
      "ns": {s: _record({"shape": v, "std_sqrt_d": 0.7}) for s, v in enumerate((45, 46, 47))},
  }
  records["ns"][3] = flagged
  three = dataclasses.replace(STUDY, metrics=("shape",), min_seeds=4)
  summary = study_summary.summarise(three, records)
  assert summary["arms"]["ns"]["flagged_seeds"] == [3]
  assert summary["arms"]["base"]["std_sqrt_d"]["mean"] == pytest.approx(0.8)
  assert summary["comparisons"][0]["flagged"] == [3]
  assert summary["verdict"] == REPRODUCED  # differences 5, 4, 6, 7
  loo = summary["leave_one_out"]
  # Three seeds left each time, decided over min_seeds - 1 = 3: each drop stays reproduced
  # except where the remaining spread is too wide for t_{0.975, 2}.
  for left, verdict in loo["verdicts"].items():
    kept = [d for s, d in enumerate((5.0, 4.0, 6.0, 7.0)) if s != left]
    want = intervals.verdict(
        intervals.mean_estimate(kept), "increase", intervals.mean_estimate(kept).p_value("increase")
    )
    assert verdict == want
  assert loo["survives"] == all(v == REPRODUCED for v in loo["verdicts"].values())
  md = study_summary.markdown(three, summary)
  assert "| ns | 46.2 [" in md and "| 3 | 4 |" in md  # the flagged seed in the arm table
  assert "collapse-flagged run (seeds 3)" in md


# A two-arm study on the tiny fake runs: MoCo-v2 without and with patch negatives.
BASE = study_types.arm("base", "configs/mocov2.py")
NS = study_types.arm("ns", "configs/mocov2_patchns.py")
STUDY = study_types.Study(
    name="pair",
    title="pair",
    arms=(BASE, NS),
    metrics=("shape", "pos_mean"),
    comparisons=(
        study_types.Comparison(
            "shape: ns - base", "shape", ("ns", "base"), expect="increase", quote="It rises."
        ),
    ),
    min_seeds=2,  # the fake runs have 2-3 seeds; test_five_seeds_are_needed_for_a_verdict
)
SHAPE = {"base": (0.40, 0.42, 0.41), "ns": (0.45, 0.46, 0.47)}


def _fake_trainer(calls: list):
  """A stand-in for cl_jax.main: writes the finished fake run of arm and seed."""

  def train(arm_, seed, extra, directory, analyses):
    calls.append((arm_.name, seed, str(directory)))
    config = study_records.arm_config(arm_, seed, extra)
    acc = {"colour": 0.9, "shape": SHAPE[arm_.name][seed], "texture": 0.3}
    study_fakes.make_run(directory, config, acc, {"colour": 0.7, "shape": 0.2, "texture": 0.2})
    return 10.0 + seed

  return train


@pytest.mark.slow
def test_records_are_read_not_retrained_and_more_seeds_are_added(tmp_path):
  work, results, calls = str(tmp_path / "runs"), str(tmp_path / "results"), []
  run = lambda seeds: study.run(
      STUDY, seeds, work, results, study_fakes.TINY, train=_fake_trainer(calls), log=lambda s: None
  )
  summary = run(2)
  assert sorted(c[:2] for c in calls) == [("base", 0), ("base", 1), ("ns", 0), ("ns", 1)]
  record = json.loads((tmp_path / "results/runs/ns/seed1.json").read_text())
  assert record["metrics"]["shape"] == pytest.approx(46.0)
  assert record["wall_s"] == 11.0 and record["step"] == study_fakes.STEPS
  # pos_mean: the mean of the rows logged in the last epoch (the whole 8-step run: 0.5, 0.6).
  assert record["metrics"]["pos_mean"] == pytest.approx(0.55)
  assert record["config"]["nonsemantic.enabled"] is True and record["config"]["seed"] == 1
  diff = summary["comparisons"][0]
  assert diff["seeds"] == [0, 1] and diff["interval"]["mean"] == pytest.approx(4.5)  # 5, 4

  calls.clear()
  shutil.rmtree(work)  # records are read without their run directories (committed records)
  run(2)
  assert calls == []  # every record exists
  assert not os.path.exists(work)  # and no run directory is made for them
  summary = run(3)
  assert sorted(c[:2] for c in calls) == [("base", 2), ("ns", 2)]
  diffs = [SHAPE["ns"][s] * 100 - SHAPE["base"][s] * 100 for s in range(3)]
  want = scipy.stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
  got = summary["comparisons"][0]["interval"]
  np.testing.assert_allclose([got["low"], got["high"]], [want.low, want.high], rtol=1e-9)
  assert summary["comparisons"][0]["verdict"] == REPRODUCED and summary["verdict"] == REPRODUCED
  for name in ("pair.md", "pair.json", "pair.png"):
    assert (tmp_path / "results" / name).exists()
  md = (tmp_path / "results/pair.md").read_text()
  assert "| ns | 46.0 [" in md and "Verdict (primary parts): **reproduced**" in md


def test_an_interrupted_run_is_resumed_in_its_own_directory(tmp_path):
  work, results, calls = str(tmp_path / "runs"), str(tmp_path / "results"), []
  directory = study_records.run_dir(work, "ns", 0)
  # An unfinished run: its config, no probe report.
  from cl_jax.runtime import run_config

  run_config.save_start(study_records.arm_config(NS, 0, study_fakes.TINY), str(directory), 0)
  # Started before its code version was recorded: refused, the run directory left alone.
  with pytest.raises(study_runs.RunFailed, match="started without a record of its code"):
    study_runs.ensure_record(NS, 0, work, results, study_fakes.TINY, train=None)
  now = fingerprint.source_digest()
  (directory / fingerprint.SOURCE_FILE).write_text(json.dumps(now))
  study_runs.ensure_record(
      NS, 0, work, results, study_fakes.TINY, train=_fake_trainer(calls), log=lambda s: None
  )
  assert calls == [("ns", 0, str(directory))]
  record = json.loads(study_records.record_path(results, "ns", 0).read_text())
  assert record["code"]["source_sha256"] == now["sha256"]
  assert record["code"]["fingerprint"] == {"moco": [1.5, 2.5]}
  # A run that started under other code is not resumed under this code.
  other = study_records.run_dir(work, "base", 0)
  other.mkdir(parents=True)
  (other / fingerprint.SOURCE_FILE).write_text(json.dumps({"sha256": "1" * 64, "commit": "old"}))
  with pytest.raises(study_runs.RunFailed, match="started under other code \\(old, now"):
    study_runs.ensure_record(BASE, 0, work, results, study_fakes.TINY, train=None)


def test_a_changed_arm_is_refused_before_anything_is_trained(tmp_path):
  work, results, calls = str(tmp_path / "runs"), str(tmp_path / "results"), []
  study.run(STUDY, 1, work, results, study_fakes.TINY, train=_fake_trainer(calls), log=print)
  changed = study_types.Study(
      name="pair",
      title="pair",
      arms=(study_types.arm("base", "configs/mocov2.py", {"moco.temperature": 0.1}), NS),
  )
  calls.clear()
  with pytest.raises(UsageError, match=r"moco.temperature: 0.2 there, 0.1 in the arm"):
    study.run(changed, 2, work, results, study_fakes.TINY, train=_fake_trainer(calls))
  assert calls == []
  # Without its record, the run directory's config refuses it too.
  study_records.record_path(results, "base", 0).unlink()
  with pytest.raises(UsageError, match=r"runs/base/seed0 holds arm base seed 0 with another"):
    study_runs.ensure_record(changed.arms[0], 0, work, results, study_fakes.TINY, train=None)
  with pytest.raises(UsageError, match="unknown config field moco.temperatur"):
    study_records.arm_config(study_types.arm("x", "configs/mocov2.py", {"moco.temperatur": 0.1}), 0)
  with pytest.raises(UsageError, match="has no arm nope"):
    study.run(STUDY, 1, work, results, study_fakes.TINY, only=["nope"], train=None)


ZEN = {"jax": "0.10.2", "xla_flags": "", "cpu": "AMD EPYC", "isa": "avx512f avx2", "cpus": 2}


def test_the_processor_is_named_with_its_family_model_and_vector_instructions():
  zen3 = (
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
      "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n"
      "cpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
  )
  assert study_records.processor(zen3) == ("AMD EPYC (family 25, model 1)", "avx2")
  xeon = "model name\t: Intel Xeon\nflags\t\t: avx2 avx512f avx512bw amx_tile\n"
  assert study_records.processor(xeon) == ("Intel Xeon", "avx512f avx2")
  # avx512bw alone is not avx512f; a bare processor has neither.
  assert study_records.processor("flags : sse2 avx512bw\n") == ("", "neither avx2 nor avx512f")


def _record(metrics: dict, fingerprint=None, commit: str = "abc1234", environment=None) -> dict:
  """A record of `metrics` with a code fingerprint (default: one component), the source digest
  of `commit` and the processor `environment` (default ZEN)."""
  code = {"commit": commit, "source_sha256": f"sha-of-{commit}"}
  code["fingerprint"] = fingerprint or {"moco": [1.5, 2.5]}
  return {"metrics": metrics, "code": code, "environment": environment or ZEN}


def test_slope_of_paired_gains_and_comparisons_without_records():
  records = {}
  for name, values in {"a1": (1, 2), "a2": (3, 5), "b1": (0, 0), "b2": (1, 1)}.items():
    records[name] = {s: _record({"m": float(v)}) for s, v in enumerate(values)}
  c = study_types.Comparison(
      "gain vs x", "m", ("a1", "a2"), (1.0, 2.0), "increase", ("b1", "b2"), quote="q"
  )
  out = study_summary.compare(c, records)
  # Gains: seed 0: 1, 2 -> slope 1; seed 1: 2, 4 -> slope 2.
  assert out["seeds"] == [0, 1] and out["interval"]["mean"] == pytest.approx(1.5)
  gains = study_types.Study(
      "g", "g", tuple(study_types.arm(n, "configs/mocov2.py") for n in records), comparisons=(c,)
  )
  ax = study_plot.plot(gains, study_summary.summarise(gains, records), records).axes[0]
  dots = sorted(
      float(y) for line in ax.lines for y in line.get_ydata() if len(line.get_ydata()) == 2
  )
  assert dots == [1.0, 2.0, 2.0, 4.0]  # each seed's gain over its baseline arm
  # Two seeds at two x: the pooled regression has no residual degrees of freedom left.
  assert study_summary.compare(c, records)["sensitivity"]["analysis"] == "pooled"
  empty = study_types.Study(
      "e",
      "e",
      (study_types.arm("a1", "configs/mocov2.py"),),
      comparisons=(study_types.Comparison("d", "m", ("a1", "a1"), expect="decrease", quote="q"),),
  )
  lone = study_summary.summarise(empty, {})["comparisons"][0]
  assert lone["interval"] is None and lone["verdict"] == NOT_RESOLVED
  with pytest.raises(ValueError, match="unknown arms"):
    study_types.Study(
        "s", "s", (BASE,), comparisons=(study_types.Comparison("d", "m", ("base", "ns")),)
    )


def test_a_decisive_comparison_needs_its_quote_and_a_kept_one_its_margin():
  pair = ("ns", "base")
  with pytest.raises(ValueError, match="needs the paper's sentence"):
    study_types.Study(
        "s",
        "s",
        STUDY.arms,
        comparisons=(study_types.Comparison("d", "m", pair, expect="increase"),),
    )
  kept = study_types.Comparison("k", "m", pair, expect="no_decrease", quote="It is kept.")
  with pytest.raises(ValueError, match="needs a margin > 0 and its reason"):
    study_types.Study("s", "s", STUDY.arms, comparisons=(kept,))
  with pytest.raises(ValueError, match="sweep_analysis"):
    study_types.Study("s", "s", STUDY.arms, sweep_analysis="best")


def test_records_of_different_code_are_refused_and_the_claim_with_them():
  same = {"moco": [1.5, 2.5], "moco+nonsemantic_patch": [3.0, 4.0]}
  records = {
      "base": {s: _record({"shape": v}, {"moco": [1.5, 2.5]}) for s, v in enumerate((40, 42, 41))},
      "ns": {s: _record({"shape": v}, same) for s, v in enumerate((45, 46, 47))},
  }
  summary = study_summary.summarise(STUDY, records)
  assert summary["verdict"] == REPRODUCED  # the components they share agree
  # Seed 2 of the baseline from code whose MoCo step differs: the comparison is refused.
  records["base"][2] = _record({"shape": 41}, {"moco": [1.5, 2.6]}, commit="def5678")
  summary = study_summary.summarise(STUDY, records)
  c = summary["comparisons"][0]
  assert c["verdict"] == REFUSED and summary["verdict"] == REFUSED and c["interval"] is None
  assert c["refused"] == (
      "records ns seed 0 (abc1234) and base seed 2 (def5678) come from different code "
      "(moco differs): delete the older record and run the study again"
  )
  assert "Refused (shape: ns - base): records ns seed 0" in study_summary.markdown(STUDY, summary)
  del records["base"][2]["code"]
  c = study_summary.summarise(STUDY, records)["comparisons"][0]
  assert c["refused"] == "record base seed 2 has no code fingerprint (older code): run it again"


def test_processors_differ_in_fingerprints_not_in_code():
  """The same source on two processors: fingerprints differ in their last bits, the records
  compare. Other source on other processors cannot be checked: refused."""
  xeon = dict(ZEN, cpu="Intel Xeon")
  records = {
      "base": {s: _record({"shape": v}) for s, v in enumerate((40, 42, 41))},
      "ns": {s: _record({"shape": v}) for s, v in enumerate((45, 46, 47))},
  }
  records["base"][2] = _record({"shape": 41}, {"moco": [1.5, 2.5000002]}, environment=xeon)
  assert study_summary.summarise(STUDY, records)["verdict"] == REPRODUCED
  # The same JAX is part of the same code.
  records["base"][2]["environment"] = dict(xeon, jax="0.10.1")
  c = study_summary.summarise(STUDY, records)["comparisons"][0]
  assert c["verdict"] == REFUSED and "other source on other processors" in c["refused"]
  records["base"][2] = _record({"shape": 41}, commit="def5678", environment=xeon)
  c = study_summary.summarise(STUDY, records)["comparisons"][0]
  assert c["refused"] == (
      "records ns seed 0 (abc1234) and base seed 2 (def5678) come from other source on other "
      "processors, so their code fingerprints cannot be compared: run the study again from one "
      "commit or on one processor"
  )


def test_holm_decides_a_claim_of_three_comparisons():
  """Three paired differences over 5 seeds, each decisive: the raw p-values, Holm's adjusted
  ones and the verdicts against the hand-applied procedure."""
  arms = tuple(study_types.arm(n, "configs/mocov2.py") for n in ("b", "x", "y", "z"))
  diffs = {"x": (1.0, 1.2, 0.9, 1.1, 1.0), "y": (0.5, -0.1, 0.7, 0.2, 0.4), "z": (-1, 2, 0, 1, -1)}
  records = {"b": {s: _record({"m": 0.0}) for s in range(5)}}
  for n, d in diffs.items():
    records[n] = {s: _record({"m": v}) for s, v in enumerate(d)}
  claim = study_types.Study(
      "h",
      "h",
      arms,
      metrics=("m",),
      comparisons=tuple(
          study_types.Comparison(n, "m", (n, "b"), expect="increase", quote="q") for n in diffs
      ),
  )
  got = study_summary.summarise(claim, records)["comparisons"]
  p = [scipy.stats.ttest_1samp(d, 0.0).pvalue for d in diffs.values()]
  assert [c["p"] for c in got] == pytest.approx(p)
  order = np.argsort(p)
  want = np.empty(3)
  want[order] = np.maximum.accumulate([(3 - j) * p[i] for j, i in enumerate(order)])
  assert [c["p_holm"] for c in got] == pytest.approx(np.minimum(want, 1))
  # The adjusted interval: the t-interval at level 1 - 0.05 / (m - j) for rank j of the p-values.
  for j, i in enumerate(order):
    d = np.asarray(list(diffs.values())[i])
    half = scipy.stats.t.ppf(1 - 0.05 / (3 - j) / 2, 4) * d.std(ddof=1) / math.sqrt(5)
    adjusted = got[i]["adjusted_interval"]
    assert got[i]["adjusted_level"] == pytest.approx(1 - 0.05 / (3 - j))
    assert (adjusted["low"], adjusted["high"]) == pytest.approx((d.mean() - half, d.mean() + half))
  assert [c["verdict"] for c in got] == [
      REPRODUCED if q <= 0.05 else NOT_RESOLVED for q in np.minimum(want, 1)
  ]
  assert got[0]["verdict"] == REPRODUCED and got[2]["verdict"] == NOT_RESOLVED


def test_five_seeds_are_needed_for_a_verdict():
  """A clear gain over 3 seeds is not resolved under the rule of five seeds (and counts in
  Holm's correction with p = 1); with 5 seeds it is reproduced."""
  gains = (5.0, 4.0, 6.0, 5.5, 4.5)
  records = {
      "base": {s: _record({"shape": 40.0}) for s in range(5)},
      "ns": {s: _record({"shape": 40.0 + g}) for s, g in enumerate(gains)},
  }
  five = dataclasses.replace(STUDY, min_seeds=5)
  assert study_types.Study("d", "d", STUDY.arms).min_seeds == 5  # the default is the rule
  c = study_summary.summarise(five, records)["comparisons"][0]
  assert c["verdict"] == REPRODUCED and not c["too_few_seeds"]
  assert c["p_holm"] == pytest.approx(scipy.stats.ttest_1samp(gains, 0.0).pvalue)
  short = {a: {s: r for s, r in seeds.items() if s < 3} for a, seeds in records.items()}
  summary = study_summary.summarise(five, short)
  c = summary["comparisons"][0]
  assert c["interval"]["mean"] == pytest.approx(5.0) and c["too_few_seeds"]
  assert c["verdict"] == NOT_RESOLVED and c["p_holm"] == 1.0 and summary["verdict"] == NOT_RESOLVED
  assert "| not resolved (fewer than 5 seeds) | - | 3 | - |" in study_summary.markdown(
      five, summary
  )
  with pytest.raises(ValueError, match="min_seeds must be at least 2"):
    dataclasses.replace(STUDY, min_seeds=1)


def test_claims_name_every_part_and_one_name_is_one_arm_everywhere():
  seen = {}
  for s in STUDIES.values():
    for a in s.arms:
      assert seen.setdefault(a.name, a) == a, f"arm {a.name} differs between studies"
  for s in CLAIMS:
    assert s.paper and s.where and s.claim and s.is_claim and s.paper_setting, s.name
  # The headline parts: those the quoted headline sentence states.
  primary = {s.name: [c.label for c in s.comparisons if c.expect and c.primary] for s in CLAIMS}
  assert primary["zhu_ft"] == [
      "both - none",
      "positive score: both - none",
      "negative score: both - none",
  ]
  assert primary["dicr_normstd"] == [
      "SimCLR: probe mean",
      "SimCLR: NormStd crop",
      "MoCo: probe mean",
  ]
  assert primary["ge_alpha"] == ["shape vs alpha", "texture vs alpha"]
  assert primary["ge_alpha_x4"] == ["shape vs alpha 0-2", "texture vs alpha 0-2"]
  # Every arm's config is valid, and differs from its quick config only in its overrides.
  for a in seen.values():
    config = study_records.arm_config(a, 0)
    config_check.validate(config, num_devices=1)
    base = study_records.arm_config(study_types.Arm(a.name, a.config), 0)
    differ = {
        k for k, _, _ in study_records.config_differences(study_records.plain_config(base), config)
    }
    assert differ == {k for k, v in a.overrides if base_value(base, k) != v}, a.name


def test_a_scale_ladder_rung_is_its_claim_at_four_times_the_epochs():
  """Each rung's arms train 4x the quick arm's epochs and differ in nothing else that trains
  (DICR's lambda still reaches its final value in the last epoch); its decisive comparisons are
  the quick claim's, same quote, direction and margin, between the longer arms."""
  for quick_name, rung in (("ge_alpha", scale_ladder.GE), ("dicr_normstd", scale_ladder.DICR)):
    quick = STUDIES[quick_name]
    assert rung.name == f"{quick_name}_x4" and rung.name in STUDIES and rung in CLAIMS
    by_label = {c.label: c for c in quick.comparisons}
    longer_of = {}
    for a in rung.arms:
      base_name = a.name.rsplit("_e", 1)[0]
      base = next(b for b in quick.arms if b.name == base_name)
      long_config = study_records.arm_config(a, 0)
      base_config = study_records.arm_config(base, 0)
      assert long_config.optim.epochs == 4 * base_config.optim.epochs
      assert long_config.dicr.warmup_epochs == long_config.optim.epochs - 1
      assert dict(a.overrides) == {
          **dict(base.overrides),
          "optim.epochs": long_config.optim.epochs,
          "dicr.warmup_epochs": long_config.optim.epochs - 1,
      }
      longer_of[base.name] = a.name
    decisive = [c for c in rung.comparisons if c.expect]
    assert decisive
    for c in decisive:
      # A slope over part of the quick sweep ("... 0-2") is the quick slope's, over those arms.
      q = by_label[c.label.removesuffix(" 0-2")]
      if c.label.endswith(" 0-2"):
        q = dataclasses.replace(q, arms=q.arms[: len(c.arms)])
        assert c.x == q.x[: len(c.arms)] and c.primary == q.primary
      assert (c.quote, c.where, c.expect, c.margin, c.metric) == (
          q.quote,
          q.where,
          q.expect,
          q.margin,
          q.metric,
      )
      assert c.arms == tuple(longer_of[n] for n in q.arms)
  with pytest.raises(ValueError, match="has no comparisons"):
    scale_ladder.rung(STUDIES["ge_alpha"], {}, ("no such comparison",))
  with pytest.raises(ValueError, match="replaces only"):
    scale_ladder.rung(STUDIES["ge_alpha"], {}, (), metrics="shape")


def base_value(config, field):
  node = config
  for part in field.split("."):
    node = node[part]
  return node


@pytest.mark.slow
def test_a_tiny_study_end_to_end_through_the_command(tmp_path):
  sets = [f"--set={f[len('--config.') :]}" for f in tiny_run.FLAGS if f.startswith("--config.")]
  sets += ["--set=optim.epochs=1", "--set=eval.every=0"]
  # Each command in a process forked from one that has imported the libraries.
  run = forked_commands.shared().run
  cmd = [
      "cl_jax.study",
      "--study=ge_nojitter",
      "--seeds=1",
      f"--workdir={tmp_path / 'runs'}",
      f"--results={tmp_path / 'results'}",
      *sets,
  ]
  out = run(cmd)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "training in" in out.stdout
  assert "Verdict (primary parts): **not resolved**" in out.stdout  # one seed has no interval
  for arm_name in ("mocov2_nojitter", "mocov2_patchns_nojitter"):
    record = json.loads((tmp_path / f"results/runs/{arm_name}/seed0.json").read_text())
    assert record["config"]["aug.jitter_prob"] == 0.0 and record["step"] == 8
    assert 0 <= record["metrics"]["shape"] <= 100 and "random_init/shape" in record["metrics"]
    # The code version: its source and the fingerprint of each of its components.
    code = record["code"]
    assert sorted(code["fingerprint"]) == (
        ["moco"] if arm_name == "mocov2_nojitter" else ["moco", "moco+nonsemantic_patch"]
    )
    assert len(code["source_sha256"]) == 64 and code["commit"]
    # The commit and clean flag against git itself: clean when no tracked source file differs.
    edited = subprocess.run(
        ["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", "cl_jax", "configs"]
    )
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True)
    assert code["clean"] is (edited.returncode == 0)
    assert code["commit"] == head.stdout.decode().strip() + ("" if code["clean"] else "-dirty")
  assert (tmp_path / "results/ge_nojitter.png").stat().st_size > 1000
  again = run(cmd)
  assert again.returncode == 0 and "training in" not in again.stdout
  bad = run(cmd[:-1] + ["--set=nonsense"])
  assert bad.returncode == 1 and bad.stderr.strip().startswith("error: --set=nonsense")


def test_claims_table_rows_hold_the_decisive_parts_and_the_runs_done():
  records = {
      "base": {s: _record({"shape": v}) for s, v in enumerate((40.0, 42.0, 41.0))},
      "ns": {s: _record({"shape": v}) for s, v in enumerate((45.0, 46.0, 47.0))},
  }
  claim = study_types.Study(
      name="pair",
      title="pair",
      arms=(BASE, NS),
      metrics=("shape",),
      comparisons=STUDY.comparisons + (study_types.Comparison("colour", "colour", ("ns", "base")),),
      paper="Someone 2021",
      where="Table 9",
      claim="negatives raise shape.",
      paper_result="70 -> 75",
      paper_setting="224 px",
      min_seeds=3,
  )
  summary = study_summary.summarise(claim, records)
  rows = study_summary.claims_table([claim], [summary], seeds=4).splitlines()
  cells = [c.strip() for c in rows[2].strip("|").split("|")]
  # Differences 5, 4, 6: mean 5, s 1, t_{0.975,2} 4.302653 / sqrt(3) = 2.484 -> [2.5, 7.5].
  assert cells[0] == "Someone 2021, Table 9: negatives raise shape."
  assert cells[1] == "70 -> 75"
  # One decisive comparison: Holm's interval is the 95% one.
  assert cells[2] == (
      "shape: ns - base (primary difference, expected increase): 5.0 [2.5, 7.5] [2.5, 7.5], "
      "reproduced"
  )
  # Two seeds left: t_{0.975, 1} = 12.7 leaves each drop unresolved.
  moves = "moves (seed 0 out: not resolved; seed 1 out: not resolved; seed 2 out: not resolved)"
  assert cells[3:6] == ["**reproduced**", "reproduced", moves]
  assert cells[6] == "on AMD EPYC (avx512f avx2), jax 0.10.2 (6 runs); the paper: 224 px"
  assert cells[7:] == ["6 of 8", "`python -m cl_jax.study --study=pair`"]
  empty = study_summary.claims_table(
      [claim], [study_summary.summarise(claim, {})], seeds=4
  ).splitlines()[2]
  assert "| not run yet | - | - | no runs yet; the paper: 224 px | 0 of 8 |" in empty
  unrun = study_summary.verdicts_table([claim], [study_summary.summarise(claim, {})])
  assert "| not run yet | - | 1 not run | - | - | - | no runs yet; the paper: 224 px |" in unrun
  short = study_summary.verdicts_table([claim], [summary]).splitlines()[2]
  assert short == (
      "| Someone 2021, Table 9: negatives raise shape. | **reproduced** | reproduced | "
      f"1 reproduced (of 1) | - | - | {moves} | on AMD EPYC (avx512f avx2), jax 0.10.2 (6 runs); "
      "the paper: 224 px | `pair` ([plot](results/studies/pair.png)) |"
  )
  # A secondary part without records, and a primary one across machines: counted apart.
  both = dataclasses.replace(
      claim,
      comparisons=claim.comparisons
      + (
          study_types.Comparison(
              "c", "colour", ("ns", "base"), expect="increase", quote="q", primary=False
          ),
      ),
  )
  records["ns"][0] = {**records["ns"][0], "environment": {**ZEN, "isa": "avx2"}}
  short = study_summary.verdicts_table([both], [study_summary.summarise(both, records)])
  assert "| **reproduced** | not resolved | 1 reproduced (of 1) | 1 not resolved (of 1) | " in short
  assert "| 1 across machines |" in short


@pytest.mark.slow
def test_a_failed_run_is_reported_and_the_others_go_on(tmp_path):
  calls, trainer = [], None

  def train(arm_, seed, extra, directory, analyses):
    if arm_.name == "base" and seed == 0:
      raise study_runs.RunFailed("arm base seed 0 failed: cl_jax.main ...")
    return trainer(arm_, seed, extra, directory, analyses)

  trainer = _fake_trainer(calls)
  summary = study.run(
      STUDY, 2, str(tmp_path / "runs"), str(tmp_path / "res"), study_fakes.TINY, train=train
  )
  assert summary["failed"] == ["arm base seed 0 failed: cl_jax.main ..."]
  assert sorted(c[:2] for c in calls) == [("base", 1), ("ns", 0), ("ns", 1)]
  assert summary["arms"]["base"]["seeds"] == [1] and summary["comparisons"][0]["seeds"] == [1]
  # --status: the failed run with its error, the others done.
  rows = study_launch.status(STUDY, 2, str(tmp_path / "runs"), str(tmp_path / "res"))
  states = [(r["arm"], r["seed"], r["state"]) for r in rows]
  assert states == [
      ("base", 0, "failed"),
      ("ns", 0, "done"),
      ("base", 1, "done"),
      ("ns", 1, "done"),
  ]
  assert rows[0]["detail"] == "arm base seed 0 failed: cl_jax.main ..."
  assert "base seed 0: failed: arm base seed 0" in study_launch.status_table("pair", rows)


# A stand-in for cl_jax.main: on SIGINT, SIGTERM or SIGUSR2 (a scheduler's warning signal) it
# notes the signal and its process group (as if saving a checkpoint) and exits with 128 + the
# signal; it asks its parent for the signal.
FAKE_CHILD = """
import os, signal, sys, time
def stop(signum, frame):
    with open(sys.argv[1], "a") as f:
        f.write(f"{signal.Signals(signum).name} {os.getpgid(0)}\\n")
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGUSR2, stop)
if sys.argv[2] != "0":
    os.kill(os.getppid(), int(sys.argv[2]))
    time.sleep(60)
sys.exit(int(sys.argv[3]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_is_passed_to_the_run_and_stops_the_study(tmp_path, signum):
  script, saved = tmp_path / "child.py", tmp_path / "saved.txt"
  script.write_text(FAKE_CHILD)
  before = signal.getsignal(signum)
  with pytest.raises(study_runs.StudyStopped, match=signal.Signals(signum).name) as stopped:
    study_runs.run_child([sys.executable, str(script), str(saved), str(int(signum)), "0"])
  assert stopped.value.code == 128 + signum
  name, group = saved.read_text().split()  # the child got the signal once, and saved
  assert name == signal.Signals(signum).name
  assert int(group) != os.getpgid(0)  # a terminal's Ctrl-C reaches the runner only
  assert signal.getsignal(signum) is before


def test_a_schedulers_warning_signal_reaches_the_run_before_the_tasks_own_handler(
    tmp_path, monkeypatch
):
  """In a SLURM task (STOP_SIGNAL_ENV set) the warning signal is passed on to the run, which
  saves and ends, while the task's own handler of it (submitit's, which requeues and exits at
  once) is held back, and restored after; without the variable it is not passed on."""
  script, saved = tmp_path / "child.py", tmp_path / "saved.txt"
  script.write_text(FAKE_CHILD)
  usr2 = signal.SIGUSR2
  monkeypatch.setenv(study_runs.STOP_SIGNAL_ENV, "USR2")
  own = []
  before = signal.signal(usr2, lambda signum, frame: own.append(signum))
  try:
    with pytest.raises(study_runs.StudyStopped, match="SIGUSR2") as stopped:
      study_runs.run_child([sys.executable, str(script), str(saved), str(int(usr2)), "0"])
    assert stopped.value.code == 128 + usr2
    assert saved.read_text().split()[0] == "SIGUSR2" and own == []
    signal.raise_signal(usr2)  # the task's own handler is back
    assert own == [usr2]
  finally:
    signal.signal(usr2, before)
  assert usr2 in study_runs.forwarded_signals()
  monkeypatch.delenv(study_runs.STOP_SIGNAL_ENV)
  assert study_runs.forwarded_signals() == (signal.SIGINT, signal.SIGTERM)


def test_a_child_without_a_signal_gives_its_status_and_a_stop_is_not_a_failed_run(tmp_path):
  script = tmp_path / "child.py"
  script.write_text(FAKE_CHILD)
  assert study_runs.run_child([sys.executable, str(script), "unused", "0", "3"]) == 3

  def stopped(arm_, seed, extra, directory, analyses):
    raise study_runs.StudyStopped("study stopped by SIGTERM: ...", 143)

  with pytest.raises(study_runs.StudyStopped):
    study.run(
        STUDY, 2, str(tmp_path / "runs"), str(tmp_path / "res"), study_fakes.TINY, train=stopped
    )


def test_a_deadline_leaves_runs_that_would_not_end_in_time_and_a_claimed_run_is_left(tmp_path):
  work, results, calls, lines = str(tmp_path / "runs"), str(tmp_path / "results"), [], []
  run = lambda seeds, **kw: study.run(
      STUDY,
      seeds,
      work,
      results,
      study_fakes.TINY,
      train=_fake_trainer(calls),
      log=lines.append,
      here="AMD EPYC (avx512f avx2), jax 0.10.2",
      **kw,
  )
  # Another process holds base seed 0's run directory: it is left to it, and taken once free.
  with study_runs.claim(study_records.run_dir(work, "base", 0)) as mine:
    assert mine and study_runs.is_claimed(study_records.run_dir(work, "base", 0))
    assert run(1)["left"] == []
  assert [c[:2] for c in calls] == [("ns", 0)]
  assert any("base seed 0 is being trained by another process" in line for line in lines)
  assert not study_runs.is_claimed(study_records.run_dir(work, "base", 0))
  run(1)
  assert [c[:2] for c in calls] == [("ns", 0), ("base", 0)]
  # The fake runs took 10 s (seed 0) on this machine: with 5 s to go no run starts, with 60 s
  # every one does.
  for s in (0,):
    for a in ("base", "ns"):
      path = study_records.record_path(results, a, s)
      record = json.loads(path.read_text())
      path.write_text(json.dumps({**record, "environment": {**record["environment"], **ZEN}}))
  summary = run(2, deadline_s=5.0)
  assert summary["left"] == ["base seed 1", "ns seed 1"] and len(calls) == 2
  assert run(2, deadline_s=60.0)["left"] == [] and len(calls) == 4


@pytest.mark.slow
def test_the_gpu_study_command_brings_back_new_records_at_tiny_size(tmp_path):
  """launch/gpu_study.sh on this processor at tiny size: two arm-seeds of the paper-scale rung
  as two workers at once; their records, and only they, come back in OUT/runs."""
  tiny = (
      "data.image_size=32",
      "data.trifeature_train=256",
      "data.trifeature_test=128",
      "optim.batch_size=32",
      "optim.epochs=1",
      "optim.warmup_epochs=0",
      "model.depth=10",
      "model.width_multiplier=0.125",
      "model.head_hidden_dim=32",
      "model.head_out_dim=16",
      "model.dtype=float32",
  )
  env = {**os.environ, "PYTHON": sys.executable, "CL_JAX_STUDY_WORKERS": "2"}
  env["TMPDIR"] = str(tmp_path)  # the script's scratch folder: under tmp_path
  env["CL_JAX_STUDY_DEADLINE_S"] = "900"
  env["CL_JAX_CACHE"] = str(tmp_path / "cache")
  arms = "simclr_trifeature128,simclr_ifm_trifeature128"
  script = os.path.join(ROOT, "launch", "gpu_study.sh")
  flags = ["--seeds=1", f"--arms={arms}", *(f"--set={x}" for x in tiny)]
  proc = subprocess.run(
      ["bash", script, "robinson_ifm_paper", str(tmp_path / "o"), *flags],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=900,
  )
  out = tmp_path / "o"
  assert proc.returncode == 0, (out / "study.log").read_text()[-3000:]
  new = sorted(str(p.relative_to(out / "runs")) for p in (out / "runs").rglob("*.json"))
  assert new == ["simclr_ifm_trifeature128/seed0.json", "simclr_trifeature128/seed0.json"]
  record = json.loads((out / "runs/simclr_ifm_trifeature128/seed0.json").read_text())
  assert record["environment"]["device"] == "cpu" and record["config"]["data.image_size"] == 32
  assert record["config"]["ifm.enabled"] and record["config"]["optim.optimizer"] == "lars"
  assert not (out / "results").exists() and "2 new records" in proc.stdout
  assert not list(tmp_path.glob("cl_jax_gpu_study*"))  # the runs' work folders removed
