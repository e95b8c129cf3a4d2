"""Pretraining entry point, followed by the linear probe.

python -m cl_jax.main --config=configs/mocov2_patchns.py[:preset] [--workdir=DIR]

Without --workdir the run lives in ./runs/<config name>[_<preset>]. Starting
again in a workdir that holds a checkpoint resumes from it.

Multi-host: every process runs the same command with --multihost. The
coordinator address, process count and process id are detected on Cloud TPU
VMs, under SLURM and Open MPI, or from JAX_COORDINATOR_ADDRESS; elsewhere give
them with --coordinator_address, --num_processes and --process_id (any of
these implies --multihost). The workdir must then be storage every host sees.
"""
import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from cl_jax import config_check, parallel, train

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with a preset: configs/NAME.py[:preset].",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default ./runs/<config>).")
_PROBE = flags.DEFINE_bool("probe", None, "Run the linear probe after pretraining "
                           "(default: the config's probe.after_pretrain).")
_STOP_AT = flags.DEFINE_integer("stop_at_step", None, "Stop this invocation once the run has "
                                "reached this step (with a checkpoint); run again to continue.",
                                lower_bound=1)
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Join a multi-process run "
                               "(jax.distributed.initialize).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0's coordinator (multi-host).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-host run.",
                                      lower_bound=1)
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's id in [0, "
                                   "num_processes) (multi-host).", lower_bound=0)
flags.mark_flag_as_required("config")


def default_workdir(config_arg: str) -> str:
  """./runs/<config file stem>[_<preset>] for --config=configs/<stem>.py[:<preset>]."""
  path, _, preset = config_arg.partition(":")
  stem = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", stem + (f"_{preset}" if preset else ""))


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # orbax logs every save at INFO
  explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if _MULTIHOST.value or any(v is not None for v in explicit):
    parallel.initialize_distributed(*explicit)
  config = _CONFIG.value
  workdir = _WORKDIR.value or default_workdir(config_flags.get_config_filename(flags.FLAGS["config"]))
  try:
    # pretrain validates the config before anything else.
    train.pretrain(config, workdir, stop_at_step=_STOP_AT.value)
  except (config_check.ConfigError, train.TrainingDiverged, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  run_probe = config.probe.after_pretrain if _PROBE.value is None else _PROBE.value
  if run_probe and jax.process_count() > 1:
    if jax.process_index() == 0:
      print(f"pretraining done; the linear probe runs as its own single-host job: "
            f"python -m cl_jax.probe --workdir={workdir}")
    return
  if run_probe:
    from cl_jax import linear_probe
    linear_probe.print_report(linear_probe.run(workdir))


if __name__ == "__main__":
  app.run(main)
