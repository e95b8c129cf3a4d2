"""The SimCLR step (Chen et al. 2020, Alg. 1): one network, both views, NT-Xent over the
global batch, with NS negatives, FT, IFM or hard-negative sampling from the config.

Each view goes through the encoder in its own forward, so batch-norm statistics
are those of one view's global batch (as for MoCo's queries); concatenating the
views would move every image of one view to other devices.
"""

import jax
import jax.numpy as jnp
import ml_collections

from cl_jax.analysis.collapse import embedding_health
from cl_jax.losses import simclr
from cl_jax.objectives import dicr
from cl_jax.objectives.forward import Views, encode, ns_features, texture_of
from cl_jax.state import TrainState


def make_objective(config: ml_collections.ConfigDict, encoder, steps_per_epoch: int):
  """objective(state, views) -> (loss, grads, {"batch_stats"}, stats) of one SimCLR step.

  stats: simclr_loss's score statistics and cl_jax.analysis.collapse.embedding_health of the
  two views' projections z1, z2, before any feature transformation.

  With DICR the loss adds lambda L_DICR of the two views (cl_jax.objectives.dicr).

  Non-semantic negatives (Ge et al. 2021, Eq. 1) are the online network's
  features of each view's NS images, without gradient (they play the part of
  MoCo's NS keys); their forward's batch statistics are not kept.
  """
  ns = config.nonsemantic
  ft_start = config.ft.start_epoch * steps_per_epoch
  regularise = dicr.make_regulariser(config, encoder, steps_per_epoch)

  def objective(state: TrainState, x: Views):
    t = None
    if ns.enabled:
      t = jnp.concatenate(
          [
              ns_features(
                  encoder,
                  state.params,
                  state.batch_stats,
                  v,
                  jax.random.fold_in(x.r_ns, i),
                  ns,
                  shuffle=False,
                  texture=texture_of(x, i),
              )[0]
              for i, v in enumerate((x.v1, x.v2))
          ]
      )  # (2B, M, d)

    def loss_fn(params):
      out1, bs = encode(encoder, params, state.batch_stats, x.v1)
      out2, bs = encode(encoder, params, bs, x.v2)
      loss, stats = simclr.simclr_loss(
          out1["z"],
          out2["z"],
          t,
          config.simclr,
          ns,
          config.ifm,
          config.hcl,
          ft_cfg=config.ft,
          ft_rng=x.r_ft,
          ft_active=state.step >= ft_start,
          score_queries=config.train.score_queries,
      )
      if regularise is not None:
        term, bs, dicr_stats = regularise(params, bs, state.step, out1, out2, x.regions)
        loss, stats = loss + term, {**stats, **dicr_stats}
      return loss, (bs, {**stats, **embedding_health(out1["z"], out2["z"])})

    (loss, (batch_stats, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return loss, grads, {"batch_stats": batch_stats}, stats

  return objective
