"""The pretraining loop: data -> jitted train step -> metrics and checkpoints.

A start (cl_jax.runtime.run_config) first compares the config with the one a resumed run
was started with, then opens the data and restores the newest intact checkpoint
(cl_jax.runtime.checkpoint), and only then writes the config and prints the start-up
summary (cl_jax.runtime.run_summary). The step runs without host synchronisation; the host
reads metrics back only every `train.log_every` steps and before each
checkpoint, where a diverged state (non-finite, or a parameter norm beyond
`train.max_param_growth` times its initial value) stops the run before anything
is saved, so the last checkpoint is always one to resume from. Between logging
steps a lean variant of the step runs, without the statistics nobody reads
(score statistics, health signals, gradient norms). At each logging
step the embeddings' health signals (cl_jax.analysis.collapse) are checked against the
`health` thresholds: a collapse is reported on the console and in
workdir/warnings.log, and logged as the scalar health/collapsed. A stop request
(the first Ctrl-C, SIGTERM, or a chosen extra signal such as SIGUSR1) stops the
run at the end of its step with a checkpoint and raises Interrupted; in a
multi-process run all processes stop at the same step (JAX's preemption sync
point), whichever of them was signalled. The run holds the workdir's writer
lock (cl_jax.runtime.workdir_lock) from before its first write to its end.
"""

import contextlib
import functools
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from etils import epath

from cl_jax import config_check, optim
from cl_jax import memory_queue as queue_lib
from cl_jax import train_step as step_lib
from cl_jax.analysis import collapse as health
from cl_jax.data import pipeline, sources, texture_source
from cl_jax.evaluators.registry import Monitors
from cl_jax.models.encoder import Encoder, encoder_for, head_layout
from cl_jax.runtime import checkpoint, logs, parallel, run_config, workdir_lock, write_faults
from cl_jax.runtime import run_summary as summary
from cl_jax.runtime.errors import UsageError
from cl_jax.runtime.metrics import MetricWriter
from cl_jax.runtime.progress import Progress
from cl_jax.state import TrainState, init_state


class TrainingDiverged(RuntimeError):
  """The loss or the state became non-finite, or the parameters grew out of range."""


class Interrupted(KeyboardInterrupt):
  """A stop request ended the run after step `step`, saved as a checkpoint; `signum` is the
  signal that asked for it (SIGINT for Ctrl-C, SIGTERM or the extra preemption signal).
  A KeyboardInterrupt, so callers that do not report it still stop as on Ctrl-C."""

  def __init__(self, step: int, signum: int = signal.SIGINT):
    super().__init__(step)
    self.step = step
    self.signum = signum


def _multiprocess() -> bool:
  """Whether this process is one of several joined by jax.distributed."""
  return jax.process_count() > 1


@contextlib.contextmanager
def _stop_requests(extra_signal: int | None = None):
  """Inside, a stop request only records its signal in the yielded list; the loop then
  stops at the end of its step with a checkpoint (see _stop_due).

  SIGINT (Ctrl-C): the first is recorded, a second raises KeyboardInterrupt. SIGTERM
  (what schedulers send first on preemption, scancel, a time limit) and
  `extra_signal` (e.g. SIGUSR1 for SLURM's --signal): recorded, repeats ignored.
  In a multi-process run SIGTERM belongs to JAX's preemption service, which agrees
  on one step for all processes whichever was signalled; SIGINT and `extra_signal`
  are handed to it as SIGTERM. Outside the main thread, where handlers cannot be
  set, signals are left alone.
  """
  requested = []
  if threading.current_thread() is not threading.main_thread():
    yield requested
    return

  def handler(signum, frame):
    del frame
    if signum == signal.SIGINT and signal.SIGINT in requested:
      raise KeyboardInterrupt
    if signum not in requested:
      requested.append(signum)
      if _multiprocess():
        os.kill(os.getpid(), signal.SIGTERM)  # to JAX's preemption notifier

  if _multiprocess():
    logs.drop("Reached preemption sync point")  # orbax's note; the stop line says it
  handled = [signal.SIGINT] + ([] if _multiprocess() else [signal.SIGTERM])
  if extra_signal is not None and extra_signal not in handled:
    handled.append(extra_signal)
  previous = {s: signal.signal(s, handler) for s in handled}
  try:
    yield requested
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def _stop_due(requested: list[int], step: int) -> int | None:
  """The signal to stop for after `step`, or None to go on. One process stops at its next
  step end; in a multi-process run every process stops at the step JAX's preemption
  service agreed on (it must be asked at every step), answering SIGTERM for the
  processes that were not signalled themselves."""
  if not _multiprocess():
    return requested[0] if requested else None
  from jax.experimental import multihost_utils

  if multihost_utils.reached_preemption_sync_point(step):
    return requested[0] if requested else signal.SIGTERM
  return None


