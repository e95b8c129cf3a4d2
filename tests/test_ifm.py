"""IFM (Robinson et al. 2021, Eq. 2), cl_jax.addons.ifm.IFM, in MoCo's
cl_jax.objectives.moco.pair_loss (add-ons from cl_jax.addons.from_config), against NumPy
re-derivations.

Reference: for each query the perturbed InfoNCE
  l_eps = -log e^{(s+ - eps)/T}
          / (e^{(s+ - eps)/T} + sum_j e^{(s_j + eps)/T} + sum_m e^{a(t_m + eps)/T})
with NS logits alpha_ns (s + eps) / T (mode "in"), and the objective (L + alpha L_eps) / 2.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax import config_defaults
from cl_jax import train_step as step_lib
from cl_jax.addons.from_config import from_config
from cl_jax.objectives import moco
from cl_jax.runtime import parallel

DIM, QUEUE = 8, 16


def _unit(rng, *shape):
  x = rng.normal(size=shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _np_loss(q, k, queue, t, T, eps, ns_alpha):
  """Batch mean of l_eps computed one query at a time (eps = 0: plain InfoNCE)."""
  total = 0.0
  for i, qi in enumerate(q):
    pos = np.exp((qi @ k[i] - eps) / T)
    den = pos + sum(np.exp((qi @ n + eps) / T) for n in queue)
    if t is not None:
      den += sum(np.exp(ns_alpha * (qi @ tm + eps) / T) for tm in t[i])
    total += -np.log(pos / den)
  return total / len(q)


def _addons(eps, alpha, enabled, with_ns):
  """The AddOns of a config with the `ifm` block (enabled, epsilon, alpha) and, with_ns, NS
  negatives of alpha 2, mode "in"."""
  c = config_defaults.base_config()
  c.ifm.update(enabled=enabled, epsilon=eps, alpha=alpha)
  c.nonsemantic.update(enabled=with_ns, alpha=2.0, alpha_mode="in")
  return from_config(c, 1)


def _pair_loss(q, k, queue, t, addons, score_queries=0):
  """pair_loss at T = 0.2 on one device, no feature transformation."""
  mesh = parallel.make_mesh(jax.devices()[:1])
  rng, step = jax.random.key(0), jnp.asarray(0)
  return moco.pair_loss(q, k, queue, t, addons, 0.2, mesh, rng, step, q.shape[0], score_queries)


@functools.partial(jax.jit, static_argnames=("addons",))
def _loss_and_grad(q, k, queue, t, addons):
  fn = lambda qq: _pair_loss(qq, k, queue, t, addons)
  (loss, stats), grad = jax.value_and_grad(fn, has_aux=True)(q)
  return loss, stats, grad


def _jax(q, k, queue, t, eps, alpha, enabled, with_ns):
  addons = _addons(eps, alpha, enabled, with_ns)
  return _loss_and_grad(q, k, queue, t if with_ns else None, addons)


def _inputs(seed, batch=5, num_ns=2):
  rng = np.random.default_rng(seed)
  return (
      _unit(rng, batch, DIM),
      _unit(rng, batch, DIM),
      _unit(rng, QUEUE, DIM),
      _unit(rng, batch, num_ns, DIM),
  )


def _f32(*xs):
  return [jnp.asarray(x, jnp.float32) for x in xs]


@pytest.mark.parametrize("with_ns", [False, True])
@pytest.mark.parametrize("eps,alpha", [(0.1, 1.0), (0.2, 0.5), (0.05, 2.0)])
def test_ifm_loss_matches_numpy(with_ns, eps, alpha):
  q, k, queue, t = _inputs(1)
  loss, _, grad = _jax(*_f32(q, k, queue, t), eps, alpha, True, with_ns)
  tt = t if with_ns else None
  want = (
      _np_loss(q, k, queue, tt, 0.2, 0.0, 2.0) + alpha * _np_loss(q, k, queue, tt, 0.2, eps, 2.0)
  ) / 2
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  # Gradient wrt q: central differences of the NumPy objective along random directions.
  rng = np.random.default_rng(2)
  h = 1e-6
  for _ in range(3):
    v = rng.normal(size=q.shape)
    f = lambda x: (
        (
            _np_loss(x, k, queue, tt, 0.2, 0.0, 2.0)
            + alpha * _np_loss(x, k, queue, tt, 0.2, eps, 2.0)
        )
        / 2
    )
    numeric = (f(q + h * v) - f(q - h * v)) / (2 * h)
    np.testing.assert_allclose(
        np.sum(np.asarray(grad, np.float64) * v), numeric, rtol=1e-3, atol=1e-5
    )


def test_ifm_raises_the_loss_and_its_hand_checked_value():
  # All similarities zero (orthogonal vectors): L = log(1 + K); L_eps = -log(e^{-e/T} /
  # (e^{-e/T} + K e^{e/T})) = log(1 + K e^{2 e / T}).
  q = np.zeros((2, DIM))
  q[:, 0] = 1
  k = np.zeros((2, DIM))
  k[:, 1] = 1
  queue = np.zeros((QUEUE, DIM))
  queue[:, 2] = 1
  t = np.zeros((2, 1, DIM))
  t[..., 3] = 1
  loss, _, _ = _jax(*_f32(q, k, queue, t), 0.1, 1.0, True, False)
  want = (np.log(1 + QUEUE) + np.log(1 + QUEUE * np.exp(2 * 0.1 / 0.2))) / 2
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  plain, _, _ = _jax(*_f32(q, k, queue, t), 0.1, 1.0, False, False)
  assert loss > plain


@pytest.mark.parametrize("with_ns", [False, True])
def test_ifm_off_leaves_the_loss_bit_identical(with_ns):
  # Switched off, the block's epsilon and alpha are never read: the loss and gradient are
  # those of the base loss, bit for bit.
  q, k, queue, t = _f32(*_inputs(3))
  base = _jax(q, k, queue, t, 0.0, 0.0, False, with_ns)
  other = _jax(q, k, queue, t, 0.3, 5.0, False, with_ns)
  np.testing.assert_array_equal(base[0], other[0])
  np.testing.assert_array_equal(base[2], other[2])
  np.testing.assert_allclose(
      base[0],
      _np_loss(*_inputs(3)[:3], _inputs(3)[3] if with_ns else None, 0.2, 0.0, 2.0),
      rtol=1e-5,
  )


@pytest.mark.slow
def test_score_statistics_over_the_first_queries():
  q, k, queue, t = _inputs(4, batch=6)
  addons = _addons(0.1, 1.0, False, True)
  _, stats = _pair_loss(*_f32(q, k, queue, t), addons, score_queries=3)
  s = q[:3] @ queue.T
  np.testing.assert_allclose(stats["pos_mean"], np.mean(np.sum(q[:3] * k[:3], 1)), rtol=1e-5)
  np.testing.assert_allclose(stats["neg_mean"], s.mean(), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(stats["neg_var"], s.var(axis=1).mean(), rtol=1e-5)
  np.testing.assert_allclose(
      stats["ns_mean"], np.einsum("bd,bmd->bm", q[:3], t[:3]).mean(), rtol=1e-5, atol=1e-7
  )


def test_layer_grad_norms_hand_checked():
  grads = {
      "backbone": {
          "conv": {"kernel": jnp.array([[3.0, 0.0], [0.0, 4.0]])},
          "bn": {"scale": jnp.array([1.0, 2.0]), "bias": jnp.array([2.0, 4.0])},
      },
      "head": {"dense_0": {"kernel": jnp.array([[0.0]]), "bias": jnp.array([-2.0])}},
  }
  norms = step_lib.layer_grad_norms(grads)
  assert list(norms) == [
      "grad_norm/backbone/bn",
      "grad_norm/backbone/conv",
      "grad_norm/head/dense_0",
  ]
  np.testing.assert_allclose(norms["grad_norm/backbone/bn"], 5.0)
  np.testing.assert_allclose(norms["grad_norm/backbone/conv"], 5.0)
  np.testing.assert_allclose(norms["grad_norm/head/dense_0"], 2.0)
