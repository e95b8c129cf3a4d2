"""Tests for MoCo's loss without add-ons (cl_jax.objectives.moco.pair_loss over
cl_jax.losses.moco.moco_contrast), on one device and on eight.

References are NumPy float64 loops over the queries:
  L = -1/B sum_i log( exp(q_i.k_i/T) / (exp(q_i.k_i/T) + sum_j exp(q_i.n_j/T)) ),
  dL/dq_i = 1/(B T) (sum_j p_ij n_j + p_i0 k_i - k_i),
with p_i the softmax over [q_i.k_i, q_i.n_1, ..., q_i.n_K] / T.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.addons.from_config import AddOns
from cl_jax.objectives import moco
from cl_jax.runtime import parallel

DIM, QUEUE = 8, 16


def _unit(rng, *shape):
  x = rng.normal(size=shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _inputs(seed, batch):
  rng = np.random.default_rng(seed)
  return _unit(rng, batch, DIM), _unit(rng, batch, DIM), _unit(rng, QUEUE, DIM)


def _np_loss(q, k, queue, temperature):
  """Batch-mean InfoNCE, one query at a time."""
  total = 0.0
  for qi, ki in zip(q, k):
    num = np.exp(qi @ ki / temperature)
    den = num + sum(np.exp(qi @ n / temperature) for n in queue)
    total += -np.log(num / den)
  return total / len(q)


def _np_grad(q, k, queue, temperature):
  """Analytic dL/dq: 1/(B T) (sum_j p_ij n_j + p_i0 k_i - k_i)."""
  grad = np.zeros_like(q)
  for i, (qi, ki) in enumerate(zip(q, k)):
    cands = np.concatenate([ki[None], queue])  # (1 + K, d)
    e = np.exp(cands @ qi / temperature)
    p = e / e.sum()
    grad[i] = (p @ cands - ki) / (len(q) * temperature)
  return grad


@functools.partial(jax.jit, static_argnames=("temperature", "devices"))
def _jax_loss_and_grads(q, k, queue, temperature, devices=1):
  """pair_loss without add-ons on `devices` devices: (loss, stats, (dL/dq, dL/dk, dL/dqueue))."""
  mesh = parallel.make_mesh(jax.devices()[:devices])
  rows = parallel.batch_sharding(mesh)
  q, k, queue = (jax.lax.with_sharding_constraint(x, rows) for x in (q, k, queue))
  rng, num_keys = jax.random.key(0), q.shape[0]
  loss_fn = lambda *args: moco.pair_loss(
      *args, None, AddOns(), temperature, mesh, rng, jnp.asarray(0), num_keys
  )
  (loss, stats), grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2), has_aux=True)(q, k, queue)
  return loss, stats, grads


def _f32(*arrays):
  return [jnp.asarray(a, jnp.float32) for a in arrays]


@pytest.mark.parametrize("batch,temperature", [(4, 0.2), (6, 0.07), (8, 0.5)])
def test_moco_loss_matches_numpy_loop(batch, temperature):
  q, k, queue = _inputs(batch, batch)
  loss, _, _ = _jax_loss_and_grads(*_f32(q, k, queue), temperature)
  chex.assert_shape(loss, ())
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, _np_loss(q, k, queue, temperature), rtol=1e-5)


def test_hand_checked_cases():
  # q orthogonal to every queued key and to its key: all logits 0, loss log(1 + K).
  q = np.zeros((2, DIM))
  q[:, 0] = 1
  k = np.zeros((2, DIM))
  k[:, 1] = 1
  queue = np.zeros((QUEUE, DIM))
  queue[:, 2] = 1
  loss, stats, _ = _jax_loss_and_grads(*_f32(q, k, queue), 0.5)
  np.testing.assert_allclose(loss, np.log(1 + QUEUE), rtol=1e-6)
  # k = q: positive logit 1/T = 2; loss -log(e^2 / (e^2 + K)).
  loss, stats, _ = _jax_loss_and_grads(*_f32(q, q, queue), 0.5)
  np.testing.assert_allclose(loss, np.log(1 + QUEUE * np.exp(-2.0)), rtol=1e-6)
  assert float(stats["pos_mean"]) == 1.0 and float(stats["neg_var"]) == 0.0


def test_large_logits_stay_finite():
  # T = 0.01: logits up to 100; the max-shifted log-sum-exp must not overflow.
  q, k, queue = _inputs(9, 8)
  queue[3] = q[0]
  loss, _, (grad, _, _) = _jax_loss_and_grads(*_f32(q, k, queue), 0.01)
  np.testing.assert_allclose(loss, _np_loss(q, k, queue, 0.01), rtol=1e-4)
  assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("devices", [2, 8])
def test_sharded_queue_gives_the_one_device_loss_stats_and_gradients(devices):
  # Queue rows and queries split over `devices` devices (each holds K/S queue rows):
  # the loss, score statistics and gradients equal the NumPy reference of the whole queue.
  q, k, queue = _inputs(11, 8)
  loss, stats, (grad, _, _) = _jax_loss_and_grads(*_f32(q, k, queue), 0.2, devices)
  np.testing.assert_allclose(loss, _np_loss(q, k, queue, 0.2), rtol=1e-5)
  np.testing.assert_allclose(grad, _np_grad(q, k, queue, 0.2), rtol=1e-4, atol=1e-6)
  one_loss, one_stats, _ = _jax_loss_and_grads(*_f32(q, k, queue), 0.2, 1)
  np.testing.assert_allclose(loss, one_loss, rtol=1e-6)
  for name in one_stats:
    np.testing.assert_allclose(stats[name], one_stats[name], rtol=1e-5, atol=1e-7)


def test_numpy_analytic_gradient_matches_finite_differences():
  # Validates the reference gradient itself, in float64, by central differences.
  q, k, queue = _inputs(2, 4)
  analytic = _np_grad(q, k, queue, 0.2)
  eps = 1e-6
  numeric = np.zeros_like(q)
  for idx in np.ndindex(q.shape):
    dq = np.zeros_like(q)
    dq[idx] = eps
    numeric[idx] = (_np_loss(q + dq, k, queue, 0.2) - _np_loss(q - dq, k, queue, 0.2)) / (2 * eps)
  np.testing.assert_allclose(analytic, numeric, atol=1e-8)


@pytest.mark.parametrize("batch,temperature", [(4, 0.2), (7, 0.1)])
def test_gradient_wrt_q_matches_analytic_numpy(batch, temperature):
  q, k, queue = _inputs(10 + batch, batch)
  _, _, (grad, _, _) = _jax_loss_and_grads(*_f32(q, k, queue), temperature)
  chex.assert_shape(grad, (batch, DIM))
  np.testing.assert_allclose(grad, _np_grad(q, k, queue, temperature), rtol=1e-4, atol=1e-5)


def test_gradient_wrt_q_matches_finite_differences_of_jax_loss():
  # Directional central difference of the float32 loss along random unit directions.
  q, k, queue = _inputs(3, 4)
  qj, kj, queuej = _f32(q, k, queue)
  loss_fn = lambda qq: float(_jax_loss_and_grads(qq, kj, queuej, 0.2)[0])
  grad = np.asarray(_jax_loss_and_grads(qj, kj, queuej, 0.2)[2][0], np.float64)
  rng = np.random.default_rng(0)
  eps = 1e-2
  for _ in range(4):
    v = rng.normal(size=q.shape)
    v /= np.linalg.norm(v)
    step = jnp.asarray(eps * v, jnp.float32)
    numeric = (loss_fn(qj + step) - loss_fn(qj - step)) / (2 * eps)
    np.testing.assert_allclose(numeric, np.sum(grad * v), rtol=2e-3, atol=2e-4)


def test_no_gradient_into_keys_or_queue():
  q, k, queue = _f32(*_inputs(4, 5))
  _, _, (g_q, g_k, g_queue) = _jax_loss_and_grads(q, k, queue, 0.2)
  assert np.abs(g_q).max() > 1e-3  # the loss does depend on q
  np.testing.assert_array_equal(g_k, np.zeros_like(k))
  np.testing.assert_array_equal(g_queue, np.zeros_like(queue))


def test_score_statistics_match_numpy():
  q, k, queue = _inputs(5, 6)
  _, stats, _ = _jax_loss_and_grads(*_f32(q, k, queue), 0.2)
  assert set(stats) == {"pos_mean", "neg_mean", "neg_var"}
  pos = [qi @ ki for qi, ki in zip(q, k)]
  per_query_var = []
  for qi in q:
    s = np.array([qi @ n for n in queue])
    per_query_var.append(np.mean((s - s.mean()) ** 2))  # population variance over negatives
  np.testing.assert_allclose(stats["pos_mean"], np.mean(pos), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["neg_mean"], np.mean(q @ queue.T), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["neg_var"], np.mean(per_query_var), rtol=1e-5, atol=1e-7)