def pretrain_data(
    config, source, process_index: int = 0, process_count: int = 1, texture: bool = False
):
  """pipeline.pretrain_dataset of `source` with `config`'s batch, image size, crop scale,
  seed and views (step_lib.num_views): this process's rows of every global batch."""
  return pipeline.pretrain_dataset(
      source,
      batch_size=config.optim.batch_size,
      image_size=config.data.image_size,
      crop_scale=tuple(config.data.crop_scale),
      seed=config.seed,
      process_index=process_index,
      process_count=process_count,
      num_views=step_lib.num_views(config),
      texture=texture,
  )


def steps_per_epoch(num_records: int, batch_size: int) -> int:
  """Full global batches per pass over the pretraining source."""
  if num_records < batch_size:
    raise UsageError(
        f"the pretraining set has {num_records} images, fewer than one global "
        f"batch (optim.batch_size = {batch_size})"
    )
  return num_records // batch_size


@jax.jit
def _state_check(loss, state) -> tuple[jax.Array, jax.Array]:
  """(every value of loss, params, EMA target and queue finite; global l2 norm of params)."""
  tree = (loss, state.params, state.target_params, state.queue)
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
  return finite, optax.global_norm(state.params)


def check_workdir(workdir: str) -> None:
  """UsageError if `workdir` names an existing file (it must be a directory or not exist)."""
  path = epath.Path(workdir)
  if path.exists() and not path.is_dir():
    raise UsageError(f"--workdir={workdir} is a file; give a directory (new or holding a run)")


def resume_changes(
    config: ml_collections.ConfigDict, workdir: str, allow_change: bool
) -> list[str]:
  """The accepted config changes if `workdir` holds checkpoints (none for a new run);
  raises ConfigChangeError (before anything is written) for a refused change."""
  steps = checkpoint.steps_on_disk(workdir)
  if not steps:
    return []
  if not (epath.Path(workdir) / "config.json").exists():
    raise UsageError(
        f"{workdir} holds checkpoints (steps {steps}) but no config.json to "
        "check the config against; restore it or use another --workdir"
    )
  return run_config.check_resume(
      run_config.read(workdir), config, step=steps[-1], workdir=workdir, allow_change=allow_change
  )


class Built(NamedTuple):
  """The parts of a run on a mesh (train.build).

  make_state() -> the initial TrainState, laid out with
  cl_jax.runtime.parallel.state_sharding (queue rows over `data`); jax.eval_shape(make_state)
  is its abstract shape, a template for restoring a checkpoint.
  """

  encoder: Encoder
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  make_state: Callable[[], TrainState]
  total_steps: int


def build(config: ml_collections.ConfigDict, num_records: int, mesh) -> Built:
  """The encoder, optimizer, lr schedule, state constructor and length of a run of
  `config` over `num_records` pretraining images on `mesh`."""
  spe = steps_per_epoch(num_records, config.optim.batch_size)
  schedule = optim.lr_schedule(config.optim, spe)
  tx = optim.make_optimizer(config.optim, schedule)
  encoder = encoder_for(config)
  moco = config.method == "moco"
  init = functools.partial(
      init_state,
      config.seed,
      encoder,
      tx,
      image_size=config.data.image_size,
      queue_size=config.moco.queue_size if moco else 0,
      embed_dim=config.model.head_out_dim,
      queue_shards=mesh.shape[parallel.DATA_AXIS],
      keys_per_step=step_lib.keys_per_step(config),
      target=config.method in ("moco", "byol"),
      queue_heads=head_layout(config)["heads"] if config.looc.enabled else None,
  )
  make_state = jax.jit(init, out_shardings=parallel.state_sharding(jax.eval_shape(init), mesh))
  return Built(encoder, tx, schedule, make_state, config.optim.epochs * spe)


