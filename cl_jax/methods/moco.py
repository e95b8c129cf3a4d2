"""MoCo v2 contrast (He et al. 2020; Chen et al. 2020) with optional NS negatives.

For each query q_i, the positive is the key k_i of the other view from the EMA
key encoder, the negatives are the K queued keys, and (Ge et al. 2021, Eq. 1)
optionally M non-semantic keys t_i1..t_iM of the query's own NS images.
"""
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax.addons import ifm, nonsemantic
from cl_jax.methods import queue_contrast


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
              score_queries: int = 0) -> tuple[jax.Array, dict]:
  """InfoNCE of queries against their keys, the queue and NS keys, optionally with IFM.

  logits_i = [q_i.k_i / T, q_i.queue_j / T (j < K), ns_logit(q_i, t_im) (m < M)]
  L = mean_i ( logsumexp(logits_i) - logits_i0 )              (Ge et al. 2021, Eq. 1)
  With IFM on, the loss is (L + alpha L_eps) / 2, L_eps the same loss on the
  similarities s+ - eps and s + eps of every negative, queue and NS
  (Robinson et al. 2021, Eq. 2; cl_jax.addons.ifm).

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

  Returns:
    (loss, stats). stats (Zhu et al. 2021, Sec. 3; similarities before the
    temperature, averaged over the chosen queries): pos_mean = mean_i q_i.k_i;
    neg_mean = mean_i mean_j q_i.queue_j; neg_var = mean_i var_j q_i.queue_j;
    with NS, ns_mean = mean over queries and NS images of q_i.t_im.
  """
  temperature = moco.temperature
  k = jax.lax.stop_gradient(k)
  pos = jnp.sum(q * k, axis=1).astype(jnp.float32)
  terms = queue_contrast.queue_terms(q, queue, temperature, mesh)
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
