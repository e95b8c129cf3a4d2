"""InfoNCE over one positive and a set of negatives (MoCo, Eq. 1 of Ge et al. 2021).

Every contrast in cl_jax is reduced to logits of shape (B, 1 + N) whose column 0
is the positive; add-ons append columns (non-semantic negatives) or transform the
inputs (feature transformation) before the loss is taken.
"""
import jax
import jax.numpy as jnp
import optax


def similarity_logits(pos: jax.Array, neg: jax.Array, temperature: float) -> jax.Array:
  """Logits [pos, neg] / T.

  Args:
    pos: (B,) cosine similarities q_i . k_i of each query with its positive.
    neg: (B, N) similarities of each query with its negatives.
    temperature: T > 0.

  Returns:
    (B, 1 + N) float32 logits, positive in column 0.
  """
  return jnp.concatenate([pos[:, None], neg], axis=1).astype(jnp.float32) / temperature


def infonce_loss(logits: jax.Array) -> jax.Array:
  """Mean over queries of -log softmax(logits)[:, 0].

  L = -1/B sum_i log( exp(l_i0) / sum_j exp(l_ij) ), the NCE loss of
  Ge et al. 2021 Eq. 1 averaged rather than summed over the batch.

  Args:
    logits: (B, 1 + N) with the positive in column 0.

  Returns:
    Scalar float32 loss.
  """
  labels = jnp.zeros((logits.shape[0],), jnp.int32)
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels).mean()
