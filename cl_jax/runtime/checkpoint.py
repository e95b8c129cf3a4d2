"""orbax checkpoints: the train state, the input iterator's position and run metadata.

Saves are asynchronous and atomic (orbax writes to a temporary directory and
renames it when complete), so a run killed mid-save leaves the previous
checkpoint as the latest one. Every process takes part: each writes the array
shards it owns and its own iterator position (grain's checkpoint handler, one
file per process); `meta` (written once) records the queue layout, so a run can
resume on a different number of devices, and the parameter norms the divergence
check compares.

A checkpoint that cannot be read (a truncated array file, a missing metadata or
input-position file, an empty step folder) is skipped on resume: `restore_intact`
falls back to the newest one that restores, and `set_aside` moves the damaged
ones out of the way (never deleting them).
"""

import contextlib
import dataclasses
import logging as std_logging
import os
import re
import sys
import warnings

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from cl_jax.runtime import logs, workdir_lock, write_faults
from cl_jax.runtime.errors import UsageError

DAMAGED_DIR = "checkpoints_damaged"


def directory(workdir: str) -> epath.Path:
  """The checkpoints folder of `workdir` (absolute, or a URL)."""
  root = str(workdir)
  return epath.Path(root if "://" in root else os.path.abspath(root)) / "checkpoints"


def make_manager(workdir: str, keep: int = 2, *, read_only: bool = False) -> ocp.CheckpointManager:
  """Manager of `workdir`/checkpoints keeping the `keep` most recent steps.

  `workdir` may be a local path or a gs:// URL. A read-only manager changes
  nothing on disk (a writable one creates the folder and removes the
  temporary folders of unfinished saves).
  """
  if read_only:
    options = ocp.CheckpointManagerOptions(
        read_only=True,
        create=False,
        max_to_keep=None,
        save_interval_steps=0,
        cleanup_tmp_directories=False,
    )
  else:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, cleanup_tmp_directories=True)
  with logs.quiet():
    return ocp.CheckpointManager(
        directory(workdir), options=options, item_names=("state", "data", "meta")
    )


def steps_on_disk(workdir: str) -> list[int]:
  """Steps of the finished checkpoint folders in `workdir`/checkpoints (read without orbax)."""
  folder = directory(workdir)
  if not folder.exists():
    return []
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def save(manager: ocp.CheckpointManager, state, data_iterator, meta: dict) -> None:
  """Start saving `state`, the iterator's position and the JSON-able `meta` at state.step."""
  manager.save(
      int(state.step),
      args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=grain.checkpoint.CheckpointSave(data_iterator),
          meta=ocp.args.JsonSave(meta),
      ),
  )


def _existing_step(manager: ocp.CheckpointManager, step: int | None) -> int | None:
  """`step`, or the latest step if None (None if there is no checkpoint); UsageError for a
  step that was not saved."""
  step = manager.latest_step() if step is None else step
  if step is not None and step not in manager.all_steps():
    raise UsageError(
        f"no checkpoint at step {step} in {manager.directory}; "
        f"available steps: {sorted(manager.all_steps())}"
    )
  return step


def restore(manager: ocp.CheckpointManager, template, step: int | None = None, data_iterator=None):
  """(state, meta) of `step` (default: the latest), or None if there is none.

  Args:
    template: the state's abstract shape (jax.eval_shape of its constructor)
      with the shardings to restore into.
    data_iterator: a grain iterator to move to the saved position (in place),
      or None to leave the input position alone (e.g. for a probe).
  """
  step = _existing_step(manager, step)
  if step is None:
    return None
  items = {"state": ocp.args.StandardRestore(template), "meta": ocp.args.JsonRestore()}
  if data_iterator is not None:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
  out = manager.restore(step, args=ocp.args.Composite(**items))
  return out["state"], out["meta"]


