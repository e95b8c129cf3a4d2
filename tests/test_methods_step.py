"""One train step of SimCLR, BYOL, SimSiam and Barlow Twins: the loss against NumPy
re-derivations from a reference forward, the EMA target, add-ons off, and 1 vs 4 devices."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from cl_jax import train
from cl_jax import train_step as step_lib
from cl_jax.addons import nonsemantic
from cl_jax.data import photometric
from cl_jax.runtime import parallel
from configs import barlow_twins, byol, simclr, simsiam

pytestmark = pytest.mark.slow  # subprocess runs or compiled train steps: minutes

B, S = 8, 16


def _config(module, **blocks):
  c = module.get_config(None)
  c.data.image_size = S
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  if c.model.predictor_hidden_dim:
    c.model.predictor_hidden_dim = 16  # wide enough that no row of p is exactly 0
  c.nonsemantic.update(patch_min=2, patch_max=6)
  c.optim.update(batch_size=B, epochs=2)
  for block, fields in blocks.items():
    c[block].update(fields)
  return c


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  return {
      v: jnp.asarray(rng.integers(0, 256, (B, S, S, 3), dtype=np.uint8)) for v in ("view1", "view2")
  }


def _step(config, batch, devices=1, perturb_target=False, at_steps=(0,)):
  """One step of `config` compiled once and taken from the initial state with its step counter
  set to each of `at_steps` (4 steps per epoch): the encoder, the initial state, and the state
  after and the metrics of the first of them, then the metrics of the others."""
  mesh = parallel.make_mesh(jax.devices()[:devices])
  encoder, tx, schedule, make_state, _ = train.build(config, 4 * B, mesh)

  def initial(step):
    state = make_state().replace(step=np.int32(step))
    if perturb_target:  # a target that differs from the online network
      state = state.replace(
          target_params=jax.tree.map(lambda x: 0.9 * x + 0.01, state.target_params)
      )
    return state

  before = jax.device_get(initial(at_steps[0]))
  fn = step_lib.jit_train_step(
      step_lib.make_train_step(config, encoder, tx, schedule, mesh, 4),
      parallel.state_sharding(before, mesh),
      parallel.batch_sharding(mesh),
  )
  global_batch = parallel.global_batch(jax.device_get(batch), mesh)
  taken = [fn(initial(t), global_batch) for t in at_steps]
  after, metrics = jax.device_get(taken[0])
  return encoder, before, after, metrics, *[jax.device_get(m) for _, m in taken[1:]]


def _views(config, state, batch):
  """The step's augmented views and rngs, re-derived from the state's seed (step 0)."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), 0)
  r_aug1, r_aug2, r_key, r_ns, r_ft = jax.random.split(rng, 5)
  spec = photometric.config_spec(config)
  augment = jax.jit(photometric.augment_batch, static_argnums=2)
  v1 = augment(r_aug1, batch["view1"], spec)[0]
  v2 = augment(r_aug2, batch["view2"], spec)[0]
  return v1, v2, r_ns


def _forward(encoder, params, batch_stats, x, predict=False):
  apply = functools.partial(encoder.apply, train=True, predict=predict, mutable=["batch_stats"])
  out, _ = jax.jit(apply)({"params": params, "batch_stats": batch_stats}, x)
  return {k: np.asarray(v, np.float64) for k, v in out.items() if k in ("z", "p", "projection")}


def _cos(a, b):
  """Cosine with each norm floored at 1e-6 (a zero vector, e.g. a predictor row whose
  ReLU layer is all zero at init, has cosine 0)."""
  norm = lambda x: np.maximum(np.linalg.norm(x, axis=-1), 1e-6)
  return np.sum(a * b, -1) / (norm(a) * norm(b))


def test_simsiam_loss_is_the_symmetric_negative_cosine(batch):
  config = _config(simsiam)
  encoder, before, after, metrics = _step(config, batch)
  assert after.target_params is None and after.queue is None
  v1, v2, _ = _views(config, before, batch)
  o1 = _forward(encoder, before.params, before.batch_stats, v1, predict=True)
  o2 = _forward(encoder, before.params, before.batch_stats, v2, predict=True)
  expect = -(_cos(o1["p"], o2["z"]).mean() + _cos(o2["p"], o1["z"]).mean()) / 2
  np.testing.assert_allclose(metrics["loss"], expect, rtol=1e-5, atol=1e-6)


def test_barlow_twins_loss_is_eq_1_of_the_two_views_projections(batch):
  """L_BT (Zbontar et al. 2021, Eq. 1) of the step, from a reference forward of the two views:
  C the correlations of the projections' dimensions over the batch (batch norm's eps 1e-5 on
  each variance), lambda 5e-3."""
  config = _config(barlow_twins)
  encoder, before, after, metrics = _step(config, batch)
  assert after.target_params is None and after.queue is None
  v1, v2, _ = _views(config, before, batch)
  za = _forward(encoder, before.params, before.batch_stats, v1)["projection"]
  zb = _forward(encoder, before.params, before.batch_stats, v2)["projection"]
  standard = lambda z: (z - z.mean(0)) / np.sqrt(len(z) * (z.var(0) + 1e-5))
  c = standard(za).T @ standard(zb)
  off = c - np.diag(np.diag(c))
  expect = np.sum((1 - np.diag(c)) ** 2) + 5e-3 * np.sum(off**2)
  np.testing.assert_allclose(metrics["loss"], expect, rtol=1e-4)


