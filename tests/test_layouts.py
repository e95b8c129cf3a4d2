"""The state in the device-local layouts its step's compiler chooses (cl_jax.runtime.layouts).

A CPU compiler keeps every array row-major, so the non-default case is forced here: layouts
given to StateLayouts (what a GPU's compiler picks for convolution kernels: (C_out, kh, kw,
C_in) order in memory). The steps must compute the same values in any layouts, hand each other
the state as they compiled for it, and a checkpoint of such a state must read back the same.
"""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.experimental.layout import Format, Layout

from cl_jax import train
from cl_jax import train_step as step_lib
from cl_jax.runtime import checkpoint, parallel
from cl_jax.runtime.layouts import StateLayouts, StepJit
from configs import mocov2_patchns

DEVICE = jax.sharding.SingleDeviceSharding(jax.devices()[0])
KERNEL_ORDER = (3, 0, 1, 2)  # (kh, kw, C_in, C_out) stored as (C_out, kh, kw, C_in)


def _forced(state, sharding_of=lambda _: DEVICE):
  """Formats for `state`: 4-D arrays in KERNEL_ORDER, 2-D ones column-major, the rest
  row-major."""

  def one(x):
    order = {4: KERNEL_ORDER, 2: (1, 0)}.get(x.ndim, tuple(range(x.ndim)))
    return Format(Layout(major_to_minor=order), sharding_of(x))

  return jax.tree.map(one, state)


def _orders(tree) -> list:
  """Each leaf's major-to-minor order (of an array's format, or of a Format)."""
  return [getattr(x, "format", x).layout.major_to_minor for x in jax.tree.leaves(tree)]


def _toy_step(state, x):
  """A step of a state with a kernel, a matrix and a counter: new state, and a loss."""
  w, m = state["w"], state["m"]
  y = jnp.einsum("hwio,i->o", w, x).sum() + m @ x[: m.shape[1]]
  new = {"w": 0.9 * w + 0.01 * x[None, None, :, None], "m": m * 0.5 + y.sum(), "n": state["n"] + 1}
  return new, jnp.sum(y)


def _toy_state():
  rng = np.random.default_rng(0)
  state = {
      "w": rng.normal(size=(3, 3, 4, 5)).astype(np.float32),
      "m": rng.normal(size=(6, 4)).astype(np.float32),
      "n": np.int32(0),
  }
  return jax.device_put(state, DEVICE)


def _toy_jit(layouts=None):
  return StepJit(
      _toy_step, jax.tree.map(lambda _: DEVICE, _toy_state()), (DEVICE,), DEVICE, layouts
  )


def test_a_step_in_given_layouts_computes_what_the_default_layouts_do():
  x = jax.device_put(np.linspace(-1, 1, 4, dtype=np.float32), DEVICE)
  expect, state = [], _toy_state()
  plain = jax.jit(_toy_step)
  for _ in range(3):
    state, loss = plain(state, x)
    expect.append((jax.device_get(state), float(loss)))
  formats = _forced(_toy_state())
  step = _toy_jit(StateLayouts(formats))
  state = _toy_state()
  for want_state, want_loss in expect:
    state, loss = step(state, x)
    assert float(loss) == want_loss
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(want_state)):
      np.testing.assert_array_equal(np.asarray(got), want)
    # The state comes back in the layouts it was compiled for, ready for the next step.
    assert _orders(state) == _orders(formats)
  assert state["w"].format.layout.major_to_minor == KERNEL_ORDER


