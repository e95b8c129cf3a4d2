"""The evaluators by name (cl_jax.evaluators): the context they share, the runner that evaluates a
checkpoint and writes their reports, and the monitors of the training loop."""

import importlib
import json
import os
import time
from types import ModuleType
from typing import NamedTuple

import jax
import ml_collections
from etils import epath

from cl_jax.evaluators import NAMES, features
from cl_jax.models.encoder import head_layout
from cl_jax.runtime import checkpoint, metrics, run_config, write_faults
from cl_jax.runtime.errors import UsageError

# Options that change the config every evaluator reads (probe.features, probe.rotation).
CONFIG_OPTIONS = ("features", "rotation")


class EvalContext(NamedTuple):
  """What an evaluator needs about the run it evaluates.

  Attributes:
    workdir: the run directory (absolute unless a URL).
    step: the checkpoint's step.
    config: the run's config (with the features / rotation options applied).
    extractor: the run's feature Extractor (features.setup): the feature function, the mesh
      the features are computed on, the probe data, the initial variables.
    variables: the checkpoint's encoder variables {"params", "batch_stats"}.
    data_dir: the TFDS data directory datasets beyond the run's own are read from.
    options: the command's options (None-valued ones left out), see each evaluator's OPTIONS.
  """

  workdir: str
  step: int
  config: ml_collections.ConfigDict
  extractor: features.Extractor
  variables: dict
  data_dir: str
  options: dict


def get(name: str) -> ModuleType:
  """The module of evaluator `name`."""
  if name not in NAMES:
    raise UsageError(f"evaluator must be one of {', '.join(NAMES)}, got {name!r}")
  return importlib.import_module(f"cl_jax.evaluators.{name}")


def parse_names(text: str) -> tuple[str, ...]:
  """The evaluator names of NAME[,NAME...], each checked."""
  names = tuple(n.strip() for n in text.split(",") if n.strip())
  if not names:
    raise UsageError(f"--evaluator is required: one or more of {', '.join(NAMES)}")
  for name in names:
    get(name)
  return names


def _check_options(names: tuple[str, ...], options: dict) -> None:
  """UsageError for an option none of the evaluators `names` reads."""
  read = set(CONFIG_OPTIONS).union(*(get(n).OPTIONS for n in names))
  for option in options:
    if option not in read:
      owners = [n for n in NAMES if option in get(n).OPTIONS]
      raise UsageError(f"--{option} is an option of {', '.join(owners)}, not of {', '.join(names)}")


def _config(workdir: str, options: dict) -> ml_collections.ConfigDict:
  """The run's config with the features / rotation options applied."""
  config = run_config.read(workdir)
  if options.get("features") is not None:
    layout = head_layout(config)
    if options["features"] == "heads" and layout["heads"] == 1 and not layout["conv5_heads"]:
      raise UsageError(
          f"--features=heads needs a LooC run with extra or conv5 heads; {workdir} has one head"
      )
    config.probe.features = options["features"]
  if options.get("rotation") is not None:
    config.probe.rotation = options["rotation"]
  return config


def report_name(module: ModuleType, report: dict) -> str:
  """The evaluator's file name of `report` in the workdir (without .json)."""
  if hasattr(module, "report_name"):
    return module.report_name(report)
  return f"{module.TAG}_step{report['step']}"


def evaluate(
    workdir: str,
    names: tuple[str, ...],
    step: int | None = None,
    data_dir: str | None = None,
    **options,
) -> list[dict]:
  """Run the evaluators `names`, in order, on checkpoint `step` (default: the latest) of the run
  in `workdir`; the checkpoint is restored and the features set up once for all of them.

  Each report is written to workdir/<report_name>.json (its path under "path" on process 0)
  and its scalars join the run's metrics and TensorBoard at the checkpoint's step. `options`
  are the command's (None for a default), checked against the evaluators' OPTIONS.
  """
  options = {k: v for k, v in options.items() if v is not None}
  _check_options(names, options)
  config = _config(workdir, options)
  data_dir = data_dir or config.data.get("data_dir", "")
  for name in names:
    write_faults.check_writable(workdir, f"the {get(name).TAG.removeprefix('eval_')} report")
  extractor = features.setup(config)
  step, variables = checkpoint.restore_encoder(workdir, extractor.init_variables, step)
  where = workdir if "://" in workdir else os.path.abspath(workdir)
  ctx = EvalContext(where, step, config, extractor, variables, data_dir, options)
  reports = []
  for name in names:
    module = get(name)
    report = {"workdir": where, "step": step, "evaluator": name, **module.run(ctx)}
    if jax.process_index() == 0:
      path = epath.Path(workdir) / f"{report_name(module, report)}.json"
      metrics.write_atomically(path, json.dumps(report, indent=2))
      metrics.append_row(workdir, step, module.scalars(report), module.TAG)
      report["path"] = str(path)
    reports.append(report)
  return reports


def table(report: dict) -> str:
  """The report of `evaluate` as text."""
  return get(report["evaluator"]).table(report)


class Monitors:
  """The evaluators config.eval.evaluators run during pretraining every config.eval.every steps
  and at the last step (none when eval.every is 0). Every process evaluates the whole split on
  its own devices; the caller logs process 0's numbers."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.every = config.eval.every
    # config_check has checked the names against MONITORS.
    self.modules = [get(name) for name in config.eval.evaluators] if self.every else []
    self.extractor = features.setup(config, jax.local_devices()) if self.modules else None
    for module in self.modules:
      module.check_monitor(self.extractor, config)

  def due(self, step: int, end: int) -> bool:
    """Whether the monitors run after `step` of a run (or call) ending at step `end`."""
    return bool(self.modules) and (step % self.every == 0 or step == end)

  def __call__(self, params, batch_stats) -> dict[str, float]:
    """Every monitor's metrics of the online encoder's `params` and `batch_stats` (replicated
    arrays of the training mesh), with <TAG>/seconds: each one's wall time."""
    variables = features.on_local_devices(
        {"params": params, "batch_stats": batch_stats}, self.extractor
    )
    out = {}
    for module in self.modules:
      start = time.perf_counter()
      out.update(module.monitor(self.extractor, variables, self.config))
      out[f"{module.TAG}/seconds"] = time.perf_counter() - start
    return out
