"""The SimSiam step (Chen & He 2021, Alg. 1), with positive extrapolation (Zhu et al. 2021,
App. E.2): L = D(p1, sg(z2))/2 + D(p2, sg(z1))/2, one network, no target, no negatives."""

import ml_collections
from jax.sharding import Mesh

from cl_jax.addons.from_config import AddOns
from cl_jax.losses import simsiam
from cl_jax.objectives import forward
from cl_jax.objectives.forward import Views
from cl_jax.objectives.method import Method
from cl_jax.state import TrainState


def make_objective(
    config: ml_collections.ConfigDict, encoder, mesh: Mesh, addons: AddOns, steps_per_epoch: int
):
  """objective(state, views) -> (loss, grads, {"batch_stats"}, stats) of one step.

  With DICR the loss adds lambda L_DICR of the two views. stats: pos_mean and
  cl_jax.objectives.health.embedding_health of the projections z1, z2 (not the
  predictions), before any extrapolation.
  """
  del config, mesh, steps_per_epoch
  extrapolate = addons.extrapolates_pairs()

  def objective(state: TrainState, x: Views):
    def loss_of(out1, out2):
      p1, z1, p2, z2 = out1["p"], out1["z"], out2["p"], out2["z"]
      (p1, z2), (p2, z1) = addons.on_pairs([(p1, z2), (p2, z1)], x.r_ft, state.step)
      return simsiam.simsiam_loss(p1, p2, z1, z2, stop_gradient=not extrapolate)

    return forward.two_view_step(encoder, addons, state, x, loss_of, predict=True)

  return objective


METHOD = Method(
    "simsiam",
    make_objective,
    predictor=True,
    addons=("ft", "dicr"),
    config_file="configs/simsiam.py",
)
