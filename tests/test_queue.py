"""Tests for cl_jax.losses.memory_queue: the MoCo key queue as a ring buffer, on one device and
sharded.

The reference is a NumPy ring buffer with an explicit write pointer per shard (advanced
by P / S rows after every step, wrapping at K / S), never derived from the step number.
Key p of step t carries the id t * P + p + 1 in coordinate 0 so every row can be traced.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.losses import memory_queue as queue_lib
from cl_jax.runtime import parallel

DIM = 3


def _mesh(num_shards):
  return parallel.make_mesh(jax.devices()[:num_shards])


@functools.partial(jax.jit, static_argnames="num_shards")
def _enqueue(queue, keys, step, num_shards):
  """enqueue on a mesh of `num_shards` devices, queue and keys sharded over rows."""
  mesh = _mesh(num_shards)
  rows = parallel.batch_sharding(mesh)
  queue, keys = (jax.lax.with_sharding_constraint(x, rows) for x in (queue, keys))
  return queue_lib.enqueue(queue, keys, step, mesh)


def _step_keys(rng, step, keys_per_step):
  """(P, DIM) keys whose coordinate 0 is the id step * P + p + 1 (exact in float32)."""
  keys = rng.normal(size=(keys_per_step, DIM))
  keys[:, 0] = step * keys_per_step + np.arange(keys_per_step) + 1
  return keys.astype(np.float32)


class NumpyRing:
  """K rows in S contiguous shards; shard j takes batch rows [j P/S, (j+1) P/S)."""

  def __init__(self, initial, num_shards):
    self.rows = initial.copy()
    self.shards = num_shards
    self.pointer = [0] * num_shards

  def push(self, keys):
    k, p = len(self.rows), len(keys)
    local_rows, local_keys = k // self.shards, p // self.shards
    for j in range(self.shards):
      start = j * local_rows + self.pointer[j]
      self.rows[start : start + local_keys] = keys[j * local_keys : (j + 1) * local_keys]
      self.pointer[j] = (self.pointer[j] + local_keys) % local_rows


def _simulate(queue_size, keys_per_step, num_shards, steps, seed=0):
  """Yields (step, keys, previous queue, queue, NumPy reference) after each step."""
  rng = np.random.default_rng(seed)
  initial = rng.normal(size=(queue_size, DIM)).astype(np.float32)
  initial[:, 0] = -np.arange(queue_size) - 1  # initial rows: negative ids
  ring = NumpyRing(initial, num_shards)
  queue = jnp.asarray(initial)
  for t in range(steps):
    keys = _step_keys(rng, t, keys_per_step)
    before = np.asarray(queue)
    queue = _enqueue(queue, jnp.asarray(keys), jnp.asarray(t, jnp.int32), num_shards)
    ring.push(keys)
    yield t, keys, before, np.asarray(queue), ring.rows.copy()


def test_single_shard_writes_keys_in_batch_order_at_the_pointer():
  k, p = 16, 4
  for t, keys, before, after, _ in _simulate(k, p, 1, 9):
    start = (t * p) % k
    np.testing.assert_array_equal(after[start : start + p], keys)
    rest = np.ones(k, bool)
    rest[start : start + p] = False
    np.testing.assert_array_equal(after[rest], before[rest])  # all other rows unchanged


@pytest.mark.parametrize("k,p", [(16, 4), (12, 3), (8, 8)])
def test_single_shard_matches_numpy_ring_buffer(k, p):
  for _, _, _, after, want in _simulate(k, p, 1, 3 * k // p + 2):
    chex.assert_shape(after, (k, DIM))
    assert after.dtype == np.float32
    np.testing.assert_array_equal(after, want)


def test_wrap_around_replaces_the_oldest_keys_first():
  k, p = 16, 4
  for t, _, before, after, _ in _simulate(k, p, 1, 3 * k // p):
    start = (t * p) % k
    overwritten = before[start : start + p, 0].astype(int)
    if t < k // p:
      np.testing.assert_array_equal(overwritten, -(np.arange(start, start + p) + 1))
    else:  # the keys of step t - K/P, the oldest ones
      np.testing.assert_array_equal(overwritten, (t - k // p) * p + np.arange(p) + 1)
    # The queue holds the newest min(K, (t+1) P) keys and initial rows for the rest.
    written = min((t + 1) * p, k)
    newest = np.arange((t + 1) * p - written, (t + 1) * p) + 1
    initial = -(np.arange(written, k) + 1)
    np.testing.assert_array_equal(
        np.sort(after[:, 0]).astype(int), np.sort(np.concatenate([initial, newest]))
    )


@pytest.mark.parametrize("k,p,s", [(24, 6, 3), (16, 4, 2), (16, 8, 4), (8, 2, 2)])
def test_sharded_queue_matches_numpy_rule(k, p, s):
  for t, keys, _, after, want in _simulate(k, p, s, 3 * k // p + 1, seed=k + p + s):
    np.testing.assert_array_equal(after, want)
    # Shard j holds batch rows [j P/S, (j+1) P/S) at local offset (t P/S) mod (K/S).
    local = (t * p // s) % (k // s)
    for j in range(s):
      rows = after[j * k // s + local : j * k // s + local + p // s]
      np.testing.assert_array_equal(rows, keys[j * p // s : (j + 1) * p // s])


def test_sharded_queue_keeps_the_latest_keys_of_every_shard():
  k, p, s = 24, 6, 3
  for t, _, _, after, _ in _simulate(k, p, s, 2 * k // p):
    if (t + 1) * p < k:
      continue
    ids = np.sort(after[:, 0]).astype(int)
    np.testing.assert_array_equal(ids, np.arange((t + 1) * p - k, (t + 1) * p) + 1)


def test_write_offset_formula():
  # offset = (t * P / S) mod (K / S), checked on hand-computed values.
  cases = [
      (0, 4, 16, 1, 0),
      (3, 4, 16, 1, 12),
      (4, 4, 16, 1, 0),
      (5, 4, 16, 1, 4),
      (3, 6, 24, 3, 6),
      (4, 6, 24, 3, 0),
      (7, 6, 24, 3, 6),
  ]
  for step, p, k, s, want in cases:
    assert int(queue_lib.write_offset(jnp.asarray(step), p, k, s)) == want


def test_init_queue_rows_are_unit_norm():
  q = queue_lib.init_queue(jax.random.key(0), 64, 16, 1, 8)
  chex.assert_shape(q, (64, 16))
  assert q.dtype == jnp.float32
  np.testing.assert_allclose(np.linalg.norm(np.asarray(q, np.float64), axis=1), 1.0, rtol=1e-6)
  # Random directions: no two rows equal, mean direction near 0 (|mean| ~ 1/sqrt(64 * 16)).
  assert len(np.unique(np.asarray(q), axis=0)) == 64
  assert np.abs(np.asarray(q).mean(axis=0)).max() < 0.2
  other = queue_lib.init_queue(jax.random.key(1), 64, 16, 1, 8)
  assert not np.array_equal(np.asarray(q), np.asarray(other))


def test_layout_matches_hand_computed_permutation():
  # K = 8, P = 4, S = 2: ring rows [t P + i] for slots t in {0, 1}, keys i in 0..3.
  # Shard 0 takes keys 0, 1 of each slot, shard 1 keys 2, 3: rows 0 1 4 5 | 2 3 6 7.
  ring = np.arange(8, dtype=np.float32)[:, None]
  sharded = np.asarray(queue_lib.to_sharded_layout(jnp.asarray(ring), 2, 4))
  np.testing.assert_array_equal(sharded[:, 0], [0, 1, 4, 5, 2, 3, 6, 7])
  back = queue_lib.to_ring_order(jnp.asarray(sharded), 2, 4)
  np.testing.assert_array_equal(np.asarray(back), ring)


@pytest.mark.parametrize("k,p,s", [(24, 6, 3), (16, 4, 2), (32, 8, 8)])
def test_sharded_queue_holds_the_one_device_queue_in_every_step(k, p, s):
  # Starting from the same keys, S shards and one shard hold the same keys in the same
  # slots after every step: to_ring_order(sharded) equals the one-device ring buffer.
  rng = np.random.default_rng(k + p + s)
  initial = rng.normal(size=(k, DIM)).astype(np.float32)
  ring = jnp.asarray(initial)
  sharded = queue_lib.to_sharded_layout(jnp.asarray(initial), s, p)
  for t in range(2 * k // p + 1):
    keys = jnp.asarray(_step_keys(rng, t, p))
    ring = _enqueue(ring, keys, jnp.asarray(t), 1)
    sharded = _enqueue(sharded, keys, jnp.asarray(t), s)
    np.testing.assert_array_equal(
        np.asarray(queue_lib.to_ring_order(sharded, s, p)), np.asarray(ring)
    )


@pytest.mark.parametrize("s", [1, 2, 8])
def test_each_device_holds_k_over_s_rows(s):
  k, p, d = 64, 16, 8
  mesh = _mesh(s)
  init = jax.jit(
      lambda: queue_lib.init_queue(jax.random.key(0), k, d, s, p),
      out_shardings=parallel.batch_sharding(mesh),
  )
  q = init()
  shards = q.addressable_shards
  assert len(shards) == s
  assert all(sh.data.shape == (k // s, d) for sh in shards)
  assert all(sh.data.nbytes == k * d * 4 // s for sh in shards)
  # The same initial keys in the same slots for every shard count.
  ring = queue_lib.init_queue(jax.random.key(0), k, d, 1, p)
  np.testing.assert_allclose(
      np.asarray(queue_lib.to_ring_order(q, s, p)), np.asarray(ring), rtol=1e-6, atol=1e-7
  )


@pytest.mark.parametrize("k,p,s", [(10, 4, 1), (8, 3, 2)])
def test_enqueue_rejects_keys_that_do_not_tile_the_queue(k, p, s):
  # P must divide K and S must divide P (docstring of enqueue); otherwise the write would be
  # clamped inside the buffer (K = 10, P = 4, step 2 writes rows 6..9, not 8, 9, 0, 1).
  with pytest.raises(ValueError, match="keys per step"):
    queue_lib.enqueue(jnp.zeros((k, DIM)), jnp.ones((p, DIM)), jnp.asarray(2), _mesh(s))
