"""Weights & Biases as an optional tracker beside TensorBoard and metrics.jsonl.

`--config.log.wandb=true` sends the run's config and every row the run writes to metrics.jsonl
(the trainer's rows, cl_jax.runtime.metrics.MetricWriter, and the evaluation jobs' rows,
metrics.append_row: the linear probe's and the evaluators' numbers) to one W&B run in
`log.wandb_project` (and `log.wandb_entity`, "" for your default). The run's id is kept in the
run directory (`wandb_run_id`), so a resumed run, and an evaluation job run later on the same
directory, continue the same W&B run; W&B's own files go to <workdir>/wandb. W&B's environment
variables apply as usual (WANDB_MODE=offline keeps everything local, to upload later with
`wandb sync <workdir>/wandb/offline-run-*`). wandb is an optional extra (`pip install wandb`);
without it, log.wandb=true stops the run at start with one line saying how to install it.
"""

import os
import secrets

import ml_collections

from cl_jax.runtime import run_config
from cl_jax.runtime.errors import UsageError

RUN_ID_FILE = "wandb_run_id"


def _wandb():
  """The wandb module, or UsageError naming how to install it."""
  try:
    import wandb
  except ImportError as e:
    raise UsageError(
        "log.wandb=true needs the wandb package: pip install wandb (or pip install -e '.[wandb]'), "
        "or set --config.log.wandb=false"
    ) from e
  return wandb


def check_available(config: ml_collections.ConfigDict) -> None:
  """UsageError at start when the config asks for W&B and wandb is not installed."""
  if config.log.wandb:
    _wandb()


def _run_id(workdir: str, create: bool) -> str | None:
  """The W&B run id kept in `workdir` (a new one written there when `create`)."""
  path = os.path.join(workdir, RUN_ID_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return f.read().strip()
  if not create:
    return None
  _wandb()
  run_id = secrets.token_hex(6)  # W&B run ids: letters and digits
  with open(path + ".tmp", "w") as f:
    f.write(run_id + "\n")
  os.replace(path + ".tmp", path)
  return run_id


def _start(workdir: str, run_id: str, project: str, entity: str, config: dict | None):
  wandb = _wandb()
  return wandb.init(
      project=project,
      entity=entity or None,
      id=run_id,
      resume="allow",
      dir=workdir,
      name=os.path.basename(os.path.abspath(workdir)),
      config=config,
      settings=wandb.Settings(silent=True, console="off"),
  )


class Tracker:
  """One process's connection to the run's W&B run: `write(step, scalars)` logs a row,
  `close()` finishes it. Opened by the trainer (MetricWriter.track) for a run whose config has
  log.wandb; `workdir` must be a local directory."""

  def __init__(self, workdir: str, config: ml_collections.ConfigDict):
    if "://" in workdir:
      raise UsageError(
          f"log.wandb keeps its run id and files in the run directory, which must be local; "
          f"--workdir={workdir} is a URL"
      )
    os.makedirs(workdir, exist_ok=True)
    self._run = _start(
        workdir,
        _run_id(workdir, create=True),
        config.log.wandb_project,
        config.log.wandb_entity,
        run_config.flatten(config),
    )

  def write(self, step: int, scalars: dict[str, float]) -> None:
    self._run.log(dict(scalars), step=step)

  def close(self) -> None:
    self._run.finish()


def log_row(workdir: str, step: int, scalars: dict[str, float]) -> None:
  """An evaluation job's row in the run's W&B run, when the run tracks to W&B (its directory
  holds a run id); nothing otherwise."""
  if "://" in workdir or _run_id(workdir, create=False) is None:
    return
  config = run_config.read(workdir)
  run = _start(
      workdir,
      _run_id(workdir, create=False),
      config.log.wandb_project,
      config.log.wandb_entity,
      None,
  )
  run.log(dict(scalars), step=step)
  run.finish()
