"""MoCo v2 contrast (He et al. 2020; Chen et al. 2020) with optional NS negatives.

For each query q_i, the positive is the key k_i of the other view from the EMA
key encoder, the negatives are the K queued keys, and (Ge et al. 2021, Eq. 1)
optionally M non-semantic keys t_i1..t_iM of the query's own NS images.
"""
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax.addons import nonsemantic
from cl_jax.methods import queue_contrast


def moco_loss(q: jax.Array, k: jax.Array, queue: jax.Array, t: jax.Array | None,
              moco: ml_collections.ConfigDict, ns: ml_collections.ConfigDict,
              mesh: Mesh) -> tuple[jax.Array, dict]:
  """InfoNCE of queries against their keys, the queue and NS keys.

  logits_i = [q_i.k_i / T, q_i.queue_j / T (j < K), ns_logit(q_i, t_im) (m < M)]
  loss = mean_i ( logsumexp(logits_i) - logits_i0 )          (Ge et al. 2021, Eq. 1)

  The queue's part of the log-sum-exp comes from the sharded queue
  (cl_jax.methods.queue_contrast); the positive and NS logits are per query.

  Args:
    q: (B, d) unit queries, with gradient.
    k: (B, d) unit keys of the other view, no gradient.
    queue: (K, d) unit queued keys, rows sharded over the mesh's `data` axis.
    t: (B, M, d) unit NS keys (no gradient), or None when NS negatives are off.
    moco: the `moco` config block (temperature).
    ns: the `nonsemantic` config block (alpha, alpha_mode).
    mesh: the device mesh.

  Returns:
    (loss, stats). stats (Zhu et al. 2021, Sec. 3; similarities before the
    temperature): pos_mean = mean_i q_i.k_i; neg_mean = mean_i mean_j
    q_i.queue_j; neg_var = mean_i var_j q_i.queue_j; with NS, ns_mean = mean
    over queries and NS images of q_i.t_im.
  """
  temperature = moco.temperature
  k = jax.lax.stop_gradient(k)
  pos = jnp.sum(q * k, axis=1).astype(jnp.float32)
  terms = queue_contrast.queue_terms(q, queue, temperature, mesh)
  parts = [pos[:, None] / temperature, terms.lse[:, None]]
  stats = {"pos_mean": pos.mean(), "neg_mean": terms.mean.mean(), "neg_var": terms.var.mean()}
  if t is not None:
    ns_sim = jnp.einsum("bd,bmd->bm", q, jax.lax.stop_gradient(t))
    parts.append(nonsemantic.ns_logits(ns_sim, ns.alpha, temperature, ns.alpha_mode))
    stats["ns_mean"] = ns_sim.mean()
  lse = jax.nn.logsumexp(jnp.concatenate(parts, axis=1), axis=1)
  loss = jnp.mean(lse - pos / temperature)
  return loss, jax.lax.stop_gradient(stats)