def test_the_first_step_fixes_the_layouts_and_its_sibling_compiles_for_them():
  layouts = StateLayouts()
  first, sibling = _toy_jit(layouts), _toy_jit(layouts)
  x = jax.device_put(np.ones(4, np.float32), DEVICE)
  state, _ = first(_toy_state(), x)
  # With Layout.AUTO the CPU's compiler chose its layouts: row-major.
  assert layouts.formats is not None
  assert _orders(layouts.formats) == [(0, 1), (), (0, 1, 2, 3)]
  state, _ = sibling(state, x)
  assert int(state["n"]) == 2
  # Given layouts reach the sibling's program: it takes and returns them.
  forced = StateLayouts(_forced(_toy_state()))
  compiled = _toy_jit(forced).compile(_toy_state(), x)
  assert _orders(compiled.input_formats[0][0]) == _orders(forced.formats)
  assert _orders(compiled.output_formats[0]) == _orders(forced.formats)


def test_place_passes_through_arrays_already_in_their_layouts():
  placed = StateLayouts(_forced(_toy_state())).place(_toy_state())
  assert placed["w"].format.layout.major_to_minor == KERNEL_ORDER
  # The formats a compiled step reports are the arrays' own, as here.
  layouts = StateLayouts(jax.tree.map(lambda a: a.format, placed))
  assert layouts.place(placed)["w"] is placed["w"]
  np.testing.assert_array_equal(np.asarray(placed["w"]), np.asarray(_toy_state()["w"]))


def test_a_checkpoint_of_a_state_in_other_layouts_reads_back_the_same_values(tmp_path):
  # Saved as the trainer saves its state (an orbax StandardSave in cl_jax's manager), read back
  # as the evaluation jobs read the encoder (checkpoint.restore_variables).
  params = StateLayouts(_forced(_toy_state())).place(_toy_state())
  assert params["w"].format.layout.major_to_minor == KERNEL_ORDER
  manager = checkpoint.make_manager(str(tmp_path))
  state = {"params": params, "batch_stats": {"mean": jnp.arange(3.0)}, "step": np.int32(7)}
  manager.save(7, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
  manager.wait_until_finished()
  template = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=DEVICE),
      {"params": _toy_state(), "batch_stats": {"mean": np.zeros(3, np.float32)}},
  )
  step, restored = checkpoint.restore_variables(
      checkpoint.make_manager(str(tmp_path), read_only=True), template
  )
  assert step == 7
  for got, want in zip(jax.tree.leaves(restored["params"]), jax.tree.leaves(_toy_state())):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(restored["batch_stats"]["mean"]), [0.0, 1.0, 2.0])


def _tiny_moco():
  c = mocov2_patchns.get_config(None)
  c.data.image_size = 16
  c.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.moco.queue_size, c.optim.batch_size = 64, 16
  return c


@pytest.mark.slow
def test_the_moco_step_with_its_kernels_in_cudnn_order_takes_the_same_steps():
  c = _tiny_moco()
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(c, 16, mesh)
  step_fn = step_lib.make_train_step(c, encoder, tx, schedule, mesh, 1, statistics=False)
  batch = jax.device_put(
      train.synthetic_batch(c, 16, np.random.default_rng(0)), parallel.batch_sharding(mesh)
  )
  sharding = parallel.state_sharding(jax.eval_shape(make_state), mesh)
  kernels = jax.tree.map(
      lambda x, s: Format(
          Layout(major_to_minor=KERNEL_ORDER if x.ndim == 4 else tuple(range(x.ndim))), s
      ),
      jax.eval_shape(make_state),
      sharding,
  )
  runs = {}
  for name, layouts in (("default", None), ("kernels in cuDNN order", StateLayouts(kernels))):
    step = step_lib.jit_on_mesh(step_fn, make_state(), mesh, layouts)
    state, losses = make_state(), []
    for _ in range(2):
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    runs[name] = (jax.device_get(state), losses, step.layouts.formats)
  (state, losses, _), (state_k, losses_k, formats_k) = runs.values()
  assert losses == losses_k
  for got, want in zip(jax.tree.leaves(state_k), jax.tree.leaves(state)):
    np.testing.assert_array_equal(got, want)
  assert _orders(formats_k).count(KERNEL_ORDER) >= 3 * 20
