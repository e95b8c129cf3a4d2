"""MoCo v2 contrast (He et al. 2020; Chen et al. 2020) with optional NS negatives.

For each query q_i, the positive is the key k_i of the other view from the EMA
key encoder, the negatives are the K queued keys, and (Ge et al. 2021, Eq. 1)
optionally M non-semantic keys t_i1..t_iM of the query's own NS images.
"""
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax import queue as queue_lib
from cl_jax.addons import feature_transform, ifm, nonsemantic
from cl_jax.methods import queue_contrast


def _transform(q, k, queue, ft, rng, active, mesh, keys_per_step):
  """(q', k', list of negative sets) of the feature transformation (see moco_loss)."""
  r_pos, r_neg, r_perm = jax.random.split(rng, 3)
  shape = (q.shape[1],) if ft.per_dimension else ()
  if ft.positive_extrapolation:
    lam = 1.0 + feature_transform.sample_coefficient(r_pos, ft.alpha_ex, ft.alpha_ex, shape)
    q, k = feature_transform.positive_extrapolation(q, k, jnp.where(active, lam, 1.0),
                                                    ft.renormalize)
  if ft.negative == "none":
    return q, k, [queue]
  mu = feature_transform.sample_coefficient(r_neg, ft.alpha_in, ft.alpha_in, shape)
  mu = mu + 1.0 if ft.negative == "extrapolate" else mu
  order = jax.random.permutation(r_perm, queue.shape[0] // keys_per_step)
  mixed = queue_lib.mix_slots(queue, order, jnp.where(active, mu, 1.0), mesh, keys_per_step,
                              ft.renormalize)
  return q, k, ([queue, mixed] if ft.union else [mixed])


def _union(terms: list[queue_contrast.QueueTerms]) -> queue_contrast.QueueTerms:
  """QueueTerms of the union of equal-sized negative sets: log-sum-exp of the
  log-sum-exps, mean of the means, pooled variance (mean of the variances plus
  the variance of the means)."""
  if len(terms) == 1:
    return terms[0]
  means = jnp.stack([t.mean for t in terms])
  variances = jnp.stack([t.var for t in terms])
  return queue_contrast.QueueTerms(
      lse=jax.nn.logsumexp(jnp.stack([t.lse for t in terms]), axis=0),
      mean=means.mean(axis=0), var=variances.mean(axis=0) + means.var(axis=0))


def _infonce(pos: jax.Array, queue_lse: jax.Array, ns_sim: jax.Array | None,
             temperature: float, ns: ml_collections.ConfigDict) -> jax.Array:
  """mean_i ( logsumexp([s+_i / T, LSE_i, ns_logits_i]) - s+_i / T ) from per-query parts.

  pos: (B,) positive similarities; queue_lse: (B,) log sum_j exp(s_ij / T) over
  the queue; ns_sim: (B, M) NS similarities or None.
  """
  parts = [pos[:, None] / temperature, queue_lse[:, None]]
  if ns_sim is not None:
    parts.append(nonsemantic.ns_logits(ns_sim, ns.alpha, temperature, ns.alpha_mode))
  lse = jax.nn.logsumexp(jnp.concatenate(parts, axis=1), axis=1)
  return jnp.mean(lse - pos / temperature)


def moco_loss(q: jax.Array, k: jax.Array, queue: jax.Array, t: jax.Array | None,
              moco: ml_collections.ConfigDict, ns: ml_collections.ConfigDict,
              ifm_cfg: ml_collections.ConfigDict, mesh: Mesh,
              score_queries: int = 0, ft_cfg: ml_collections.ConfigDict | None = None,
              ft_rng: jax.Array | None = None, ft_active: jax.Array | bool = True,
              keys_per_step: int | None = None) -> tuple[jax.Array, dict]:
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
  for negative extrapolation, App. G.1), or the union of both queues (Sec. 5.3).
  Every similarity, the statistics included, is then taken on the transformed
  features. Before ft.start_epoch the coefficients are 1 (no transformation).

  The queue's part of the log-sum-exp comes from the sharded queue
  (cl_jax.methods.queue_contrast); the positive and NS logits are per query.

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
    keys_per_step: P of the queue layout (needed for negative transforms).

  Returns:
    (loss, stats). stats (Zhu et al. 2021, Sec. 3; similarities before the
    temperature, averaged over the chosen queries): pos_mean = mean_i q_i.k_i;
    neg_mean = mean_i mean_j q_i.queue_j; neg_var = mean_i var_j q_i.queue_j;
    with NS, ns_mean = mean over queries and NS images of q_i.t_im.
  """
  temperature = moco.temperature
  k = jax.lax.stop_gradient(k)
  negatives = [queue]
  if ft_cfg is not None and ft_cfg.enabled:
    q, k, negatives = _transform(q, k, queue, ft_cfg, ft_rng, ft_active, mesh, keys_per_step)
  pos = jnp.sum(q * k, axis=1).astype(jnp.float32)
  terms = _union([queue_contrast.queue_terms(q, n, temperature, mesh) for n in negatives])
  ns_sim = None if t is None else jnp.einsum("bd,bmd->bm", q, jax.lax.stop_gradient(t))
  loss = _infonce(pos, terms.lse, ns_sim, temperature, ns)
  if ifm_cfg.enabled:
    eps = ifm_cfg.epsilon
    adv_pos, adv_ns = ifm.adversarial_similarities(pos, ns_sim, eps)
    adv = _infonce(adv_pos, ifm.shifted_logsumexp(terms.lse, eps, temperature), adv_ns,
                   temperature, ns)
    loss = ifm.combine(loss, adv, ifm_cfg.alpha)

  n = score_queries or q.shape[0]
  stats = {"pos_mean": pos[:n].mean(), "neg_mean": terms.mean[:n].mean(),
           "neg_var": terms.var[:n].mean()}
  if ns_sim is not None:
    stats["ns_mean"] = ns_sim[:n].mean()
  return loss, jax.lax.stop_gradient(stats)
