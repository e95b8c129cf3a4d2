"""SimCLR's NT-Xent contrast over the global batch (Chen et al. 2020, Sec. 2.1).

The two views' unit projections z1, z2 (B, d) are stacked into 2B vectors
u = [z1; z2]; the positive of anchor i is its other view p(i) = (i + B) mod 2B,
and its negatives are the other 2B - 2 vectors. With s_ik = u_i . u_k,

  l_i  = -log( exp(s_ip(i) / T) / sum_{k != i} exp(s_ik / T) )
  loss = 1/(2B) sum_i l_i                       (both directions of every pair)

pair_contrast gives this contrast (cl_jax.losses.contrast) and batch_contrast
the same for anchors and candidate negatives built otherwise (the feature
transformation's, cl_jax.addons). Everything is ordinary jnp on the global
batch: under jit with the batch sharded over devices, XLA partitions it.
"""

from typing import Sequence

import jax
import jax.numpy as jnp

from cl_jax.losses import contrast as contrast_lib
from cl_jax.losses.queue_contrast import dot_scores


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


def positives(z1: jax.Array, z2: jax.Array) -> jax.Array:
  """(2B,) s_i,p(i) = z1_i . z2_i, once for each direction of the pair."""
  pos_half = jnp.sum(z1 * z2, axis=1)
  return jnp.concatenate([pos_half, pos_half])


def negative_mask(bsz: int) -> jax.Array:
  """(2B, 2B) bool, True where k is neither anchor i nor its partner p(i) = (i + B) mod 2B."""
  idx = jnp.arange(2 * bsz)
  partner = (idx + bsz) % (2 * bsz)
  return (idx[None, :] != idx[:, None]) & (idx[None, :] != partner[:, None])


def batch_contrast(
    anchors: jax.Array,
    pos: jax.Array,
    candidates: Sequence[jax.Array],
    masks: Sequence[jax.Array],
) -> contrast_lib.Contrast:
  """Contrast of anchors against one or more sets of candidate negatives.

  Args:
    anchors: (N, d) float32 anchors.
    pos: (N,) float32 positive similarities.
    candidates: sets of (C_i, d) float32 candidates; the similarities are
      anchors @ candidates.T (at full precision, dot_scores), side by side.
    masks: one (N, C_i) bool mask per set, True where the candidate is a negative.

  Returns:
    Contrast with pos, batch (N, sum C_i) and batch_mask.
  """
  sims = [dot_scores(anchors, c) for c in candidates]
  if len(sims) == 1:
    return contrast_lib.Contrast(pos=pos, batch=sims[0], batch_mask=masks[0])
  return contrast_lib.Contrast(
      pos=pos, batch=jnp.concatenate(sims, axis=1), batch_mask=jnp.concatenate(masks, axis=1)
  )


def pair_contrast(z1: jax.Array, z2: jax.Array) -> tuple[jax.Array, contrast_lib.Contrast]:
  """NT-Xent's contrast of the two views: anchors u = [z1; z2] against u itself.

  Args:
    z1, z2: (B, d) unit projections of the two views, B >= 2, any float dtype
      (the similarities are computed in float32).

  Returns:
    (anchors, contrast): (2B, d) float32 u, anchor i < B being z1_i and anchor
    B + i z2_i; Contrast with pos (2B,) s_i,p(i), batch (2B, 2B) s_ik and
    batch_mask (2B, 2B), True where k is neither i nor p(i) (2B - 2 per row).
  """
  _check_pair(z1, z2)
  z1, z2 = z1.astype(jnp.float32), z2.astype(jnp.float32)
  u = jnp.concatenate([z1, z2], axis=0)
  return u, batch_contrast(u, positives(z1, z2), [u], [negative_mask(z1.shape[0])])


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
    (loss, stats): () float32 loss and contrast_stats of all 2B anchors.
  """
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0; got {temperature}")
  _, c = pair_contrast(z1, z2)
  if extra_negative_logits is not None:
    c = contrast_lib.with_extra(c, extra_negative_logits, lambda e: e, None)
  return contrast_lib.info_nce(c, temperature), contrast_lib.contrast_stats(c, c.pos.shape[0])
