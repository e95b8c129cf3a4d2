"""Shape check shared by the losses that take per-anchor positive and negative logits."""

import jax


def check_logit_shapes(pos_logits: jax.Array, neg_logits: jax.Array, neg_mask: jax.Array) -> None:
  """Raise ValueError unless pos_logits is (N,), neg_logits (N, K) and neg_mask (N, K)."""
  n = pos_logits.shape[0]
  if pos_logits.shape != (n,) or neg_logits.ndim != 2 or neg_logits.shape[0] != n:
    raise ValueError(
        f"pos_logits must be (N,) and neg_logits (N, K); got {pos_logits.shape} "
        f"and {neg_logits.shape}"
    )
  if neg_mask.shape != neg_logits.shape:
    raise ValueError(
        f"neg_mask must have neg_logits' shape {neg_logits.shape}; got " f"{neg_mask.shape}"
    )
