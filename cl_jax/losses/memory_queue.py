"""The MoCo memory queue: a ring buffer of the K most recent keys, sharded over devices.

The (K, d) queue is split into S contiguous shards of K / S rows, one per device of the
`data` mesh axis, so the queue's memory is divided among them. Shard j receives the keys of
batch rows [j P/S, (j+1) P/S) of every step (the rows device j computed), at the same local
offset in every shard, so each device writes only into its own shard. With S = 1 this is the
plain ring buffer of He et al. 2020: keys in batch order, oldest replaced first. The write
pointer is derived from the step, never stored.

Ring order and sharded layout. Let n = K / P be the number of steps the queue
holds. In ring order (the S = 1 layout) key i of the step in slot t sits in row
t P + i. In the S-shard layout the same key sits in row j K/S + t P/S + i' with
j = i div (P/S) and i' = i mod (P/S): the (n, S, P/S) index block is transposed
to (S, n, P/S). Both layouts hold the same keys in the same slots, so a run on S
devices and a run on one device hold the same queue up to this permutation.
"""

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cl_jax.runtime import parallel
from cl_jax.runtime.errors import UsageError
from cl_jax.runtime.parallel import DATA_AXIS


def check_layout(queue_size: int, keys_per_step: int, num_shards: int) -> None:
  """A queue of queue_size keys holds whole steps of keys_per_step keys, split evenly over
  num_shards shards; ValueError otherwise."""
  if queue_size % keys_per_step or keys_per_step % num_shards:
    raise ValueError(
        f"the keys per step ({keys_per_step}) must divide the queue size "
        f"({queue_size}) and be divisible by the number of queue shards "
        f"({num_shards})"
    )


def to_sharded_layout(queue: jax.Array, num_shards: int, keys_per_step: int) -> jax.Array:
  """(K, ...) queue in ring order -> the same keys in the S-shard layout. Trailing axes
  (d, or (H, d) for LooC's one queue per head) move with their row."""
  k, rest = queue.shape[0], queue.shape[1:]
  check_layout(k, keys_per_step, num_shards)
  blocks = queue.reshape((k // keys_per_step, num_shards, keys_per_step // num_shards) + rest)
  return blocks.swapaxes(0, 1).reshape(queue.shape)


def to_ring_order(queue: jax.Array, num_shards: int, keys_per_step: int) -> jax.Array:
  """(K, ...) queue in the S-shard layout -> the same keys in ring order (inverse of
  to_sharded_layout)."""
  k, rest = queue.shape[0], queue.shape[1:]
  check_layout(k, keys_per_step, num_shards)
  blocks = queue.reshape((num_shards, k // keys_per_step, keys_per_step // num_shards) + rest)
  return blocks.swapaxes(0, 1).reshape(queue.shape)


def write_offset(
    step: jax.Array, keys_per_step: int, queue_size: int, num_shards: int
) -> jax.Array:
  """Local row offset at which step `step` writes into every shard.

  offset = (step * P / S) mod (K / S), P keys per step, K rows, S shards.
  """
  local_keys, local_rows = keys_per_step // num_shards, queue_size // num_shards
  return (step * local_keys) % local_rows


def enqueue(queue: jax.Array, keys: jax.Array, step: jax.Array, mesh: Mesh) -> jax.Array:
  """Replace the oldest P keys of the queue with `keys`, each device in its own shard.

  Args:
    queue: (K, ...) current queue in the S-shard layout, rows sharded over `data`
      ((K, d); (K, H, d) for LooC's H queues, which advance together).
    keys: (P, ...) new keys, rows sharded over `data`; P divides K, S divides P.
    step: scalar int, the training step whose keys these are.
    mesh: mesh whose `data` axis has S devices.

  Returns:
    (K, ...) updated queue, sharded like `queue`.
  """
  k = queue.shape[0]
  p = keys.shape[0]
  shards = mesh.shape[DATA_AXIS]
  check_layout(k, p, shards)
  offset = write_offset(step, p, k, shards)

  def local(queue_shard, key_shard, offset):
    start = (offset,) + (0,) * (queue_shard.ndim - 1)
    return jax.lax.dynamic_update_slice(queue_shard, key_shard.astype(queue_shard.dtype), start)

  return jax.shard_map(
      local, mesh=mesh, in_specs=(P(DATA_AXIS), P(DATA_AXIS), P()), out_specs=P(DATA_AXIS)
  )(queue, keys, offset)


def init_queue(
    rng: jax.Array,
    queue_size: int,
    dim: int,
    num_shards: int,
    keys_per_step: int,
    heads: int | None = None,
) -> jax.Array:
  """(K, d) random unit keys, the initial queue of MoCo, in the S-shard layout; with
  heads=H, (K, H, d), one queue per LooC head (Xiao et al. 2021, Sec. 4).

  The keys are drawn in ring order and then laid out, so the initial queue holds
  the same keys in the same slots for every shard count.
  """
  shape = (queue_size, dim) if heads is None else (queue_size, heads, dim)
  q = jax.random.normal(rng, shape, jnp.float32)
  q = q / jnp.linalg.norm(q, axis=-1, keepdims=True)
  return to_sharded_layout(q, num_shards, keys_per_step)


def relayout(state, meta: dict, mesh, keys: int):
  """`state` with its queue moved from the checkpoint's layout (meta["queue_shards"]
  shards) to the layout of `mesh` (cl_jax.losses.memory_queue), so a run resumes exactly on a
  different number of devices."""
  old, new = meta["queue_shards"], mesh.shape[parallel.DATA_AXIS]
  if state.queue is None:
    return state
  if meta["keys_per_step"] != keys:
    raise UsageError(
        f"the checkpoint's queue holds {meta['keys_per_step']} keys per step but "
        f"this config enqueues {keys}; resume with the run's own batch size"
    )
  if old == new:
    return state
  move = jax.jit(
      lambda q: to_sharded_layout(to_ring_order(q, old, keys), new, keys),
      out_shardings=parallel.batch_sharding(mesh),
  )
  return state.replace(queue=move(state.queue))
