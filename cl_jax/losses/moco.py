"""MoCo v2 contrast (He et al. 2020; Chen et al. 2020) with optional NS negatives.

For each query q_i, the positive is the key k_i of the other view from the EMA
key encoder, the negatives are the K queued keys, and (Ge et al. 2021, Eq. 1)
optionally M non-semantic keys t_i1..t_iM of the query's own NS images.
"""

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax import memory_queue as queue_lib
from cl_jax.addons import feature_transform, ifm, nonsemantic
from cl_jax.losses import queue_contrast


def _hard_scores(
    lam: jax.Array, active: jax.Array | bool, renormalize: bool, unit_queries: bool
) -> queue_contrast.ScoreFn:
  """Score function (for queue_terms) of the hard negatives of Zhu et al. 2021, App. G.2:

    h_ij = lam q_i + (1 - lam) n_j,    s_ij = q_i . h_ij  (or q_i . h_ij / |h_ij|),   (Eq. 8)

  lam = Beta(a, b), a scalar, a (d,) vector or one (d,) vector per query. Each score
  comes from the (B, K/S)
  score block of the gathered queries and the device's queue shard
  (cl_jax.addons.feature_transform), never from the (B, K/S, d) tensor of h_ij.
  The gradient flows through q_i in both the query and the hard negative.
  With unit queries and a scalar lam, the scores follow from q_i . n_j alone;
  otherwise (dimension-level lam, or queries that positive extrapolation left
  off the unit sphere) from the exact form for any norm. The form from q_i . n_j
  drops the radial part of dL/dq_i (the d|q_i|^2 / dq_i terms), which an
  l2-normalising head removes anyway. While inactive the scores are q_i . n_j,
  the very values of the plain contrast.

  Args:
    lam: scalar, (d,) or (B, d) float32 coefficient.
    active: bool scalar, False before the transformation's start epoch.
    renormalize: score against h_ij / |h_ij| (App. F.2).
    unit_queries: the queries are unit vectors (as are the queued keys).

  Returns:
    scores(q_all (B, d), queue_shard (K/S, d)) -> (B, K/S).
  """

  def hard(q_all, queue_shard):
    if jnp.ndim(lam) == 0 and unit_queries:
      return feature_transform.hard_negative_scores_from_similarity(
          q_all @ queue_shard.T, lam, renormalize
      )
    return feature_transform.hard_negative_scores(q_all, queue_shard, lam, renormalize)

  def plain(q_all, queue_shard):
    return q_all @ queue_shard.T

  return lambda q_all, queue_shard: jax.lax.cond(active, hard, plain, q_all, queue_shard)


