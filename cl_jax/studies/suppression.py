"""Feature suppression on Trifeature (Robinson et al. 2021, Sec. 2.3 and 4.1, Figs. 3 and 6):
SimCLR at T 0.05, 0.2 and 0.5, each with IFM off and on (epsilon 0.1, alpha 1), and
hard-negative sampling at T 0.5 with beta 0.5, 1 and 2 (tau+ 0.1), read out by the fast probe.

Besides the study's standard tables it writes the grid's own, one row per run (named as
before: simclr_t{T}[_ifm], hcl_t0.5_b{beta}): suppression_grid.md (mean +- sample std over
seeds, ddof 1), suppression_grid.csv and suppression_grid.png (cl_jax.viz.suppression_plot).
"""

import csv
import dataclasses
import io

import numpy as np

from cl_jax.analysis.study_types import Study
from cl_jax.studies.arms import simclr
from cl_jax.viz import suppression_plot

FEATURES = suppression_plot.FEATURES
TEMPERATURES = (0.05, 0.2, 0.5)
HCL_TEMPERATURE = 0.5
HCL_BETAS = (0.5, 1.0, 2.0)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One point of the grid: SimCLR at `temperature`, IFM on/off, hard negatives at `beta`
  (None without); `name` is the grid's name of the run."""

  name: str
  temperature: float
  ifm: bool
  beta: float | None


@dataclasses.dataclass(frozen=True)
class Row:
  """A run's results over seeds in percent: mean and (for > 1 seed) sample std (ddof 1) of
  FEATURES and "mean" (the mean of the three)."""

  spec: RunSpec
  seeds: int
  mean: dict[str, float]
  std: dict[str, float] | None


def spec_of(config: dict) -> RunSpec:
  """The grid point of a flattened run config."""
  t = float(config["simclr.temperature"])
  beta = float(config["hcl.beta"]) if config["hcl.enabled"] else None
  ifm = bool(config["ifm.enabled"])
  name = f"hcl_t{t:g}_b{beta:g}" if beta is not None else f"simclr_t{t:g}" + ("_ifm" if ifm else "")
  return RunSpec(name, t, ifm, beta)


def summarise(spec: RunSpec, per_seed: list[dict[str, float]]) -> Row:
  """Mean (and, for > 1 seed, sample std) over the seeds' accuracies (percent)."""
  keys = (*FEATURES, "mean")
  values = {k: np.array([a[k] for a in per_seed]) for k in keys}
  mean = {k: float(v.mean()) for k, v in values.items()}
  std = {k: float(v.std(ddof=1)) for k, v in values.items()} if len(per_seed) > 1 else None
  return Row(spec, len(per_seed), mean, std)


def rows(study: Study, records: dict) -> list[Row]:
  """A Row for every arm of `study` (grid order) with at least one record."""
  out = []
  for a in study.arms:
    seeds = records.get(a.name, {})
    if seeds:
      first = next(iter(seeds.values()))
      per_seed = [
          {**{k: r["metrics"][k] for k in FEATURES}, "mean": r["metrics"]["mean"]}
          for r in seeds.values()
      ]
      out.append(summarise(spec_of(first["config"]), per_seed))
  return out


def markdown_table(rows_: list[Row], header: str) -> str:
  """`header`, then a markdown table of `rows_`: percent with one decimal, "m ± s" over seeds."""
  cols = ["run", "T", "IFM", "beta", *FEATURES, "mean", "seeds"]
  lines = [
      header,
      "",
      "| " + " | ".join(cols) + " |",
      "|" + "|".join(["---"] * 4 + ["---:"] * 5) + "|",
  ]
  for r in rows_:
    beta = f"{r.spec.beta:g}" if r.spec.beta is not None else "-"
    cells = [r.spec.name, f"{r.spec.temperature:g}", "on" if r.spec.ifm else "off", beta]
    for k in (*FEATURES, "mean"):
      cells.append(f"{r.mean[k]:.1f}" + (f" ± {r.std[k]:.1f}" if r.std is not None else ""))
    cells.append(str(r.seeds))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def csv_table(rows_: list[Row]) -> str:
  """CSV of `rows_`: ifm 0/1, beta empty without hard negatives, percent to 4 decimals,
  <feature>_std empty for a single seed."""
  keys = (*FEATURES, "mean")
  out = io.StringIO()
  w = csv.writer(out, lineterminator="\n")
  w.writerow(["run", "temperature", "ifm", "beta", *keys, *(f"{k}_std" for k in keys), "seeds"])
  for r in rows_:
    w.writerow(
        [
            r.spec.name,
            f"{r.spec.temperature:g}",
            int(r.spec.ifm),
            "" if r.spec.beta is None else f"{r.spec.beta:g}",
            *(f"{r.mean[k]:.4f}" for k in keys),
            *(f"{r.std[k]:.4f}" if r.std is not None else "" for k in keys),
            r.seeds,
        ]
    )
  return out.getvalue()


HEADER = (
    "## Trifeature feature suppression (Robinson et al. 2021, Figs. 3 and 6)\n\n"
    "SimCLR (configs/simclr.py); linear probe (fast protocol) top-1 % on the test split, mean "
    "± sample std over the seeds. IFM: epsilon 0.1, alpha 1. Hard negatives: tau+ 0.1."
)


def outputs(study: Study, records: dict) -> dict:
  """suppression_grid.md, .csv and .png."""
  table = rows(study, records)
  return {
      "suppression_grid.md": markdown_table(table, HEADER),
      "suppression_grid.csv": csv_table(table),
      "suppression_grid.png": suppression_plot.plot_suppression(table),
  }


STUDY = Study(
    name="suppression",
    title="Trifeature feature suppression (Robinson et al. 2021, Figs. 3 and 6)",
    arms=tuple(simclr(t, ifm_epsilon=e) for t in TEMPERATURES for e in (None, 0.1))
    + tuple(simclr(HCL_TEMPERATURE, hcl_beta=b) for b in HCL_BETAS),
    metrics=("colour", "shape", "texture", "mean"),
    outputs=outputs,
)
