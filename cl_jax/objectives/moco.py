"""The MoCo step (He et al. 2020, Alg. 1; Chen et al. 2020 for v2), with NS, FT and IFM.

1. EMA update of the key encoder, theta_k <- m theta_k + (1 - m) theta_q;
2. keys of the other view (and of the NS images) from the key encoder,
   without gradient, under shuffle-BN when model.bn_mode = "shuffle";
3. loss and gradient of the query encoder (cl_jax.losses.moco.moco_loss);
4. the step's keys replace the oldest keys of the queue.
"""

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh

from cl_jax import memory_queue as queue_lib
from cl_jax.analysis.collapse import embedding_health
from cl_jax.losses import moco
from cl_jax.objectives import dicr
from cl_jax.objectives.forward import Views, encode, encode_keys, ns_features, texture_of
from cl_jax.state import TrainState


def keys_per_step(config: ml_collections.ConfigDict) -> int:
  """P, the keys enqueued per step: the global batch, twice when symmetric."""
  return config.optim.batch_size * (2 if config.moco.symmetric else 1)


def make_objective(config: ml_collections.ConfigDict, encoder, mesh: Mesh, steps_per_epoch: int):
  """objective(state, views) -> (loss, grads, state updates, stats) of one MoCo step.

  The updates are the new batch_stats, target_params, target_batch_stats and
  queue; stats are moco_loss's score statistics (the mean over the pairs when
  symmetric) and cl_jax.analysis.collapse.embedding_health of the first pair's queries and
  keys, before any feature transformation. With DICR (symmetric MoCo only) the loss adds
  lambda L_DICR of the two views' online outputs (cl_jax.objectives.dicr).
  """
  ns = config.nonsemantic
  shuffle = config.model.bn_mode == "shuffle"
  m = config.moco.momentum
  ft_start = config.ft.start_epoch * steps_per_epoch
  num_keys = keys_per_step(config)
  regularise = dicr.make_regulariser(config, encoder, steps_per_epoch)

  def objective(state: TrainState, x: Views):
    pairs = [(x.v1, x.v2), (x.v2, x.v1)] if config.moco.symmetric else [(x.v1, x.v2)]
    target_params = optax.incremental_update(state.params, state.target_params, 1.0 - m)
    target_bs = state.target_batch_stats
    keys, ns_feats = [], []
    for i, (vq, vk) in enumerate(pairs):
      k, target_bs = encode_keys(
          encoder, target_params, target_bs, vk, jax.random.fold_in(x.r_key, i), shuffle, mesh=mesh
      )
      keys.append(k)
      # The NS forward's batch statistics are not kept: the running statistics
      # follow the real views only.
      ns_feats.append(
          ns_features(
              encoder,
              target_params,
              target_bs,
              vq,
              jax.random.fold_in(x.r_ns, i),
              ns,
              shuffle,
              texture_of(x, i),
              mesh,
          )[0]
          if ns.enabled
          else None
      )

    def loss_fn(params):
      bs = state.batch_stats
      losses, stats, outs = [], [], []
      for (vq, _), k, t in zip(pairs, keys, ns_feats):
        out, bs = encode(encoder, params, bs, vq)
        outs.append(out)
        loss, st = moco.moco_loss(
            out["z"],
            k,
            state.queue,
            t,
            config.moco,
            ns,
            config.ifm,
            mesh,
            config.train.score_queries,
            ft_cfg=config.ft,
            ft_rng=jax.random.fold_in(x.r_ft, len(losses)),
            ft_active=state.step >= ft_start,
            keys_per_step=num_keys,
        )
        losses.append(loss)
        stats.append(st)
      mean = lambda xs: sum(xs) / len(xs)
      loss, stats = mean(losses), jax.tree.map(lambda *xs: mean(xs), *stats)
      if regularise is not None:  # symmetric: outs holds the online outputs of v1 and v2
        term, bs, dicr_stats = regularise(params, bs, state.step, outs[0], outs[1], x.regions)
        loss, stats = loss + term, {**stats, **dicr_stats}
      health = embedding_health(outs[0]["z"], keys[0])
      return loss, (bs, {**stats, **health})

    (loss, (batch_stats, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    # The keys of one example stay adjacent, (B, V, d) -> (B * V, d), so the
    # rows a device holds stay on that device.
    new_queue = queue_lib.enqueue(
        state.queue, jnp.stack(keys, axis=1).reshape(-1, k.shape[-1]), state.step, mesh
    )
    updates = dict(
        batch_stats=batch_stats,
        target_params=target_params,
        target_batch_stats=target_bs,
        queue=new_queue,
    )
    return loss, grads, updates, stats

  return objective
