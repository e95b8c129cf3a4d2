"""Tests for cl_jax.optim (schedule, SGD) and the key-encoder EMA of cl_jax.train_step.

References: the cosine schedule lr * 0.5 * (1 + cos(pi t / T)) with an optional linear
warm-up, torch.optim.SGD with momentum and coupled weight decay written out in NumPy, and
the EMA theta_k <- m theta_k + (1 - m) theta_q (He et al. 2020, Eq. 2), which step.py
computes as optax.incremental_update(params, target_params, 1 - m).
"""

import math

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from cl_jax import optim


def _optim_config(lr=0.1, epochs=4, warmup_epochs=0, weight_decay=5e-2, momentum=0.9):
  return ml_collections.ConfigDict(
      {
          "optimizer": "sgd",
          "lr": lr,
          "epochs": epochs,
          "warmup_epochs": warmup_epochs,
          "weight_decay": weight_decay,
          "momentum": momentum,
      }
  )


def _np_lr(t, lr, total, warmup):
  """Linear warm-up 0 -> lr over `warmup` steps, then cosine from lr to 0 at `total`."""
  if t < warmup:
    return lr * t / warmup
  return lr * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))


def test_schedule_without_warmup_is_cosine():
  cfg = _optim_config(lr=0.3, epochs=4, warmup_epochs=0)
  schedule = optim.lr_schedule(cfg, steps_per_epoch=5)  # T = 20 steps
  for t in range(21):
    want = 0.3 * 0.5 * (1 + math.cos(math.pi * t / 20))
    np.testing.assert_allclose(float(schedule(t)), want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(
      [float(schedule(0)), float(schedule(10)), float(schedule(20))], [0.3, 0.15, 0.0], atol=1e-7
  )


def test_schedule_with_warmup_ramps_linearly_then_cosine():
  cfg = _optim_config(lr=0.3, epochs=4, warmup_epochs=1)
  schedule = optim.lr_schedule(cfg, steps_per_epoch=5)  # W = 5, T = 20
  for t in range(21):
    np.testing.assert_allclose(float(schedule(t)), _np_lr(t, 0.3, 20, 5), rtol=1e-5, atol=1e-7)
  # Hand-checked: 0 at t = 0, lr/5 at t = 1, lr at t = W, lr/2 half-way through the cosine.
  np.testing.assert_allclose(
      [float(schedule(t)) for t in (0, 1, 5, 12.5, 20)], [0.0, 0.06, 0.3, 0.15, 0.0], atol=1e-7
  )


def _np_torch_sgd(params, grads_per_step, lrs, momentum, weight_decay):
  """torch.optim.SGD(momentum, weight_decay, dampening=0, nesterov=False), in float64."""
  w = {name: np.asarray(v, np.float64) for name, v in params.items()}
  buf = {name: None for name in w}
  history = []
  for grads, lr in zip(grads_per_step, lrs):
    for name in w:
      g = grads[name] + weight_decay * w[name]  # coupled weight decay
      buf[name] = g if buf[name] is None else momentum * buf[name] + g
      w[name] = w[name] - lr * buf[name]
    history.append({name: v.copy() for name, v in w.items()})
  return history


@pytest.mark.parametrize("warmup_epochs", [0, 1])
def test_step_schedule_divides_by_ten_at_each_decay_epoch(warmup_epochs):
  cfg = _optim_config(lr=0.3, epochs=4, warmup_epochs=warmup_epochs)
  cfg.schedule, cfg.decay_epochs = "step", (2, 3)
  schedule = optim.lr_schedule(cfg, steps_per_epoch=5)  # decays at steps 10 and 15
  for t in range(21):
    want = 0.3 * 0.1 ** ((t >= 10) + (t >= 15))
    if t < 5 * warmup_epochs:
      want = 0.3 * t / 5
    np.testing.assert_allclose(float(schedule(t)), want, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("warmup_epochs", [0, 1])
def test_optimizer_matches_torch_sgd_in_numpy(warmup_epochs):
  cfg = _optim_config(
      lr=0.2, epochs=3, warmup_epochs=warmup_epochs, weight_decay=5e-2, momentum=0.9
  )
  steps_per_epoch, steps = 2, 5  # T = 6, W = 0 or 2
  rng = np.random.default_rng(0)
  params = {
      "kernel": rng.normal(size=(3, 4)).astype(np.float32),
      "bias": rng.normal(size=(4,)).astype(np.float32),
  }
  grads = [
      {name: rng.normal(size=v.shape).astype(np.float32) for name, v in params.items()}
      for _ in range(steps)
  ]
  lrs = [_np_lr(t, 0.2, 6, warmup_epochs * steps_per_epoch) for t in range(steps)]
  want = _np_torch_sgd(params, grads, lrs, 0.9, 5e-2)

  tx = optim.make_optimizer(cfg, optim.lr_schedule(cfg, steps_per_epoch))
  state = tx.init(params)
  current = jax.tree.map(jnp.asarray, params)
  for t in range(steps):
    updates, state = tx.update(jax.tree.map(jnp.asarray, grads[t]), state, current)
    current = optax.apply_updates(current, updates)
    chex.assert_trees_all_close(current, want[t], rtol=1e-5, atol=1e-6)


def test_weight_decay_alone_shrinks_parameters():
  # Zero gradients, no momentum: w_t = w_0 prod_s (1 - lr_s wd), biases included.
  cfg = _optim_config(lr=0.5, epochs=2, weight_decay=0.1, momentum=0.0)
  tx = optim.make_optimizer(cfg, optim.lr_schedule(cfg, 2))  # T = 4
  params = {"w": jnp.ones((2, 2)), "b": jnp.full((3,), 2.0)}
  state = tx.init(params)
  factor = 1.0
  for t in range(3):
    updates, state = tx.update(jax.tree.map(jnp.zeros_like, params), state, params)
    params = optax.apply_updates(params, updates)
    factor *= 1 - 0.1 * 0.5 * 0.5 * (1 + math.cos(math.pi * t / 4))
  chex.assert_trees_all_close(
      params, {"w": np.full((2, 2), factor), "b": np.full((3,), 2 * factor)}, rtol=1e-6
  )


def _random_tree(rng):
  return {
      "conv": {"kernel": rng.normal(size=(3, 3, 2, 4)).astype(np.float32)},
      "bn": {
          "scale": rng.normal(size=(4,)).astype(np.float32),
          "bias": rng.normal(size=(4,)).astype(np.float32),
      },
      "head": [rng.normal(size=(4, 5)).astype(np.float32)],
  }


@pytest.mark.parametrize("m", [0.0, 0.5, 0.99])
def test_ema_update_matches_numpy(m):
  rng = np.random.default_rng(int(m * 100))
  online, target = _random_tree(rng), _random_tree(rng)
  new_target = optax.incremental_update(online, target, 1.0 - m)  # as in step.py
  want = jax.tree.map(
      lambda o, t: m * t.astype(np.float64) + (1 - m) * o.astype(np.float64), online, target
  )
  chex.assert_trees_all_close(new_target, want, rtol=1e-6, atol=1e-7)


def test_ema_momentum_zero_copies_online_and_repeated_updates_decay_geometrically():
  rng = np.random.default_rng(1)
  online, target = _random_tree(rng), _random_tree(rng)
  chex.assert_trees_all_close(optax.incremental_update(online, target, 1.0), online)
  # With fixed online weights, n updates give online + m^n (target_0 - online).
  m, current = 0.9, target
  for _ in range(5):
    current = optax.incremental_update(online, current, 1.0 - m)
  want = jax.tree.map(lambda o, t: o + m**5 * (t.astype(np.float64) - o), online, target)
  chex.assert_trees_all_close(current, want, rtol=1e-5, atol=1e-6)


def test_lars_matches_numpy():
  """optax.lars as configured: weight decay and trust ratio on kernels only (You et al. 2017).

  u = g + wd w, r = eta ||w|| / ||u|| (kernels; 1 for vectors), v = mu v + lr r u, w -= v.
  """
  cfg = ml_collections.ConfigDict(dict(optimizer="lars", weight_decay=0.01, momentum=0.9))
  lr, eta = 0.5, 1e-3
  tx = optim.make_optimizer(cfg, optax.constant_schedule(lr))
  rng = np.random.default_rng(0)
  w = {"kernel": rng.normal(size=(3, 4)), "bias": rng.normal(size=(4,))}
  params = jax.tree.map(jnp.float32, w)
  state = tx.init(params)
  v = jax.tree.map(np.zeros_like, w)
  for _ in range(2):
    g = {"kernel": rng.normal(size=(3, 4)), "bias": rng.normal(size=(4,))}
    updates, state = tx.update(jax.tree.map(jnp.float32, g), state, params)
    params = optax.apply_updates(params, updates)
    for name in w:
      u = g[name] + (0.01 * w[name] if name == "kernel" else 0.0)
      r = eta * np.linalg.norm(w[name]) / np.linalg.norm(u) if name == "kernel" else 1.0
      v[name] = 0.9 * v[name] + lr * r * u
      w[name] = w[name] - v[name]
  for name in w:
    np.testing.assert_allclose(params[name], w[name], rtol=1e-5, atol=1e-6)
