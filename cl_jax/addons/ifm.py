"""Implicit feature modification (Robinson et al. 2021, Sec. 3, Eq. 2).

The adversary moves the positive key by -eps v and every negative by +eps v
(v the anchor); for unit vectors this lowers the positive similarity by eps and
raises every negative similarity by eps:

  l_eps = -log e^{(s+ - eps)/T} / (e^{(s+ - eps)/T} + sum_i e^{(s_i + eps)/T})     (Eq. 2)

and training minimises (L + alpha L_eps) / 2 (Sec. 3; alpha = 1 by default,
where it equals the (L + alpha L_eps) / (1 + alpha) of the authors' code).
"""

import jax


def adversarial_similarities(
    pos: jax.Array, neg: jax.Array | None, epsilon: float
) -> tuple[jax.Array, jax.Array | None]:
  """(s+ - eps, s_i + eps): the similarities of Eq. 2, any shapes, before the temperature."""
  return pos - epsilon, (None if neg is None else neg + epsilon)


def shifted_logsumexp(lse: jax.Array, epsilon: float, temperature: float) -> jax.Array:
  """log sum_i exp((s_i + eps) / T) from lse = log sum_i exp(s_i / T): lse + eps / T.

  Lets the adversarial loss reuse the log-sum-exp over the sharded queue.
  """
  return lse + epsilon / temperature


def combine(loss: jax.Array, adversarial: jax.Array, alpha: float) -> jax.Array:
  """(L + alpha L_eps) / 2, the IFM objective of Sec. 3."""
  return (loss + alpha * adversarial) / 2