def relayout_queue(state, meta: dict, mesh, keys: int):
  """`state` with its queue moved from the checkpoint's layout (meta["queue_shards"]
  shards) to the layout of `mesh` (cl_jax.memory_queue), so a run resumes exactly on a
  different number of devices."""
  old, new = meta["queue_shards"], mesh.shape[parallel.DATA_AXIS]
  if state.queue is None:
    return state
  if meta["keys_per_step"] != keys:
    raise UsageError(
        f"the checkpoint's queue holds {meta['keys_per_step']} keys per step but "
        f"this config enqueues {keys}; resume with the run's own batch size"
    )
  if old == new:
    return state
  move = jax.jit(
      lambda q: queue_lib.to_sharded_layout(queue_lib.to_ring_order(q, old, keys), new, keys),
      out_shardings=parallel.batch_sharding(mesh),
  )
  return state.replace(queue=move(state.queue))


def pretrain(
    config: ml_collections.ConfigDict,
    workdir: str,
    stop_at_step: int | None = None,
    allow_config_change: bool = False,
    stop_signal: int | None = None,
) -> tuple[int, int]:
  """Pretrain (or resume) in `workdir`; returns (last step taken, total steps).

  With `stop_at_step`, this call stops (with a checkpoint) once the run has
  reached that step; calling again continues the same run (a step the run has
  already reached is a UsageError). A resume with a changed config is refused
  unless every change is in run_config.CHANGEABLE and `allow_config_change` is
  set. The run holds the workdir's writer lock (cl_jax.runtime.workdir_lock) throughout.
  A stop request (Ctrl-C, SIGTERM, `stop_signal`) ends it at the end of its step
  with a checkpoint and raises Interrupted.
  """
  check_workdir(workdir)
  taken_over = []
  with write_faults.guard("the writer lock", workdir):  # e.g. a read-only workdir
    with workdir_lock.hold(workdir, warn=taken_over.append):
      with write_faults.guard("the run's files", workdir, lambda: after_write_fault(workdir)):
        return _pretrain(
            config, workdir, stop_at_step, allow_config_change, stop_signal, taken_over
        )


def after_write_fault(workdir: str) -> str:
  """Remove the unfinished save a write fault left and say what the run can resume from."""
  checkpoint.remove_unfinished(workdir)
  steps = checkpoint.steps_on_disk(workdir)
  kept = (
      f"The last intact checkpoint is step {steps[-1]}; it and the logs are as they were"
      if steps
      else "No checkpoint was saved"
  )
  return f"{kept}: free space or fix the permissions, then run the same command to resume"


def _checkpoint_named(e: BaseException) -> str:
  """'checkpoint N' for the save whose folder an orbax error names, else 'a checkpoint'."""
  found = re.search(r"checkpoints/(\d+)\.orbax-checkpoint-tmp", str(e))
  return f"checkpoint {found.group(1)}" if found else "a checkpoint"


def _raise_thread_fault(faults: list, workdir: str) -> None:
  """Raise the first write fault that ended a background writer thread (TensorBoard's
  event writer is the only one the loop does not wait on) as a WriteFault."""
  if faults:
    with write_faults.guard("the TensorBoard events", f"{workdir}/tb"):
      raise faults[0]


def _close_all(closers, failing: bool) -> None:
  """Call every closer in order. When the run is already failing, their own errors are
  dropped (the first failure is the one to report); otherwise the first is raised once
  all have run."""
  first = None
  for close in closers:
    try:
      close()
    except Exception as e:
      first = first or e
  if first is not None and not failing:
    raise first


