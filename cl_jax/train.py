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
step the embeddings' health signals (cl_jax.objectives.health) are checked against the
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
import json
import math
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from cl_jax import addons, batch_plan, config_check, objectives, optim
from cl_jax import train_step as step_lib
from cl_jax.data import geometric, gpu_views, pipeline, sources, texture_source
from cl_jax.evaluators import features, linear_probe
from cl_jax.evaluators.registry import Monitors
from cl_jax.losses import memory_queue as queue_lib
from cl_jax.models.encoder import Encoder, encoder_for, head_layout
from cl_jax.objectives import health
from cl_jax.runtime import (
    checkpoint,
    metrics,
    parallel,
    process_exit,
    run_config,
    run_summary,
    stall_watchdog,
    wandb_tracker,
    workdir_lock,
    write_faults,
)
from cl_jax.runtime.errors import UsageError
from cl_jax.runtime.layouts import StateLayouts
from cl_jax.runtime.metrics import MetricWriter
from cl_jax.runtime.progress import Progress, Throughput
from cl_jax.runtime.run_log import collapse_notice, report_warning
from cl_jax.runtime.stop_requests import Interrupted, stop_due, stop_requests
from cl_jax.state import TrainState, init_state

# In a run's workdir: the digest of the folder index its pretraining reads (_same_data).
DATA_INDEX_FILE = "data_index.json"


class TrainingDiverged(RuntimeError):
  """The loss or the state became non-finite, or the parameters grew out of range."""


def pretrain_data(
    config, source, process_index: int = 0, process_count: int = 1, texture: bool = False
):
  """pipeline.pretrain_dataset of `source` with `config`'s batch, image size, crop scale,
  seed, views (step_lib.num_views) and decoder: this process's rows of every global batch."""
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
      decoder=config.data.decoder,
  )


def input_to_devices(config, mesh):
  """The function from this process's batch of pretrain_data to the train step's global batch:
  parallel.global_batch, or with data.decoder gpu gpu_views.DeviceViews (the views decoded and
  resampled on the devices)."""
  if config.data.decoder == "gpu":
    return gpu_views.DeviceViews(mesh, config.data.image_size, step_lib.num_views(config))
  return functools.partial(parallel.global_batch, mesh=mesh)


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


# Compiled once: op by op, the norm of ~60 parameter arrays costs a second at every start.
_param_norm = jax.jit(optax.global_norm)


def check_workdir(workdir: str) -> None:
  """UsageError if `workdir` names an existing file (it must be a directory or not exist), or
  lies under a file."""
  path = epath.Path(workdir)
  if path.exists() and not path.is_dir():
    raise UsageError(f"--workdir={workdir} is a file; give a directory (new or holding a run)")
  if "://" in workdir:
    return
  parent = os.path.dirname(os.path.abspath(workdir))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UsageError(f"--workdir={workdir} lies under {parent}, a file; give a directory")


def make_workdir(workdir: str) -> str | None:
  """Create `workdir` (a local one) with its parents, or UsageError in one line; returns the
  topmost directory it created (None where `workdir` existed or is remote)."""
  if "://" in workdir:
    return None
  top, path = None, os.path.abspath(workdir)
  while not os.path.exists(path):
    top, path = path, os.path.dirname(path)
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise UsageError(
        f"--workdir={workdir} cannot be created ({e.strerror}); give a directory you can write to"
    ) from None
  return top


def _remove_made(workdir: str, top: str) -> None:
  """Remove the empty directories make_workdir made, `workdir` up to `top` (one that is not
  empty, or cannot be removed, is kept with those above it)."""
  path = os.path.abspath(workdir)
  while path.startswith(top):
    try:
      os.rmdir(path)
    except OSError:
      return
    path = os.path.dirname(path)


