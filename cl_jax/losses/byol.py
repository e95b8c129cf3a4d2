"""BYOL (Grill et al. 2020) and its non-semantic-negative variant (Ge et al. 2021).

The online network's prediction p of one view regresses onto the target (EMA)
network's projection z of the other view; the target gets no gradient, and its
weights follow the online ones with the cosine-scheduled momentum tau_k.
"""

import jax
import jax.numpy as jnp
import optax

# Floor on the squared norm when normalising, so a zero vector gives cos = 0, not NaN.
_EPS_SQ = 1e-12


def _cosine(a: jax.Array, b: jax.Array) -> jax.Array:
  """cos(a, b) over the last axis in float32 (optax's l2-normalised dot product)."""
  return optax.cosine_similarity(a.astype(jnp.float32), b.astype(jnp.float32), epsilon=_EPS_SQ)


def _check_pair(p: jax.Array, z: jax.Array) -> None:
  if p.ndim != 2 or p.shape != z.shape:
    raise ValueError(
        f"p and z must both be (B, d) with the same shape; got {p.shape} and " f"{z.shape}"
    )


def byol_loss(p: jax.Array, z: jax.Array, stop_gradient: bool = True) -> tuple[jax.Array, dict]:
  """BYOL regression loss of one view order (Grill et al. 2020, Sec. 3.1, Eq. 2).

  L = 1/B sum_i || p_i/||p_i|| - z_i/||z_i|| ||^2 = 1/B sum_i (2 - 2 cos(p_i, z_i)),
  with a stop-gradient on z. BYOL's total loss is the sum of the two view
  orders, L + L~ = byol_loss(p1, z2) + byol_loss(p2, z1) (Sec. 3.1); the
  caller adds them.

  Args:
    p: (B, d) online predictions of one view (any scale; normalised here).
    z: (B, d) target projections of the other view (normalised here).
    stop_gradient: block the gradient into z. False only for a z that is
      itself computed from p, the extrapolated target of feature
      transformation (cl_jax.addons.feature_transform.siamese_positive_extrapolation),
      whose gradient must reach p.

  Returns:
    (loss, stats): () float32 loss; stats["pos_mean"] = mean_i cos(p_i, z_i),
    no gradient.
  """
  _check_pair(p, z)
  cos = _cosine(p, jax.lax.stop_gradient(z) if stop_gradient else z)
  return jnp.mean(2.0 - 2.0 * cos), {"pos_mean": jax.lax.stop_gradient(cos.mean())}


def byol_ns_loss(
    p: jax.Array,
    z: jax.Array,
    t: jax.Array,
    alpha: float,
    *,
    stop_gradient: bool = True,
    anchor: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
  """BYOL with non-semantic negatives (Ge et al. 2021, Eq. 2), one view order.

  On unit vectors Eq. 2 reads
    L_i = ||z_i - z_p||^2 - alpha ||z_i - z_ns||^2
        = 2 - 2 alpha - 2 z_i.z_p + 2 alpha z_i.z_ns;
  its right-hand side fixes the norms as squared (||a - b||^2 = 2 - 2 a.b), the
  same squared distance as plain BYOL. Here z_i is the online prediction p_i,
  z_p the target projection z_i of the other view and z_ns the target
  projection of an NS image of the query view. With M NS images the penalty is
  their mean, so alpha means the same for any M (M = 1 is Eq. 2 exactly):
    loss = 1/B sum_i [ 2 - 2 cos(p_i, z_i) - alpha/M sum_m (2 - 2 cos(p_i, t_im)) ].
  The caller sums the two view orders as for byol_loss.

  Args:
    p: (B, d) online predictions (normalised here).
    z: (B, d) target projections of the other view (no gradient).
    t: (B, M, d) target projections of M NS images per query view (no gradient).
    alpha: >= 0, the NS penalty (about 0.05 in the paper); 0 gives byol_loss.
    stop_gradient: as for byol_loss (False for an extrapolated pair).
    anchor: (B, d) the prediction the NS distance is measured from, default p.
      With positive extrapolation (Zhu et al. 2021, App. E.2) p and z are the
      extrapolated pair and the anchor is the original prediction: the
      extrapolation makes the positive harder and leaves Eq. 2's NS term alone.

  Returns:
    (loss, stats): () float32 loss; stats pos_mean = mean_i cos(p_i, z_i) and
    ns_mean = mean over i, m of cos(anchor_i, t_im), no gradient.
  """
  _check_pair(p, z)
  if not alpha >= 0:
    raise ValueError(f"nonsemantic alpha must be >= 0; got {alpha}")
  loss, stats = byol_loss(p, z, stop_gradient)
  penalty, ns_mean = ns_distance(p if anchor is None else anchor, t)
  return loss - alpha * penalty, {**stats, "ns_mean": ns_mean}


def ns_distance(p: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The NS term of Eq. 2 before alpha: 1/B sum_i 1/M sum_m (2 - 2 cos(p_i, t_im)).

  Args:
    p: (B, d) online predictions (normalised here), with gradient.
    t: (B, M, d) target projections of the NS images (no gradient).

  Returns:
    (distance, ns_mean): () float32 mean squared distance of the unit vectors,
    and the mean cosine (no gradient).
  """
  if t.ndim != 3 or p.ndim != 2 or t.shape[0] != p.shape[0] or t.shape[2] != p.shape[1]:
    raise ValueError(f"t must be (B, M, d) = ({p.shape[0]}, M, {p.shape[-1]}); got {t.shape}")
  ns_cos = _cosine(p[:, None, :], jax.lax.stop_gradient(t))  # (B, M)
  return jnp.mean(2.0 - 2.0 * ns_cos), jax.lax.stop_gradient(ns_cos.mean())


def target_momentum(step: jax.Array | int, total_steps: int, base_momentum: float) -> jax.Array:
  """EMA momentum of the target network at step k (Grill et al. 2020, Sec. 3).

  tau_k = 1 - (1 - tau_base) (cos(pi k / K) + 1) / 2,
  from tau_base at k = 0 up to 1 at k = K; for k > K it stays 1 (optax's cosine
  decay holds its end value). jnp-traceable in `step`, so it can run inside jit.

  Args:
    step: k >= 0, Python int or traced integer scalar.
    total_steps: K > 0, a Python int.
    base_momentum: tau_base in [0, 1] (0.996 in BYOL).

  Returns:
    () float32 tau_k.
  """
  if not total_steps > 0:
    raise ValueError(f"total_steps must be > 0; got {total_steps}")
  if not 0.0 <= base_momentum <= 1.0:
    raise ValueError(f"base_momentum must lie in [0, 1]; got {base_momentum}")
  # optax's cosine decay is (1 - tau_base) (cos(pi k / K) + 1) / 2 for k <= K.
  decay = optax.cosine_decay_schedule(1.0 - base_momentum, total_steps)
  return (1.0 - decay(step)).astype(jnp.float32)
