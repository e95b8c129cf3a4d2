"""Direct intra-image contrastive regularisation, DICR (2025 submission, Sec. 3.2), and its
variants DIRR and ICR (Sec. 4.2).

Each positive pair (v1, v2) of an image splits into four regions: the crops' overlap o_i and the
rest n_i of each view. With the encoder's feature map f_i (h, w, C) before pooling and its mean
h_i (the representation, Eq. 1):

  h_{o_i} = RoIAlign_{o_i}(f_i)                                  (Eq. 6)
  h_{n_i} = (S_{v_i} h_i - S_{o_i} h_{o_i}) / S_{n_i}            (Eq. 3 solved for h_n)
  L_DICR  = -tau log exp(sim(o1, o2) / tau)
                     / (exp(sim(o1, o2) / tau) + sum_{{x,y} != {o1,o2}} exp(sim(x, y) / tau))
                                                                 (Eq. 5)

The pairs {x, y} of the denominator are the five other pairs of the four regions: {o1, n1},
{o1, n2}, {n1, o2}, {n1, n2}, {o2, n2}. sim follows the area rules of Eq. 7: cosine when both
areas are at least epsilon, 1 when both are below, 0 when exactly one is. So fully overlapping
views attract (n1 = n2 = null), disjoint views repel ({n1, n2} is then the pair of whole views),
and a view v_i inside v_j attracts o and repels {o_i, n_j} and {o_j, n_j}.

Variants: DIRR replaces sim(o1, o2) by a constant s; ICR first maps every region's
representation through a projector of its own (the encoder's region head).
"""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from cl_jax.addons.addon import record
from cl_jax.addons.dicr_regions import overlap_in_views, roi_mean
from cl_jax.models.heads import l2_normalize
from cl_jax.runtime.config_fields import choice, get, integer, number

# Its entry's members (cl_jax.addons).
BLOCK = "dicr"
TITLE = "DICR"
NEEDS = "it regularises the feature maps of both views through the online network"

VARIANTS = ("dicr", "dirr", "icr")
# The four regions in the order of region_representations, and the pairs of Eq. 5.
REGIONS = ("o1", "n1", "o2", "n2")
POSITIVE = (0, 2)
NEGATIVES = ((0, 1), (0, 3), (1, 2), (1, 3), (2, 3))


class Regions(NamedTuple):
  """The overlap of the two views of each image, from the host's crop boxes and flips.

  o1, o2: (B, 4) float32 overlap [y0, x0, y1, x1] in view 1's / view 2's [0, 1] coordinates.
  areas: (B, 4) float32 areas of (o1, n1, o2, n2) as fractions of their view's area (S_v = 1).
  """

  o1: jax.Array
  o2: jax.Array
  areas: jax.Array


def regions_of(batch: dict) -> Regions:
  """The Regions of a host batch (box1, flip1, box2, flip2 as made by cl_jax.data.pipeline).

  S_{o_i} = |o| / |box_i|, the overlap's share of crop i (and of view i), and S_{n_i} = 1 - S_{o_i}.
  """
  o1, o2, overlap = overlap_in_views(batch["box1"], batch["flip1"], batch["box2"], batch["flip2"])

  def crop_area(box):
    box = jnp.asarray(box, jnp.float32)
    return (box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1])

  s_o1 = jnp.minimum(overlap / crop_area(batch["box1"]), 1.0)
  s_o2 = jnp.minimum(overlap / crop_area(batch["box2"]), 1.0)
  return Regions(o1, o2, jnp.stack([s_o1, 1.0 - s_o1, s_o2, 1.0 - s_o2], axis=1))


def epsilon_fraction(epsilon_area: float, image_size: int) -> float:
  """Eq. 7's threshold as a fraction of the view: epsilon_area (view pixels) / S^2."""
  return epsilon_area / float(image_size * image_size)


def region_representations(
    feature_map: jax.Array,
    pooled: jax.Array,
    region: jax.Array,
    s_o: jax.Array,
    epsilon: float,
) -> tuple[jax.Array, jax.Array]:
  """(h_o, h_n) of one view's overlap and non-overlap regions (Eqs. 6 and 3).

  h_o is RoIAlign's mean over the region with as many bilinear samples per side as the map has
  cells (roi_mean); h_n = (S_v h - S_o h_o) / S_n with S_v = 1, S_n = 1 - S_o. Where
  S_n < epsilon the non-overlap region is null and h_n is set to h (Eq. 7 then fixes its
  similarities, so it only has to stay finite).

  Args:
    feature_map: (B, h, w, C) the backbone's map before pooling.
    pooled: (B, C) its spatial mean, the representation h.
    region: (B, 4) the overlap in this view's [0, 1] coordinates.
    s_o: (B,) the overlap's area as a fraction of the view.
    epsilon: the null-region area threshold as a fraction of the view.

  Returns:
    h_o, h_n: (B, C) float32.
  """
  samples = max(feature_map.shape[1:3])
  h_o = jax.vmap(lambda f, r: roi_mean(f, r, samples))(feature_map, region)
  h = pooled.astype(jnp.float32)
  s_n = 1.0 - s_o
  present = (s_n >= epsilon)[:, None]
  h_n = (h - s_o[:, None] * h_o) / jnp.where(present, s_n[:, None], 1.0)
  return h_o, jnp.where(present, h_n, h)


