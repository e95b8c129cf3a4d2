"""Feature suppression on Trifeature (Robinson et al. 2021, Sec. 2.3 and 4.1, Figs. 3 and 6).

python -m cl_jax.suppression [--workdir=runs/suppression] [--config=configs/simclr.py]
    [--seeds=N] [--only=NAME,NAME,...] [--config.optim.epochs=4 --config.data.image_size=16 ...]

Run from the repository root. Trains a grid of SimCLR encoders on the built-in
Trifeature dataset and reads out colour, shape and texture with the fast linear
probe (cl_jax.linear_probe), one classifier per feature:

  simclr_t{T}        SimCLR at temperature T in {0.05, 0.2, 0.5}   (Fig. 3, left)
  simclr_t{T}_ifm    the same with implicit feature modification,
                     epsilon 0.1, alpha 1                          (Fig. 6)
  hcl_t0.5_b{beta}   hard-negative sampling (Robinson et al. ICLR 2021)
                     with class prior tau+ 0.1 at T 0.5, concentration
                     beta in {0.5, 1, 2}                            (Fig. 3, right)

Larger beta and smaller T make instance discrimination harder (Sec. 2.3). The
--config file (default configs/simclr.py) gives everything else; its fields are
overridden ml_collections-style, exactly as for cl_jax.main (e.g.
--config.optim.epochs=4); the fields the grid sets itself (GRID_FIELDS) may not
be overridden. Seed i of a run (i = 0 .. --seeds - 1) trains with
config.seed + i in <workdir>/<run name>/seed<config.seed + i>/.

Runs happen one after another in this process: one JAX start-up for the grid (each run
still compiles its own train step), and errors surface as Python exceptions rather than
exit codes. A run whose final probe report (probe_step<last>_fast.json) exists is read,
not retrained; a run with checkpoints but no report resumes from its latest checkpoint
(cl_jax.train.pretrain). A run directory whose config.json disagrees with the grid's
config in any field's value is refused rather than mixed in.
--only restricts which runs are trained; every grid run with a finished report
enters the results. A run that diverges is reported and the rest go on; the
command then exits with status 1.

Results, rewritten after every run, in <workdir>/:
  suppression.md    markdown table: run, T, IFM, beta, colour, shape, texture,
                    their mean, seeds; top-1 % on the test split, mean over seeds
                    +- sample standard deviation (ddof 1) when a run has > 1;
  suppression.csv   the same numbers, one column per value and its std;
  suppression.png   cl_jax.viz.suppression_plot.
"""

import csv
import dataclasses
import io
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import ml_collections
import numpy as np
from absl import app, flags, logging
from etils import epath
from ml_collections import config_flags

from cl_jax import cli, linear_probe, train
from cl_jax.data import sources
from cl_jax.errors import UsageError
from cl_jax.run_config import ABSENT, differences
from cl_jax.run_config import read as read_stored_config
from cl_jax.viz import suppression_plot

FEATURES = suppression_plot.FEATURES
TEMPERATURES = (0.05, 0.2, 0.5)
IFM_EPSILON = 0.1
IFM_ALPHA = 1.0
HCL_TEMPERATURE = 0.5
HCL_BETAS = (0.5, 1.0, 2.0)
HCL_TAU_PLUS = 0.1
PROTOCOL = "fast"
# Config fields each run of the grid sets; overriding them would be silently undone.
GRID_FIELDS = (
    "simclr.temperature",
    "ifm.enabled",
    "ifm.epsilon",
    "ifm.alpha",
    "hcl.enabled",
    "hcl.beta",
    "hcl.tau_plus",
)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One point of the grid: SimCLR at `temperature`, IFM on/off, hard negatives at `beta`.

  beta is None for runs without hard-negative sampling; ifm and beta are never
  both set.
  """

  name: str
  temperature: float
  ifm: bool
  beta: float | None


@dataclasses.dataclass(frozen=True)
class Row:
  """A run's results over seeds, in percent (top-1 accuracy x 100).

  mean: FEATURES and "mean" (the mean of the three) -> mean over seeds.
  std: the same keys -> sample standard deviation over seeds (ddof 1); None
    for a single seed.
  """

  spec: RunSpec
  seeds: int
  mean: dict[str, float]
  std: dict[str, float] | None


def grid(
    temperatures: Sequence[float] = TEMPERATURES,
    hcl_betas: Sequence[float] = HCL_BETAS,
    hcl_temperature: float = HCL_TEMPERATURE,
) -> list[RunSpec]:
  """The study's runs: per temperature IFM off then on, then hard negatives per beta."""
  specs = []
  for t in temperatures:
    specs.append(RunSpec(f"simclr_t{t:g}", float(t), False, None))
    specs.append(RunSpec(f"simclr_t{t:g}_ifm", float(t), True, None))
  for b in hcl_betas:
    specs.append(
        RunSpec(f"hcl_t{hcl_temperature:g}_b{b:g}", float(hcl_temperature), False, float(b))
    )
  return specs


