"""Tests for cl_jax.losses.hard_negatives.hcl_loss_from_logits and hcl_loss, its form on a
contrast (Robinson et al., ICLR 2021).

The reference is the estimator written out directly in NumPy float64, one anchor
at a time, with no log-space rewriting:
  w_k = e^{beta s_k} / sum_k e^{beta s_k},  est = N sum_k w_k e^{s_k},
  Ng = max((est - tau+ N e^{s+}) / (1 - tau+), N e^{-1/T}),
  l = -log(e^{s+} / (e^{s+} + Ng)),
and the reference gradients are central finite differences of it.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.losses import hard_negatives
from cl_jax.losses.contrast import Contrast, Extra, info_nce
from cl_jax.losses.queue_contrast import QueueTerms
from tests.finite_differences import central_differences


def _np_anchor(pos, neg, beta, tau_plus, temperature):
  """(l, Ng, clamped) for one anchor; neg holds only its negatives' logits."""
  n = len(neg)
  w = np.exp(beta * neg)
  w /= w.sum()
  debiased = (n * np.sum(w * np.exp(neg)) - tau_plus * n * np.exp(pos)) / (1 - tau_plus)
  floor = n * np.exp(-1 / temperature)
  ng = max(debiased, floor)
  return -np.log(np.exp(pos) / (np.exp(pos) + ng)), ng, debiased < floor


def _np_loss(pos, neg, mask, beta, tau_plus, temperature):
  return np.mean(
      [_np_anchor(pos[i], neg[i][mask[i]], beta, tau_plus, temperature)[0] for i in range(len(pos))]
  )


@functools.partial(jax.jit, static_argnames=("beta", "tau_plus", "temperature"))
def _loss_and_grads(pos, neg, mask, beta, tau_plus, temperature):
  fn = lambda p, n: hard_negatives.hcl_loss_from_logits(p, n, mask, beta, tau_plus, temperature)
  return jax.value_and_grad(fn, argnums=(0, 1))(pos, neg)


def _unit(rng, *shape):
  x = rng.normal(size=shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _simclr_logits(rng, batch, dim, temperature):
  """(pos, neg, mask) float64 logits of 2B anchors of unit vectors, SimCLR's layout."""
  z1, z2 = _unit(rng, batch, dim), _unit(rng, batch, dim)
  u = np.concatenate([z1, z2])
  n = 2 * batch
  pos = np.array([u[i] @ u[(i + batch) % n] for i in range(n)]) / temperature
  mask = np.array([[k not in (i, (i + batch) % n) for k in range(n)] for i in range(n)])
  return pos, u @ u.T / temperature, mask


def _random_mask(rng, n, k):
  mask = rng.random((n, k)) < 0.6
  mask[np.arange(n), rng.integers(0, k, n)] = True  # at least one negative per row
  return mask


def _f32(*arrays):
  return [jnp.asarray(a, jnp.float32) for a in arrays]


@pytest.mark.parametrize(
    "beta,tau_plus,temperature",
    [(1.0, 0.1, 0.5), (0.5, 0.0, 0.2), (2.0, 0.05, 0.1), (0.0, 0.2, 0.5)],
)
def test_loss_matches_numpy(beta, tau_plus, temperature):
  rng = np.random.default_rng(int(10 * beta + 100 * tau_plus))
  pos, neg, mask = _simclr_logits(rng, 5, 6, temperature)
  loss, _ = _loss_and_grads(*_f32(pos, neg), mask, beta, tau_plus, temperature)
  chex.assert_shape(loss, ())
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, _np_loss(pos, neg, mask, beta, tau_plus, temperature), rtol=2e-5)


def test_hcl_loss_of_a_contrast_matches_numpy_and_weighs_in_batch_negatives_only():
  # hcl_loss(contrast, T) is the estimator of the logits s+ / T and s_ik / T; a queue or
  # extra negatives have no place in it.
  rng = np.random.default_rng(11)
  temperature, beta, tau_plus = 0.2, 1.0, 0.1
  sim_pos, sim, mask = _simclr_logits(rng, 4, 5, 1.0)  # similarities: logits at T = 1
  pos, batch = _f32(sim_pos, sim)
  contrast = Contrast(pos=pos, batch=batch, batch_mask=jnp.asarray(mask))
  loss = jax.jit(hard_negatives.hcl_loss, static_argnums=(1, 2, 3))(
      contrast, temperature, beta, tau_plus
  )
  want = _np_loss(sim_pos / temperature, sim / temperature, mask, beta, tau_plus, temperature)
  np.testing.assert_allclose(loss, want, rtol=2e-5)
  queue = QueueTerms(*(jnp.zeros(len(sim_pos)) for _ in range(3)))
  extra = Extra(sim=batch, logits=lambda r: r, stat=None)
  for bad in (contrast._replace(queue=queue), contrast._replace(extra=(extra,)), Contrast(pos)):
    with pytest.raises(ValueError, match="in-batch negatives only"):
      hard_negatives.hcl_loss(bad, temperature, beta, tau_plus)