def _open_checked(config: ml_collections.ConfigDict, probe: bool) -> tuple:
  """(the pretraining source, whether it carries texture images, the Monitors), each check
  that needs the data passed: the source opens, texture negatives find their images, the
  monitors their data and settings, and with `probe` the linear probe that the caller runs
  after the last step its data and settings (UsageError otherwise)."""
  source, texture = _pretrain_source(config)
  monitors = Monitors(config)
  if probe:
    extractor = monitors.extractor or features.setup(config, jax.local_devices())
    linear_probe.check_data(extractor, config.probe.protocol)
  return source, texture, monitors


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
  encoder = encoder_for(config, mesh)
  method = objectives.method_of(config)
  init = functools.partial(
      init_state,
      config.seed,
      encoder,
      tx,
      image_size=config.data.image_size,
      queue_size=config.moco.queue_size if method.queue else 0,
      embed_dim=config.model.head_out_dim,
      queue_shards=mesh.shape[parallel.DATA_AXIS],
      keys_per_step=step_lib.keys_per_step(config),
      target=method.target,
      queue_heads=head_layout(config)["heads"] if config.looc.enabled else None,
  )
  make_state = jax.jit(init, out_shardings=parallel.state_sharding(jax.eval_shape(init), mesh))
  return Built(encoder, tx, schedule, make_state, config.optim.epochs * spe)


def synthetic_batch(config, batch: int, rng: np.random.Generator) -> dict:
  """A host batch shaped like the pipeline's: random uint8 views (all of LooC's), their crop
  boxes and flips drawn as the pipeline draws them from a source twice the view's side (DICR
  reads them), and the texture images of texture negatives."""
  size = config.data.image_size
  host = {}
  for v in range(1, step_lib.num_views(config) + 1):
    host[f"view{v}"] = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    crops = [
        geometric.sample_crop(rng, 2 * size, 2 * size, scale=tuple(config.data.crop_scale))
        for _ in range(batch)
    ]
    host[f"box{v}"] = np.stack([c.box for c in crops]).astype(np.float32)
    host[f"flip{v}"] = np.array([c.flip for c in crops])
  if config.nonsemantic.enabled and config.nonsemantic.kind == "texture":
    for v in (1, 2):
      host[f"texture{v}"] = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
  return host


def synthetic_step(config: ml_collections.ConfigDict, devices: int, statistics: bool = False):
  """(step, state, data): the jitted train step of `config` on the first `devices` devices,
  as the benchmarks and the code fingerprint run it (the lean step, or with statistics=True
  the logging step), a fresh state and a synthetic global batch of config.optim.batch_size,
  both placed on the mesh."""
  mesh = parallel.make_mesh(jax.devices()[:devices])
  config_check.validate(config, num_devices=devices, reads_data=False)
  batch = config.optim.batch_size
  encoder, tx, schedule, make_state, _ = build(config, batch, mesh)
  state = make_state()
  step = step_lib.jit_on_mesh(
      step_lib.make_train_step(config, encoder, tx, schedule, mesh, 1, statistics), state, mesh
  )
  host = synthetic_batch(config, batch, np.random.default_rng(0))
  return step, state, jax.device_put(host, parallel.batch_sharding(mesh))


def pretrain(
    config: ml_collections.ConfigDict,
    workdir: str,
    stop_at_step: int | None = None,
    allow_config_change: bool = False,
    stop_signal: int | None = None,
    reindex: bool = False,
    probe: bool = False,
) -> tuple[int, int]:
  """Pretrain (or resume) in `workdir`; returns (last step taken, total steps).

  With `stop_at_step`, this call stops (with a checkpoint) once the run has
  reached that step; calling again continues the same run (a step the run has
  already reached is a UsageError). A resume with a changed config is refused
  unless every change is in run_config.CHANGEABLE and `allow_config_change` is
  set. The run holds the workdir's writer lock (cl_jax.runtime.workdir_lock) throughout.
  A stop request (Ctrl-C, SIGTERM, `stop_signal`) ends it at the end of its step
  with a checkpoint and raises Interrupted. A run over a folder of images (data.name folder)
  keeps its index's digest in the workdir (DATA_INDEX_FILE); resuming it over a folder whose
  index changed is a UsageError unless `reindex`, which resumes over the folder as it is now.
  Every check that needs the data (_open_checked; with `probe`, of the linear probe that the
  caller runs after the last step) runs before the workdir is locked; a refused run removes the
  directories it made.
  """
  check_workdir(workdir)
  # The config is checked before the workdir is created or locked: a refused config leaves
  # nothing behind.
  mesh = parallel.make_mesh()
  config = batch_plan.resolve(config, mesh.devices.size)  # optim.batch_per_chip's batch and lr
  config_check.validate(config, num_devices=mesh.devices.size)
  wandb_tracker.check_available(config)
  made = make_workdir(workdir)
  try:
    opened = _open_checked(config, probe)
  except BaseException:
    if made:  # a refused run leaves no workdir behind
      _remove_made(workdir, made)
    raise
  taken_over = []
  with write_faults.guard("the writer lock", workdir):  # e.g. a read-only workdir
    with workdir_lock.hold(workdir, warn=taken_over.append):
      with write_faults.guard(
          "the run's files", workdir, lambda: checkpoint.after_write_fault(workdir)
      ):
        return _pretrain(
            config,
            opened,
            mesh,
            workdir,
            stop_at_step,
            allow_config_change,
            stop_signal,
            taken_over,
            reindex,
        )