def select(specs: Sequence[RunSpec], only: Sequence[str] | None) -> list[RunSpec]:
  """The specs named in `only` (grid order), or all of them for None."""
  if only is None:
    return list(specs)
  names = [s.name for s in specs]
  unknown = [n for n in only if n not in names]
  if unknown or not only:
    raise UsageError(
        f"--only names {unknown or 'no run'}; the grid's runs are " f"{', '.join(names)}"
    )
  return [s for s in specs if s.name in only]


def check_overrides(overrides: Mapping[str, object]) -> None:
  """UsageError if a command-line config override sets a field the grid sets per run."""
  clash = sorted(k for k in overrides if k in GRID_FIELDS)
  if clash:
    raise UsageError(
        f"--config.{clash[0]} is set by the study for each run (its grid fields: "
        f"{', '.join(GRID_FIELDS)}); drop the override"
    )


def check_base(config: ml_collections.ConfigDict) -> None:
  """UsageError unless `config` is a SimCLR config on Trifeature (colour/shape/texture)."""
  if config.method != "simclr":
    raise UsageError(
        f"the study trains SimCLR, but the config's method is "
        f"{config.method!r}; use --config=configs/simclr.py"
    )
  if config.data.name != "trifeature":
    raise UsageError(
        f"the study reads out Trifeature's colour, shape and texture, but "
        f"data.name = {config.data.name!r}; use the Trifeature preset"
    )


def run_config(
    base: ml_collections.ConfigDict, spec: RunSpec, seed_index: int
) -> ml_collections.ConfigDict:
  """`base` with the grid fields of `spec` set and seed = base.seed + seed_index."""
  c = base.copy_and_resolve_references()
  c.simclr.temperature = spec.temperature
  c.ifm.enabled = spec.ifm
  c.ifm.epsilon = IFM_EPSILON
  c.ifm.alpha = IFM_ALPHA
  c.hcl.enabled = spec.beta is not None
  if spec.beta is not None:
    c.hcl.beta = spec.beta
  c.hcl.tau_plus = HCL_TAU_PLUS
  c.seed = base.seed + seed_index
  return c


def run_dir(root: str, spec: RunSpec, config: ml_collections.ConfigDict) -> epath.Path:
  """<root>/<run name>/seed<config.seed>."""
  return epath.Path(root) / spec.name / f"seed{config.seed}"


def final_step(config: ml_collections.ConfigDict) -> int:
  """The step the run's last checkpoint (and so its final probe report) will carry."""
  num = len(sources.open_source(config.data, "pretrain"))
  return config.optim.epochs * train.steps_per_epoch(num, config.optim.batch_size)


def check_run_config(config: ml_collections.ConfigDict, workdir: epath.Path) -> None:
  """UsageError if workdir/config.json holds a field whose value differs from `config`'s.

  Fields present in only one of them (a newer config schema) are not compared.
  """
  path = workdir / "config.json"
  if not path.exists():
    return
  differ = [
      (k, a, b)
      for k, a, b in differences(read_stored_config(str(workdir)), config)
      if ABSENT not in (a, b)
  ]
  if differ:
    shown = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, a, b in differ[:4])
    raise UsageError(
        f"{workdir} holds a run with another config ({shown}"
        f"{', ...' if len(differ) > 4 else ''}); use a fresh --workdir for a "
        "study at other settings, or delete that run directory"
    )


