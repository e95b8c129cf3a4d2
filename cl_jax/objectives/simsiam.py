"""The SimSiam step (Chen & He 2021, Alg. 1), with positive extrapolation (Zhu et al. 2021,
App. E.2): L = D(p1, sg(z2))/2 + D(p2, sg(z1))/2, one network, no target, no negatives."""

import jax
import ml_collections

from cl_jax.analysis.collapse import embedding_health
from cl_jax.losses import simsiam
from cl_jax.objectives import dicr
from cl_jax.objectives.forward import Views, encode
from cl_jax.objectives.siamese_ft import extrapolate_pairs, uses_extrapolation
from cl_jax.state import TrainState


def make_objective(config: ml_collections.ConfigDict, encoder, steps_per_epoch: int):
  """objective(state, views) -> (loss, grads, {"batch_stats"}, stats) of one step.

  With DICR the loss adds lambda L_DICR of the two views (cl_jax.objectives.dicr).
  stats: pos_mean and cl_jax.analysis.collapse.embedding_health of the projections z1, z2
  (not the predictions), before any extrapolation.
  """
  ft = config.ft
  ft_start = ft.start_epoch * steps_per_epoch
  extrapolate = uses_extrapolation(ft)
  regularise = dicr.make_regulariser(config, encoder, steps_per_epoch)

  def objective(state: TrainState, x: Views):
    def loss_fn(params):
      out1, bs = encode(encoder, params, state.batch_stats, x.v1, predict=True)
      out2, bs = encode(encoder, params, bs, x.v2, predict=True)
      p1, z1, p2, z2 = out1["p"], out1["z"], out2["p"], out2["z"]
      if extrapolate:
        (p1, z2), (p2, z1) = extrapolate_pairs(
            [(p1, z2), (p2, z1)], ft, x.r_ft, state.step >= ft_start
        )
      loss, stats = simsiam.simsiam_loss(p1, p2, z1, z2, stop_gradient=not extrapolate)
      if regularise is not None:
        term, bs, dicr_stats = regularise(params, bs, state.step, out1, out2, x.regions)
        loss, stats = loss + term, {**stats, **dicr_stats}
      return loss, (bs, {**stats, **embedding_health(out1["z"], out2["z"])})

    (loss, (batch_stats, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return loss, grads, {"batch_stats": batch_stats}, stats

  return objective
