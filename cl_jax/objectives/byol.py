"""The BYOL step (Grill et al. 2020, Sec. 3.1), with NS negatives (Ge et al. 2021, Eq. 2)
and positive extrapolation (Zhu et al. 2021, App. E.2).

  1. target <- tau_k target + (1 - tau_k) online, tau_k the cosine schedule
     (cl_jax.losses.byol.target_momentum);
  2. target projections of both views (and of the NS images of each view), no gradient;
  3. the online network's predictions regress onto the other view's target
     projection, L = l(p1, z2) + l(p2, z1), minus alpha times the NS distance.
"""

import jax
import ml_collections
import optax

from cl_jax.analysis.collapse import embedding_health
from cl_jax.losses import byol
from cl_jax.objectives import dicr
from cl_jax.objectives.forward import Views, encode, encode_keys, ns_features, texture_of
from cl_jax.objectives.siamese_ft import extrapolate_pairs, uses_extrapolation
from cl_jax.state import TrainState


def make_objective(config: ml_collections.ConfigDict, encoder, steps_per_epoch: int):
  """objective(state, views) -> (loss, grads, state updates, stats) of one BYOL step.

  With DICR the loss adds lambda L_DICR of the two views (cl_jax.objectives.dicr).
  Updates: batch_stats, target_params, target_batch_stats. Stats: pos_mean (mean
  cosine of the two directions' pairs, after any extrapolation), tau, ns_mean
  with NS negatives, and cl_jax.analysis.collapse.embedding_health of the online
  projections z1, z2 (not the predictions), before any extrapolation.
  """
  ns = config.nonsemantic
  ft = config.ft
  total = config.optim.epochs * steps_per_epoch
  ft_start = ft.start_epoch * steps_per_epoch
  extrapolate = uses_extrapolation(ft)
  regularise = dicr.make_regulariser(config, encoder, steps_per_epoch)

  def objective(state: TrainState, x: Views):
    tau = byol.target_momentum(state.step, total, config.byol.base_momentum)
    target_params = optax.incremental_update(state.params, state.target_params, 1.0 - tau)
    target_bs = state.target_batch_stats
    z, t = [], []
    for i, v in enumerate((x.v1, x.v2)):
      zi, target_bs = encode_keys(
          encoder, target_params, target_bs, v, jax.random.fold_in(x.r_key, i), shuffle=False
      )
      z.append(zi)
      # Kept apart from the running statistics, as for MoCo's NS keys.
      t.append(
          ns_features(
              encoder,
              target_params,
              target_bs,
              v,
              jax.random.fold_in(x.r_ns, i),
              ns,
              shuffle=False,
              texture=texture_of(x, i),
          )[0]
          if ns.enabled
          else None
      )

    def loss_fn(params):
      out1, bs = encode(encoder, params, state.batch_stats, x.v1, predict=True)
      out2, bs = encode(encoder, params, bs, x.v2, predict=True)
      preds = (out1["p"], out2["p"])
      pairs = [(preds[0], z[1]), (preds[1], z[0])]
      if extrapolate:
        pairs = extrapolate_pairs(pairs, ft, x.r_ft, state.step >= ft_start)
      loss, stats = 0.0, []
      for (p, target), pred, ns_t in zip(pairs, preds, t):
        if ns_t is None:
          term, st = byol.byol_loss(p, target, stop_gradient=not extrapolate)
        else:
          term, st = byol.byol_ns_loss(
              p, target, ns_t, ns.alpha, stop_gradient=not extrapolate, anchor=pred
          )
        loss = loss + term
        stats.append(st)
      stats = jax.tree.map(lambda a, b: (a + b) / 2, *stats)
      if regularise is not None:
        term, bs, dicr_stats = regularise(params, bs, state.step, out1, out2, x.regions)
        loss, stats = loss + term, {**stats, **dicr_stats}
      health = embedding_health(out1["z"], out2["z"])
      return loss, (bs, {**stats, **health})

    (loss, (batch_stats, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates = dict(
        batch_stats=batch_stats, target_params=target_params, target_batch_stats=target_bs
    )
    return loss, grads, updates, {**stats, "tau": tau}

  return objective