def _pretrain_source(config: ml_collections.ConfigDict) -> tuple[object, bool]:
  """(the pretraining source, whether it carries texture images): the dataset's train split,
  with texture negatives' offline images beside each image when nonsemantic.kind = texture."""
  source = sources.open_source(config.data, "pretrain")
  texture = config.nonsemantic.enabled and config.nonsemantic.kind == "texture"
  if texture:
    source = texture_source.TextureSource(
        source, config.data.texture_dir, dataset=config.data.name, split="train"
    )
  return source, texture


def _report_start(lock_notes, damaged, start: int, workdir: str, progress: Progress) -> None:
  """Report the writer lock's warnings and the damaged checkpoints set aside."""
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


def _open_log(config, workdir: str, start: int, lead: bool) -> MetricWriter:
  """The run's metric writer from step `start`, with the config saved beside the checkpoints
  (config.json, config.step<start>.json) and in TensorBoard's text tab."""
  if lead:
    run_config.save_start(config, workdir, start)
  writer = MetricWriter(workdir, start_step=start)
  writer.write_text("config", f"```\n{config.to_json(indent=2)}\n```", start)
  if lead and config.log.wandb:
    writer.track(wandb_tracker.Tracker(workdir, config))
  return writer


def _same_data(workdir: str, source, reindex: bool, lead: bool) -> None:
  """Keep the pretraining source's index digest (a folder's, cl_jax.data.folder_source) in
  DATA_INDEX_FILE; a run with a checkpoint whose stored digest differs is refused (UsageError)
  unless `reindex`. Sources without a digest (TFDS, Trifeature) are fixed by their name."""
  digest = getattr(source, "digest", None)
  if digest is None:
    return
  path = epath.Path(workdir) / DATA_INDEX_FILE
  if checkpoint.steps_on_disk(workdir) and path.exists():
    stored = json.loads(path.read_text())
    if stored["digest"] != digest and not reindex:
      raise UsageError(
          f"{source.folder} changed since this run started ({stored['images']} images then, "
          f"{len(source)} now): a resumed run would read other images in another order. Start a "
          "new --workdir, or resume over the folder as it is now with --reindex"
      )
  if lead:
    metrics.write_atomically(
        path, json.dumps({"folder": source.folder, "digest": digest, "images": len(source)})
    )


