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
from jax.sharding import Mesh

from cl_jax.addons.from_config import AddOns
from cl_jax.losses import byol
from cl_jax.objectives import forward
from cl_jax.objectives.forward import Views, encode
from cl_jax.objectives.health import embedding_health
from cl_jax.objectives.method import Method
from cl_jax.runtime.config_fields import number
from cl_jax.state import TrainState


def make_objective(
    config: ml_collections.ConfigDict, encoder, mesh: Mesh, addons: AddOns, steps_per_epoch: int
):
  """objective(state, views) -> (loss, grads, state updates, stats) of one BYOL step.

  steps_per_epoch places tau's cosine schedule on the step axis.

  With DICR the loss adds lambda L_DICR of the two views. Updates: batch_stats,
  target_params, target_batch_stats. Stats: pos_mean (mean cosine of the two directions'
  pairs, after any extrapolation), tau, ns_mean with NS negatives, and
  cl_jax.objectives.health.embedding_health of the online projections z1, z2 (not the
  predictions), before any extrapolation.
  """
  del mesh

  ns = addons.nonsemantic
  total = config.optim.epochs * steps_per_epoch
  extrapolate = addons.extrapolates_pairs()

  def objective(state: TrainState, x: Views):
    tau = byol.target_momentum(state.step, total, config.byol.base_momentum)
    target_params = forward.momentum_target(state, tau)
    views = (x.v1, x.v2)
    targets, target_bs = forward.target_keys(
        encoder, target_params, state.target_batch_stats, list(views), x.r_key, shuffle=None
    )
    ns_targets = forward.ns_keys(
        encoder, target_params, target_bs, list(views), x, ns, shuffle=None
    )

    def loss_fn(params):
      params, (z, t) = forward.keys_first(params, (targets, ns_targets))
      out1, bs = encode(encoder, params, state.batch_stats, x.v1, predict=True)
      out2, bs = encode(encoder, params, bs, x.v2, predict=True)
      preds = (out1["p"], out2["p"])
      pairs = addons.on_pairs([(preds[0], z[1]), (preds[1], z[0])], x.r_ft, state.step)
      loss, stats = 0.0, []
      for (p, target), pred, ns_t in zip(pairs, preds, t):
        if ns_t is None:
          term, st = byol.byol_loss(p, target, stop_gradient=not extrapolate)
        else:
          term, st = ns.regression_loss(p, target, ns_t, not extrapolate, pred)
        loss = loss + term
        stats.append(st)
      stats = jax.tree.map(lambda a, b: (a + b) / 2, *stats)
      stats = {**stats, **embedding_health(out1["z"], out2["z"])}
      return forward.regularised(
          addons.dicr, loss, stats, bs, encoder, params, state.step, (out1, out2), x.regions
      )

    loss, batch_stats, stats, grads = forward.value_and_grad(loss_fn, state.params)
    updates = forward.momentum_updates(batch_stats, target_params, target_bs)
    return loss, grads, updates, {**stats, "tau": tau}

  return objective


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.base_momentum = 0.99  # tau_base of the cosine target-momentum schedule
  return block


METHOD = Method(
    "byol",
    make_objective,
    target=True,
    predictor=True,
    addons=("nonsemantic", "ft", "dicr"),
    block="byol",
    defaults=defaults,
    check=lambda c: number(c, "byol.base_momentum", 0.0, 1.0),
    config_file="configs/byol.py",
)