def similarity(
    h_x: jax.Array, h_y: jax.Array, s_x: jax.Array, s_y: jax.Array, epsilon: float
) -> jax.Array:
  """sim(h_x, h_y) of Eq. 7: cos(h_x, h_y) if S_x, S_y >= epsilon; 1 if both are below; else 0.

  Args:
    h_x, h_y: (B, C) region representations.
    s_x, s_y: (B,) their areas.

  Returns:
    (B,) float32; its gradient is zero where a rule replaces the cosine.
  """
  big_x, big_y = s_x >= epsilon, s_y >= epsilon
  cos = jnp.sum(l2_normalize(h_x) * l2_normalize(h_y), axis=-1)
  return jnp.where(big_x & big_y, cos, jnp.where(big_x | big_y, 0.0, 1.0))


def dicr_loss(
    h: jax.Array,
    areas: jax.Array,
    epsilon: float,
    temperature: float,
    constant_positive: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """L_DICR of Eq. 5, averaged over the batch.

  Args:
    h: (B, 4, C) representations of the regions (o1, n1, o2, n2) (or ICR's projections).
    areas: (B, 4) their areas as fractions of the view (Regions.areas).
    epsilon: Eq. 7's area threshold, same unit.
    temperature: tau.
    constant_positive: DIRR's s in place of sim(h_o1, h_o2); None for DICR.

  Returns:
    (loss, stats): dicr/loss (the unweighted mean), dicr/pos_sim (mean positive similarity),
    dicr/neg_sim (mean of the five other pairs' similarities), dicr/null_regions (mean number
    of null regions per image), float32 scalars.
  """

  def sim(pair):
    x, y = pair
    return similarity(h[:, x], h[:, y], areas[:, x], areas[:, y], epsilon)

  positive = sim(POSITIVE)
  if constant_positive is not None:
    positive = jnp.full_like(positive, constant_positive)
  negatives = jnp.stack([sim(pair) for pair in NEGATIVES], axis=1)  # (B, 5)
  logits = jnp.concatenate([positive[:, None], negatives], axis=1) / temperature
  per_image = -temperature * (logits[:, 0] - jax.nn.logsumexp(logits, axis=1))
  loss = jnp.mean(per_image)
  stats = {
      "dicr/loss": loss,
      "dicr/pos_sim": jnp.mean(positive),
      "dicr/neg_sim": jnp.mean(negatives),
      "dicr/null_regions": jnp.mean(jnp.sum(areas < epsilon, axis=1).astype(jnp.float32)),
  }
  return loss, stats


def dicr_weight(
    step: jax.Array, steps_per_epoch: int, weight: float, warmup_epochs: int
) -> jax.Array:
  """lambda of Eq. 8 at `step`: 0 in epoch 0, raised linearly once per epoch to `weight` at
  epoch `warmup_epochs` and kept there; warmup_epochs = 0 gives `weight` throughout.
  """
  if warmup_epochs == 0:
    return jnp.float32(weight)
  epoch = (step // steps_per_epoch).astype(jnp.float32)
  return weight * jnp.minimum(epoch / warmup_epochs, 1.0)


def stacked_regions(out1: dict, out2: dict, regions: Regions, epsilon: float) -> jax.Array:
  """The representations of the four regions of each view pair (Eqs. 3 and 6).

  Args:
    out1, out2: encoder outputs of view 1 and view 2 with feature_map (B, h, w, C) and
      pooled (B, C).
    regions: the pairs' Regions.
    epsilon: Eq. 7's threshold as a fraction of the view (epsilon_fraction).

  Returns:
    (B, 4, C) float32 h_{o1}, h_{n1}, h_{o2}, h_{n2} (REGIONS order), dicr_loss's input.
  """
  h_o1, h_n1 = region_representations(
      out1["feature_map"], out1["pooled"], regions.o1, regions.areas[:, 0], epsilon
  )
  h_o2, h_n2 = region_representations(
      out2["feature_map"], out2["pooled"], regions.o2, regions.areas[:, 2], epsilon
  )
  return jnp.stack([h_o1, h_n1, h_o2, h_n2], axis=1)


@dataclasses.dataclass(frozen=True)
class DICR:
  """The DICR term of a run (the `dicr` config block): L = L_SSL + lambda L_DICR (Eq. 8).

  variant: "dicr", "dirr" (sim(o1, o2) replaced by dirr_similarity) or "icr" (regions
    projected by the encoder's region head first).
  weight, warmup_epochs, steps_per_epoch: lambda's schedule, dicr_weight.
  temperature: tau of Eq. 5.
  epsilon: Eq. 7's threshold as a fraction of the view (epsilon_fraction).
  """

  variant: str
  weight: float
  warmup_epochs: int
  steps_per_epoch: int
  temperature: float
  epsilon: float
  dirr_similarity: float

  def regularise(
      self, encoder, params, batch_stats, step: jax.Array, out1: dict, out2: dict, regions
  ):
    """(lambda L_DICR, batch_stats, stats) of the online outputs out1, out2 of the two views
    (with feature_map and pooled) and their Regions.

    ICR's projection runs in train-mode batch norm, whose statistics come back in
    batch_stats. stats: dicr_loss's, and dicr/weight (lambda).
    """
    h = stacked_regions(out1, out2, regions, self.epsilon)  # (B, 4, C)
    if self.variant == "icr":
      b, r, c = h.shape
      z, mutated = encoder.apply(
          {"params": params, "batch_stats": batch_stats},
          h.reshape(b * r, c),
          train=True,
          method="project_regions",
          mutable=["batch_stats"],
      )
      h, batch_stats = z.reshape(b, r, -1), mutated["batch_stats"]
    positive = self.dirr_similarity if self.variant == "dirr" else None
    loss, stats = dicr_loss(h, regions.areas, self.epsilon, self.temperature, positive)
    weight = dicr_weight(step, self.steps_per_epoch, self.weight, self.warmup_epochs)
    return weight * loss, batch_stats, {**stats, "dicr/weight": weight}


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """L = L_SSL + lambda L_DICR over the regions of the two views' overlap (Sec. 3.2). The
  weight and temperature are the paper's final lambda and tau for MoCo (the method configs
  set theirs)."""
  block = ml_collections.ConfigDict()
  block.enabled = False
  block.variant = "dicr"  # dicr | dirr (constant positive similarity) | icr (projected regions)
  block.weight = 10.0  # final lambda of Eq. 8
  # lambda = weight x min(epoch / warmup_epochs, 1), raised once per epoch from 0 (0: constant);
  # by default it reaches the final weight in the run's last epoch.
  block.warmup_epochs = config.optim.get_ref("epochs") - 1
  block.temperature = 0.02  # tau of Eq. 5
  block.epsilon_area = 4.0  # Eq. 7's null-region threshold in view pixels (2 x 2 at 32 px)
  block.dirr_similarity = 0.8  # DIRR's constant s in place of sim(h_o1, h_o2)
  block.icr_layers = 1  # ICR's projector: 1 linear layer (ICR^1) or an MLP of that many layers
  return block


def check(c, method, reads_data: bool) -> None:
  del method, reads_data
  size = get(c, "data.image_size")
  variant = choice(c, "dicr.variant", VARIANTS)
  number(c, "dicr.weight", 0.0, None, lo_open=True)
  integer(c, "dicr.warmup_epochs", 0, integer(c, "optim.epochs", 1))
  number(c, "dicr.temperature", 0.0, None, lo_open=True)
  number(c, "dicr.epsilon_area", 0.0, float(size * size))
  if variant == "dirr":
    number(c, "dicr.dirr_similarity", -1.0, 1.0)
  if variant == "icr":
    integer(c, "dicr.icr_layers", 1)


def describe(c) -> str:
  d = c.dicr
  variant = {"dicr": "DICR", "dirr": f"DIRR, s {d.dirr_similarity}"}.get(
      d.variant, f"ICR, {d.icr_layers}-layer projector"
  )
  return (
      f"intra-image regularisation ({variant}, lambda {d.weight} reached at epoch "
      f"{d.warmup_epochs}, tau {d.temperature}, epsilon {d.epsilon_area} px)"
  )


def build(c, steps_per_epoch: int):
  return record(
      DICR,
      c.dicr,
      steps_per_epoch=steps_per_epoch,
      epsilon=epsilon_fraction(c.dicr.epsilon_area, c.data.image_size),
  )