def restore_variables(manager: ocp.CheckpointManager, template: dict, step: int | None = None):
  """(step, {"params", "batch_stats"}) of the online encoder in checkpoint `step` (default:
  the latest), or None if there is none. Only those arrays are read, not the optimizer
  state, the EMA target or the queue.

  Args:
    template: {"params", "batch_stats"} abstract arrays (shape, dtype, sharding).
  """
  step = _existing_step(manager, step)
  if step is None:
    return None
  item = {**template, "step": jax.ShapeDtypeStruct((), np.int32, sharding=_sharding(template))}
  args = ocp.args.PyTreeRestore(
      item=item,
      restore_args=ocp.checkpoint_utils.construct_restore_args(item),
      partial_restore=True,
  )
  state = manager.restore(step, args=ocp.args.Composite(state=args))["state"]
  return int(state["step"]), {"params": state["params"], "batch_stats": state["batch_stats"]}


def restore_encoder(workdir: str, init_variables, step: int | None = None) -> tuple[int, dict]:
  """(step, {"params", "batch_stats"}) of the online encoder in checkpoint `step` (default: the
  latest) of the run in `workdir`, laid out as `init_variables()` returns them (only its
  jax.eval_shape is taken); UsageError when the run has no checkpoint."""
  workdir_lock.note_if_training(workdir, step)
  manager = make_manager(workdir, read_only=True)
  restored = restore_variables(manager, jax.eval_shape(init_variables), step)
  if restored is None:
    raise UsageError(
        f"no checkpoint in {workdir}/checkpoints: pretrain first "
        f"(python -m cl_jax.main --workdir={workdir} ...)"
    )
  return restored


def _sharding(tree):
  """The sharding of the first leaf of `tree`."""
  return jax.tree.leaves(tree)[0].sharding


@dataclasses.dataclass
class Restored:
  """A checkpoint read back: its state, meta and the input iterator at its position."""

  state: object
  meta: dict
  data_iterator: object