def read_report(
    config: ml_collections.ConfigDict, workdir: epath.Path, last_step: int
) -> dict | None:
  """The run's fast-probe report at `last_step` (final_step), or None before it is written."""
  check_run_config(config, workdir)
  path = workdir / f"probe_step{last_step}_{PROTOCOL}.json"
  return json.loads(path.read_text()) if path.exists() else None


def finished_rows(
    base: ml_collections.ConfigDict, root: str, seeds: int, last_step: int
) -> list[Row]:
  """A Row for every grid run (grid order) with a report for at least one of its seeds."""
  rows = []
  for spec in grid():
    reports = []
    for i in range(seeds):
      config = run_config(base, spec, i)
      report = read_report(config, run_dir(root, spec, config), last_step)
      if report is not None:
        reports.append(report)
    if reports:
      rows.append(summarise(spec, reports))
  return rows


def train_and_probe(config: ml_collections.ConfigDict, workdir: epath.Path) -> dict:
  """Pretrain (or resume) the run in `workdir`, then write and return its fast-probe report."""
  train.pretrain(config, str(workdir))
  return linear_probe.run(str(workdir), protocol=PROTOCOL)


def accuracies(report: Mapping) -> dict[str, float]:
  """Top-1 accuracy in percent of each feature in a probe report, and their mean."""
  acc = report.get("accuracy", {})
  missing = [f for f in FEATURES if f not in acc]
  if missing:
    raise UsageError(
        f"the probe report {report.get('path', report.get('workdir'))} has no "
        f"accuracy for {missing}: it is not a Trifeature report"
    )
  out = {f: 100.0 * float(acc[f]["top1"]) for f in FEATURES}
  out["mean"] = float(np.mean([out[f] for f in FEATURES]))
  return out


def summarise(spec: RunSpec, reports: Sequence[Mapping]) -> Row:
  """Mean (and, for > 1 seed, sample std) over the seeds' reports of each accuracy."""
  if not reports:
    raise ValueError(f"run {spec.name} has no probe report to summarise")
  per_seed = [accuracies(r) for r in reports]
  keys = (*FEATURES, "mean")
  values = {k: np.array([a[k] for a in per_seed]) for k in keys}
  mean = {k: float(v.mean()) for k, v in values.items()}
  std = {k: float(v.std(ddof=1)) for k, v in values.items()} if len(reports) > 1 else None
  return Row(spec, len(reports), mean, std)


def _ifm_cell(spec: RunSpec) -> str:
  return "on" if spec.ifm else "off"


def _beta_cell(spec: RunSpec) -> str:
  return f"{spec.beta:g}" if spec.beta is not None else "-"


def markdown_table(rows: Sequence[Row], header: str) -> str:
  """`header`, then a markdown table of `rows`: percent with one decimal, "m ± s" over seeds."""
  cols = ["run", "T", "IFM", "beta", *FEATURES, "mean", "seeds"]
  lines = [
      header,
      "",
      "| " + " | ".join(cols) + " |",
      "|" + "|".join(["---"] * 4 + ["---:"] * 5) + "|",
  ]
  for r in rows:
    cells = [r.spec.name, f"{r.spec.temperature:g}", _ifm_cell(r.spec), _beta_cell(r.spec)]
    for k in (*FEATURES, "mean"):
      cells.append(f"{r.mean[k]:.1f}" + (f" ± {r.std[k]:.1f}" if r.std is not None else ""))
    cells.append(str(r.seeds))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def csv_table(rows: Sequence[Row]) -> str:
  """CSV of `rows`: ifm 0/1, beta empty without hard negatives, percent to 4 decimals,
  <feature>_std empty for a single seed."""
  keys = (*FEATURES, "mean")
  out = io.StringIO()
  w = csv.writer(out, lineterminator="\n")
  w.writerow(["run", "temperature", "ifm", "beta", *keys, *(f"{k}_std" for k in keys), "seeds"])
  for r in rows:
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


def write_results(rows: Sequence[Row], root: str, header: str) -> list[str]:
  """suppression.md, .csv and .png in `root`; returns their paths."""
  out = epath.Path(root)
  out.mkdir(parents=True, exist_ok=True)
  md, cs, png = out / "suppression.md", out / "suppression.csv", out / "suppression.png"
  md.write_text(markdown_table(rows, header))
  cs.write_text(csv_table(rows))
  suppression_plot.write_png(suppression_plot.plot_suppression(rows), png)
  return [str(md), str(cs), str(png)]


