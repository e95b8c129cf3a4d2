"""MoCo v2 contrast (He et al. 2020; Chen et al. 2020) with optional NS negatives.

For each query q_i, the positive is the key k_i of the other view from the EMA
key encoder, the negatives are the K queued keys, and (Ge et al. 2021, Eq. 1)
optionally M non-semantic keys t_i1..t_iM of the query's own NS images.
"""
import jax
import jax.numpy as jnp
import ml_collections

from cl_jax.addons import nonsemantic
from cl_jax.methods import infonce


def score_stats(pos: jax.Array, neg: jax.Array, ns_sim: jax.Array | None) -> dict:
  """Similarity statistics before the temperature (Zhu et al. 2021, Sec. 3).

  pos_mean = mean_i s_i+; neg_mean = mean_i mean_j s_ij;
  neg_var = mean_i var_j s_ij (each query's variance over its negatives);
  ns_mean = mean over queries and NS images of q_i . t_im.
  """
  stats = {"pos_mean": pos.mean(), "neg_mean": neg.mean(), "neg_var": neg.var(axis=1).mean()}
  if ns_sim is not None:
    stats["ns_mean"] = ns_sim.mean()
  return stats


def moco_loss(q: jax.Array, k: jax.Array, queue: jax.Array, t: jax.Array | None,
              moco: ml_collections.ConfigDict,
              ns: ml_collections.ConfigDict) -> tuple[jax.Array, dict]:
  """InfoNCE of queries against their keys, the queue and NS keys.

  logits_i = [q_i.k_i / T, q_i.queue_j / T (j < K), ns_logit(q_i, t_im) (m < M)]
  loss = mean_i CE(logits_i, 0)

  Args:
    q: (B, d) unit queries, with gradient.
    k: (B, d) unit keys of the other view, no gradient.
    queue: (K, d) unit queued keys, no gradient.
    t: (B, M, d) unit NS keys (no gradient), or None when NS negatives are off.
    moco: the `moco` config block (temperature).
    ns: the `nonsemantic` config block (alpha, alpha_mode).

  Returns:
    (loss, stats) with the score statistics of `score_stats`.
  """
  k = jax.lax.stop_gradient(k)
  queue = jax.lax.stop_gradient(queue)
  pos = jnp.sum(q * k, axis=1)
  neg = q @ queue.T
  logits = infonce.similarity_logits(pos, neg, moco.temperature)
  ns_sim = None
  if t is not None:
    t = jax.lax.stop_gradient(t)
    ns_sim = jnp.einsum("bd,bmd->bm", q, t)
    logits = jnp.concatenate(
        [logits, nonsemantic.ns_logits(ns_sim, ns.alpha, moco.temperature, ns.alpha_mode)], axis=1)
  stats = score_stats(*jax.lax.stop_gradient((pos, neg, ns_sim)))
  return infonce.infonce_loss(logits), stats
