"""The InfoNCE contrast that MoCo, SimCLR and LooC share, in similarity space.

Anchor i has one positive similarity s+_i and negatives of three kinds, all
similarities before the temperature T:
  queue:  keys held in the sharded memory queue, reduced per anchor to
          LSE_i = log sum_j exp(s_ij / T) and the scores' mean and variance
          (cl_jax.losses.queue_contrast.QueueTerms);
  batch:  an (N, C) matrix of candidate similarities s_ik with a mask of the
          anchor's negatives (SimCLR's other in-batch views);
  extra:  further (N, M) blocks r_im whose logits f(r_im) are a given function
          of the similarity (non-semantic negatives, alpha r / T, Ge et al.
          2021, Eq. 1; LooC's same-image keys, r / T, Xiao et al. 2021, Eq. 2).
The loss (He et al. 2020, Eq. 1; Chen et al. 2020, Eq. 1):

  l_i = log( e^{s+_i/T} + e^{LSE_i} + sum_{k: mask_ik} e^{s_ik/T} + sum_m e^{f(r_im)} ) - s+_i / T
  L   = mean_i l_i.

Add-ons change the contrast, never this function: they append extra blocks,
build the similarities from transformed features, or shift every similarity
(cl_jax.addons).
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from cl_jax.losses.queue_contrast import QueueTerms


class Extra(NamedTuple):
  """A block of further negatives of each anchor.

  sim: (N, M) similarities r_im, before the temperature.
  logits: r -> (N, M) logits f(r), a fixed function of the similarities.
  stat: name of the statistic holding mean r_im, or None for none.
  """

  sim: jax.Array
  logits: Callable[[jax.Array], jax.Array]
  stat: str | None


class Contrast(NamedTuple):
  """The similarities of N anchors with their positive and their negatives (module docstring).

  pos: (N,) float32 s+_i.
  queue: QueueTerms of (N,) arrays, or None without a queue.
  batch: (N, C) float32 candidate similarities s_ik, or None.
  batch_mask: (N, C) bool, True where k is a negative of anchor i (with batch).
  extra: Extra blocks, in the order their logits join the log-sum-exp.
  """

  pos: jax.Array
  queue: QueueTerms | None = None
  batch: jax.Array | None = None
  batch_mask: jax.Array | None = None
  extra: tuple[Extra, ...] = ()


def with_extra(
    contrast: Contrast, sim: jax.Array, logits: Callable[[jax.Array], jax.Array], stat: str | None
) -> Contrast:
  """contrast with one more Extra block (sim (N, M), logits f, statistic name) at the end."""
  n = contrast.pos.shape[0]
  if sim.ndim != 2 or sim.shape[0] != n:
    raise ValueError(f"extra negatives must be (N, M) with N = {n} anchors; got {sim.shape}")
  return contrast._replace(extra=contrast.extra + (Extra(sim, logits, stat),))


def info_nce(contrast: Contrast, temperature: float) -> jax.Array:
  """L = mean_i l_i of the module docstring, () float32.

  Masked batch entries enter as -inf: they add exactly nothing and get exactly
  zero gradient. Every anchor needs at least one negative.
  """
  c, t = contrast, temperature
  parts = [c.pos[:, None] / t]
  if c.queue is not None:
    parts.append(c.queue.lse[:, None])
  if c.batch is not None:
    parts.append(jnp.where(c.batch_mask, c.batch / t, -jnp.inf))
  parts += [e.logits(e.sim).astype(jnp.float32) for e in c.extra]
  lse = jax.nn.logsumexp(jnp.concatenate(parts, axis=1), axis=1)
  return jnp.mean(lse - c.pos / t)


def contrast_stats(contrast: Contrast, rows: int) -> dict:
  """Score statistics of the first `rows` anchors (Zhu et al. 2021, Sec. 3), no gradient.

  Similarities before the temperature: pos_mean = mean_i s+_i; neg_mean =
  mean_i mean_k s_ik and neg_var = mean_i var_k s_ik over the anchor's queue or
  in-batch negatives (population variance); each Extra block with a stat name
  adds mean_{i, m} r_im under that name.

  Returns:
    dict of () float32.
  """
  c, sg = contrast, jax.lax.stop_gradient
  stats = {"pos_mean": c.pos[:rows].mean()}
  if c.queue is not None:
    stats.update(neg_mean=c.queue.mean[:rows].mean(), neg_var=c.queue.var[:rows].mean())
  if c.batch is not None:
    sim, mask = sg(c.batch[:rows]), c.batch_mask[:rows]
    count = mask.sum(axis=1)
    mean = jnp.where(mask, sim, 0.0).sum(axis=1) / count
    var = jnp.where(mask, jnp.square(sim - mean[:, None]), 0.0).sum(axis=1) / count
    stats.update(neg_mean=mean.mean(), neg_var=var.mean())
  for e in c.extra:
    if e.stat is not None:
      stats[e.stat] = e.sim[:rows].mean()
  return sg(stats)
