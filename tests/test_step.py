"""One MoCo train step on a tiny config, checked against NumPy re-derivations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax import train
from cl_jax import train_step as step_lib
from cl_jax.runtime import parallel
from configs import mocov2_patchns

pytestmark = pytest.mark.slow  # subprocess runs or compiled train steps: minutes

B, S, K = 8, 16, 32


def _config(ns: bool):
  c = mocov2_patchns.get_config(None)
  c.data.image_size = S
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8, bn_groups=2)
  c.moco.update(queue_size=K, momentum=0.9)
  c.nonsemantic.update(enabled=ns, patch_min=2, patch_max=6)
  c.optim.update(batch_size=B, epochs=1)
  return c


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  return {
      v: jnp.asarray(rng.integers(0, 256, (B, S, S, 3), dtype=np.uint8)) for v in ("view1", "view2")
  }


def _one_step(config, batch):
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(config, 4 * B, mesh)
  state = make_state()
  before = jax.device_get(state)
  fn = jax.jit(step_lib.make_train_step(config, encoder, tx, schedule, mesh, 4))
  after, metrics = fn(state, batch)
  return before, jax.device_get(after), jax.device_get(metrics)


@pytest.mark.parametrize("ns", [False, True])
def test_step_updates_ema_queue_and_counter(ns, batch):
  config = _config(ns)
  before, after, metrics = _one_step(config, batch)
  m = config.moco.momentum
  # EMA (He et al. 2020, Eq. 2): theta_k <- m theta_k + (1 - m) theta_q, with the
  # query parameters of before the gradient step.
  expect = jax.tree.map(
      lambda t, q: m * np.asarray(t) + (1 - m) * np.asarray(q), before.target_params, before.params
  )
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
      after.target_params,
      expect,
  )
  assert int(after.step) == 1
  # Step 0 writes its B keys into rows [0, B); the rest of the queue is untouched.
  np.testing.assert_array_equal(after.queue[B:], before.queue[B:])
  assert not np.allclose(after.queue[:B], before.queue[:B])
  np.testing.assert_allclose(np.linalg.norm(after.queue[:B], axis=1), 1.0, rtol=1e-5)
  # Parameters moved; metrics are finite and NS statistics appear only with NS on.
  assert not all(
      np.allclose(a, b)
      for a, b in zip(jax.tree.leaves(after.params), jax.tree.leaves(before.params))
  )
  assert ("ns_mean" in metrics) == ns
  assert all(np.isfinite(v) for v in metrics.values())
  assert -1 <= metrics["pos_mean"] <= 1 and metrics["neg_var"] >= 0


def test_ns_negatives_raise_the_loss_of_the_same_step(batch):
  # An extra negative can only add to the softmax denominator: loss_NS > loss.
  _, _, plain = _one_step(_config(False), batch)
  _, _, with_ns = _one_step(_config(True), batch)
  assert with_ns["loss"] > plain["loss"]
  np.testing.assert_allclose(with_ns["pos_mean"], plain["pos_mean"], rtol=1e-5)


def test_lean_step_returns_the_same_state_with_loss_and_lr_only(batch):
  """The step the loop runs between logging steps (statistics=False) updates the state as the
  full step does; only its metrics shrink to loss and lr."""
  config = _config(True)
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(config, 4 * B, mesh)
  out = {}
  for statistics in (True, False):
    fn = jax.jit(
        step_lib.make_train_step(config, encoder, tx, schedule, mesh, 4, statistics=statistics)
    )
    out[statistics] = jax.device_get(fn(make_state(), batch))
  (full, full_metrics), (lean, lean_metrics) = out[True], out[False]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), full, lean)
  assert set(lean_metrics) == {"loss", "lr"} and len(full_metrics) > 10
  assert lean_metrics["loss"] == pytest.approx(full_metrics["loss"], rel=1e-6)


def _barrier_widths(text: str) -> list[int]:
  """The operand count of each stablehlo.optimization_barrier in a lowered module's text."""
  widths = []
  for line in text.splitlines():
    if "stablehlo.optimization_barrier" in line:
      operands = line.split("stablehlo.optimization_barrier", 1)[1].split(":", 1)[0]
      widths.append(operands.count("%"))
  return widths


def test_on_tpus_the_query_forward_waits_for_every_key():
  """Lowered for each platform (no TPU or GPU needed): on TPUs the query encoder's parameters
  pass one optimization barrier together with the keys and the NS keys, so the query's forward
  starts when every key exists (cl_jax.objectives.forward.keys_first); on GPUs no barrier holds
  the parameters, whose conversions XLA fuses."""
  config = _config(True)
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(config, 4 * B, mesh)
  state = jax.eval_shape(make_state)
  views = {v: jax.ShapeDtypeStruct((B, S, S, 3), jnp.uint8) for v in ("view1", "view2")}
  traced = jax.jit(step_lib.make_train_step(config, encoder, tx, schedule, mesh, 4)).trace(
      state, views
  )
  params = len(jax.tree.leaves(state.params))
  tpu = _barrier_widths(traced.lower(lowering_platforms=("tpu",)).as_text())
  cuda = _barrier_widths(traced.lower(lowering_platforms=("cuda",)).as_text())
  assert max(tpu) >= params + 2, (params, tpu)  # the parameters, the keys, the NS keys
  assert max(cuda) < params, (params, cuda)
