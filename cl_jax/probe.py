"""The linear-probe job: a separate process reading a pretraining workdir.

python -m cl_jax.probe --workdir=runs/mocov2_patchns [--step=N] [--protocol=fast|paper]
"""
import sys

from absl import app, flags, logging

from cl_jax import config_check, linear_probe

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding checkpoints/.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
_PROTOCOL = flags.DEFINE_enum("protocol", None, list(config_check.PROBE_PROTOCOLS),
                              "Probe protocol (default: the run config's probe.protocol).")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if not _WORKDIR.value:
    sys.exit("error: --workdir is required")
  try:
    linear_probe.print_report(linear_probe.run(_WORKDIR.value, _STEP.value, _PROTOCOL.value))
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main)