def _pretrain(
    config: ml_collections.ConfigDict,
    opened: tuple,
    mesh,
    workdir: str,
    stop_at_step: int | None,
    allow_config_change: bool,
    stop_signal: int | None,
    lock_notes: list[str],
    reindex: bool,
):
  """pretrain's body, run while holding the writer lock; `opened` is (the pretraining source,
  whether it carries texture images, the Monitors), as pretrain checked them; `lock_notes` are
  the lock's warnings, reported once the run's log is open."""
  # ---- Config and data (the config resolved and checked by pretrain).
  changes = resume_changes(config, workdir, allow_config_change)
  lead = jax.process_index() == 0
  source, texture, monitors = opened
  _same_data(workdir, source, reindex, lead)
  spe = steps_per_epoch(len(source), config.optim.batch_size)
  data = pretrain_data(config, source, jax.process_index(), jax.process_count(), texture)
  make_iterator = functools.partial(pipeline.make_iterator, data, config.data.workers)

  # ---- Model and state.
  encoder, tx, schedule, make_state, total = build(config, len(source), mesh)
  end = total if stop_at_step is None else min(total, stop_at_step)
  keys = step_lib.keys_per_step(config)

  # ---- Restore: the newest intact checkpoint, or a new run.
  state, it, norm0, damaged = _restore_or_init(workdir, make_state, make_iterator, mesh, keys)
  start = int(state.step)
  if stop_at_step is not None and stop_at_step <= start:
    it.close()
    raise UsageError(
        f"--stop_at_step={stop_at_step} is at or below the step this run has reached "
        f"({start} of {total}): nothing to do; give a later step to continue"
    )
  progress = Progress(total, start, enabled=lead)
  _report_start(lock_notes, damaged, start, workdir, progress)
  manager = checkpoint.make_manager(workdir, config.train.keep_checkpoints)
  writer = _open_log(config, workdir, start, lead)
  method = objectives.method_of(config)
  summary = run_summary.startup(
      config,
      workdir=workdir,
      mesh=mesh,
      start=start,
      steps_per_epoch=spe,
      total=total,
      params=state.params,
      splits=sources.split_sizes(config, len(source)),
      notes=addons.describe(config) + ([method.describe(config)] if method.describe else []),
      changes=changes,
  )
  progress.write(summary)

  # ---- The loop.
  # The full step (with its statistics) on logging steps, the lean one between them, both
  # keeping the state in the layouts the first of them to compile chose.
  layouts = StateLayouts()
  train_steps = {
      logs: step_lib.jit_on_mesh(
          step_lib.make_train_step(config, encoder, tx, schedule, mesh, spe, logs),
          state,
          mesh,
          layouts,
      )
      for logs in (True, False)
  }
  meta = {
      "queue_shards": mesh.shape[parallel.DATA_AXIS],
      "keys_per_step": keys,
      "param_norm_init": norm0,
  }
  log = _Logger(config, workdir, writer, progress, lead)
  watch = stall_watchdog.StallWatchdog(
      config.train.stall_timeout_s,
      functools.partial(_stalled, workdir, config.train.stall_timeout_s),
  )
  loop = _Loop(
      config,
      workdir,
      mesh,
      input_to_devices(config, mesh),
      train_steps,
      monitors,
      manager,
      log,
      meta,
      watch,
  )
  done, stop = start, None
  # it.close() stops the input workers and frees their shared memory.
  closers = (progress.close, writer.close, manager.wait_until_finished, it.close)
  with (
      stop_requests(stop_signal) as requested,
      checkpoint.quiet_failed_saves(),
      write_faults.in_threads() as thread_faults,
      watch,
  ):
    try:
      done, stop = _train(loop, state, it, start, end, requested, thread_faults)
    # ---- The end: every closer runs; a failure already raised is the one reported.
    except BaseException:
      write_faults.close_all(closers, failing=True)
      raise
    else:
      with write_faults.guard(checkpoint.named_in_error, checkpoint.directory(workdir)):
        write_faults.close_all(closers, failing=False)
      write_faults.raise_thread_fault(thread_faults, workdir)
  if stop is not None:
    raise Interrupted(done, stop)
  return max(start, end), total


class _Loop(NamedTuple):
  """What the training loop runs with (built by _pretrain): the jitted steps by whether the
  step logs, the monitors, the checkpoint manager, the logger and the checkpoints' metadata."""

  config: ml_collections.ConfigDict
  workdir: str
  mesh: object
  to_devices: object  # input_to_devices
  train_steps: dict
  monitors: Monitors
  manager: object
  log: "_Logger"
  meta: dict
  watch: stall_watchdog.StallWatchdog


