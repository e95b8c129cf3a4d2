"""Pretraining entry point, followed by the linear probe.

python -m cl_jax.main --config=configs/mocov2_patchns.py[:preset] [--workdir=DIR]

Without --workdir the run lives in ./runs/<config name>[_<preset>]. Starting
again in a workdir that holds a checkpoint resumes from it.
"""
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from cl_jax import config_check, train

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with a preset: configs/NAME.py[:preset].",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default ./runs/<config>).")
_PROBE = flags.DEFINE_bool("probe", None, "Run the linear probe after pretraining "
                           "(default: the config's probe.after_pretrain).")
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
  config = _CONFIG.value
  workdir = _WORKDIR.value or default_workdir(config_flags.get_config_filename(flags.FLAGS["config"]))
  try:
    train.pretrain(config, workdir)   # validates the config before anything else
  except (config_check.ConfigError, train.TrainingDiverged, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  run_probe = config.probe.after_pretrain if _PROBE.value is None else _PROBE.value
  if run_probe:
    from cl_jax import linear_probe
    linear_probe.print_report(linear_probe.run(workdir))


if __name__ == "__main__":
  app.run(main)
