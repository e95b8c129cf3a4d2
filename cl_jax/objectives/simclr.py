"""The SimCLR step (Chen et al. 2020, Alg. 1): one network, both views, NT-Xent over the
global batch, composed with the run's add-ons (NS negatives, FT, IFM, hard-negative
sampling, DICR).

Each view goes through the encoder in its own forward, so batch-norm statistics
are those of one view's global batch (as for MoCo's queries); concatenating the
views would move every image of one view to other devices.
"""

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax.addons.from_config import AddOns
from cl_jax.losses import simclr
from cl_jax.objectives import forward
from cl_jax.objectives.forward import Views
from cl_jax.objectives.method import Method
from cl_jax.runtime.config_fields import number
from cl_jax.state import TrainState


def batch_loss(
    z1: jax.Array,
    z2: jax.Array,
    t: jax.Array | None,
    addons: AddOns,
    temperature: float,
    rng: jax.Array,
    step: jax.Array,
    score_queries: int = 0,
) -> tuple[jax.Array, dict]:
  """NT-Xent of the global batch with the run's add-ons, and its statistics.

  1. the contrast of the anchors u = [z1; z2] against each other (losses.simclr.
     pair_contrast), or with the feature transformation, of the extrapolated pairs against
     the mixed negatives (Zhu et al. 2021, Sec. 4, App. E.1; FeatureTransform.on_batch);
  2. non-semantic negatives: each anchor's NS features appended (Ge et al. 2021, Eq. 1);
  3. the contrast's loss: InfoNCE, hard-negative sampling's estimator (Robinson, Chuang,
     Sra & Jegelka 2021), and with IFM (L + alpha L_eps) / 2 (AddOns.contrast_loss).
  With every add-on off, the loss is simclr.nt_xent_loss(z1, z2, T)'s, bit for bit.

  Args:
    z1, z2: (B, d) unit projections of the two views, both with gradient.
    t: (2B, M, d) unit NS features of each anchor's own view, anchor order
      [view-1 anchors; view-2 anchors], no gradient; None without NS negatives.
    addons: the run's add-ons.
    temperature: T.
    rng: PRNG key of the feature transformation's coefficients and permutation.
    step: () the step (the transformation's start).
    score_queries: n with 0 < n < B takes the statistics over the first n view-1 anchors;
      0, or n >= B, over all 2B anchors.

  Returns:
    (loss, stats): contrast_stats on the transformed features (over each anchor's
    negatives, the union's 2(2B - 2) when on; ns_mean with NS).
  """
  bsz = z1.shape[0]
  if addons.ft is not None:
    anchors, c = addons.ft.on_batch(z1, z2, rng, jnp.asarray(addons.ft.active(step)))
  else:
    anchors, c = simclr.pair_contrast(z1, z2)
  rows = score_queries if 0 < score_queries < bsz else 2 * bsz
  return addons.contrast_step(c, anchors, t, temperature, rows)


def make_objective(
    config: ml_collections.ConfigDict, encoder, mesh: Mesh, addons: AddOns, steps_per_epoch: int
):
  """objective(state, views) -> (loss, grads, {"batch_stats"}, stats) of one SimCLR step.

  stats: batch_loss's and cl_jax.objectives.health.embedding_health of the two views'
  projections z1, z2, before any feature transformation. With DICR the loss adds lambda
  L_DICR of the two views.

  Non-semantic negatives (Ge et al. 2021, Eq. 1) are the online network's features of each
  view's NS images, without gradient (they play the part of MoCo's NS keys).
  """
  del mesh, steps_per_epoch

  ns = addons.nonsemantic

  def objective(state: TrainState, x: Views):
    t = None
    if ns is not None:  # (2B, M, d), the anchors' order
      t = jnp.concatenate(
          forward.ns_keys(
              encoder, state.params, state.batch_stats, [x.v1, x.v2], x, ns, shuffle=None
          )
      )

    def loss_of(out1, out2):
      with jax.named_scope("batch_contrast"):  # names its collectives in the compiled program
        return batch_loss(
            out1["z"],
            out2["z"],
            t,
            addons,
            config.simclr.temperature,
            x.r_ft,
            state.step,
            config.train.score_queries,
        )

    return forward.two_view_step(encoder, addons, state, x, loss_of)

  return objective


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.temperature = 0.5
  return block


METHOD = Method(
    "simclr",
    make_objective,
    negatives="batch",
    addons=("hcl", "nonsemantic", "ft", "ifm", "dicr"),
    block="simclr",
    defaults=defaults,
    check=lambda c: number(c, "simclr.temperature", 0.0, None, lo_open=True),
    config_file="configs/simclr.py",
)
