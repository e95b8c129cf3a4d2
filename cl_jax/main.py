"""Pretraining entry point, followed by the linear probe.

python -m cl_jax.main --config=configs/mocov2_patchns.py[:preset] [--workdir=DIR]

Without --workdir the run lives in ./runs/<config name>[_<preset>]. Starting
again in a workdir that holds a checkpoint resumes from it, provided the config
is the run's own (cl_jax.runtime.run_config; --allow_config_change accepts changes of
logging, checkpointing, probe, workers, length and learning rate). Ctrl-C lets
a pending checkpoint save finish and prints how to resume. The probe runs once
the run is finished (not after a --stop_at_step chunk).

Stopping: Ctrl-C, SIGTERM (a scheduler's preemption, scancel or time limit) and
the --stop_signal signal end the run at the end of its step with a checkpoint,
print one line with the resume command, and exit with status 128 + the signal's
number (130 Ctrl-C, 143 SIGTERM, 138 SIGUSR1), what a shell or scheduler reads as
"ended by that signal"; a requeued job resumes from that checkpoint. Outside the
training loop (start-up, the closing saves done, the probe) SIGTERM and the
--stop_signal signal end the process at once with one line and the same status:
every checkpoint that finished saving is intact (one process; in a multi-process
run JAX's preemption service keeps SIGTERM). A training loop that stops making progress
(train.stall_timeout_s, cl_jax.runtime.stall_watchdog) ends with one line and status 75.

Multi-host: every process runs the same command with --multihost. The
coordinator address, process count and process id are detected on Cloud TPU
VMs, under SLURM and Open MPI, or from JAX_COORDINATOR_ADDRESS; elsewhere give
them with --coordinator_address, --num_processes and --process_id (any of
these implies --multihost). The workdir must then be storage every host sees.
"""

import os
import shlex
import signal
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

import cl_jax
from cl_jax import train
from cl_jax.runtime import cli, distributed_startup, logs, process_exit, stop_requests
from cl_jax.runtime.errors import UsageError

_CONFIG = cli.define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default ./runs/<config>).")
_PROBE = flags.DEFINE_bool(
    "probe",
    None,
    "Run the linear probe after pretraining " "(default: the config's probe.after_pretrain).",
)
_STOP_AT = flags.DEFINE_integer(
    "stop_at_step",
    None,
    "Stop this invocation once the run has "
    "reached this step (with a checkpoint); run again to continue.",
    lower_bound=1,
)
_ALLOW_CHANGE = flags.DEFINE_bool(
    "allow_config_change",
    False,
    "On resume, accept changes of "
    "the fields in cl_jax.runtime.run_config.CHANGEABLE (logging, "
    "checkpoints, probe, workers, epochs, lr).",
)
_REINDEX = flags.DEFINE_bool(
    "reindex",
    False,
    "Resume over a folder of images (data.name folder) that changed since the run started: "
    "the run reads the folder as it is now (another data order).",
)
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Join a multi-process run " "(jax.distributed.initialize)."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0's coordinator (multi-host)."
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Processes in a multi-host run.", lower_bound=1
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's id in [0, " "num_processes) (multi-host).", lower_bound=0
)
_STARTUP_TIMEOUT = flags.DEFINE_integer(
    "startup_timeout",
    300,
    "Seconds a multi-host process " "waits for all processes to join.",
    lower_bound=1,
)
_STOP_SIGNAL = flags.DEFINE_string(
    "stop_signal",
    None,
    "A signal handled like SIGTERM besides it (e.g. USR1, for SLURM's "
    "--signal=USR1@120): stop at the end of the step with a checkpoint and exit "
    "with status 128 + its number.",
)
flags.mark_flag_as_required("config")


def default_workdir(config_arg: str) -> str:
  """./runs/<config file stem>[_<preset>] for --config=configs/<stem>.py[:<preset>]."""
  path, _, preset = config_arg.partition(":")
  stem = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", stem + (f"_{preset}" if preset else ""))


