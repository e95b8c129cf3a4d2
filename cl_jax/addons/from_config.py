"""The one place that maps a config to its add-ons, and the loss of a contrast under them.

Each enabled block becomes the add-on's record of plain scalars (its build); the objectives
compose them with their method's contrast (cl_jax.objectives). Which combinations the maths
allows is decided by the config check (cl_jax.addons.check, with each method's entry); this
module reads what it allowed.
"""

from typing import NamedTuple

import jax
import ml_collections

from cl_jax.addons import ADDONS
from cl_jax.addons.dicr import DICR
from cl_jax.addons.feature_transform_contrast import FeatureTransform
from cl_jax.addons.hcl import HardNegativeSampling
from cl_jax.addons.ifm import IFM
from cl_jax.addons.nonsemantic import NonSemantic
from cl_jax.losses.contrast import Contrast, contrast_stats, info_nce
from cl_jax.losses.hard_negatives import hcl_loss


class AddOns(NamedTuple):
  """The add-ons of a run, one field per entry of cl_jax.addons.ADDONS; None for those
  switched off."""

  nonsemantic: NonSemantic | None = None
  ft: FeatureTransform | None = None
  ifm: IFM | None = None
  hcl: HardNegativeSampling | None = None
  dicr: DICR | None = None

  def contrast_loss(self, contrast: Contrast, temperature: float) -> jax.Array:
    """The loss of a contrast: InfoNCE (cl_jax.losses.contrast.info_nce), or hard-negative
    sampling's estimator (cl_jax.losses.hard_negatives.hcl_loss); with IFM, (L + alpha
    L_eps) / 2 of that loss (Robinson et al. 2021, Eq. 2)."""
    if self.hcl is not None:
      loss_of = lambda c: hcl_loss(c, temperature, self.hcl.beta, self.hcl.tau_plus)
    else:
      loss_of = lambda c: info_nce(c, temperature)
    if self.ifm is not None:
      return self.ifm.loss(loss_of, contrast, temperature)
    return loss_of(contrast)

  def contrast_step(
      self, contrast: Contrast, anchors: jax.Array, t: jax.Array | None, temperature: float,
      rows: int
  ) -> tuple[jax.Array, dict]:  # fmt: skip
    """(loss, stats) of a method's contrast of its N anchors under the add-ons: each anchor's
    NS negatives appended when t is given (NonSemantic.negatives, Ge et al. 2021, Eq. 1),
    then contrast_loss; stats: cl_jax.losses.contrast.contrast_stats over the first `rows`
    anchors.

    Args:
      contrast: the method's contrast of the anchors (after any feature transformation).
      anchors: (N, d) the anchors its similarities come from.
      t: (N, M, d) unit NS features of each anchor's own view, or None.
      temperature: T.
      rows: the anchors the statistics cover.
    """
    if t is not None:
      contrast = self.nonsemantic.negatives(contrast, anchors, t, temperature)
    return self.contrast_loss(contrast, temperature), contrast_stats(contrast, rows)

  def extrapolates_pairs(self) -> bool:
    """Whether the feature transformation touches the positive pairs."""
    return self.ft is not None and self.ft.positive_extrapolation

  def on_pairs(self, pairs: list, rng: jax.Array, step: jax.Array) -> list:
    """The positive pairs [(a, b), ...] of a method without negatives, each (B, d), after
    positive extrapolation (Zhu et al. 2021, App. E.2; FeatureTransform.on_pairs), or as
    they are without it."""
    if not self.extrapolates_pairs():
      return pairs
    return self.ft.on_pairs(pairs, rng, self.ft.active(step))


def from_config(config: ml_collections.ConfigDict, steps_per_epoch: int) -> AddOns:
  """The AddOns of a (checked) config; steps_per_epoch places ft.start_epoch and DICR's
  warm-up on the step axis."""
  return AddOns(
      **{
          name: addon.build(config, steps_per_epoch) if config[name].enabled else None
          for name, addon in ADDONS.items()
      }
  )
