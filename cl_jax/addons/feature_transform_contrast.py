"""Feature transformation as a transform of each method's contrast (Zhu et al. 2021, Sec. 4,
App. E, G), from the mixing of cl_jax.addons.feature_transform.

  MoCo (on_queue): q, k extrapolated (Eq. 3); negatives the queue mixed with itself
    (Eq. 5, Eq. 7) or each query's hard negatives (App. G.2, Eq. 8), or the union
    of the plain and the transformed queue (Sec. 4.3).
  SimCLR (on_batch): the pairs extrapolated; negatives the in-batch features mixed
    with a permutation of themselves, or their union with the plain ones.
  BYOL, SimSiam (on_pairs): positive extrapolation only (App. E.2).

Before the start step every output equals its input exactly (selects on the
outputs, so re-normalisation cannot move them by an ulp), and the loss is that of
the plain method.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cl_jax.addons import feature_transform as ft_math
from cl_jax.addons.addon import record
from cl_jax.losses import memory_queue as queue_lib
from cl_jax.losses import queue_contrast, simclr
from cl_jax.losses.contrast import Contrast
from cl_jax.losses.moco import NegativeSet
from cl_jax.runtime import parallel
from cl_jax.runtime.config_fields import boolean, choice, fail, integer, number

# Its entry's members (cl_jax.addons).
BLOCK = "ft"
TITLE = "feature transformation"
NEEDS = "it transforms the features of positive pairs and negatives"


def _hard_scores(
    lam: jax.Array, active: jax.Array | bool, renormalize: bool, unit_queries: bool
) -> queue_contrast.ScoreFn:
  """Score function (for queue_terms) of the hard negatives of App. G.2:

    h_ij = lam q_i + (1 - lam) n_j,    s_ij = q_i . h_ij  (or q_i . h_ij / |h_ij|),   (Eq. 8)

  lam = Beta(a, b), a scalar, a (d,) vector or one (d,) vector per query. Each
  score comes from the (B, K/S) score block of the gathered queries and the
  device's queue shard, never from the (B, K/S, d) tensor of h_ij. The gradient
  flows through q_i in both the query and the hard negative. With unit queries
  and a scalar lam, the scores follow from q_i . n_j alone; otherwise (dimension-
  level lam, or queries that positive extrapolation left off the unit sphere)
  from the exact form for any norm. The form from q_i . n_j drops the radial part
  of dL/dq_i (the d|q_i|^2 / dq_i terms), which an l2-normalising head removes
  anyway. While inactive the scores are q_i . n_j, those of the plain contrast.

  Args:
    lam: scalar, (d,) or (B, d) float32 coefficient.
    active: bool scalar, False before the transformation's start step.
    renormalize: score against h_ij / |h_ij| (App. F.2).
    unit_queries: the queries are unit vectors (as are the queued keys).

  Returns:
    scores(q_all (B, d), queue_shard (K/S, d)) -> (B, K/S).
  """

  def hard(q_all, queue_shard):
    if jnp.ndim(lam) == 0 and unit_queries:
      return ft_math.hard_negative_scores_from_similarity(
          queue_contrast.dot_scores(q_all, queue_shard), lam, renormalize
      )
    return ft_math.hard_negative_scores(q_all, queue_shard, lam, renormalize)

  def plain(q_all, queue_shard):
    return queue_contrast.dot_scores(q_all, queue_shard)

  return lambda q_all, queue_shard: jax.lax.cond(active, hard, plain, q_all, queue_shard)


def mix_slots(
    queue: jax.Array, slot_order: jax.Array, mix, mesh: Mesh, keys_per_step: int, renormalize: bool
) -> jax.Array:
  """Feature-transformed copy of the queue: every key mixed with a partner key.

  Key i of ring slot t is mixed with key i of slot slot_order[t] by
  cl_jax.addons.feature_transform.negative_interpolation (Zhu et al. 2021,
  Eq. 5): mu * n + (1 - mu) * n_partner. Pairing keys of the same batch row
  across a random permutation of the K / P slots keeps each pair inside one
  shard, so every device mixes its own rows, and gives the same pairs for any
  number of devices. The stored queue is not changed.

  Args:
    queue: (K, d) queue in the S-shard layout, rows sharded over `data`.
    slot_order: (K / P,) int permutation of the slots.
    mix: scalar, (d,) or (K, d) coefficient mu; a (K, d) mu is in ring order (row r
      mixes the key at ring position r, so the mixed keys do not depend on the
      number of devices) and is moved to the queue's layout here.
    mesh: the device mesh (S devices on `data`).
    keys_per_step: P.
    renormalize: project the mixed keys back to unit length.

  Returns:
    (K, d) mixed negatives, sharded like `queue`.
  """
  shards = mesh.shape[parallel.DATA_AXIS]
  queue_lib.check_layout(queue.shape[0], keys_per_step, shards)
  local = keys_per_step // shards
  partner = (slot_order[:, None] * local + jnp.arange(local)[None, :]).reshape(-1)

  def per_shard(rows, partner, mix):
    return ft_math.negative_interpolation(rows, partner, mix, renormalize)

  mix_spec = P()
  if jnp.ndim(mix) == 2:
    mix, mix_spec = queue_lib.to_sharded_layout(mix, shards, keys_per_step), P(parallel.DATA_AXIS)
  return jax.shard_map(
      per_shard,
      mesh=mesh,
      in_specs=(P(parallel.DATA_AXIS), P(), mix_spec),
      out_specs=P(parallel.DATA_AXIS),
  )(queue, partner, mix)


@dataclasses.dataclass(frozen=True)
class FeatureTransform:
  """The feature transformation of a run (the `ft` config block).

  positive_extrapolation: transform the positive pairs, with lam = 1 + Beta(alpha_ex,
    alpha_ex) (Eq. 3), or lam = Beta(alpha_ex, alpha_ex) with positive_interpolation.
  negative: "none", "interpolate" (mu = Beta(alpha_in, alpha_in), Eq. 5), "extrapolate"
    (mu = 1 + Beta(alpha_ex, alpha_ex), Eq. 7) or "hard" (lam = Beta(hard_a, hard_b),
    Eq. 8; MoCo only).
  union: the plain and the transformed negatives together (2K, Sec. 4.3).
  coefficients: "scalar", "dimension" or "sample_dimension" (feature_transform.coefficient_shape).
  renormalize: l2-normalise the transformed features (App. F.2).
  start_step: no transformation before this step.
  """

  positive_extrapolation: bool
  positive_interpolation: bool
  alpha_ex: float
  negative: str
  alpha_in: float
  hard_a: float
  hard_b: float
  union: bool
  coefficients: str
  renormalize: bool
  start_step: int

  def active(self, step: jax.Array) -> jax.Array:
    """() bool: the transformation is on at `step`."""
    return step >= self.start_step

  def _shape(self, rows: int, dim: int) -> tuple[int, ...]:
    return ft_math.coefficient_shape(self.coefficients, rows, dim)

  def _positive_lam(self, rng: jax.Array, rows: int, dim: int) -> jax.Array:
    return ft_math.positive_coefficient(
        rng, self.alpha_ex, self.positive_interpolation, self._shape(rows, dim)
    )

  def _negative_mu(self, rng: jax.Array, rows: int, dim: int) -> jax.Array:
    return ft_math.negative_coefficient(
        rng, self.negative, self.alpha_in, self.alpha_ex, self._shape(rows, dim)
    )

  def on_queue(
      self,
      q: jax.Array,
      k: jax.Array,
      queue: jax.Array,
      rng: jax.Array,
      active: jax.Array | bool,
      mesh: Mesh,
      keys_per_step: int,
  ) -> tuple[jax.Array, jax.Array, list[NegativeSet]]:
    """(q', k', negative sets) of MoCo's contrast (cl_jax.losses.moco.moco_contrast).

    q' = l q + (1 - l) k and k' = l k + (1 - l) q with positive extrapolation. The
    negatives: the queue with slots mixed (mix_slots, which respects the queue's
    sharding), or scored as each query's hard negatives; with union the plain queue
    first. Every similarity is then taken on the transformed features; the stored queue
    is never changed. Pass `active` on to moco_contrast as union_active, so that an
    inactive union keeps the plain set alone.

    Args:
      q: (B, d) queries with gradient; k: (B, d) keys without.
      queue: (K, d) queued keys, rows sharded over `data`.
      rng: PRNG key of the step's coefficients and slot permutation.
      active: () bool, False before the start step.
      mesh: the device mesh.
      keys_per_step: P of the queue layout (to mix whole slots).
    """
    r_pos, r_neg, r_perm = jax.random.split(rng, 3)
    (rows, dim), keys = q.shape, queue.shape[0]
    if self.positive_extrapolation:
      q_ex, k_ex = ft_math.positive_extrapolation(
          q, k, self._positive_lam(r_pos, rows, dim), self.renormalize
      )
      q, k = jnp.where(active, q_ex, q), jnp.where(active, k_ex, k)
    plain = (queue, None)
    if self.negative == "none":
      return q, k, [plain]
    if self.negative == "hard":
      lam = ft_math.sample_coefficient(r_neg, self.hard_a, self.hard_b, self._shape(rows, dim))
      unit_queries = self.renormalize or not self.positive_extrapolation
      transformed = (queue, _hard_scores(lam, active, self.renormalize, unit_queries))
    else:
      mu = self._negative_mu(r_neg, keys, dim)
      order = jax.random.permutation(r_perm, keys // keys_per_step)
      mixed = mix_slots(queue, order, mu, mesh, keys_per_step, self.renormalize)
      transformed = (jnp.where(active, mixed, queue), None)
    return q, k, ([plain, transformed] if self.union else [transformed])

  def on_batch(
      self, z1: jax.Array, z2: jax.Array, rng: jax.Array, active: jax.Array | bool
  ) -> tuple[jax.Array, Contrast]:
    """(anchors, contrast) of SimCLR's transformed contrast (App. E.1 applies FT to SimCLR).

    SimCLR's one network makes both views, so gradients flow through every transformed
    feature. Positives: each pair extrapolated, z1' = l z1 + (1 - l) z2 and z2' =
    l z2 + (1 - l) z1 (Eq. 3); anchors [z1'; z2']. Negatives are built from the original
    u = [z1; z2], not the extrapolated features: the in-batch negatives play the part of
    MoCo's queue, which holds the encoder's untransformed outputs and is only mixed with
    itself (Eq. 5), and Table 12 ablates the two transforms as separate modules.
    "interpolate" / "extrapolate": n = mu u + (1 - mu) u[perm], perm a fresh permutation
    of the 2B positions; anchor i's negatives are the n_k at k != i, p(i) (a mixed n_k may
    contain u_i or u_p(i), as Eq. 5 mixes any two entries); union: u_k and n_k there,
    2(2B - 2) negatives.

    While inactive the transformed features are replaced by the originals and the
    union's mixed set is masked out: the loss is the plain NT-Xent's bit for bit.

    Args:
      z1, z2: (B, d) unit projections of the two views.
      rng: PRNG key of the step's coefficients and permutation.
      active: () bool.

    Returns:
      ((2B, d) float32 anchors, Contrast with pos (2B,), batch (2B, 2B or 4B) and its mask).
    """
    r_pos, r_neg, r_perm = jax.random.split(rng, 3)
    z1, z2 = z1.astype(jnp.float32), z2.astype(jnp.float32)
    bsz, dim = z1.shape
    keep = lambda new, old: jnp.where(active, new, old)
    u = jnp.concatenate([z1, z2], axis=0)
    if self.positive_extrapolation:
      e1, e2 = ft_math.positive_extrapolation(
          z1, z2, self._positive_lam(r_pos, bsz, dim), self.renormalize
      )
      z1, z2 = keep(e1, z1), keep(e2, z2)
    anchors = jnp.concatenate([z1, z2], axis=0)
    pos, mask = simclr.positives(z1, z2), simclr.negative_mask(bsz)
    if self.negative == "none":
      return anchors, simclr.batch_contrast(anchors, pos, [u], [mask])
    mu = self._negative_mu(r_neg, 2 * bsz, dim)
    perm = jax.random.permutation(r_perm, 2 * bsz)
    mixed = ft_math.negative_interpolation(u, perm, mu, self.renormalize)
    if not self.union:
      return anchors, simclr.batch_contrast(anchors, pos, [keep(mixed, u)], [mask])
    return anchors, simclr.batch_contrast(anchors, pos, [u, mixed], [mask, mask & active])

  def on_pairs(
      self, pairs: list[tuple[jax.Array, jax.Array]], rng: jax.Array, active: jax.Array | bool
  ) -> list[tuple[jax.Array, jax.Array]]:
    """(p', z') of each (prediction, target) pair of BYOL or SimSiam, Eq. 3 on unit vectors.

    p' = l p^ + (1 - l) z^ and z' = l z^ + (1 - l) p^ (feature_transform.
    siamese_positive_extrapolation), l drawn per pair. The target z is stopped before
    the mixing and z' is not stopped after it, so the gradient reaches p through both
    (the loss must not stop z' again). While inactive the pairs come back as (p,
    stop_gradient(z)), the untransformed loss's inputs (to float32 rounding: XLA may
    fuse the selection differently from the plain graph).

    Args:
      pairs: [(p (B, d), z (B, d))], online predictions and target projections.
      rng: PRNG key of the step's coefficients.
      active: () bool.
    """
    out = []
    for i, (p, z) in enumerate(pairs):
      z = jax.lax.stop_gradient(z)
      lam = self._positive_lam(jax.random.fold_in(rng, i), *p.shape)
      p2, z2 = ft_math.siamese_positive_extrapolation(p, z, lam, self.renormalize)
      out.append((jnp.where(active, p2, p), jnp.where(active, z2, z)))
    return out


NEGATIVE = ("none", "interpolate", "extrapolate", "hard")


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.enabled = False
  # q' = l q + (1-l) k, k' = l k + (1-l) q, l = 1 + Beta(a_ex, a_ex)
  block.positive_extrapolation = True
  block.alpha_ex = 2.0
  # With positive_extrapolation: l = Beta(a_ex, a_ex) in (0, 1) instead, interpolated (easier)
  # positives, the arm that Zhu et al. Table 3 compares extrapolation with.
  block.positive_interpolation = False
  # none | interpolate (mu ~ Beta(a_in, a_in)) | extrapolate (1 + Beta) | hard
  block.negative = "interpolate"
  block.alpha_in = 1.6
  block.hard_a = 5.0  # negative "hard": l q + (1-l) n with l ~ Beta(hard_a, hard_b) (App. G.2)
  block.hard_b = 2.0
  block.union = False  # negatives: original queue + transformed queue (2K)
  # Mixing coefficients: "scalar" (one per step, the paper's main runs), "dimension" (one
  # (d,) vector per step) or "sample_dimension" (one (d,) vector per positive pair and per
  # negative, the dimension-level mixing of Sec. 4.3 as the authors' code draws it).
  block.coefficients = "scalar"
  block.renormalize = False  # project transformed features back to unit length
  block.start_epoch = 0  # no transformation before this epoch
  return block


def check(c, method, reads_data: bool) -> None:
  """Positive extrapolation, transformed negatives (those the method has), their union."""
  del reads_data
  if boolean(c, "ft.positive_interpolation") and not boolean(c, "ft.positive_extrapolation"):
    fail(
        "ft.positive_interpolation",
        True,
        "interpolation replaces the extrapolation coefficient: set ft.positive_extrapolation "
        "= True too",
    )
  boolean(c, "ft.positive_extrapolation")
  number(c, "ft.alpha_ex", 0.0, None, lo_open=True)
  negative = choice(c, "ft.negative", NEGATIVE)
  for p in ("alpha_in", "hard_a", "hard_b"):
    number(c, f"ft.{p}", 0.0, None, lo_open=True)
  if method.negatives is None and negative != "none":
    fail(
        "ft.negative",
        negative,
        f"method {method.name!r} has no negatives: only positive "
        "extrapolation applies (App. E.2); set ft.negative = 'none'",
    )
  if method.negatives != "queue" and negative == "hard":
    fail(
        "ft.negative",
        negative,
        f"hard negatives (App. G.2) are built against a memory queue, which method "
        f"{method.name!r} does not hold; use 'interpolate' or 'extrapolate'",
    )
  union = boolean(c, "ft.union")
  choice(c, "ft.coefficients", ft_math.COEFFICIENTS)
  boolean(c, "ft.renormalize")
  integer(c, "ft.start_epoch", 0, integer(c, "optim.epochs", 1) - 1)
  if union and negative == "none":
    fail(
        "ft.union",
        union,
        "the union needs transformed negatives: set ft.negative to "
        "'interpolate' or 'extrapolate'",
    )


def describe(c) -> str:
  positive = "interpolation" if c.ft.positive_interpolation else "extrapolation"
  parts = ([f"positive {positive}"] if c.ft.positive_extrapolation else []) + (
      [f"negative {c.ft.negative}"] if c.ft.negative != "none" else []
  )
  return f"feature transformation ({', '.join(parts) or 'nothing transformed'})"


def build(c, steps_per_epoch: int):
  return record(FeatureTransform, c.ft, start_step=c.ft.start_epoch * steps_per_epoch)
