"""The MoCo memory queue: a ring buffer of the K most recent keys.

The queue is a (K, d) array split into `num_shards` contiguous shards of K / S
rows (S = number of devices on the `data` mesh axis). Shard j receives the keys
of batch rows [j * P/S, (j+1) * P/S) (the rows that device j holds when the
batch is sharded), at the same local offset in every shard. With S = 1 this is
the plain ring buffer of He et al. 2020: keys in batch order, oldest replaced
first. The write pointer is derived from the step, never stored.
"""
import jax
import jax.numpy as jnp


def write_offset(step: jax.Array, keys_per_step: int, queue_size: int,
                 num_shards: int) -> jax.Array:
  """Local row offset at which step `step` writes into every shard.

  offset = (step * P / S) mod (K / S), P keys per step, K rows, S shards.
  """
  local_keys, local_rows = keys_per_step // num_shards, queue_size // num_shards
  return (step * local_keys) % local_rows


def enqueue(queue: jax.Array, keys: jax.Array, step: jax.Array,
            num_shards: int = 1) -> jax.Array:
  """Replace the oldest P keys of the queue with `keys`.

  Args:
    queue: (K, d) current queue.
    keys: (P, d) new keys, P divides K and S divides P.
    step: scalar int, the training step whose keys these are.
    num_shards: S, number of queue shards.

  Returns:
    (K, d) updated queue.
  """
  k, d = queue.shape
  p = keys.shape[0]
  if k % p or p % num_shards:
    raise ValueError(f"the keys per step ({p}) must divide the queue size ({k}) and be "
                     f"divisible by the number of queue shards ({num_shards})")
  offset = write_offset(step, p, k, num_shards)
  shards = queue.reshape(num_shards, k // num_shards, d)
  new = keys.astype(queue.dtype).reshape(num_shards, p // num_shards, d)
  shards = jax.lax.dynamic_update_slice(shards, new, (0, offset, 0))
  return shards.reshape(k, d)


def init_queue(rng: jax.Array, queue_size: int, dim: int) -> jax.Array:
  """(K, d) random l2-normalised keys, the initial queue of MoCo."""
  q = jax.random.normal(rng, (queue_size, dim), jnp.float32)
  return q / jnp.linalg.norm(q, axis=1, keepdims=True)