def _all_processes(ok: bool) -> bool:
  """Whether `ok` holds on every process (so that all of them pick the same checkpoint)."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils

  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def _quiet_aborted_reads(unraisable) -> None:
  """sys.unraisablehook that drops what the reads of an aborted orbax restore leave
  behind (one "Event loop is closed" error or unretrieved read error per pending
  array; restore_intact reports the failure itself), and reports the rest."""
  code = getattr(unraisable.object, "cr_code", None)
  from_orbax = code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
  closed = isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(
      unraisable.exc_value
  )
  if not (closed or from_orbax):
    sys.__unraisablehook__(unraisable)


def _drop_aborted_read_logs(record) -> bool:
  """Log filter: False (drop) for the error logs of the reads an aborted orbax restore
  leaves behind (orbax's own, and asyncio's "Task exception was never retrieved" for its
  read tasks), which may arrive after restore_intact has reported the checkpoint."""
  orbax = f"{os.sep}orbax{os.sep}"
  return not (
      record.levelno >= std_logging.ERROR
      and (orbax in record.pathname or orbax in record.getMessage())
  )


_ABORTED_READ_LOGGERS = ("absl", "asyncio")


@contextlib.contextmanager
def quiet_failed_saves():
  """Inside, the error logs and unraisable-exception reports that a failed asynchronous
  save leaves behind (orbax's writer threads, their asyncio tasks) are dropped: the
  failure itself reaches the caller from save() or wait_until_finished(), which
  report it once. When the block raises, the filters stay for the rest of the process
  (the failed writes' tasks report when they are collected, up to exit), joined by one for
  the RuntimeWarning of the write coroutines an aborted save never started (cl_jax itself
  has no coroutines)."""
  hook = sys.unraisablehook
  loggers = [std_logging.getLogger(name) for name in _ABORTED_READ_LOGGERS]
  for logger in loggers:
    logger.addFilter(_drop_failed_save_logs)
  sys.unraisablehook = _quiet_aborted_reads
  try:
    yield
  except BaseException:  # the filters stay: the failed writes report on until exit
    warnings.filterwarnings(
        "ignore", message=r"coroutine '.*' was never awaited", category=RuntimeWarning
    )
    raise
  sys.unraisablehook = hook
  for logger in loggers:
    logger.removeFilter(_drop_failed_save_logs)


def _drop_failed_save_logs(record) -> bool:
  """Log filter: False (drop) for orbax's error logs and for the error logs that word a
  write fault (asyncio's "Future exception was never retrieved" of a failed write)."""
  return _drop_aborted_read_logs(record) and not (
      record.levelno >= std_logging.ERROR
      and write_faults.reason_in_text(record.getMessage()) is not None
  )


def restore_intact(
    manager: ocp.CheckpointManager, template, make_iterator
) -> tuple[Restored | None, list[tuple[int, str]]]:
  """(the newest checkpoint that reads back whole or None, [(step, reason)] of the
  newer ones that could not be read).

  Args:
    template: the state's abstract shape with its shardings.
    make_iterator: () -> a fresh grain iterator at the start of the data; the
      Restored holds one moved to the checkpoint's position.
  """
  damaged = []
  hook = sys.unraisablehook
  loggers = [std_logging.getLogger(name) for name in _ABORTED_READ_LOGGERS]
  for logger in loggers:
    logger.addFilter(_drop_aborted_read_logs)
  for step in sorted(manager.all_steps(), reverse=True):
    iterator = make_iterator()
    sys.unraisablehook = _quiet_aborted_reads
    try:
      with logs.quiet():
        state, meta = restore(manager, template, step, data_iterator=iterator)
      error = None
    except Exception as e:  # any failure to read means this checkpoint is not usable
      first = str(e).splitlines()[0] if str(e) else ""
      error = f"{type(e).__name__}: {first.split('. See full')[0][:200]}"
    if _all_processes(error is None):
      if not damaged:  # nothing failed: no aborted reads to silence
        sys.unraisablehook = hook
        for logger in loggers:
          logger.removeFilter(_drop_aborted_read_logs)
      return Restored(state, meta, iterator), damaged
    damaged.append((step, error or "unreadable on another process"))
  return None, damaged


def remove_unfinished(workdir: str) -> list[str]:
  """Delete the temporary folders of saves that never finished (orbax's
  <step>.orbax-checkpoint-tmp*) from `workdir`/checkpoints; their paths."""
  folder = directory(workdir)
  if not folder.exists():
    return []
  removed = []
  for path in folder.iterdir():
    if ".orbax-checkpoint-tmp" in path.name:
      path.rmtree()
      removed.append(str(path))
  return removed


def set_aside(workdir: str, step: int) -> str:
  """Move the checkpoint folder of `step` to `workdir`/checkpoints_damaged/<step>[.n]
  (kept for inspection, out of the way of the steps the run saves next); its new path."""
  source = directory(workdir) / str(step)
  target_dir = directory(workdir).parent / DAMAGED_DIR
  target_dir.mkdir(parents=True, exist_ok=True)
  target, n = target_dir / str(step), 1
  while target.exists():
    target, n = target_dir / f"{step}.{n}", n + 1
  source.rename(target)
  return str(target)


def after_write_fault(workdir: str) -> str:
  """Remove the unfinished save a write fault left and say what the run can resume from."""
  remove_unfinished(workdir)
  steps = steps_on_disk(workdir)
  kept = (
      f"The last intact checkpoint is step {steps[-1]}; it and the logs are as they were"
      if steps
      else "No checkpoint was saved"
  )
  return f"{kept}: free space or fix the permissions, then run the same command to resume"


def named_in_error(e: BaseException) -> str:
  """'checkpoint N' for the save whose folder an orbax error names, else 'a checkpoint'."""
  found = re.search(r"checkpoints/(\d+)\.orbax-checkpoint-tmp", str(e))
  return f"checkpoint {found.group(1)}" if found else "a checkpoint"