def _interrupted(e: stop_requests.Interrupted) -> str:
  command = shlex.join(["python", "-m", "cl_jax.main", *sys.argv[1:]])
  what = (
      "interrupted" if e.signum == signal.SIGINT else f"stopped by {signal.Signals(e.signum).name}"
  )
  return f"{what}: saved a checkpoint at step {e.step}. Resume with: {command}"


def _signal_number(name: str | None) -> int | None:
  """The number of signal `name` (USR1, SIGUSR1 or 10), None for None; UsageError otherwise."""
  if name is None:
    return None
  key = name.upper()
  try:
    if key.isdigit():
      return int(signal.Signals(int(key)))
    return int(signal.Signals[key if key.startswith("SIG") else "SIG" + key])
  except (KeyError, ValueError):
    raise UsageError(
        f"--stop_signal={name} is not a signal name; give one such as USR1 or SIGUSR2"
    ) from None


def _end_outside_training(signum, frame) -> None:
  """Signal handler outside the training loop: end at once with 128 + signum (no save is in
  flight there: the loop waits for its saves)."""
  del frame
  process_exit.end_now(
      f"stopped by {signal.Signals(signum).name} outside the training loop", 128 + signum
  )


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  # orbax's warning when a save waited for the previous one (a slow disk or a loaded machine)
  # is advice on the checkpoint cadence, not a fault, and would break a stop's one line.
  logs.drop("Waiting for previous save to complete took")
  if cl_jax.XLA_CPU_CHOICE:
    print(cl_jax.XLA_CPU_CHOICE, file=sys.stderr)
  explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  with cli.report(train.TrainingDiverged):
    stop_signal = _signal_number(_STOP_SIGNAL.value)
    if _MULTIHOST.value or any(v is not None for v in explicit):
      distributed_startup.initialize_distributed(*explicit, timeout_s=_STARTUP_TIMEOUT.value)
    else:  # the training loop handles them itself while it runs (cl_jax.runtime.stop_requests)
      for sig in [signal.SIGTERM] + ([stop_signal] if stop_signal else []):
        signal.signal(sig, _end_outside_training)
    config = _CONFIG.value
    workdir = _WORKDIR.value or default_workdir(
        config_flags.get_config_filename(flags.FLAGS["config"])
    )
    run_probe = config.probe.after_pretrain if _PROBE.value is None else _PROBE.value
    try:
      last, total = train.pretrain(
          config,
          workdir,
          stop_at_step=_STOP_AT.value,
          allow_config_change=_ALLOW_CHANGE.value,
          stop_signal=stop_signal,
          reindex=_REINDEX.value,
          probe=run_probe and jax.process_count() == 1,  # the probe this command runs at the end
      )
    except stop_requests.Interrupted as e:
      print(_interrupted(e), file=sys.stderr, flush=True)
      sys.exit(128 + e.signum)
  lead = jax.process_index() == 0
  if last < total:
    if lead:
      print(
          f"stopped at step {last} of {total} (--stop_at_step); run the same command "
          "again to continue. The probe runs when the run is finished."
      )
    return
  if run_probe and jax.process_count() > 1:
    if lead:
      print(
          f"pretraining done; the linear probe runs as its own single-host job: "
          f"python -m cl_jax.evaluate --workdir={workdir} --evaluator=linear_probe"
      )
    return
  if run_probe:
    from cl_jax import evaluate

    with cli.report():
      evaluate.print_reports(evaluate.registry.evaluate(workdir, ("linear_probe",)))


def run() -> None:
  """Entry point: Ctrl-C outside the training loop ends with one line, too."""
  try:
    app.run(main, flags_parser=cli.parse_flags)
  except KeyboardInterrupt:
    process_exit.end_now("interrupted", 130)


if __name__ == "__main__":
  run()
