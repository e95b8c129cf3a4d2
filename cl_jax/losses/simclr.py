"""SimCLR's NT-Xent contrast over the global batch (Chen et al. 2020, Sec. 2.1).

The two views' unit projections z1, z2 (B, d) are stacked into 2B vectors
u = [z1; z2]; the positive of anchor i is its other view p(i) = (i + B) mod 2B,
and its negatives are the other 2B - 2 vectors. With s_ik = u_i . u_k,

  l_i  = -log( exp(s_ip(i) / T) / sum_{k != i} exp(s_ik / T) )
  loss = 1/(2B) sum_i l_i                       (both directions of every pair)

The pieces are separate so an add-on can change them before the loss:
pair_scores gives the positive similarities, the full similarity matrix and the
mask of each anchor's negatives; nt_xent_from_logits takes logits built from
them, plus optional extra negative logits per anchor (e.g. the non-semantic
negatives of Ge et al. 2021, Eq. 1). simclr_loss assembles the full objective
with the add-ons: non-semantic negatives, implicit feature modification, feature
transformation and, in place of NT-Xent's negative term, hard-negative sampling.
Everything is ordinary jnp on the global batch: under jit with the batch sharded
over devices, XLA partitions it.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from cl_jax.addons import feature_transform, ifm, nonsemantic
from cl_jax.losses import hard_negatives

# Negative transforms of the in-batch negatives; "hard" (App. G.2) is built against a queue.
FT_NEGATIVES = ("none", "interpolate", "extrapolate")


class PairScores(NamedTuple):
  """Similarities of the 2B stacked projections u = [z1; z2], float32.

  pos: (2B,) s_i,p(i), each anchor with its other view.
  sim: (2B, 2B) s_ik = u_i . u_k for all pairs.
  neg_mask: (2B, 2B) bool, True where k is a negative of anchor i
    (k != i and k != p(i)); 2B - 2 entries per row.
  """

  pos: jax.Array
  sim: jax.Array
  neg_mask: jax.Array


def pair_scores(z1: jax.Array, z2: jax.Array) -> PairScores:
  """Positive similarities, all pairwise similarities and the negatives' mask.

  Args:
    z1, z2: (B, d) unit projections of the two views, B >= 2, any float dtype
      (the similarities are computed in float32).

  Returns:
    PairScores for u = [z1; z2]; anchor i < B is z1_i, anchor B + i is z2_i.
  """
  _check_pair(z1, z2)
  z1, z2 = z1.astype(jnp.float32), z2.astype(jnp.float32)
  u = jnp.concatenate([z1, z2], axis=0)  # (2B, d)
  return PairScores(_positives(z1, z2), u @ u.T, _negative_mask(z1.shape[0]))


def _check_pair(z1: jax.Array, z2: jax.Array) -> None:
  """ValueError unless z1 and z2 are both (B, d), B >= 2."""
  if z1.ndim != 2 or z1.shape != z2.shape:
    raise ValueError(
        f"z1 and z2 must both be (B, d) with the same shape; got {z1.shape} " f"and {z2.shape}"
    )
  if z1.shape[0] < 2:
    raise ValueError(
        f"NT-Xent needs a batch of B >= 2 pairs to have negatives; got " f"B = {z1.shape[0]}"
    )


def _positives(z1: jax.Array, z2: jax.Array) -> jax.Array:
  """(2B,) s_i,p(i) = z1_i . z2_i, once for each direction of the pair."""
  pos_half = jnp.sum(z1 * z2, axis=1)
  return jnp.concatenate([pos_half, pos_half])


def _negative_mask(bsz: int) -> jax.Array:
  """(2B, 2B) bool, True where k is neither anchor i nor its partner p(i) = (i + B) mod 2B."""
  idx = jnp.arange(2 * bsz)
  partner = (idx + bsz) % (2 * bsz)
  return (idx[None, :] != idx[:, None]) & (idx[None, :] != partner[:, None])


def nt_xent_from_logits(
    pos_logits: jax.Array,
    neg_logits: jax.Array,
    neg_mask: jax.Array,
    extra_negative_logits: jax.Array | None = None,
) -> jax.Array:
  """Mean cross-entropy of each anchor's positive against its negatives.

  loss = 1/N sum_i ( log( exp(a_i) + sum_{k: mask_ik} exp(n_ik) + sum_m exp(e_im) ) - a_i )

  Entries outside the mask are set to -inf before the log-sum-exp, so they add
  exactly nothing to the value and receive exactly zero gradient.

  Args:
    pos_logits: (N,) a_i, the positive logit of each anchor (e.g. s_ip(i) / T).
    neg_logits: (N, K) n_ik, candidate negative logits (e.g. s_ik / T).
    neg_mask: (N, K) bool, True where n_ik is a negative of anchor i; every
      row needs at least one True or one extra logit.
    extra_negative_logits: optional (N, M) e_im, further negatives of each
      anchor (for the non-semantic negatives: alpha * u_i . t_im / T, rows in
      the anchors' order [view 1; view 2]).

  Returns:
    () float32 loss.
  """
  hard_negatives.check_logit_shapes(pos_logits, neg_logits, neg_mask)
  parts = [
      pos_logits[:, None].astype(jnp.float32),
      jnp.where(neg_mask, neg_logits.astype(jnp.float32), -jnp.inf),
  ]
  if extra_negative_logits is not None:
    n = pos_logits.shape[0]
    if extra_negative_logits.ndim != 2 or extra_negative_logits.shape[0] != n:
      raise ValueError(
          f"extra_negative_logits must be (N, M) with N = {n} anchors; got "
          f"{extra_negative_logits.shape}"
      )
    parts.append(extra_negative_logits.astype(jnp.float32))
  lse = jax.nn.logsumexp(jnp.concatenate(parts, axis=1), axis=1)
  return jnp.mean(lse - pos_logits.astype(jnp.float32))


def score_stats(scores: PairScores) -> dict:
  """Positive and negative similarity statistics, before the temperature.

  pos_mean = mean_i s_ip(i); neg_mean = mean_i mean_{k neg of i} s_ik;
  neg_var = mean_i var_{k neg of i} s_ik (population variance over the 2B - 2
  negatives of each anchor). No gradient.

  Returns:
    dict of () float32: pos_mean, neg_mean, neg_var.
  """
  pos, sim, mask = jax.lax.stop_gradient(scores)
  count = mask.sum(axis=1)
  mean = jnp.where(mask, sim, 0.0).sum(axis=1) / count
  var = jnp.where(mask, jnp.square(sim - mean[:, None]), 0.0).sum(axis=1) / count
  return {"pos_mean": pos.mean(), "neg_mean": mean.mean(), "neg_var": var.mean()}


def nt_xent_loss(
    z1: jax.Array, z2: jax.Array, temperature: float, extra_negative_logits: jax.Array | None = None
) -> tuple[jax.Array, dict]:
  """NT-Xent of the global batch, averaged over all 2B anchors.

  l_i = log( sum_{k != i} exp(s_ik / T) + sum_m exp(e_im) ) - s_ip(i) / T,
  loss = 1/(2B) sum_i l_i   (Chen et al. 2020, Eq. 1 and Alg. 1; e_im only when
  extra negatives are given, as in Ge et al. 2021, Eq. 1).

  Args:
    z1, z2: (B, d) unit projections of the two views, with gradient.
    temperature: T > 0, a Python float.
    extra_negative_logits: optional (2B, M) logits appended to each anchor's
      negatives, rows in the order [view-1 anchors; view-2 anchors].

  Returns:
    (loss, stats): () float32 loss and score_stats of the batch's similarities.
  """
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0; got {temperature}")
  scores = pair_scores(z1, z2)
  loss = nt_xent_from_logits(
      scores.pos / temperature, scores.sim / temperature, scores.neg_mask, extra_negative_logits
  )
  return loss, score_stats(scores)


def _transformed_scores(
    z1: jax.Array,
    z2: jax.Array,
    ft: ml_collections.ConfigDict,
    rng: jax.Array | None,
    active: jax.Array | bool,
) -> tuple[jax.Array, PairScores]:
  """(anchors, scores) of the feature transformation (Zhu et al. 2021, Sec. 4, App. E.1).

  anchors: (2B, d) float32 [z1'; z2'], the positively extrapolated pairs (Eq. 3),
  or [z1; z2] without positive extrapolation. scores.pos: (2B,) z1'_i . z2'_i.
  scores.sim: (2B, C) anchors against the negative set(s) built from u = [z1; z2]:
  C = 2B, or 4B for the union [u | mixed]; scores.neg_mask hides each anchor's
  own and its partner's position in every set.

  While `active` is False every transformed feature is replaced by its original
  (a select on the outputs, so re-normalisation cannot move them by an ulp) and
  the union's mixed set is masked out: the scores equal pair_scores(z1, z2)'s.
  """
  if ft.negative not in FT_NEGATIVES:
    raise ValueError(
        f"ft.negative = {ft.negative!r} is not available for SimCLR: use one of "
        f"{FT_NEGATIVES} (hard negatives, App. G.2, are built against the MoCo "
        "queue)"
    )
  if rng is None:
    raise ValueError("ft.enabled needs ft_rng, the PRNG key of the step's mixing coefficients")
  r_pos, r_neg, r_perm = jax.random.split(rng, 3)
  z1, z2 = z1.astype(jnp.float32), z2.astype(jnp.float32)
  bsz, dim = z1.shape
  shape = lambda n: feature_transform.coefficient_shape(ft.coefficients, n, dim)
  keep = lambda new, old: jnp.where(active, new, old)
  u = jnp.concatenate([z1, z2], axis=0)
  if ft.positive_extrapolation:
    lam = feature_transform.positive_coefficient(
        r_pos, ft.alpha_ex, ft.positive_interpolation, shape(bsz)
    )
    e1, e2 = feature_transform.positive_extrapolation(z1, z2, lam, ft.renormalize)
    z1, z2 = keep(e1, z1), keep(e2, z2)
  anchors = jnp.concatenate([z1, z2], axis=0)
  mask = _negative_mask(bsz)
  if ft.negative == "none":
    return anchors, PairScores(_positives(z1, z2), anchors @ u.T, mask)
  mu = feature_transform.negative_coefficient(
      r_neg, ft.negative, ft.alpha_in, ft.alpha_ex, shape(2 * bsz)
  )
  perm = jax.random.permutation(r_perm, 2 * bsz)
  mixed = feature_transform.negative_interpolation(u, perm, mu, ft.renormalize)
  if not ft.union:
    return anchors, PairScores(_positives(z1, z2), anchors @ keep(mixed, u).T, mask)
  sim = jnp.concatenate([anchors @ u.T, anchors @ mixed.T], axis=1)
  return anchors, PairScores(
      _positives(z1, z2), sim, jnp.concatenate([mask, mask & active], axis=1)
  )


def _check_combination(t, ifm_cfg, hcl_cfg, ft_cfg) -> None:
  """ValueError when hard-negative sampling is combined with another add-on."""
  if not hcl_cfg.enabled:
    return
  others = [
      name
      for name, on in (
          ("ifm.enabled", ifm_cfg.enabled),
          ("nonsemantic.enabled (NS features t were given)", t is not None),
          ("ft.enabled", ft_cfg is not None and ft_cfg.enabled),
      )
      if on
  ]
  if others:
    raise ValueError(
        f"hcl.enabled replaces NT-Xent's negative term and is not combined with "
        f"other add-ons: switch off {', '.join(others)} or hcl.enabled"
    )


def simclr_loss(
    z1: jax.Array,
    z2: jax.Array,
    t: jax.Array | None,
    simclr_cfg: ml_collections.ConfigDict,
    ns_cfg: ml_collections.ConfigDict,
    ifm_cfg: ml_collections.ConfigDict,
    hcl_cfg: ml_collections.ConfigDict,
    ft_cfg: ml_collections.ConfigDict | None = None,
    ft_rng: jax.Array | None = None,
    ft_active: jax.Array | bool = True,
    score_queries: int = 0,
) -> tuple[jax.Array, dict]:
  """SimCLR's NT-Xent over the global batch with its add-ons.

  Anchors u_i, i < 2B, are [z1; z2]; anchor i's positive is p(i) = (i + B) mod 2B
  and its in-batch negatives are the other 2B - 2 features. With the positive
  similarity s+_i, the negative similarities s_ik and, with NS features, the
  similarities r_im = u_i . t_im:

    l_i  = log( e^{s+_i/T} + sum_k e^{s_ik/T} + sum_m e^{ns(r_im)} ) - s+_i / T
    L    = mean_i l_i                 (Chen et al. 2020, Eq. 1; Ge et al. 2021, Eq. 1)

  ns(r) = nonsemantic.ns_logits(r, ns.alpha, T, ns.alpha_mode) (alpha r / T for L_in).

  IFM (Robinson et al. 2021, Eq. 2): L_eps is L on s+ - eps, s_ik + eps and
  r_im + eps; the loss is ifm.combine(L, L_eps, alpha) = (L + alpha L_eps) / 2.

  Feature transformation (Zhu et al. 2021, Sec. 4; App. E.1 applies it to SimCLR
  without further detail). SimCLR's one network makes both views, so there is
  no stop-gradient anywhere: gradients flow through every transformed feature.
  - Positives: each pair is extrapolated, z1'_i = l z1_i + (1 - l) z2_i and
    z2'_i = l z2_i + (1 - l) z1_i, l = 1 + Beta(a_ex, a_ex) (Eq. 3); the anchors
    and positive scores use z1', z2', as MoCo's use q', k'.
  - Negatives are built from the original features u = [z1; z2], not the
    extrapolated ones. The in-batch negatives play the part of MoCo's queue,
    which holds the encoder's untransformed outputs and is only ever mixed
    with itself (Eq. 5); extrapolation is a transform of a positive pair
    (Eq. 3-4 state its effect on the positive score only), and mixing the
    extrapolated features would make the negative transform depend on the
    positive one, which Table 12 ablates as separate modules.
    "interpolate": n = mu u + (1 - mu) u[perm], mu = Beta(a_in, a_in), perm a
    fresh random permutation of the 2B positions (Eq. 5); "extrapolate":
    mu = 1 + Beta(a_in, a_in) (App. G.1, Eq. 7, with the a_in of this config as
    in moco_loss). Anchor i's negatives are n_k at the positions k != i, p(i);
    a mixed n_k may contain u_i or u_p(i) through perm[k], as Eq. 5 mixes any
    two entries. union: both u_k and n_k at those positions, 2(2B - 2)
    negatives (Table 5, Sec. 4.3). coefficients: scalar, one (d,) vector per step, or one
    per pair / per negative (Sec. 4.3, feature_transform.coefficient_shape);
    renormalize: l2-normalise the transformed features (App. F.2).
  - ft_active False (before ft.start_epoch): the transformed features are
    replaced by the originals (a select, not coefficients of 1, so that
    re-normalisation cannot move them) and the union's mixed set is masked
    out. The loss is that of FT off bit for bit; the statistics and gradients
    agree to float32 rounding (XLA fuses the extra selects, and sums the
    gradients' parts, in another order).

  Hard-negative sampling (Robinson, Chuang, Sra & Jegelka 2021): the negative
  term sum_k e^{s_ik/T} becomes the estimator of
  hard_negatives.hcl_loss_from_logits (beta, tau_plus) over the in-batch
  negatives; it is not combined with NS, IFM or FT.

  With every add-on off, the loss is nt_xent_loss(z1, z2, T)'s, bit for bit.

  Args:
    z1, z2: (B, d) unit projections of the two views, both with gradient.
    t: (2B, M, d) unit NS features of each anchor's own view, anchor order
      [view-1 anchors; view-2 anchors], no gradient; None when NS is off.
    simclr_cfg: the `simclr` config block (temperature).
    ns_cfg: the `nonsemantic` config block (alpha, alpha_mode); used when t is given.
    ifm_cfg: the `ifm` config block (enabled, epsilon, alpha).
    hcl_cfg: the `hcl` config block (enabled, beta, tau_plus).
    ft_cfg: the `ft` config block (enabled, positive_extrapolation, alpha_ex,
      negative, alpha_in, union, coefficients, renormalize), or None (off).
    ft_rng: PRNG key of the step's coefficients and permutation (FT on).
    ft_active: bool or () bool array; False before the transformation's start epoch.
    score_queries: n with 0 < n < B takes the statistics over the first n
      view-1 anchors; 0, or n >= B, over all 2B anchors.

  Returns:
    (loss, stats): () float32 loss; stats, () float32 without gradient, on the
    transformed features and before the temperature: pos_mean = mean_i s+_i;
    neg_mean = mean_i mean_k s_ik; neg_var = mean_i var_k s_ik (over each
    anchor's negatives, the union's 2(2B - 2) when on); with NS, ns_mean =
    mean_{i, m} r_im.
  """
  temperature = simclr_cfg.temperature
  if not temperature > 0:
    raise ValueError(f"simclr.temperature must be > 0; got {temperature}")
  if not (isinstance(score_queries, int) and score_queries >= 0):
    raise ValueError(
        f"score_queries must be an int >= 0 (0: all anchors); got " f"{score_queries!r}"
    )
  _check_combination(t, ifm_cfg, hcl_cfg, ft_cfg)
  _check_pair(z1, z2)
  bsz, dim = z1.shape
  if ft_cfg is not None and ft_cfg.enabled:
    anchors, scores = _transformed_scores(z1, z2, ft_cfg, ft_rng, jnp.asarray(ft_active))
  else:
    scores = pair_scores(z1, z2)
    anchors = jnp.concatenate([z1, z2], axis=0).astype(jnp.float32)

  ns_sim = None
  if t is not None:
    if t.ndim != 3 or t.shape[0] != 2 * bsz or t.shape[2] != dim:
      raise ValueError(
          f"t must be (2B, M, d) = ({2 * bsz}, M, {dim}), the NS features of "
          f"each anchor in the order [view 1; view 2]; got {t.shape}"
      )
    ns_sim = jnp.einsum("nd,nmd->nm", anchors, jax.lax.stop_gradient(t).astype(jnp.float32))

  def nt_xent(pos, sim, ns):
    extra = (
        None
        if ns is None
        else nonsemantic.ns_logits(ns, ns_cfg.alpha, temperature, ns_cfg.alpha_mode)
    )
    return nt_xent_from_logits(pos / temperature, sim / temperature, scores.neg_mask, extra)

  if hcl_cfg.enabled:
    loss = hard_negatives.hcl_loss_from_logits(
        scores.pos / temperature,
        scores.sim / temperature,
        scores.neg_mask,
        hcl_cfg.beta,
        hcl_cfg.tau_plus,
        temperature,
    )
  else:
    loss = nt_xent(scores.pos, scores.sim, ns_sim)
  if ifm_cfg.enabled:
    adv_pos, adv_sim = ifm.adversarial_similarities(scores.pos, scores.sim, ifm_cfg.epsilon)
    _, adv_ns = ifm.adversarial_similarities(scores.pos, ns_sim, ifm_cfg.epsilon)
    loss = ifm.combine(loss, nt_xent(adv_pos, adv_sim, adv_ns), ifm_cfg.alpha)

  rows = score_queries if 0 < score_queries < bsz else 2 * bsz
  stats = score_stats(PairScores(*(x[:rows] for x in scores)))
  if ns_sim is not None:
    stats["ns_mean"] = ns_sim[:rows].mean()
  return loss, jax.lax.stop_gradient(stats)
