"""Weighted k-nearest-neighbour classification of frozen features (Wu et al. 2018, Sec. 3.4;
the kNN monitor of solo-learn and the MoCo CIFAR demo), with the memory bank sharded over the
device mesh.

A query q (unit) scores class c by its k most similar bank features b_i (unit, cosine
similarity s_i = q . b_i):

  score_c(q) = sum_{i in top-k(q)} exp(s_i / T) [y_i = c]

and is predicted as argmax_c score_c. Each device holds a slice of the bank, finds its local
top-k, and the candidates of all devices are gathered for the global top-k, so one device and
many devices pick the same neighbours.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cl_jax.models.heads import l2_normalize
from cl_jax.parallel import DATA_AXIS


def _similarities(queries: jax.Array, bank: jax.Array, labels: jax.Array) -> jax.Array:
  """(Q, N) cosine similarities, -inf for the bank's padding rows (label -1)."""
  sims = l2_normalize(queries.astype(jnp.float32)) @ l2_normalize(bank.astype(jnp.float32)).T
  return jnp.where(labels[None, :] >= 0, sims, -jnp.inf)


def _vote(sims: jax.Array, labels: jax.Array, num_classes: int, temperature: float) -> jax.Array:
  """sum_i exp(s_i / T) one_hot(y_i): (Q, k) similarities and labels -> (Q, C)."""
  weights = jnp.where(labels >= 0, jnp.exp(sims / temperature), 0.0)
  return jnp.einsum("qk,qkc->qc", weights, jax.nn.one_hot(labels, num_classes))


@functools.cache
def sharded_knn_scores(mesh: Mesh, num_classes: int, k: int, temperature: float):
  """Class scores of weighted kNN with the bank's rows split over the mesh's `data` axis.

  Returns a jitted scores(queries (Q, D) replicated, bank (N, D), bank_labels (N,)) ->
  (Q, num_classes) float32. Features are normalised inside; labels are ints in
  [0, num_classes), -1 for padding rows, N a multiple of the device count (pad_bank) and
  k <= N. Each device's top-k is gathered and the global top-k of the candidates votes.
  """

  def local(queries, bank, labels):
    top, index = jax.lax.top_k(_similarities(queries, bank, labels), min(k, bank.shape[0]))
    top = jax.lax.all_gather(top, DATA_AXIS, axis=1, tiled=True)  # (Q, devices * k)
    cand = jax.lax.all_gather(labels[index], DATA_AXIS, axis=1, tiled=True)
    best, pick = jax.lax.top_k(top, k)
    return _vote(best, jnp.take_along_axis(cand, pick, axis=1), num_classes, temperature)

  return jax.jit(
      jax.shard_map(
          local,
          mesh=mesh,
          in_specs=(P(), P(DATA_AXIS), P(DATA_AXIS)),
          out_specs=P(),
          check_vma=False,
      )
  )


def pad_bank(bank: np.ndarray, labels: np.ndarray, multiple: int) -> tuple[np.ndarray, np.ndarray]:
  """Pad the bank with zero rows labelled -1 to a multiple of `multiple` rows."""
  extra = -len(bank) % multiple
  return (
      np.concatenate([bank, np.zeros((extra, bank.shape[1]), bank.dtype)]),
      np.concatenate([labels, -np.ones(extra, labels.dtype)]),
  )


def knn_accuracy(
    mesh: Mesh,
    bank: np.ndarray,
    bank_labels: dict[str, np.ndarray],
    queries: np.ndarray,
    query_labels: dict[str, np.ndarray],
    num_classes: dict[str, int],
    k: int = 200,
    temperature: float = 0.1,
    chunk: int = 1024,
) -> dict[str, float]:
  """Top-1 weighted-kNN accuracy of every label, the bank sharded over `mesh`.

  Args:
    bank: (N, D) features of the memory bank (the probe's train split).
    bank_labels, query_labels: {label name: (N,) / (Q,) ints}.
    queries: (Q, D) features of the evaluated split.
    num_classes: {label name: classes}.
    k: neighbours (at most N); temperature: T.
    chunk: queries scored per call.

  Returns:
    {label name: accuracy in [0, 1]}.
  """
  if not 1 <= k <= len(bank):
    raise ValueError(f"k must be in [1, {len(bank)}] (the bank's size), got {k}")
  devices = mesh.shape[DATA_AXIS]
  rows = NamedSharding(mesh, P(DATA_AXIS))
  out = {}
  for name, labels in bank_labels.items():
    padded, padded_labels = pad_bank(np.asarray(bank, np.float32), np.asarray(labels), devices)
    on_mesh = jax.device_put(padded, rows), jax.device_put(padded_labels.astype(np.int32), rows)
    scores = sharded_knn_scores(mesh, num_classes[name], k, temperature)
    predicted = np.concatenate(
        [
            np.argmax(np.asarray(scores(jnp.asarray(queries[s : s + chunk]), *on_mesh)), axis=1)
            for s in range(0, len(queries), chunk)
        ]
    )
    out[name] = float(np.mean(predicted == np.asarray(query_labels[name])))
  return out
