"""Implicit feature modification (Robinson et al. 2021, Sec. 3, Eq. 2).

The adversary moves the positive key by -eps v and every negative by +eps v
(v the anchor); for unit vectors this lowers the positive similarity by eps and
raises every negative similarity by eps:

  l_eps = -log e^{(s+ - eps)/T} / (e^{(s+ - eps)/T} + sum_i e^{(s_i + eps)/T})     (Eq. 2)

and training minimises (L + alpha L_eps) / 2 (Sec. 3; alpha = 1 by default,
where it equals the (L + alpha L_eps) / (1 + alpha) of the authors' code).
"""

import dataclasses
from typing import Callable

import jax
import ml_collections

from cl_jax.addons.addon import record
from cl_jax.losses.contrast import Contrast
from cl_jax.runtime.config_fields import number

# Its entry's members (cl_jax.addons).
BLOCK = "ifm"
TITLE = "implicit feature modification"
NEEDS = "it perturbs the logits of an InfoNCE loss"


def adversarial(contrast: Contrast, epsilon: float, temperature: float) -> Contrast:
  """The contrast of Eq. 2: s+ - eps, and s + eps for every negative of every kind.

  The queue's reduced log-sum-exp moves by eps / T, since
  log sum_j exp((s_j + eps) / T) = LSE + eps / T; the score statistics stay.
  """
  c = contrast
  pos, batch = c.pos - epsilon, None if c.batch is None else c.batch + epsilon
  extra = tuple(e._replace(sim=e.sim + epsilon) for e in c.extra)
  queue = None if c.queue is None else c.queue._replace(lse=c.queue.lse + epsilon / temperature)
  return Contrast(pos=pos, queue=queue, batch=batch, batch_mask=c.batch_mask, extra=extra)


@dataclasses.dataclass(frozen=True)
class IFM:
  """IFM of a run (the `ifm` config block): epsilon, the similarity shift; alpha, L_eps's weight."""

  epsilon: float
  alpha: float

  def loss(
      self, loss_of: Callable[[Contrast], jax.Array], contrast: Contrast, temperature: float
  ) -> jax.Array:
    """(L + alpha L_eps) / 2 with L = loss_of(contrast) and L_eps = loss_of(adversarial)."""
    loss = loss_of(contrast)
    adv = loss_of(adversarial(contrast, self.epsilon, temperature))
    return (loss + self.alpha * adv) / 2


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.enabled = False
  block.epsilon = 0.1  # similarity shift of the positive (-) and negatives (+)
  block.alpha = 1.0  # loss = (L + alpha L_eps) / 2
  return block


def check(c, method, reads_data: bool) -> None:
  del method, reads_data
  number(c, "ifm.epsilon", 0.0, 2.0, lo_open=True)
  number(c, "ifm.alpha", 0.0, None)


def describe(c) -> str:
  return f"implicit feature modification (epsilon {c.ifm.epsilon})"


def build(c, steps_per_epoch: int):
  return record(IFM, c.ifm)