def test_loss_with_an_irregular_mask_matches_numpy():
  # Rows with different negative counts N_i: each anchor uses its own N.
  rng = np.random.default_rng(1)
  pos, neg = rng.uniform(-2, 2, 6), rng.uniform(-2, 2, (6, 9))
  mask = _random_mask(rng, 6, 9)
  assert len(set(mask.sum(1))) > 1
  loss, _ = _loss_and_grads(*_f32(pos, neg), mask, 1.5, 0.1, 0.5)
  np.testing.assert_allclose(loss, _np_loss(pos, neg, mask, 1.5, 0.1, 0.5), rtol=2e-5)


@pytest.mark.parametrize("beta,tau_plus", [(1.0, 0.1), (3.0, 0.0), (0.5, 0.3)])
def test_gradients_match_finite_differences_and_masked_entries_get_none(beta, tau_plus):
  rng = np.random.default_rng(2)
  temperature = 0.5
  pos, neg = rng.uniform(-1, 1, 5) / temperature, rng.uniform(-1, 1, (5, 7)) / temperature
  mask = _random_mask(rng, 5, 7)
  _, (g_pos, g_neg) = _loss_and_grads(*_f32(pos, neg), mask, beta, tau_plus, temperature)
  n_pos, n_neg = central_differences(
      lambda p, n: _np_loss(p, n, mask, beta, tau_plus, temperature), pos, neg
  )
  assert np.abs(n_neg).max() > 1e-3
  np.testing.assert_allclose(g_pos, n_pos, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(g_neg, n_neg, rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(g_neg)[~mask], 0.0)


@pytest.mark.parametrize("temperature", [0.5, 0.1])
@pytest.mark.slow
def test_uniform_weights_without_debiasing_is_nt_xent(temperature):
  rng = np.random.default_rng(3)
  pos, neg, mask = _simclr_logits(rng, 6, 5, temperature)
  args = _f32(pos, neg)
  loss, (g_pos, g_neg) = _loss_and_grads(*args, mask, 0.0, 0.0, temperature)
  # NT-Xent of the logits: InfoNCE at T = 1 (which divides exactly).
  nt_xent = lambda p, n: info_nce(Contrast(pos=p, batch=n, batch_mask=jnp.asarray(mask)), 1.0)
  want, (w_pos, w_neg) = jax.value_and_grad(nt_xent, argnums=(0, 1))(*args)
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  np.testing.assert_allclose(g_pos, w_pos, rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(g_neg, w_neg, rtol=1e-5, atol=1e-8)


def test_large_beta_concentrates_on_the_hardest_negative():
  rng = np.random.default_rng(4)
  temperature = 0.5
  pos, neg, mask = _simclr_logits(rng, 4, 5, temperature)
  losses = [
      float(_loss_and_grads(*_f32(pos, neg), mask, beta, 0.0, temperature)[0])
      for beta in (0.0, 1.0, 4.0, 200.0)
  ]
  assert np.all(np.diff(losses) > 0)  # harder weights, larger loss
  # beta -> inf: sum_k w_k e^{s_k} -> e^{max_k s_k}, so Ng -> N e^{max s}.
  hardest = np.where(mask, neg, -np.inf).max(axis=1)
  limit = np.mean(np.log1p(mask.sum(1) * np.exp(hardest - pos)))
  np.testing.assert_allclose(losses[-1], limit, rtol=1e-4)
  assert abs(losses[0] - limit) > 0.1
  # Gradient goes to the hardest negative of each row only.
  _, (_, g_neg) = _loss_and_grads(*_f32(pos, neg), mask, 200.0, 0.0, temperature)
  g_neg = np.asarray(g_neg)
  np.testing.assert_array_equal(
      np.argmax(g_neg, axis=1), np.argmax(np.where(mask, neg, -np.inf), axis=1)
  )
  share = g_neg.max(axis=1) / g_neg.sum(axis=1)
  assert np.all(share > 0.99)


def test_clamp_engages_for_a_large_class_prior():
  # tau+ = 0.9 with a confident positive: the debiased estimate is negative, so
  # Ng = N e^{-1/T}, l = log(1 + N e^{-1/T - s+}), and the negatives get no gradient.
  rng = np.random.default_rng(5)
  temperature, tau_plus = 0.5, 0.9
  pos = np.full(4, 0.9 / temperature)
  neg = rng.uniform(-0.5, 0.5, (4, 6)) / temperature
  mask = np.ones((4, 6), bool)
  assert all(_np_anchor(pos[i], neg[i], 1.0, tau_plus, temperature)[2] for i in range(4))
  loss, (g_pos, g_neg) = _loss_and_grads(*_f32(pos, neg), mask, 1.0, tau_plus, temperature)
  want = np.mean(np.log1p(6 * np.exp(-1 / temperature - pos)))
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  np.testing.assert_allclose(loss, _np_loss(pos, neg, mask, 1.0, tau_plus, temperature), rtol=1e-6)
  np.testing.assert_array_equal(g_neg, 0.0)
  sigma = 1 / (1 + np.exp(pos + 1 / temperature) / 6)  # d l / d s+ = -sigma
  np.testing.assert_allclose(g_pos, -sigma / 4, rtol=1e-5)


def test_clamp_engages_on_some_anchors_only():
  temperature, tau_plus = 0.5, 0.5
  pos = np.array([1.8, -1.0, 1.9, 0.0])
  neg = np.array([[-1.5, -1.2, -1.0], [1.0, 0.5, -0.5], [-1.9, -1.8, -1.0], [0.2, 0.4, 0.1]])
  mask = np.ones(neg.shape, bool)
  clamped = [_np_anchor(pos[i], neg[i], 1.0, tau_plus, temperature)[2] for i in range(4)]
  assert any(clamped) and not all(clamped)
  loss, (g_pos, g_neg) = _loss_and_grads(*_f32(pos, neg), mask, 1.0, tau_plus, temperature)
  np.testing.assert_allclose(loss, _np_loss(pos, neg, mask, 1.0, tau_plus, temperature), rtol=1e-5)
  n_pos, n_neg = central_differences(
      lambda p, n: _np_loss(p, n, mask, 1.0, tau_plus, temperature), pos, neg
  )
  np.testing.assert_allclose(g_pos, n_pos, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(g_neg, n_neg, rtol=1e-4, atol=1e-6)
  assert np.all(np.isfinite(g_pos)) and np.all(np.isfinite(g_neg))


def test_large_logits_stay_finite():
  # T = 0.01 and beta = 2: (beta + 1) s reaches 300, far past float32's exp range.
  rng = np.random.default_rng(6)
  temperature = 0.01
  pos, neg, mask = _simclr_logits(rng, 4, 3, temperature)
  loss, (g_pos, g_neg) = _loss_and_grads(*_f32(pos, neg), mask, 2.0, 0.1, temperature)
  np.testing.assert_allclose(loss, _np_loss(pos, neg, mask, 2.0, 0.1, temperature), rtol=1e-4)
  assert np.all(np.isfinite(g_pos)) and np.all(np.isfinite(g_neg))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(beta=-1.0), "beta"),
        (dict(tau_plus=1.0), "tau_plus"),
        (dict(tau_plus=-0.1), "tau_plus"),
        (dict(temperature=0.0), "temperature"),
        (dict(mask_shape=(4, 3)), "neg_mask"),
        (dict(pos_shape=(3,)), r"\(N,\)"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
  args = dict(beta=1.0, tau_plus=0.1, temperature=0.5)
  args.update({k: v for k, v in kwargs.items() if k in args})
  pos = jax.ShapeDtypeStruct(kwargs.get("pos_shape", (4,)), jnp.float32)
  neg = jax.ShapeDtypeStruct((4, 5), jnp.float32)
  mask = jax.ShapeDtypeStruct(kwargs.get("mask_shape", (4, 5)), jnp.bool_)
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(
        lambda p, n, m: hard_negatives.hcl_loss_from_logits(p, n, m, **args), pos, neg, mask
    )