def _transform(q, k, queue, ft, rng, active, mesh, keys_per_step):
  """(q', k', negative sets) of the feature transformation (see moco_loss).

  Each negative set is a (keys (K, d), score function or None) pair for
  queue_contrast.queue_terms. While inactive every output equals its input
  exactly (a select on the outputs, so re-normalisation cannot move them by an
  ulp; a cond on the hard-negative scores); with _union keeping the plain set
  alone, the loss is then bit-identical to the loss without the transformation.
  """
  r_pos, r_neg, r_perm = jax.random.split(rng, 3)
  (rows, dim), keys = q.shape, queue.shape[0]
  shape = lambda n: feature_transform.coefficient_shape(ft.coefficients, n, dim)
  if ft.positive_extrapolation:
    lam = feature_transform.positive_coefficient(
        r_pos, ft.alpha_ex, ft.positive_interpolation, shape(rows)
    )
    q_ex, k_ex = feature_transform.positive_extrapolation(q, k, lam, ft.renormalize)
    q, k = jnp.where(active, q_ex, q), jnp.where(active, k_ex, k)
  plain = (queue, None)
  if ft.negative == "none":
    return q, k, [plain]
  if ft.negative == "hard":
    lam = feature_transform.sample_coefficient(r_neg, ft.hard_a, ft.hard_b, shape(rows))
    unit_queries = ft.renormalize or not ft.positive_extrapolation
    transformed = (queue, _hard_scores(lam, active, ft.renormalize, unit_queries))
  elif ft.negative in ("interpolate", "extrapolate"):
    mu = feature_transform.negative_coefficient(
        r_neg, ft.negative, ft.alpha_in, ft.alpha_ex, shape(keys)
    )
    order = jax.random.permutation(r_perm, queue.shape[0] // keys_per_step)
    mixed = queue_lib.mix_slots(queue, order, mu, mesh, keys_per_step, ft.renormalize)
    transformed = (jnp.where(active, mixed, queue), None)
  else:
    raise ValueError(
        f"ft.negative must be one of 'none', 'interpolate', 'extrapolate', "
        f"'hard', got {ft.negative!r}"
    )
  return q, k, ([plain, transformed] if ft.union else [transformed])


def _union(
    terms: list[queue_contrast.QueueTerms], active: jax.Array | bool
) -> queue_contrast.QueueTerms:
  """QueueTerms of the union of equal-sized negative sets: log-sum-exp of the
  log-sum-exps, mean of the means, pooled variance (mean of the variances plus
  the variance of the means). While inactive (no transformation yet, every set
  is the plain queue) the terms of the first set alone, exactly, so the loss is
  that of the K plain negatives and not of the queue counted twice."""
  if len(terms) == 1:
    return terms[0]
  means = jnp.stack([t.mean for t in terms])
  variances = jnp.stack([t.var for t in terms])
  union = queue_contrast.QueueTerms(
      lse=jax.nn.logsumexp(jnp.stack([t.lse for t in terms]), axis=0),
      mean=means.mean(axis=0),
      var=variances.mean(axis=0) + means.var(axis=0),
  )
  return jax.tree.map(lambda u, first: jnp.where(active, u, first), union, terms[0])


def _infonce(
    pos: jax.Array,
    queue_lse: jax.Array,
    ns_sim: jax.Array | None,
    temperature: float,
    ns: ml_collections.ConfigDict,
) -> jax.Array:
  """mean_i ( logsumexp([s+_i / T, LSE_i, ns_logits_i]) - s+_i / T ) from per-query parts.

  pos: (B,) positive similarities; queue_lse: (B,) log sum_j exp(s_ij / T) over
  the queue; ns_sim: (B, M) NS similarities or None.
  """
  parts = [pos[:, None] / temperature, queue_lse[:, None]]
  if ns_sim is not None:
    parts.append(nonsemantic.ns_logits(ns_sim, ns.alpha, temperature, ns.alpha_mode))
  lse = jax.nn.logsumexp(jnp.concatenate(parts, axis=1), axis=1)
  return jnp.mean(lse - pos / temperature)


def moco_loss(
    q: jax.Array,
    k: jax.Array,
    queue: jax.Array,
    t: jax.Array | None,
    moco: ml_collections.ConfigDict,
    ns: ml_collections.ConfigDict,
    ifm_cfg: ml_collections.ConfigDict,
    mesh: Mesh,
    score_queries: int = 0,
    ft_cfg: ml_collections.ConfigDict | None = None,
    ft_rng: jax.Array | None = None,
    ft_active: jax.Array | bool = True,
    keys_per_step: int | None = None,
) -> tuple[jax.Array, dict]:
  """InfoNCE of queries against their keys, the queue and NS keys, optionally with IFM.

  logits_i = [q_i.k_i / T, q_i.queue_j / T (j < K), ns_logit(q_i, t_im) (m < M)]
  L = mean_i ( logsumexp(logits_i) - logits_i0 )              (Ge et al. 2021, Eq. 1)
  With IFM on, the loss is (L + alpha L_eps) / 2, L_eps the same loss on the
  similarities s+ - eps and s + eps of every negative, queue and NS
  (Robinson et al. 2021, Eq. 2; cl_jax.addons.ifm).

  With feature transformation on (Zhu et al. 2021, Sec. 4; cl_jax.addons.
  feature_transform), q and k are first extrapolated, q' = l q + (1 - l) k and
  k' = l k + (1 - l) q with l = 1 + Beta(a_ex, a_ex), and the negatives are the
  queue mixed with itself, mu n + (1 - mu) n', mu = Beta(a_in, a_in) (1 + Beta
  for negative extrapolation, App. G.1), or the hard negatives of each query,
  h_ij = lam q_i + (1 - lam) n_j with lam = Beta(hard_a, hard_b) (App. G.2,
  Eq. 8; scored per device without building them, gradient through q_i in both
  places), or the union of the original and the transformed queue, 2K negatives
  (Sec. 4.3). Every similarity, the statistics included, is then taken on the
  transformed features. Before ft.start_epoch nothing is transformed and the
  loss and gradients are bit-identical to those with ft off. The stored queue
  is never changed.

  The queue's part of the log-sum-exp comes from the sharded queue
  (cl_jax.losses.queue_contrast); the positive and NS logits are per query.

  Args:
    q: (B, d) unit queries, with gradient.
    k: (B, d) unit keys of the other view, no gradient.
    queue: (K, d) unit queued keys, rows sharded over the mesh's `data` axis.
    t: (B, M, d) unit NS keys (no gradient), or None when NS negatives are off.
    moco: the `moco` config block (temperature).
    ns: the `nonsemantic` config block (alpha, alpha_mode).
    ifm_cfg: the `ifm` config block (enabled, epsilon, alpha).
    mesh: the device mesh.
    score_queries: n > 0 takes the score statistics over the first n queries
      of the global batch (Zhu et al. 2021 use 64); 0, or n >= B, over all.
    ft_cfg: the `ft` config block, or None (off).
    ft_rng: PRNG key of the step's mixing coefficients and slot permutation.
    ft_active: False before the transformation's start epoch.
    keys_per_step: P of the queue layout (needed to mix the queue, ft.negative
      "interpolate" or "extrapolate").

  Returns:
    (loss, stats). stats (Zhu et al. 2021, Sec. 3; similarities before the
    temperature, averaged over the chosen queries): pos_mean = mean_i q_i.k_i;
    neg_mean = mean_i mean_j q_i.queue_j; neg_var = mean_i var_j q_i.queue_j
    (over the transformed negatives, all 2K of them for the union);
    with NS, ns_mean = mean over queries and NS images of q_i.t_im.
  """
  temperature = moco.temperature
  k = jax.lax.stop_gradient(k)
  negatives = [(queue, None)]
  if ft_cfg is not None and ft_cfg.enabled:
    q, k, negatives = _transform(q, k, queue, ft_cfg, ft_rng, ft_active, mesh, keys_per_step)
  pos = jnp.sum(q * k, axis=1).astype(jnp.float32)
  terms = _union(
      [
          queue_contrast.queue_terms(q, keys, temperature, mesh, scores)
          for keys, scores in negatives
      ],
      ft_active,
  )
  ns_sim = None if t is None else jnp.einsum("bd,bmd->bm", q, jax.lax.stop_gradient(t))
  loss = _infonce(pos, terms.lse, ns_sim, temperature, ns)
  if ifm_cfg.enabled:
    eps = ifm_cfg.epsilon
    adv_pos, adv_ns = ifm.adversarial_similarities(pos, ns_sim, eps)
    adv = _infonce(
        adv_pos, ifm.shifted_logsumexp(terms.lse, eps, temperature), adv_ns, temperature, ns
    )
    loss = ifm.combine(loss, adv, ifm_cfg.alpha)

  n = score_queries or q.shape[0]
  stats = {
      "pos_mean": pos[:n].mean(),
      "neg_mean": terms.mean[:n].mean(),
      "neg_var": terms.var[:n].mean(),
  }
  if ns_sim is not None:
    stats["ns_mean"] = ns_sim[:n].mean()
  return loss, jax.lax.stop_gradient(stats)
