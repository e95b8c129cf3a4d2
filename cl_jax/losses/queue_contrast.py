"""Queries against the sharded memory queue, without any device holding all of it.

Each device holds a K/S-row shard of the queue and B/S queries. The queries are
gathered (B x d, small), every device scores all B queries against its own
shard, and the negatives' log-sum-exp is combined across devices with a
max-shifted sum, so no device ever holds the whole queue:

  m_i   = max over all shards of max_j s_ij / T
  LSE_i = m_i + log( sum over shards of sum_{j in shard} exp(s_ij / T - m_i) )
        = log sum_{j < K} exp(s_ij / T)

where s_ij = q_i . queue_j, or any score of query i against queue row j that a
score function computes from the gathered queries and the device's shard (e.g.
the hard negatives of Zhu et al. 2021, App. G.2, whose scores depend on the
query). A device's memory for the scores is B x K/S; the communication is the
gathered queries and a few length-B vectors. Gradients flow through the gather
(its transpose is a reduce-scatter), so one device and S devices give the same
loss and the same gradients.
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cl_jax.runtime.parallel import DATA_AXIS

# scores(q_all, queue_shard): (B, d) gathered queries and a (K/S, d) queue shard
# -> (B, K/S) scores s_ij, differentiable in the queries.
ScoreFn = Callable[[jax.Array, jax.Array], jax.Array]

# Every contrastive score is a float32 product at full precision: a TPU computes a
# default-precision float32 matrix product in one bfloat16 pass (about 3 significant digits,
# before the division by a temperature of 0.2 or less); GPUs and CPUs compute it in float32.
SCORE_PRECISION = jax.lax.Precision.HIGHEST


def dot_scores(a: jax.Array, b: jax.Array) -> jax.Array:
  """(n, d) x (m, d) -> (n, m) a @ b.T at SCORE_PRECISION."""
  return jnp.matmul(a, b.T, precision=SCORE_PRECISION)


class QueueTerms(NamedTuple):
  """Per-query quantities of the contrast against the queue, each (B,) float32.

  lse: log sum_j exp(s_ij / T), differentiable in q.
  mean, var: mean_j s_ij and var_j s_ij (before the temperature, no gradient),
    the negative-score statistics of Zhu et al. 2021, Sec. 3.
  """

  lse: jax.Array
  mean: jax.Array
  var: jax.Array


def queue_terms(
    q: jax.Array, queue: jax.Array, temperature: float, mesh: Mesh, scores: ScoreFn | None = None
) -> QueueTerms:
  """Log-sum-exp and score statistics of each query against the whole queue.

  Args:
    q: (B, d) queries, rows sharded over `data`, with gradient.
    queue: (K, d) keys, rows sharded over `data` (any order; no gradient).
    temperature: T > 0.
    mesh: mesh with the `data` axis.
    scores: None for s_ij = q_i . queue_j, or a function of the (B, d) gathered
      queries and the device's (K/S, d) queue shard returning the (B, K/S) scores
      s_ij. It runs once per device inside the shard map and may close over
      replicated values (coefficients, flags); the gradient flows through every
      use of the queries in it.

  Returns:
    QueueTerms of (B,) arrays of the scores s_ij, rows sharded over `data`.
  """
  k = queue.shape[0]
  queue = jax.lax.stop_gradient(queue)

  def local(q_shard, queue_shard):
    own = jax.lax.axis_index(DATA_AXIS)
    rows = q_shard.shape[0]
    q_all = jax.lax.all_gather(q_shard, DATA_AXIS, tiled=True)  # (B, d)
    s = dot_scores(q_all, queue_shard) if scores is None else scores(q_all, queue_shard)
    want = (q_all.shape[0], queue_shard.shape[0])
    if s.shape != want:
      raise ValueError(
          f"the score function must return the (B, K/S) = {want} scores of the "
          f"gathered queries against the queue shard, got shape {s.shape}"
      )
    s = s.astype(jnp.float32)  # (B, K/S)
    logits = s / temperature
    m = jax.lax.pmax(jax.lax.stop_gradient(logits).max(axis=1), DATA_AXIS)  # (B,)
    sumexp = jnp.exp(logits - m[:, None]).sum(axis=1)
    own_sumexp = jax.lax.psum_scatter(sumexp, DATA_AXIS, tiled=True)  # (B/S,)
    own_m = jax.lax.dynamic_slice_in_dim(m, own * rows, rows)
    lse = own_m + jnp.log(own_sumexp)

    s = jax.lax.stop_gradient(s)
    mean = jax.lax.psum(s.sum(axis=1), DATA_AXIS) / k  # (B,)
    sq = jnp.square(s - mean[:, None]).sum(axis=1)
    var = jax.lax.psum_scatter(sq, DATA_AXIS, tiled=True) / k
    return QueueTerms(lse, jax.lax.dynamic_slice_in_dim(mean, own * rows, rows), var)

  spec = P(DATA_AXIS)
  with jax.named_scope("queue_contrast"):  # names its collectives in the compiled program
    return jax.shard_map(
        local, mesh=mesh, in_specs=(spec, spec), out_specs=QueueTerms(spec, spec, spec)
    )(q, queue)


def union(terms: list[QueueTerms], active: jax.Array | bool = True) -> QueueTerms:
  """QueueTerms of the union of equal-sized negative sets.

  Log-sum-exp of the log-sum-exps, mean of the means, and the pooled variance
  (mean of the variances plus the variance of the means). While `active` is
  False the terms of the first set alone, exactly: a transformation not yet
  switched on leaves the K plain negatives, not the queue counted twice. One
  set is returned as it is.
  """
  if len(terms) == 1:
    return terms[0]
  means = jnp.stack([t.mean for t in terms])
  variances = jnp.stack([t.var for t in terms])
  pooled = QueueTerms(
      lse=jax.nn.logsumexp(jnp.stack([t.lse for t in terms]), axis=0),
      mean=means.mean(axis=0),
      var=variances.mean(axis=0) + means.var(axis=0),
  )
  return jax.tree.map(lambda u, first: jnp.where(active, u, first), pooled, terms[0])
