"""The one place that maps a config to its add-ons, and the loss of a contrast under them.

Each enabled block becomes the add-on's record of plain scalars; the objectives
compose them with their method's contrast (cl_jax.objectives). Which
combinations the maths allows is decided by cl_jax.config_check alone; this
module reads what it allowed.
"""

import dataclasses
from typing import NamedTuple

import jax
import ml_collections

from cl_jax.addons.dicr import DICR, epsilon_fraction
from cl_jax.addons.feature_transform_contrast import FeatureTransform
from cl_jax.addons.ifm import IFM
from cl_jax.addons.nonsemantic import NonSemantic
from cl_jax.losses.contrast import Contrast, info_nce
from cl_jax.losses.hard_negatives import hcl_loss


@dataclasses.dataclass(frozen=True)
class HardNegativeSampling:
  """Hard-negative sampling in place of InfoNCE's negative term (the `hcl` block; SimCLR)."""

  beta: float
  tau_plus: float


class AddOns(NamedTuple):
  """The add-ons of a run; None (or no views) for those switched off.

  looc_views: LooC's atomic augmentations, each with its own head and key view
    (Xiao et al. 2021, Sec. 3); () for LooC's head 0 alone; None without LooC.
  """

  nonsemantic: NonSemantic | None = None
  ft: FeatureTransform | None = None
  ifm: IFM | None = None
  hcl: HardNegativeSampling | None = None
  dicr: DICR | None = None
  looc_views: tuple[str, ...] | None = None

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

  def extrapolates_pairs(self) -> bool:
    """Whether the feature transformation touches the positive pairs."""
    return self.ft is not None and self.ft.positive_extrapolation


def looc_augmentations(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The atomic augmentations with their own LooC head and key view (none without LooC)."""
  return tuple(config.looc.augmentations) if config.looc.enabled else ()


def _record(cls, block: ml_collections.ConfigDict, **derived):
  """An add-on record whose fields are the config block's fields of the same names, except
  those given in `derived` (fields the config states in other units)."""
  names = [f.name for f in dataclasses.fields(cls) if f.name not in derived]
  return cls(**{name: block[name] for name in names}, **derived)


def from_config(config: ml_collections.ConfigDict, steps_per_epoch: int) -> AddOns:
  """The AddOns of a (checked) config; steps_per_epoch places ft.start_epoch and DICR's
  warm-up on the step axis."""
  ns, ft, ifm, hcl, dicr = (config[b] for b in ("nonsemantic", "ft", "ifm", "hcl", "dicr"))
  epsilon = epsilon_fraction(dicr.epsilon_area, config.data.image_size)
  return AddOns(
      nonsemantic=_record(NonSemantic, ns) if ns.enabled else None,
      ft=_record(FeatureTransform, ft, start_step=ft.start_epoch * steps_per_epoch)
      if ft.enabled
      else None,
      ifm=_record(IFM, ifm) if ifm.enabled else None,
      hcl=_record(HardNegativeSampling, hcl) if hcl.enabled else None,
      dicr=_record(DICR, dicr, steps_per_epoch=steps_per_epoch, epsilon=epsilon)
      if dicr.enabled
      else None,
      looc_views=tuple(config.looc.augmentations) if config.looc.enabled else None,
  )
