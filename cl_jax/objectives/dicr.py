"""The DICR term of the objectives (2025 submission "Direct intra-image contrastive
regularisation", Eq. 8): L = L_SSL + lambda L_DICR, on the online network's feature maps of
both views, with the DIRR and ICR variants of Sec. 4.2 (cl_jax.addons.dicr)."""

from typing import Callable

import jax
import ml_collections

from cl_jax.addons import dicr


def make_regulariser(
    config: ml_collections.ConfigDict, encoder, steps_per_epoch: int
) -> Callable | None:
  """None without DICR (config.dicr.enabled False), else
  regularise(params, batch_stats, step, out1, out2, regions) -> (lambda L_DICR, batch_stats,
  stats) for the online outputs out1, out2 of the two views (with feature_map and pooled).

  lambda follows dicr.dicr_weight; ICR projects the four regions' representations through the
  encoder's region head (train-mode batch norm, whose statistics come back in batch_stats).
  stats: dicr_loss's, and dicr/weight (lambda).
  """
  cfg = config.dicr
  if not cfg.enabled:
    return None
  epsilon = dicr.epsilon_fraction(cfg, config.data.image_size)
  positive = cfg.dirr_similarity if cfg.variant == "dirr" else None

  def regularise(params, batch_stats, step: jax.Array, out1: dict, out2: dict, regions):
    h = dicr.stacked_regions(out1, out2, regions, epsilon)  # (B, 4, C)
    if cfg.variant == "icr":
      b, r, c = h.shape
      z, mutated = encoder.apply(
          {"params": params, "batch_stats": batch_stats},
          h.reshape(b * r, c),
          train=True,
          method="project_regions",
          mutable=["batch_stats"],
      )
      h, batch_stats = z.reshape(b, r, -1), mutated["batch_stats"]
    loss, stats = dicr.dicr_loss(h, regions.areas, epsilon, cfg.temperature, positive)
    weight = dicr.dicr_weight(step, steps_per_epoch, cfg)
    return weight * loss, batch_stats, {**stats, "dicr/weight": weight}

  return regularise
