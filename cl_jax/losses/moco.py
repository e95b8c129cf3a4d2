"""MoCo's contrast (He et al. 2020, Eq. 1; Chen et al. 2020 for v2) against the sharded queue.

For each query q_i the positive is the key k_i of the other view from the
momentum encoder and the negatives are the K queued keys:

  L = mean_i ( log( e^{q_i.k_i / T} + sum_j e^{q_i.n_j / T} ) - q_i.k_i / T ).

The queue's part of the log-sum-exp comes from cl_jax.losses.queue_contrast,
so no device holds the whole queue. The contrast may hold several negative sets
scored against the queue (the feature transformation's, cl_jax.addons), whose
union enters the log-sum-exp.
"""

from typing import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from cl_jax.losses import contrast as contrast_lib
from cl_jax.losses import queue_contrast

# (keys (K, d) sharded over `data`, score function or None for q . key); see queue_terms.
NegativeSet = tuple[jax.Array, queue_contrast.ScoreFn | None]


def moco_contrast(
    q: jax.Array,
    k: jax.Array,
    negatives: Sequence[NegativeSet],
    temperature: float,
    mesh: Mesh,
    union_active: jax.Array | bool = True,
) -> contrast_lib.Contrast:
  """Contrast of B queries: positives q_i.k_i and the queue terms of the negative sets.

  Args:
    q: (B, d) queries, rows sharded over `data`, with gradient.
    k: (B, d) positive keys (the caller decides their gradient).
    negatives: one or more NegativeSets of equal size; with several, their
      union (queue_contrast.union), or the first alone while union_active is False.
    temperature: T > 0.
    mesh: the device mesh.
    union_active: bool or () bool array.

  Returns:
    Contrast with pos (B,) float32 and queue QueueTerms.
  """
  pos = jnp.sum(q * k, axis=1).astype(jnp.float32)
  terms = [
      queue_contrast.queue_terms(q, keys, temperature, mesh, scores) for keys, scores in negatives
  ]
  return contrast_lib.Contrast(pos=pos, queue=queue_contrast.union(terms, union_active))
