"""The LooC step (Xiao et al. 2021, Sec. 3-4) on MoCo v2.

1. EMA update of the key encoder, as MoCo's;
2. the key encoder embeds every key view k_0..k_n in every head (no gradient,
   shuffle-BN per view when model.bn_mode = "shuffle"): z_i^{k_j} for all i, j;
3. loss and gradient of the query encoder, cl_jax.losses.looc.looc_loss (Eq. 2),
   from one forward pass of the query view through the backbone and all heads;
4. head i's queue receives z_i^{k_i}, the key that is head i's positive (k_0 for
   head 0); the H queues share one (K, H, d) array and advance together.
"""

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh

from cl_jax import memory_queue as queue_lib
from cl_jax.analysis.collapse import embedding_health
from cl_jax.losses import looc
from cl_jax.objectives.forward import Views, encode, encode_keys
from cl_jax.state import TrainState


def head_embeddings(out: dict) -> jax.Array:
  """(B, H, d) unit embeddings of every head from an encoder output (one head: z)."""
  return out["z_heads"] if "z_heads" in out else out["z"][:, None]


def make_objective(config: ml_collections.ConfigDict, encoder, mesh: Mesh):
  """objective(state, views) -> (loss, grads, state updates, stats) of one LooC step.

  The views are x.v1 (query) and the keys x.v2 (k_0) followed by x.extra
  (k_1..k_n). stats: looc_loss's, and cl_jax.analysis.collapse.embedding_health of head 0's
  queries and k_0 keys.
  """
  shuffle = config.model.bn_mode == "shuffle"
  m = config.moco.momentum

  def objective(state: TrainState, x: Views):
    target_params = optax.incremental_update(state.params, state.target_params, 1.0 - m)
    target_bs = state.target_batch_stats
    keys = []
    for j, vk in enumerate((x.v2,) + tuple(x.extra)):
      k, target_bs = encode_keys(
          encoder,
          target_params,
          target_bs,
          vk,
          jax.random.fold_in(x.r_key, j),
          shuffle,
          output=head_embeddings,
          mesh=mesh,
      )
      keys.append(k)
    keys = jnp.stack(keys, axis=2)  # (B, H, V, d): keys[b, i, j] = z_i^{k_j}

    def loss_fn(params):
      out, bs = encode(encoder, params, state.batch_stats, x.v1)
      q = head_embeddings(out)
      loss, stats = looc.looc_loss(
          q, keys, state.queue, config.moco.temperature, mesh, config.train.score_queries
      )
      return loss, (bs, {**stats, **embedding_health(q[:, 0], keys[:, 0, 0])})

    (loss, (batch_stats, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    heads = keys.shape[1]
    own = keys[:, jnp.arange(heads), jnp.arange(heads)]  # (B, H, d): z_i^{k_i}
    new_queue = queue_lib.enqueue(state.queue, own, state.step, mesh)
    updates = dict(
        batch_stats=batch_stats,
        target_params=target_params,
        target_batch_stats=target_bs,
        queue=new_queue,
    )
    return loss, grads, updates, stats

  return objective
