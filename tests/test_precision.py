"""Mixed precision of the compiled train step: bf16 convolutions, float32 statistics and state.

The check reads the StableHLO that the jitted MoCo-v2 step lowers to (before XLA's
backend passes, which on a CPU run bf16 convolutions in float32): with model.dtype
"bfloat16" every convolution of the step (forwards, input and kernel gradients) takes and
gives bf16, every reduction over an activation (batch-norm statistics, pooling) is float32,
and the parameters, batch statistics, optimizer state and target encoder stay float32.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax import train
from cl_jax import train_step as step_lib
from cl_jax.runtime import parallel
from configs import mocov2_patchns

_CONV = re.compile(
    r"stablehlo\.convolution.*: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> (tensor<[^>]*>)"
)
_REDUCE = re.compile(r"stablehlo\.reduce\(.*: \(tensor<([0-9x]+)x(\w+)>, ")


def _lowered_step(dtype: str):
  """(StableHLO text of the lean MoCo-v2 + NS step of a tiny ResNet-18, its initial state)."""
  c = mocov2_patchns.get_config(None)
  c.data.image_size = 16
  c.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8, dtype=dtype)
  c.moco.queue_size, c.optim.batch_size = 256, 32
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(c, 32, mesh)
  state = make_state()
  step = step_lib.jit_on_mesh(
      step_lib.make_train_step(c, encoder, tx, schedule, mesh, 1, statistics=False), state, mesh
  )
  batch = jax.device_put(
      train.synthetic_batch(c, 32, np.random.default_rng(0)), parallel.batch_sharding(mesh)
  )
  return step.lower(state, batch).as_text(), state


def _element_type(tensor_type: str) -> str:
  return tensor_type.rsplit("x", 1)[1].rstrip(">")


@pytest.fixture(scope="module")
def lowered():
  return {dtype: _lowered_step(dtype) for dtype in ("bfloat16", "float32")}


@pytest.mark.slow
def test_every_convolution_of_the_bf16_step_runs_in_bf16(lowered):
  convs = {d: _CONV.findall(text) for d, (text, _) in lowered.items()}
  # ResNet-18 has 20 convolutions: the query forward (20), its kernel gradients (20) and
  # input gradients (19, none for the stem's input), the key forward and the NS forward.
  assert len(convs["bfloat16"]) == len(convs["float32"]) == 20 + 20 + 19 + 20 + 20
  for types in convs["bfloat16"]:
    assert [_element_type(t) for t in types] == ["bf16", "bf16", "bf16"], types
  for types in convs["float32"]:
    assert [_element_type(t) for t in types] == ["f32", "f32", "f32"], types


@pytest.mark.slow
def test_batch_norm_statistics_and_pooling_reduce_in_float32(lowered):
  text, _ = lowered["bfloat16"]
  reductions = _REDUCE.findall(text)
  activations = [dtype for shape, dtype in reductions if shape.count("x") >= 3]
  # Batch-norm statistics reduce (G, B/G, H, W, C) tensors: two per BN layer and forward.
  assert len(activations) >= 2 * 20
  assert set(activations) == {"f32"}
  assert "bf16" not in {dtype for _, dtype in reductions}


@pytest.mark.slow
def test_the_state_stays_float32(lowered):
  _, state = lowered["bfloat16"]
  for tree in (state.params, state.batch_stats, state.opt_state, state.target_params):
    for leaf in jax.tree.leaves(tree):
      if jnp.issubdtype(leaf.dtype, jnp.floating):
        assert leaf.dtype == jnp.float32
  assert state.queue.dtype == jnp.float32
