"""The train state: one pytree holding everything a step reads and writes."""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from cl_jax.losses import memory_queue as queue_lib


@flax.struct.dataclass
class TrainState:
  """Everything needed to continue a run exactly (with the data iterator state).

  Attributes:
    step: () int32, steps taken.
    params, batch_stats: online (query) encoder variables.
    target_params, target_batch_stats: EMA (key / target) encoder variables,
      None for methods without a target network (SimCLR, SimSiam).
    opt_state: optax state of the online parameters.
    queue: (K, d) float32 memory queue of keys ((K, H, d) with LooC's H heads), in the layout of
      cl_jax.losses.memory_queue for the run's number of devices; None without a queue
      (every method but MoCo).
    rng: (2,) uint32 raw PRNG key; step t uses fold_in(rng, t).
  """

  step: jax.Array
  params: Any
  batch_stats: Any
  target_params: Any
  target_batch_stats: Any
  opt_state: Any
  queue: jax.Array
  rng: jax.Array


def init_variables(seed: int, encoder, image_size: int) -> dict:
  """{"params", "batch_stats"} of the online encoder at initialisation (init_state's).

  Parameters are drawn with the "rbg" PRNG (XLA's RngBitGenerator), which
  compiles in a fraction of threefry's time for the many parameter shapes of a
  ResNet; the run's own stream (augmentation, shuffles) is threefry, whose
  numbers do not depend on how arrays are sharded.
  """
  example = jnp.zeros((encoder.backbone.bn_groups, image_size, image_size, 3))
  variables = encoder.init(jax.random.key(seed, impl="rbg"), example, train=False)
  return {"params": variables["params"], "batch_stats": variables["batch_stats"]}


def init_state(
    seed: int,
    encoder,
    tx: optax.GradientTransformation,
    *,
    image_size: int,
    queue_size: int,
    embed_dim: int,
    queue_shards: int,
    keys_per_step: int,
    target: bool = True,
    queue_heads: int | None = None,
) -> TrainState:
  """Fresh state: random online encoder (init_variables), target = online, random
  unit queue.

  Args:
    seed: the run's seed.
    encoder: cl_jax.models.encoder.Encoder.
    tx: the optimizer.
    image_size: S of the (G, S, S, 3) example used to create the variables
      (G = batch-norm groups).
    queue_size, embed_dim: K and d of the queue; K = 0 for no queue.
    queue_shards, keys_per_step: S (devices on the `data` axis) and P of the
      queue layout.
    target: keep an EMA target network (MoCo, BYOL).
    queue_heads: H for LooC's one queue per head, a (K, H, d) queue; None for
      the (K, d) queue.
  """
  r_queue, r_run = jax.random.split(jax.random.key(seed))
  variables = init_variables(seed, encoder, image_size)
  params, batch_stats = variables["params"], variables["batch_stats"]
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      batch_stats=batch_stats,
      target_params=jax.tree.map(jnp.copy, params) if target else None,
      target_batch_stats=jax.tree.map(jnp.copy, batch_stats) if target else None,
      opt_state=tx.init(params),
      queue=(
          queue_lib.init_queue(
              r_queue, queue_size, embed_dim, queue_shards, keys_per_step, queue_heads
          )
          if queue_size
          else None
      ),
      rng=jax.random.key_data(r_run),
  )
