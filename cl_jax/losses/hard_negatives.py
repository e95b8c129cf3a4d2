"""Hard-negative sampling objective (Robinson, Chuang, Sra & Jegelka, ICLR 2021; "HCL").

The negative term of the contrastive loss is an importance-sampling estimate
under a distribution that favours negatives close to the anchor, debiased for
the chance that a "negative" shares the anchor's class. With logits
s_ik = u_i . u_k / T over anchor i's N negatives and s+_i its positive logit:

  w_ik  = exp(beta s_ik) / sum_k exp(beta s_ik)            (hardness concentration beta >= 0)
  Ng_i  = max( ( N sum_k w_ik e^{s_ik} - tau+ N e^{s+_i} ) / (1 - tau+),  N e^{-1/T} )
  l_i   = -log( e^{s+_i} / (e^{s+_i} + Ng_i) )
  loss  = mean_i l_i

tau+ in [0, 1) is the class prior of the debiasing correction (0: none) and
N e^{-1/T} the estimator's theoretical minimum (every negative at similarity
-1). beta = 0 weights the negatives uniformly, so with tau+ = 0 the loss is
NT-Xent (the clamp cannot engage for logits of unit vectors, s_ik >= -1/T).
"""

import jax
import jax.numpy as jnp

from cl_jax.losses.contrast import Contrast


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


def hcl_loss_from_logits(
    pos_logits: jax.Array,
    neg_logits: jax.Array,
    neg_mask: jax.Array,
    beta: float,
    tau_plus: float,
    temperature: float,
) -> jax.Array:
  """Mean hard-negative loss l_i of the module docstring, computed in log space.

  With LSE_i(x) = log sum_{k: mask_ik} exp(x_ik) and N_i the number of negatives
  of anchor i (True entries of its mask row):

    log(N sum_k w_ik e^{s_ik}) = log N_i + LSE_i((beta + 1) s) - LSE_i(beta s)      =: a_i
    log(tau+ N e^{s+_i})       = log(tau+ N_i) + s+_i                                 =: b_i
    log Ng_i = max( a_i + log(1 - e^{b_i - a_i}) - log(1 - tau+),  log N_i - 1/T )
    l_i      = logaddexp(s+_i, log Ng_i) - s+_i

  where the first argument of the max is -inf when b_i >= a_i (the debiased
  estimate is not positive: the clamp holds). Masked entries enter the
  log-sum-exps as -inf, so they add nothing and receive exactly zero gradient;
  every row needs at least one negative. When the clamp holds, the loss of that
  anchor does not depend on its negatives (zero gradient to them).

  Args:
    pos_logits: (N,) s+_i = u_i . u_p(i) / T.
    neg_logits: (N, K) candidate negative logits s_ik = u_i . u_k / T.
    neg_mask: (N, K) bool, True where k is a negative of anchor i.
    beta: hardness concentration, a Python float >= 0.
    tau_plus: class prior, a Python float in [0, 1).
    temperature: T > 0 of the logits (it sets the clamp N e^{-1/T}).

  Returns:
    () float32 loss, the mean over the N anchors.
  """
  check_logit_shapes(pos_logits, neg_logits, neg_mask)
  if not beta >= 0:
    raise ValueError(f"hcl beta (hardness concentration) must be >= 0; got {beta}")
  if not 0 <= tau_plus < 1:
    raise ValueError(f"hcl tau_plus (class prior) must be in [0, 1); got {tau_plus}")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0; got {temperature}")

  pos = pos_logits.astype(jnp.float32)
  neg = neg_logits.astype(jnp.float32)
  masked_lse = lambda x: jax.nn.logsumexp(jnp.where(neg_mask, x, -jnp.inf), axis=1)
  log_count = jnp.log(neg_mask.sum(axis=1).astype(jnp.float32))
  log_mean = log_count + masked_lse((beta + 1.0) * neg) - masked_lse(beta * neg)
  if tau_plus == 0:
    log_debiased = log_mean
  else:
    gap = log_count + jnp.log(tau_plus) + pos - log_mean  # b_i - a_i
    positive = gap < 0
    # Double where: the unused branch sees a finite argument, so no NaN gradient.
    safe_gap = jnp.where(positive, gap, -1.0)
    log_debiased = jnp.where(positive, log_mean + jnp.log1p(-jnp.exp(safe_gap)), -jnp.inf)
    log_debiased = log_debiased - jnp.log1p(-tau_plus)
  log_ng = jnp.maximum(log_debiased, log_count - 1.0 / temperature)
  return jnp.mean(jnp.logaddexp(pos, log_ng) - pos)


def hcl_loss(contrast: Contrast, temperature: float, beta: float, tau_plus: float) -> jax.Array:
  """hcl_loss_from_logits of a contrast's in-batch negatives: logits s+_i / T and s_ik / T.

  The estimator takes the place of InfoNCE's negative term, so the contrast holds
  in-batch negatives only (no queue, no extra blocks).
  """
  c = contrast
  if c.batch is None or c.queue is not None or c.extra:
    raise ValueError(
        "hard-negative sampling weighs in-batch negatives only: the contrast must hold a "
        "batch block and no queue or extra negatives"
    )
  return hcl_loss_from_logits(
      c.pos / temperature, c.batch / temperature, c.batch_mask, beta, tau_plus, temperature
  )
