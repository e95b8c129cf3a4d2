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
negatives of Ge et al. 2021, Eq. 1). Everything is ordinary jnp on the global
batch: under jit with the batch sharded over devices, XLA partitions it.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp


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
  if z1.ndim != 2 or z1.shape != z2.shape:
    raise ValueError(f"z1 and z2 must both be (B, d) with the same shape; got {z1.shape} "
                     f"and {z2.shape}")
  bsz = z1.shape[0]
  if bsz < 2:
    raise ValueError(f"NT-Xent needs a batch of B >= 2 pairs to have negatives; got B = {bsz}")
  z1, z2 = z1.astype(jnp.float32), z2.astype(jnp.float32)
  u = jnp.concatenate([z1, z2], axis=0)                        # (2B, d)
  sim = u @ u.T
  pos_half = jnp.sum(z1 * z2, axis=1)
  pos = jnp.concatenate([pos_half, pos_half])
  idx = jnp.arange(2 * bsz)
  partner = (idx + bsz) % (2 * bsz)
  neg_mask = (idx[None, :] != idx[:, None]) & (idx[None, :] != partner[:, None])
  return PairScores(pos, sim, neg_mask)


def nt_xent_from_logits(pos_logits: jax.Array, neg_logits: jax.Array, neg_mask: jax.Array,
                        extra_negative_logits: jax.Array | None = None) -> jax.Array:
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
  n = pos_logits.shape[0]
  if pos_logits.shape != (n,) or neg_logits.ndim != 2 or neg_logits.shape[0] != n:
    raise ValueError(f"pos_logits must be (N,) and neg_logits (N, K); got {pos_logits.shape} "
                     f"and {neg_logits.shape}")
  if neg_mask.shape != neg_logits.shape:
    raise ValueError(f"neg_mask must have neg_logits' shape {neg_logits.shape}; got "
                     f"{neg_mask.shape}")
  parts = [pos_logits[:, None].astype(jnp.float32),
           jnp.where(neg_mask, neg_logits.astype(jnp.float32), -jnp.inf)]
  if extra_negative_logits is not None:
    if extra_negative_logits.ndim != 2 or extra_negative_logits.shape[0] != n:
      raise ValueError(f"extra_negative_logits must be (N, M) with N = {n} anchors; got "
                       f"{extra_negative_logits.shape}")
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


def nt_xent_loss(z1: jax.Array, z2: jax.Array, temperature: float,
                 extra_negative_logits: jax.Array | None = None) -> tuple[jax.Array, dict]:
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
  loss = nt_xent_from_logits(scores.pos / temperature, scores.sim / temperature,
                             scores.neg_mask, extra_negative_logits)
  return loss, score_stats(scores)