@pytest.mark.parametrize("ns", [False, True])
def test_byol_loss_and_ema_target(ns, batch):
  config = _config(byol, nonsemantic={"enabled": ns, "alpha": 0.3})
  encoder, before, after, metrics = _step(config, batch, perturb_target=True)
  assert after.queue is None
  tau = config.byol.base_momentum  # tau_0 = tau_base (cosine schedule at k = 0)
  np.testing.assert_allclose(metrics["tau"], tau, rtol=1e-7)
  target = jax.tree.map(
      lambda t, q: tau * np.asarray(t) + (1 - tau) * np.asarray(q),
      before.target_params,
      before.params,
  )
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
      after.target_params,
      target,
  )
  v1, v2, r_ns = _views(config, before, batch)
  online = [_forward(encoder, before.params, before.batch_stats, v, predict=True) for v in (v1, v2)]
  tgt = [_forward(encoder, target, before.target_batch_stats, v) for v in (v1, v2)]
  loss = 0.0
  for i, j in ((0, 1), (1, 0)):
    p = online[i]["p"]
    loss += np.mean(2 - 2 * _cos(p, tgt[j]["z"]))  # Grill et al. Eq. 2
    if ns:
      r_patch, _ = jax.random.split(jax.random.fold_in(r_ns, i))
      view = (v1, v2)[i]
      images = nonsemantic.patch_negatives(r_patch, view, 1, 2, 6).reshape(view.shape)
      t = _forward(encoder, target, before.target_batch_stats, images)["z"]
      loss -= 0.3 * np.mean(2 - 2 * _cos(p, t))  # Ge et al. Eq. 2
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5, atol=1e-6)


def test_simclr_loss_is_nt_xent_of_the_two_views(batch):
  t = 0.3
  config = _config(simclr, simclr={"temperature": t})
  encoder, before, after, metrics = _step(config, batch)
  assert after.target_params is None and after.queue is None
  v1, v2, _ = _views(config, before, batch)
  u = np.concatenate(
      [_forward(encoder, before.params, before.batch_stats, v)["z"] for v in (v1, v2)]
  )
  losses = []
  for i in range(2 * B):  # Chen et al. 2020, Eq. 1, loop form
    partner = (i + B) % (2 * B)
    denominator = sum(np.exp(u[i] @ u[k] / t) for k in range(2 * B) if k != i)
    losses.append(-np.log(np.exp(u[i] @ u[partner] / t) / denominator))
  np.testing.assert_allclose(metrics["loss"], np.mean(losses), rtol=1e-5)


@pytest.mark.parametrize("module", [byol, simsiam])
def test_positive_extrapolation_before_its_start_epoch_changes_nothing(module, batch):
  _, _, plain_state, plain, plain_later = _step(_config(module), batch, at_steps=(0, 4))
  ft = {"enabled": True, "negative": "none", "start_epoch": 1}
  _, _, ft_state, waiting, active = _step(_config(module, ft=ft), batch, at_steps=(0, 4))
  # Equal up to float32 rounding: the inactive pairs are selected with jnp.where,
  # which XLA may fuse differently from the plain graph.
  np.testing.assert_allclose(waiting["loss"], plain["loss"], rtol=1e-6, atol=1e-7)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
      ft_state.params,
      plain_state.params,
  )
  # From its start epoch (step 4: epoch 1) the extrapolated positives change the loss.
  assert active["loss"] != plain_later["loss"]


@pytest.mark.parametrize(
    "module, optim",
    [
        (simclr, {}),
        (byol, {}),
        # SGD at a tenth of the config's lr: at batch 8 Barlow Twins' first step at its own lr
        # moves the stem's weights by more than their size, and the float32 differences of the
        # sums' order with them, to 1e-4 of the weights.
        (barlow_twins, {"optimizer": "sgd", "base_lr": 0.02}),
    ],
)
def test_one_and_four_devices_take_the_same_step(module, optim, batch):
  config = _config(module, model={"bn_mode": "local", "bn_groups": 4}, optim=optim)
  _, _, one, m1 = _step(config, batch, devices=1)
  _, _, four, m4 = _step(config, batch, devices=4)
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-5)
  # The gradient is summed in another order on 4 devices: entries near zero differ by
  # float32 rounding, so each array is compared at 1e-4 of its largest entry, or 4e-6
  # for arrays that are rounding noise only (biases in front of a batch norm, whose gradient
  # is zero: their entries after the step reach 1.2e-6 on an AVX-512 CPU).
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=max(4e-6, 1e-4 * np.abs(a).max()))


def test_a_state_without_target_and_queue_checkpoints(batch, tmp_path):
  _, _, after, _ = _step(_config(simsiam), batch)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "s", after)
  with ocp.StandardCheckpointer() as ckpt:
    restored = ckpt.restore(tmp_path / "s", jax.tree.map(np.zeros_like, after))
  assert restored.queue is None and restored.target_params is None
  jax.tree.map(np.testing.assert_array_equal, restored.params, after.params)
  np.testing.assert_array_equal(
      restored.opt_state[1][0].trace["head"]["out"]["kernel"],
      after.opt_state[1][0].trace["head"]["out"]["kernel"],
  )