def _train(loop: _Loop, state, it, start: int, end: int, requested, thread_faults):
  """Take steps start + 1 .. end of the run (fewer if a stop is requested): log every
  train.log_every steps, at the monitors' steps and the last, check divergence and save
  every train.checkpoint_every steps, at the last and at a stop. Each step beats the stall
  watchdog; compiling, evaluating and starting a save are paused stretches. Returns (the last
  step taken, the signal that stopped it or None)."""
  config, workdir, manager, watch = loop.config, loop.workdir, loop.manager, loop.watch
  progress, norm0 = loop.log.progress, loop.meta["param_norm_init"]
  clock = Throughput(start, config.optim.batch_size)
  compiled = set()
  done, stop = start, None
  for step in range(start, end):
    watch.beat(step)
    done = step + 1
    eval_due = loop.monitors.due(done, end)
    logged = done % config.train.log_every == 0 or done == end or eval_due
    first_call = logged not in compiled
    batch = loop.to_devices(next(it))
    if first_call and step > start:  # it compiles: keep it out of img/s
      jax.block_until_ready(state.step)
      t_compile = time.perf_counter()
    with watch.paused() if first_call else contextlib.nullcontext():
      state, metrics = loop.train_steps[logged](state, batch)
      if first_call:
        jax.block_until_ready(metrics["loss"])
    progress.step()
    if first_call:
      compiled.add(logged)
      if step == start:
        progress.compiled(done, clock.restart(done))
      else:
        clock.exclude(time.perf_counter() - t_compile)
    stop = stop_due(requested, done)
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
        with watch.paused():
          scalars.update(loop.monitors(state.params, state.batch_stats))
        clock.exclude(time.perf_counter() - t_eval)  # img/s counts training only
      rate = clock.rate(done)
      if rate is not None:
        scalars["img_per_s"] = rate
      write_faults.raise_thread_fault(thread_faults, workdir)
      loop.log(done, scalars)
    if saved:
      with write_faults.guard(checkpoint.named_in_error, checkpoint.directory(workdir)):
        meta = {**loop.meta, "param_norm": norm, "loss": float(metrics["loss"])}
        with watch.paused():
          checkpoint.save(manager, state, it, meta)
    if stop is not None:
      break
  return done, stop


def _stalled(workdir: str, timeout_s: float, step: int, idle_s: float) -> None:
  """The stall watchdog's end of the run: every thread's stack to a file, one line, exit
  with stall_watchdog.STALL_STATUS."""
  path = stall_watchdog.write_stacks(workdir, jax.process_index())
  process_exit.end_now(
      f"stalled: no training step finished in {idle_s:.0f} s after step {step} "
      f"(train.stall_timeout_s = {timeout_s:g}): the input pipeline or a device stopped "
      f"answering; every thread's stack is in {path}",
      stall_watchdog.STALL_STATUS,
  )


class _Logger:
  """Writes a logging step's scalars: the health check (health/collapsed), the metrics log,
  the collapse notices (console and warnings.log, process 0) and the progress line."""

  def __init__(self, config, workdir: str, writer: MetricWriter, progress: Progress, lead: bool):
    self.config, self.workdir, self.lead = config, workdir, lead
    self.writer, self.progress = writer, progress
    self.collapsed_logs = 0

  def __call__(self, step: int, scalars: dict[str, float]) -> None:
    h = self.config.health
    warning = health.collapse_warning(scalars, h.min_std_sqrt_d, h.min_rank)
    scalars["health/collapsed"] = float(warning is not None)
    with write_faults.guard("the metrics log", self.writer.path):
      self.writer.write(step, scalars)
    notice, self.collapsed_logs = collapse_notice(warning, self.collapsed_logs, scalars)
    if self.lead and notice is not None:
      report_warning(f"step {step}: {notice}", self.workdir, self.progress)
    self.progress.log(step, scalars)


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
    return state, make_iterator(), float(_param_norm(state.params)), damaged
  state = queue_lib.relayout(restored.state, restored.meta, mesh, keys)
  norm0 = restored.meta.get("param_norm_init")
  if norm0 is None:  # a checkpoint of an earlier version: recompute from the seed
    norm0 = float(_param_norm(make_state().params))
  return state, restored.data_iterator, norm0, damaged


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
