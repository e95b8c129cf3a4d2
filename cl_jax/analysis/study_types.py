"""The types of a study (cl_jax.analysis.study): an Arm (a config file with overrides), a
Comparison of record metrics between arms, and a Study (arms, comparisons, and for a claim the
paper's words and setting), checked when made. A leaf module: the study engine's modules
(study, study_records, study_runs, study_summary) and the studies (cl_jax.studies) import it.
"""

import dataclasses
from collections.abc import Callable, Mapping

from cl_jax.analysis import intervals

ANALYSES = ("normstd",)
SWEEP_ANALYSES = ("per_seed", "pooled")


@dataclasses.dataclass(frozen=True)
class Arm:
  """A config file (PATH[:preset]) with `overrides` ((field, value), ...)."""

  name: str
  config: str
  overrides: tuple[tuple[str, object], ...] = ()


def arm(name: str, config: str, overrides: Mapping[str, object] | None = None) -> Arm:
  """Arm `name` of config file `config` with {field: value} overrides."""
  return Arm(name, config, tuple(sorted((overrides or {}).items())))


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A paired difference (arms = (treatment, baseline), no x) or a slope over a sweep (arms
  in the order of their swept values x) of one record metric; `expect` is its expected
  direction (intervals.DIRECTIONS) or None for a comparison reported without a verdict.
  A slope with `minus` (one baseline arm per swept arm) is the slope of the paired gains
  metric(arms[i]) - metric(minus[i]). A decisive comparison (with `expect`) quotes the
  paper's sentence that states its direction (`quote`, with `where` it stands); a
  non-inferiority one ("no_decrease", "no_increase") has its `margin`, in the metric's units,
  fixed before the runs, and `margin_reason`. A decisive comparison is `primary` when it tests
  the claim's quoted headline sentence itself, secondary (primary=False) when it tests another
  sentence, inferred or supporting: secondary parts are judged and shown, and never decide the
  headline (intervals.headline_verdict)."""

  label: str
  metric: str
  arms: tuple[str, ...]
  x: tuple[float, ...] = ()
  expect: str | None = None
  minus: tuple[str, ...] = ()
  quote: str = ""
  where: str = ""
  margin: float | None = None
  margin_reason: str = ""
  primary: bool = True

  @property
  def kind(self) -> str:
    return "slope" if self.x else "difference"


@dataclasses.dataclass(frozen=True)
class Study:
  """Arms, the analyses run on each finished run (ANALYSES), the record metrics tabulated per
  arm, comparisons, and for a claim of a paper: where it stands (paper, figure or table), the
  claim (the paper's words), what the paper reports and the setting the paper ran
  (`paper_setting`: backbone, data, image size, epochs, batch), shown beside the setting of the
  records. `outputs`, when given, writes the
  study's own tables (study, records -> {file name: text}) beside the standard ones.
  `sweep_analysis`: the primary analysis of its slopes, "per_seed" (the interval of the
  seeds' least-squares slopes) or "pooled" (one regression with seed effects); the other is
  reported beside it as a sensitivity check (cl_jax.analysis.intervals). `min_seeds`: the
  seeds a decisive comparison needs before it has a verdict (the rule of every claim: five);
  with fewer it is "not resolved"."""

  name: str
  title: str
  arms: tuple[Arm, ...]
  analyses: tuple[str, ...] = ()
  metrics: tuple[str, ...] = ("colour", "shape", "texture")
  comparisons: tuple[Comparison, ...] = ()
  paper: str = ""
  where: str = ""
  claim: str = ""
  paper_result: str = ""
  paper_setting: str = ""
  notes: str = ""
  outputs: Callable[["Study", dict], dict] | None = None
  sweep_analysis: str = "per_seed"
  min_seeds: int = 5

  def __post_init__(self):
    names = [a.name for a in self.arms]
    unknown = [a for a in self.analyses if a not in ANALYSES]
    if unknown:
      raise ValueError(f"study {self.name}: unknown analyses {unknown}; known: {ANALYSES}")
    if len(set(names)) != len(names):
      raise ValueError(f"study {self.name}: arm names repeat: {names}")
    for c in self.comparisons:
      missing = [a for a in (*c.arms, *c.minus) if a not in names]
      if missing:
        raise ValueError(f"study {self.name}: comparison {c.label} names unknown arms {missing}")
      if c.kind == "difference" and len(c.arms) != 2:
        raise ValueError(f"study {self.name}: {c.label} must compare two arms")
      if c.kind == "slope" and len(c.x) != len(c.arms):
        raise ValueError(f"study {self.name}: {c.label} needs one x per arm")
      if c.minus and (c.kind != "slope" or len(c.minus) != len(c.arms)):
        raise ValueError(f"study {self.name}: {c.label}: minus needs a slope, one arm per x")
      if c.expect is not None and c.expect not in intervals.DIRECTIONS:
        raise ValueError(f"study {self.name}: {c.label} expects {c.expect!r}")
      if c.expect is not None and not c.quote:
        raise ValueError(f"study {self.name}: {c.label} needs the paper's sentence (quote)")
      if c.expect in intervals.NON_INFERIORITY and not (
          c.margin and c.margin > 0 and c.margin_reason
      ):
        raise ValueError(f"study {self.name}: {c.label} needs a margin > 0 and its reason")
    decisive = [c for c in self.comparisons if c.expect is not None]
    if decisive and not any(c.primary for c in decisive):
      raise ValueError(
          f"study {self.name}: no decisive comparison is primary; mark those that test the "
          "quoted headline sentence primary=True"
      )
    if self.sweep_analysis not in SWEEP_ANALYSES:
      raise ValueError(f"study {self.name}: sweep_analysis must be one of {SWEEP_ANALYSES}")
    if self.min_seeds < 2:
      raise ValueError(f"study {self.name}: min_seeds must be at least 2, got {self.min_seeds}")

  @property
  def is_claim(self) -> bool:
    return any(c.expect is not None for c in self.comparisons)
