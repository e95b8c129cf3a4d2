"""Device mesh and shardings.

The global batch is split over a 1-D `data` mesh axis; the train state is
replicated except the memory queue, whose rows are split over the same axis.
"""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"


def make_mesh(devices=None) -> Mesh:
  """1-D mesh over all (or the given) devices with axis name `data`."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over `data`, other axes whole."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array."""
  return NamedSharding(mesh, P())


def state_sharding(state, mesh: Mesh):
  """Shardings of a TrainState (or its abstract shape): the queue's rows over
  `data` (when there is a queue), everything else replicated."""
  rep = replicated(mesh)
  return state.replace(
      **{
          f: jax.tree.map(lambda _: rep, getattr(state, f))
          for f in state.__dataclass_fields__
          if f != "queue"
      },
      queue=None if state.queue is None else batch_sharding(mesh),
  )


def global_batch(local: dict, mesh: Mesh) -> dict:
  """Global arrays from this process's share of the batch (rows of `local`)."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), local)
