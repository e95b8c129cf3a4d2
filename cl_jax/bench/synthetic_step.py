"""The train step as the benchmarks build it: on a synthetic batch, jitted on a mesh, with the
FLOP count of its compiled form (cl_jax.bench.step, memory and efficiency build it here)."""

import jax
import ml_collections
import numpy as np

from cl_jax import config_check, train
from cl_jax import train_step as step_lib
from cl_jax.data import geometric
from cl_jax.runtime import parallel


def synthetic_batch(config, batch: int, rng: np.random.Generator) -> dict:
  """A host batch shaped like the pipeline's: random uint8 views (all of LooC's), their crop
  boxes and flips drawn as the pipeline draws them from a source twice the view's side (DICR
  reads them), and the texture images of texture negatives."""
  size = config.data.image_size
  host = {}
  for v in range(1, step_lib.num_views(config) + 1):
    host[f"view{v}"] = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    crops = [
        geometric.sample_crop(rng, 2 * size, 2 * size, scale=tuple(config.data.crop_scale))
        for _ in range(batch)
    ]
    host[f"box{v}"] = np.stack([c.box for c in crops]).astype(np.float32)
    host[f"flip{v}"] = np.array([c.flip for c in crops])
  if config.nonsemantic.enabled and config.nonsemantic.kind == "texture":
    for v in (1, 2):
      host[f"texture{v}"] = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
  return host


def step_flops(lowered, devices: int) -> float:
  """FLOPs of one call of a step on one device: XLA's cost analysis of the lowered program
  (the whole step over the global batch, before the backend's passes) / devices. Convolutions
  count 2 per multiply-add over the taps that fall inside the image (padding excluded), as a
  hand count does. The compiled program is not used: on GPUs its convolutions are cuDNN custom
  calls that XLA's cost analysis does not count (a compiled MoCo-v2 ResNet-50 step reported 0.75
  of its 32 GFLOP per image on an H200), and TPU recomputation would count as model work.

  Args:
    lowered: jax.stages.Lowered of the jitted step (step.lower(state, data)).
    devices: the devices the step's global batch is split over.
  """
  analysis = lowered.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
    analysis = analysis[0]
  if not analysis or not analysis.get("flops"):
    raise RuntimeError("XLA's cost analysis of the lowered step reports no FLOP count")
  return float(analysis["flops"]) / devices


def build(config: ml_collections.ConfigDict, devices: int, statistics: bool = False):
  """(step, state, data): the jitted train step of `config` on the first `devices` devices
  (the lean step, or with statistics=True the logging step), a fresh state and a synthetic
  global batch of config.optim.batch_size, both placed on the mesh."""
  mesh = parallel.make_mesh(jax.devices()[:devices])
  config_check.validate(config, num_devices=devices, reads_data=False)
  batch = config.optim.batch_size
  encoder, tx, schedule, make_state, _ = train.build(config, batch, mesh)
  state = make_state()
  step = step_lib.jit_on_mesh(
      step_lib.make_train_step(config, encoder, tx, schedule, mesh, 1, statistics), state, mesh
  )
  host = synthetic_batch(config, batch, np.random.default_rng(0))
  return step, state, jax.device_put(host, parallel.batch_sharding(mesh))