def describe(config_file: str, overrides: Mapping[str, object], seeds: int) -> str:
  """The markdown heading of the results: method, probe, grid constants, config."""
  given = ", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "none"
  return (
      f"## Trifeature feature suppression (Robinson et al. 2021, Figs. 3 and 6)\n\n"
      f"SimCLR; linear probe ({PROTOCOL} protocol) top-1 % on the test split"
      f"{f', mean ± sample std over {seeds} seeds' if seeds > 1 else ', one seed'}. "
      f"IFM: epsilon {IFM_EPSILON:g}, alpha {IFM_ALPHA:g}. Hard negatives: tau+ "
      f"{HCL_TAU_PLUS:g}. Config {config_file}; overrides: {given}."
  )


def run_study(
    base: ml_collections.ConfigDict,
    root: str,
    train_specs: Sequence[RunSpec],
    seeds: int,
    header: str,
    train_fn: Callable[[ml_collections.ConfigDict, epath.Path], dict] = train_and_probe,
    log: Callable[[str], None] = print,
) -> tuple[list[Row], list[str]]:
  """Train `train_specs` (every seed) unless their reports exist; write results after each run.

  The grid does not change the data, batch or epochs, so every run ends at the
  same step. Returns (finished_rows: every grid run with a report, trained now
  or before; one message per run that diverged).
  """
  last_step = final_step(base)
  failures = []
  for n, spec in enumerate(train_specs, 1):
    for i in range(seeds):
      config = run_config(base, spec, i)
      workdir = run_dir(root, spec, config)
      tag = f"[{n}/{len(train_specs)}] {spec.name} seed {config.seed}"
      if read_report(config, workdir, last_step) is not None:
        log(f"{tag}: probe report found in {workdir}, not retrained")
        continue
      start = time.perf_counter()
      try:
        acc = accuracies(train_fn(config, workdir))
      except train.TrainingDiverged as e:
        failures.append(f"{spec.name} seed {config.seed}: {e}")
        log(f"{tag}: {e}")
        continue
      log(
          f"{tag}: "
          + ", ".join(f"{k} {acc[k]:.1f}%" for k in (*FEATURES, "mean"))
          + f" ({time.perf_counter() - start:.0f} s)"
      )
      write_results(finished_rows(base, root, seeds, last_step), root, header)
  rows = finished_rows(base, root, seeds, last_step)
  if rows:
    write_results(rows, root, header)
  return rows, failures


def main(argv):
  """The command line (module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; see --help")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  config = flags.FLAGS.config
  overrides = config_flags.get_override_values(flags.FLAGS["config"])
  root, seeds = flags.FLAGS.workdir, flags.FLAGS.seeds
  start = time.perf_counter()
  with cli.report():
    check_overrides(overrides)
    check_base(config)
    specs = select(grid(), flags.FLAGS.only)
    header = describe(config_flags.get_config_filename(flags.FLAGS["config"]), overrides, seeds)
    rows, failures = run_study(config, root, specs, seeds, header)
  if rows:
    print("\n" + markdown_table(rows, header))
    for name in ("suppression.md", "suppression.csv", "suppression.png"):
      print(epath.Path(root) / name)
  print(f"study wall time {time.perf_counter() - start:.0f} s")
  if failures:
    sys.exit(
        "runs that diverged (rerun with another lr or drop them with --only):\n  "
        + "\n  ".join(failures)
    )


def _define_flags() -> None:
  """The command's flags, defined only when it runs as a program (cl_jax.main also
  defines --config, and importing this module for its functions defines none)."""
  config_flags.DEFINE_config_file(
      "config",
      "configs/simclr.py",
      "SimCLR config file (fields override as " "--config.block.field=value).",
      lock_config=True,
  )
  flags.DEFINE_string(
      "workdir",
      "runs/suppression",
      "Root directory of the study: one " "subdirectory per run and seed, and the results.",
  )
  flags.DEFINE_integer("seeds", 1, "Seeds per run (config.seed + 0 .. seeds - 1).", lower_bound=1)
  flags.DEFINE_list(
      "only",
      None,
      "Comma-separated run names to train (default: the whole "
      "grid: " + ", ".join(s.name for s in grid()) + ").",
  )


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