def _pretrain(config, workdir, stop_at_step, allow_config_change, stop_signal, lock_notes):
  """pretrain's body, run while holding the writer lock; `lock_notes` are the lock's
  warnings, reported once the run's log is open."""
  mesh = parallel.make_mesh()
  config_check.validate(config, num_devices=mesh.devices.size)
  changes = resume_changes(config, workdir, allow_config_change)
  lead = jax.process_index() == 0
  source = sources.open_source(config.data, "pretrain")
  texture = config.nonsemantic.enabled and config.nonsemantic.kind == "texture"
  if texture:
    source = texture_source.TextureSource(
        source, config.data.texture_dir, dataset=config.data.name, split="train"
    )
  spe = steps_per_epoch(len(source), config.optim.batch_size)
  encoder, tx, schedule, make_state, total = build(config, len(source), mesh)
  end = total if stop_at_step is None else min(total, stop_at_step)
  keys = step_lib.keys_per_step(config)
  data = pretrain_data(config, source, jax.process_index(), jax.process_count(), texture)
  make_iterator = functools.partial(pipeline.make_iterator, data, config.data.workers)
  state, it, norm0, damaged = _restore_or_init(workdir, make_state, make_iterator, mesh, keys)
  start = int(state.step)
  if stop_at_step is not None and stop_at_step <= start:
    it.close()
    raise UsageError(
        f"--stop_at_step={stop_at_step} is at or below the step this run has reached "
        f"({start} of {total}): nothing to do; give a later step to continue"
    )
  progress = Progress(total, start, enabled=lead)
  for line in lock_notes:
    report_warning(line, workdir, progress)
  for step, reason, path in damaged:
    report_warning(
        f"checkpoint {step} in {workdir} cannot be read ({reason}); moved to {path} "
        "(not deleted); resuming from the newest intact checkpoint"
        + (f" (step {start})" if start else ": none, starting from step 0"),
        workdir,
        progress,
    )
  manager = checkpoint.make_manager(workdir, config.train.keep_checkpoints)
  if lead:
    run_config.save_start(config, workdir, start)
  writer = MetricWriter(workdir, start_step=start)
  writer.write_text("config", f"```\n{config.to_json(indent=2)}\n```", start)
  progress.write(
      summary.startup(
          config,
          workdir=workdir,
          mesh=mesh,
          start=start,
          steps_per_epoch=spe,
          total=total,
          params=state.params,
          pretrain_size=len(source),
          changes=changes,
      )
  )
  # The full step (with its statistics) on logging steps, the lean one between them.
  train_steps = {
      logs: step_lib.jit_on_mesh(
          step_lib.make_train_step(config, encoder, tx, schedule, mesh, spe, logs), state, mesh
      )
      for logs in (True, False)
  }
  meta = {
      "queue_shards": mesh.shape[parallel.DATA_AXIS],
      "keys_per_step": keys,
      "param_norm_init": norm0,
  }
  monitors = Monitors(config)
  done = start
  stop = None
  # it.close() stops the input workers and frees their shared memory.
  closers = (progress.close, writer.close, manager.wait_until_finished, it.close)
  with (
      _stop_requests(stop_signal) as requested,
      checkpoint.quiet_failed_saves(),
      write_faults.in_threads() as thread_faults,
  ):
    try:
      t_last = time.perf_counter()
      step_last, collapsed_logs = start, 0
      compiled = set()
      for step in range(start, end):
        done = step + 1
        eval_due = monitors.due(done, end)
        logged = done % config.train.log_every == 0 or done == end or eval_due
        first_call = logged not in compiled
        if first_call and step > start:  # it compiles: keep it out of img/s
          jax.block_until_ready(state.step)
          t_compile = time.perf_counter()
        state, metrics = train_steps[logged](state, parallel.global_batch(next(it), mesh))
        progress.step()
        if first_call:
          compiled.add(logged)
          jax.block_until_ready(metrics["loss"])
          now = time.perf_counter()
          if step == start:
            progress.compiled(done, now - t_last)
            t_last, step_last = now, done
          else:
            t_last += now - t_compile
        stop = _stop_due(requested, done)
        saved = done % config.train.checkpoint_every == 0 or done == end or stop is not None
        if not (logged or saved):
          continue
        finite, norm = (float(x) for x in jax.device_get(_state_check(metrics["loss"], state)))
        _stop_if_diverged(bool(finite), norm / norm0, done, manager, config)
        if logged:
          scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
          scalars["param_norm"] = norm
          if eval_due:
            t_eval = time.perf_counter()
            scalars.update(monitors(state.params, state.batch_stats))
            t_last += time.perf_counter() - t_eval  # img/s counts training only
          now = time.perf_counter()
          if done > step_last:
            scalars["img_per_s"] = (done - step_last) * config.optim.batch_size / (now - t_last)
          t_last, step_last = now, done
          warning = health.collapse_warning(
              scalars, config.health.min_std_sqrt_d, config.health.min_rank
          )
          scalars["health/collapsed"] = float(warning is not None)
          _raise_thread_fault(thread_faults, workdir)
          with write_faults.guard("the metrics log", writer.path):
            writer.write(done, scalars)
          notice, collapsed_logs = collapse_notice(warning, collapsed_logs, scalars)
          if lead and notice is not None:
            report_warning(f"step {done}: {notice}", workdir, progress)
          progress.log(done, scalars)
        if saved:
          with write_faults.guard(_checkpoint_named, checkpoint.directory(workdir)):
            checkpoint.save(
                manager, state, it, {**meta, "param_norm": norm, "loss": float(metrics["loss"])}
            )
        if stop is not None:
          break
    except BaseException:
      _close_all(closers, failing=True)
      raise
    else:
      with write_faults.guard(_checkpoint_named, checkpoint.directory(workdir)):
        _close_all(closers, failing=False)
      _raise_thread_fault(thread_faults, workdir)
  if stop is not None:
    raise Interrupted(done, stop)
  return max(start, end), total


