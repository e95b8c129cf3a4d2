"""SimSiam (Chen & He 2021): predictions regress onto the other view's projections.

No negatives and no momentum encoder; the stop-gradient on the projections is
what prevents collapse (Sec. 3 and 4.1).
"""

import jax
import jax.numpy as jnp
import optax

# Floor on the squared norm when normalising, so a zero vector gives cos = 0, not NaN.
_EPS_SQ = 1e-12


def simsiam_loss(
    p1: jax.Array, p2: jax.Array, z1: jax.Array, z2: jax.Array, stop_gradient: bool = True
) -> tuple[jax.Array, dict]:
  """Symmetric negative cosine similarity with stop-gradient (Eq. 1 and 4).

  D(p, z) = - p/||p|| . sg(z)/||z||, averaged over the batch;
  L = D(p1, z2)/2 + D(p2, z1)/2.

  Args:
    p1, p2: (B, d) predictor outputs of views 1 and 2, with gradient.
    z1, z2: (B, d) projector outputs of views 1 and 2; no gradient flows into them.
    stop_gradient: False only when z1, z2 are the extrapolated targets of
      feature transformation (computed from p, which must get their gradient;
      the caller stops the projections before mixing).

  Returns:
    (loss, stats): () float32 loss in [-1, 1]; stats["pos_mean"] = mean over
    both terms of cos(p, z), no gradient.
  """
  shapes = {a.shape for a in (p1, p2, z1, z2)}
  if len(shapes) != 1 or p1.ndim != 2:
    raise ValueError(
        f"p1, p2, z1, z2 must all be (B, d) with the same shape; got "
        f"{p1.shape}, {p2.shape}, {z1.shape}, {z2.shape}"
    )

  def cos(p, z):
    z = jax.lax.stop_gradient(z) if stop_gradient else z
    return optax.cosine_similarity(p.astype(jnp.float32), z.astype(jnp.float32), epsilon=_EPS_SQ)

  pos_mean = (cos(p1, z2).mean() + cos(p2, z1).mean()) / 2
  return -pos_mean, {"pos_mean": jax.lax.stop_gradient(pos_mean)}
