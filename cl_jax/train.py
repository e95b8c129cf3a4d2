"""The pretraining loop: data -> jitted train step -> metrics and checkpoints.

The step runs without host synchronisation; the host reads metrics back only
every `train.log_every` steps and before each checkpoint, where a non-finite
loss or state stops the run before anything is saved. At each logging step the
embeddings' health signals (cl_jax.health) are checked against the `health`
thresholds: a collapse is reported on the console and in workdir/warnings.log,
and logged as the scalar health/collapsed.
"""
import functools
import json
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from absl import logging
from etils import epath

from cl_jax import checkpoint, config_check, health, optim, parallel, queue as queue_lib
from cl_jax import step as step_lib
from cl_jax.data import pipeline, sources
from cl_jax.metrics import MetricWriter
from cl_jax.models.encoder import build_encoder
from cl_jax.state import init_state


class TrainingDiverged(RuntimeError):
  """The loss or the parameters became NaN or infinite."""


def steps_per_epoch(num_records: int, batch_size: int) -> int:
  """Full global batches per pass over the pretraining source."""
  if num_records < batch_size:
    raise ValueError(f"the pretraining set has {num_records} images, fewer than one global "
                     f"batch (optim.batch_size = {batch_size})")
  return num_records // batch_size


@jax.jit
def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """workdir/config.json: the run's config, read by the probe job (workdir may be a URL)."""
  root = epath.Path(workdir)
  root.mkdir(parents=True, exist_ok=True)
  tmp = root / "config.json.tmp"
  tmp.write_text(config.to_json(indent=2))
  tmp.replace(root / "config.json")


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run in `workdir` was started with."""
  path = epath.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} not found: {workdir} holds no cl_jax pretraining run")
  data = json.loads(path.read_text())
  # JSON turns tuples into lists; the config uses tuples for ranges.
  c = ml_collections.ConfigDict(data)
  for block, field in (("data", "crop_scale"), ("aug", "blur_sigma"), ("probe", "decay_epochs")):
    c[block][field] = tuple(c[block][field])
  return c


def build(config: ml_collections.ConfigDict, num_records: int, mesh):
  """(encoder, optimizer, schedule, make_state, total steps) of a run on `mesh`.

  make_state() -> the initial TrainState, laid out with
  cl_jax.parallel.state_sharding (queue rows over `data`); jax.eval_shape(make_state)
  is its abstract shape, a template for restoring a checkpoint.
  """
  spe = steps_per_epoch(num_records, config.optim.batch_size)
  schedule = optim.lr_schedule(config.optim, spe)
  tx = optim.make_optimizer(config.optim, schedule)
  encoder = build_encoder(config.model)
  moco = config.method == "moco"
  init = functools.partial(
      init_state, config.seed, encoder, tx, image_size=config.data.image_size,
      queue_size=config.moco.queue_size if moco else 0, embed_dim=config.model.head_out_dim,
      queue_shards=mesh.shape[parallel.DATA_AXIS], keys_per_step=step_lib.keys_per_step(config),
      target=config.method in ("moco", "byol"))
  make_state = jax.jit(init, out_shardings=parallel.state_sharding(jax.eval_shape(init), mesh))
  return encoder, tx, schedule, make_state, config.optim.epochs * spe


def relayout_queue(state, meta: dict, mesh, keys: int):
  """`state` with its queue moved from the checkpoint's layout (meta["queue_shards"]
  shards) to the layout of `mesh` (cl_jax.queue), so a run resumes exactly on a
  different number of devices."""
  old, new = meta["queue_shards"], mesh.shape[parallel.DATA_AXIS]
  if state.queue is None:
    return state
  if meta["keys_per_step"] != keys:
    raise ValueError(f"the checkpoint's queue holds {meta['keys_per_step']} keys per step but "
                     f"this config enqueues {keys}; resume with the run's own batch size")
  if old == new:
    return state
  move = jax.jit(lambda q: queue_lib.to_sharded_layout(
      queue_lib.to_ring_order(q, old, keys), new, keys),
      out_shardings=parallel.batch_sharding(mesh))
  return state.replace(queue=move(state.queue))


def pretrain(config: ml_collections.ConfigDict, workdir: str,
             stop_at_step: int | None = None) -> int:
  """Pretrain (or resume) in `workdir`; returns the last step taken.

  With `stop_at_step`, this call stops (with a checkpoint) once the run has
  reached that step; calling again continues the same run.
  """
  mesh = parallel.make_mesh()
  config_check.validate(config, num_devices=mesh.devices.size)
  lead = jax.process_index() == 0
  if lead:
    write_config(config, workdir)
  source = sources.open_source(config.data, "pretrain")
  encoder, tx, schedule, make_state, total = build(config, len(source), mesh)
  end = total if stop_at_step is None else min(total, stop_at_step)
  keys = step_lib.keys_per_step(config)
  meta = {"queue_shards": mesh.shape[parallel.DATA_AXIS], "keys_per_step": keys}
  manager = checkpoint.make_manager(workdir, config.train.keep_checkpoints)
  data = pipeline.pretrain_dataset(
      source, batch_size=config.optim.batch_size, image_size=config.data.image_size,
      crop_scale=tuple(config.data.crop_scale), seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count())
  it = pipeline.make_iterator(data, config.data.workers)
  restored = checkpoint.restore(manager, jax.eval_shape(make_state), data_iterator=it)
  if restored is None:
    state = make_state()
  else:
    state = relayout_queue(*restored, mesh, keys)
  start = int(state.step)
  if lead and start:
    print(f"resuming from the checkpoint at step {start} in {workdir}")

  train_step = step_lib.jit_train_step(
      step_lib.make_train_step(config, encoder, tx, schedule, mesh,
                               steps_per_epoch(len(source), config.optim.batch_size)),
      parallel.state_sharding(state, mesh), parallel.batch_sharding(mesh))
  writer = MetricWriter(workdir)
  bar = tqdm.tqdm(total=total, initial=start, desc="pretrain", disable=not lead,
                  dynamic_ncols=True)
  t_last, step_last = time.perf_counter(), start
  collapsed_logs = 0
  try:
    for step in range(start, end):
      state, metrics = train_step(state, parallel.global_batch(next(it), mesh))
      done = step + 1
      bar.update(1)
      if done % config.train.log_every == 0 or done == end:
        scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
        now = time.perf_counter()
        scalars["img_per_s"] = (done - step_last) * config.optim.batch_size / (now - t_last)
        t_last, step_last = now, done
        _stop_if_diverged(bool(np.isfinite(scalars["loss"])), done, manager)
        warning = health.collapse_warning(scalars, config.health.min_std_sqrt_d,
                                          config.health.min_rank)
        scalars["health/collapsed"] = float(warning is not None)
        writer.write(done, scalars)
        notice, collapsed_logs = collapse_notice(warning, collapsed_logs, scalars)
        if lead and notice is not None:
          report_warning(f"step {done}: {notice}", workdir)
        bar.set_postfix(loss=f"{scalars['loss']:.4f}", lr=f"{scalars['lr']:.3g}")
      if done % config.train.checkpoint_every == 0 or done == end:
        finite = _all_finite((metrics["loss"], state.params, state.target_params, state.queue))
        _stop_if_diverged(bool(finite), done, manager)
        checkpoint.save(manager, state, it, meta)
  finally:
    bar.close()
    writer.close()
    manager.wait_until_finished()
  return max(start, end)


def collapse_notice(warning: str | None, collapsed_logs: int,
                    scalars: dict[str, float]) -> tuple[str | None, int]:
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
  signals = ", ".join(f"{k} = {scalars[k]:.3g}" for k in ("health/std_sqrt_d", "health/rank")
                      if k in scalars)
  return f"representation recovered after {collapsed_logs} collapsed logging steps: {signals}", 0


def report_warning(line: str, workdir: str) -> None:
  """Print `line` above the progress bar, log it as a warning and append it to
  workdir/warnings.log (object stores cannot append: the file is read and rewritten)."""
  tqdm.tqdm.write(line)
  logging.warning(line)
  path = epath.Path(workdir) / "warnings.log"
  if "://" in str(workdir):
    path.write_text((path.read_text() if path.exists() else "") + line + "\n")
  else:
    with path.open("a", encoding="utf-8") as f:
      f.write(line + "\n")


def _stop_if_diverged(finite: bool, step: int, manager) -> None:
  """Raise TrainingDiverged (after pending saves finish) unless `finite`."""
  if finite:
    return
  manager.wait_until_finished()
  last = manager.latest_step()
  kept = (f"the last good checkpoint (step {last}) is intact" if last is not None
          else "no checkpoint had been written yet")
  raise TrainingDiverged(
      f"training diverged: the loss or the parameters became NaN or infinite by step {step}; "
      f"{kept}. Lower optim.lr or check the data, then start again in the same workdir to "
      "resume from that checkpoint.")
