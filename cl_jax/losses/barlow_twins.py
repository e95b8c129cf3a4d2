"""Barlow Twins (Zbontar, Jing, Misra, LeCun & Deny, ICML 2021): the cross-correlation of the
two views' embeddings is driven towards the identity; no negatives, no predictor, no target.

  C_ij = sum_b zA_bi zB_bj / ( sqrt(sum_b zA_bi^2) sqrt(sum_b zB_bj^2) )        (Eq. 2)
  L_BT = sum_i (1 - C_ii)^2 + lambda sum_i sum_{j != i} C_ij^2                  (Eq. 1)

over the global batch b = 1..B, the embeddings mean-centred along the batch first (Sec. 2 and
Algorithm 1: each output normalised along the batch dimension), so C is the matrix of
correlations between the dimensions of the two views' embeddings, in [-1, 1].
"""

import jax
import jax.numpy as jnp

from cl_jax.losses.queue_contrast import SCORE_PRECISION


def cross_correlation(za: jax.Array, zb: jax.Array, eps: float = 1e-5) -> jax.Array:
  """C of Eq. 2 on mean-centred embeddings.

  Each dimension is centred and scaled along the batch, z^_bi = (z_bi - mean_b z_bi) /
  sqrt(B (var_b z_bi + eps)), so C = z^A^T z^B; eps = 0 gives Eq. 2 exactly, eps > 0 keeps a
  constant dimension at 0 instead of 0 / 0 (eps is batch norm's, on the biased variance).

  Args:
    za, zb: (B, d) embeddings of the two views, rows split over the batch (the sums run over
      the global batch).
    eps: added to each dimension's variance.

  Returns:
    (d, d) float32 C, C[i, j] = corr(za[:, i], zb[:, j]).
  """
  if za.shape != zb.shape or za.ndim != 2:
    raise ValueError(f"za and zb must be (B, d) of one shape; got {za.shape} and {zb.shape}")

  def standardised(z):
    z = z.astype(jnp.float32)
    centred = z - z.mean(axis=0)
    var = jnp.mean(jnp.square(centred), axis=0)
    return centred / jnp.sqrt(z.shape[0] * (var + eps))

  return jnp.einsum("bi,bj->ij", standardised(za), standardised(zb), precision=SCORE_PRECISION)


def barlow_twins_loss(
    za: jax.Array, zb: jax.Array, off_diagonal_weight: float, eps: float = 1e-5
) -> tuple[jax.Array, dict]:
  """L_BT of Eq. 1 and its statistics.

  Args:
    za, zb: (B, d) projector outputs of the two views (not normalised), both with gradient.
    off_diagonal_weight: lambda, the weight of the redundancy-reduction term.
    eps: cross_correlation's.

  Returns:
    (loss, stats): () float32 L_BT; stats["pos_mean"] = mean_i C_ii (the invariance term's
    correlations) and stats["off_diagonal_rms"] = sqrt(mean_{i != j} C_ij^2), no gradient.
  """
  c = cross_correlation(za, zb, eps)
  d = c.shape[0]
  diagonal = jnp.diagonal(c)
  off_sq = jnp.sum(jnp.square(c)) - jnp.sum(jnp.square(diagonal))
  loss = jnp.sum(jnp.square(1.0 - diagonal)) + off_diagonal_weight * off_sq
  stats = {
      "pos_mean": jnp.mean(diagonal),
      "off_diagonal_rms": jnp.sqrt(off_sq / max(d * (d - 1), 1)),
  }
  return loss, jax.lax.stop_gradient(stats)