def _restore_or_init(workdir: str, make_state, make_iterator, mesh, keys: int):
  """(state, data iterator, initial parameter norm, [(step, reason, moved to)] of the
  damaged checkpoints set aside) of the newest intact checkpoint, or of a new run."""
  damaged = []
  restored = None
  if checkpoint.steps_on_disk(workdir):
    restored, unreadable = checkpoint.restore_intact(
        checkpoint.make_manager(workdir, read_only=True), jax.eval_shape(make_state), make_iterator
    )
    for step, reason in unreadable:
      path = (
          checkpoint.set_aside(workdir, step)
          if jax.process_index() == 0
          else f"{workdir}/{checkpoint.DAMAGED_DIR}"
      )
      damaged.append((step, reason, path))
    if unreadable and jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("cl_jax: damaged checkpoints set aside")
  if restored is None:
    state = make_state()
    return state, make_iterator(), float(optax.global_norm(state.params)), damaged
  state = relayout_queue(restored.state, restored.meta, mesh, keys)
  norm0 = restored.meta.get("param_norm_init")
  if norm0 is None:  # a checkpoint of an earlier version: recompute from the seed
    norm0 = float(optax.global_norm(make_state().params))
  return state, restored.data_iterator, norm0, damaged


def collapse_notice(
    warning: str | None, collapsed_logs: int, scalars: dict[str, float]
) -> tuple[str | None, int]:
  """(line to report or None, updated count) for one logging step's collapse warning.

  collapsed_logs counts the consecutive logging steps with a warning so far. The
  warning is reported when the run enters the collapsed state and at every 10th
  logging step it stays there; the first healthy logging step after it reports
  the recovery with the health signals of `scalars`.
  """
  if warning is not None:
    return (warning if collapsed_logs % 10 == 0 else None), collapsed_logs + 1
  if not collapsed_logs:
    return None, 0
  signals = ", ".join(
      f"{k} = {scalars[k]:.3g}" for k in ("health/std_sqrt_d", "health/rank") if k in scalars
  )
  return f"representation recovered after {collapsed_logs} collapsed logging steps: {signals}", 0


def report_warning(line: str, workdir: str, progress: Progress) -> None:
  """Print `line` (above the progress bar) and append it to workdir/warnings.log
  (object stores cannot append: the file is read and rewritten)."""
  progress.write(line)
  path = epath.Path(workdir) / "warnings.log"
  if "://" in str(workdir):
    path.write_text((path.read_text() if path.exists() else "") + line + "\n")
  else:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
      f.write(line + "\n")


def _stop_if_diverged(
    finite: bool, growth: float, step: int, manager, config: ml_collections.ConfigDict
) -> None:
  """Raise TrainingDiverged (after pending saves finish) unless the state at `step` is
  finite with a parameter norm of at most train.max_param_growth times the initial one."""
  limit = config.train.max_param_growth
  if finite and growth <= limit:
    return
  norm = f"is {growth:.3g} times" if math.isfinite(growth) else "overflowed float32, beyond"
  reason = (
      "the loss or the state is no longer finite"
      if not finite
      else f"the parameter norm {norm} its initial value (limit "
      f"train.max_param_growth = {limit:g})"
  )
  manager.wait_until_finished()
  last = manager.latest_step()
  lr = f"this run's is {config.optim.lr:g}"
  if last is None:
    advice = f"No checkpoint was saved: start again with a lower --config.optim.lr ({lr})."
  else:
    advice = (
        f"The last checkpoint (step {last}) was saved before that, with its parameters "
        f"in range, and is intact: run the same command with a lower --config.optim.lr "
        f"({lr}) and --allow_config_change to resume from step {last}."
    )
  raise TrainingDiverged(f"training diverged at step {step}: {reason}. {advice}")
