"""The Barlow Twins step (Zbontar et al. 2021, Algorithm 1): one network, both views, the
cross-correlation loss of their projections over the global batch
(cl_jax.losses.barlow_twins), with DICR (2025 submission, Eq. 8: L_SSL + lambda L_DICR).

The other add-ons are not defined for it: it has no negatives (non-semantic negatives, IFM,
hard-negative sampling, transformed negatives) and no stopped target that positive
extrapolation mixes (Zhu et al. 2021, App. E.2).
"""

import jax
import ml_collections
from jax.sharding import Mesh

from cl_jax.addons.from_config import AddOns
from cl_jax.losses import barlow_twins
from cl_jax.objectives import forward
from cl_jax.objectives.forward import Views
from cl_jax.objectives.method import Method
from cl_jax.runtime.config_fields import number
from cl_jax.state import TrainState


def make_objective(
    config: ml_collections.ConfigDict, encoder, mesh: Mesh, addons: AddOns, steps_per_epoch: int
):
  """objective(state, views) -> (loss, grads, {"batch_stats"}, stats) of one step: L_BT of the
  two views' projections (not normalised), plus lambda L_DICR with DICR. stats: the loss's
  and the embedding health of the unit projections z1, z2."""
  del mesh, steps_per_epoch

  weight = config.barlow_twins.off_diagonal_weight

  def objective(state: TrainState, x: Views):
    def loss_of(out1, out2):
      # Its (d, d) sums over the global batch are one all-reduce, named for the compile report.
      with jax.named_scope("global_batch_loss"):
        return barlow_twins.barlow_twins_loss(out1["projection"], out2["projection"], weight)

    return forward.two_view_step(encoder, addons, state, x, loss_of)

  return objective


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.off_diagonal_weight = 5e-3  # lambda of Eq. 1 (Sec. 4, "Loss function coefficient")
  return block


METHOD = Method(
    "barlow_twins",
    make_objective,
    addons=("dicr",),
    block="barlow_twins",
    defaults=defaults,
    check=lambda c: number(c, "barlow_twins.off_diagonal_weight", 0.0, None),
    config_file="configs/barlow_twins.py",
)
