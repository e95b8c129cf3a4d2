"""Tests for cl_jax.losses.simclr.nt_xent_loss and its pieces: pair_contrast, the contrast
of the two views, and the InfoNCE and statistics of cl_jax.losses.contrast it feeds.

The reference is a NumPy float64 double loop over the 2B anchors u = [z1; z2]:
  l_i = -log( exp(s_ip/T) / (sum_{k != i} exp(s_ik/T) + sum_m exp(e_im)) ),
  loss = mean_i l_i,
and the reference gradients are central finite differences of that loop.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.losses import simclr
from cl_jax.runtime import parallel
from tests.finite_differences import central_differences


def _unit(rng, *shape):
  x = rng.normal(size=shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _np_loss(z1, z2, temperature, extra=None):
  """Mean NT-Xent over the 2B ordered positive pairs, one anchor at a time."""
  u = np.concatenate([z1, z2])
  n, b = len(u), len(z1)
  total = 0.0
  for i in range(n):
    p = (i + b) % n
    den = sum(np.exp(u[i] @ u[k] / temperature) for k in range(n) if k != i)
    if extra is not None:
      den += sum(np.exp(e) for e in extra[i])
    total += -np.log(np.exp(u[i] @ u[p] / temperature) / den)
  return total / n


@functools.partial(jax.jit, static_argnames=("temperature",))
def _loss_and_grads(z1, z2, extra, temperature):
  """(loss, stats, (dL/dz1, dL/dz2)); extra is None or (2B, M) logits."""
  fn = lambda a, b: simclr.nt_xent_loss(a, b, temperature, extra)
  (loss, stats), grads = jax.value_and_grad(fn, argnums=(0, 1), has_aux=True)(z1, z2)
  return loss, stats, grads


def _f32(*arrays):
  return [jnp.asarray(a, jnp.float32) for a in arrays]


@pytest.mark.parametrize(
    "batch,dim,temperature", [(2, 3, 0.5), (4, 8, 0.1), (7, 5, 0.2), (16, 32, 0.07)]
)
def test_loss_matches_numpy_double_loop(batch, dim, temperature):
  rng = np.random.default_rng(batch)
  z1, z2 = _unit(rng, batch, dim), _unit(rng, batch, dim)
  loss, _, _ = _loss_and_grads(*_f32(z1, z2), None, temperature)
  chex.assert_shape(loss, ())
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, _np_loss(z1, z2, temperature), rtol=2e-5)


@pytest.mark.parametrize("batch,dim,temperature", [(2, 3, 0.5), (4, 5, 0.1)])
def test_gradients_match_numpy_finite_differences(batch, dim, temperature):
  rng = np.random.default_rng(100 + batch)
  z1, z2 = _unit(rng, batch, dim), _unit(rng, batch, dim)
  _, _, (g1, g2) = _loss_and_grads(*_f32(z1, z2), None, temperature)
  n1, n2 = central_differences(lambda a, b: _np_loss(a, b, temperature), z1, z2)
  assert np.abs(n1).max() > 1e-2  # the loss does depend on z1
  np.testing.assert_allclose(g1, n1, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g2, n2, rtol=1e-4, atol=1e-5)


def test_hand_checked_cases():
  b = 3
  eye = np.eye(2 * b)
  # All 2B vectors orthogonal: every similarity 0, loss log(2B - 1) for any T.
  z1, z2 = eye[:b], eye[b:]
  for temperature in (0.1, 1.0):
    loss, stats, _ = _loss_and_grads(*_f32(z1, z2), None, temperature)
    np.testing.assert_allclose(loss, np.log(2 * b - 1), rtol=1e-6)
  assert float(stats["pos_mean"]) == 0.0 and float(stats["neg_var"]) == 0.0
  # z2 = z1, rows orthogonal: positive 1, the 2B - 2 negatives 0:
  # loss = log(1 + (2B - 2) exp(-1/T)).
  loss, stats, _ = _loss_and_grads(*_f32(eye[:b], eye[:b]), None, 0.5)
  np.testing.assert_allclose(loss, np.log(1 + (2 * b - 2) * np.exp(-2.0)), rtol=1e-6)
  assert float(stats["pos_mean"]) == 1.0 and float(stats["neg_mean"]) == 0.0


def test_self_similarity_is_excluded():
  # z1 = z2 = the same vector for every pair: s = 1 everywhere except the excluded
  # self-pair, so all 2B - 1 candidates tie: loss log(2B - 1), not log(2B).
  b = 4
  z = np.tile(_unit(np.random.default_rng(0), 1, 6), (b, 1))
  loss, _, (g1, g2) = _loss_and_grads(*_f32(z, z), None, 0.1)
  np.testing.assert_allclose(loss, np.log(2 * b - 1), rtol=1e-6)
  assert np.all(np.isfinite(g1)) and np.all(np.isfinite(g2))


def test_extra_negative_logits_enter_the_denominator():
  rng = np.random.default_rng(7)
  b, dim, m, temperature = 5, 6, 3, 0.2
  z1, z2 = _unit(rng, b, dim), _unit(rng, b, dim)
  extra = rng.normal(size=(2 * b, m))
  loss, _, (g1, _) = _loss_and_grads(*_f32(z1, z2, extra), temperature)
  np.testing.assert_allclose(loss, _np_loss(z1, z2, temperature, extra), rtol=2e-5)
  # Orthogonal vectors and M zero extra logits: loss log(2B - 1 + M).
  eye = np.eye(2 * b)
  loss, _, _ = _loss_and_grads(*_f32(eye[:b], eye[b:], np.zeros((2 * b, m))), temperature)
  np.testing.assert_allclose(loss, np.log(2 * b - 1 + m), rtol=1e-6)


def test_gradient_flows_into_extra_logits_as_softmax_weights():
  # dL/de_im = softmax weight of e_im in anchor i's denominator / 2B.
  rng = np.random.default_rng(8)
  b, dim, m, temperature = 3, 4, 2, 0.5
  z1, z2 = _unit(rng, b, dim), _unit(rng, b, dim)
  extra = rng.normal(size=(2 * b, m))
  fn = lambda e: simclr.nt_xent_loss(*_f32(z1, z2), temperature, e)[0]
  grad = jax.jit(jax.grad(fn))(jnp.asarray(extra, jnp.float32))
  u = np.concatenate([z1, z2])
  expected = np.zeros_like(extra)
  for i in range(2 * b):
    den = sum(np.exp(u[i] @ u[k] / temperature) for k in range(2 * b) if k != i)
    den += np.exp(extra[i]).sum()
    expected[i] = np.exp(extra[i]) / den / (2 * b)
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_score_statistics_match_numpy():
  rng = np.random.default_rng(3)
  b, dim = 6, 5
  z1, z2 = _unit(rng, b, dim), _unit(rng, b, dim)
  _, stats, _ = _loss_and_grads(*_f32(z1, z2), None, 0.2)
  assert set(stats) == {"pos_mean", "neg_mean", "neg_var"}
  u = np.concatenate([z1, z2])
  pos, means, variances = [], [], []
  for i in range(2 * b):
    p = (i + b) % (2 * b)
    pos.append(u[i] @ u[p])
    negs = np.array([u[i] @ u[k] for k in range(2 * b) if k not in (i, p)])
    assert len(negs) == 2 * b - 2
    means.append(negs.mean())
    variances.append(negs.var())
  np.testing.assert_allclose(stats["pos_mean"], np.mean(pos), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["neg_mean"], np.mean(means), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["neg_var"], np.mean(variances), rtol=1e-5, atol=1e-7)


def test_pair_contrast_layout():
  rng = np.random.default_rng(4)
  b = 3
  z1, z2 = _unit(rng, b, 4), _unit(rng, b, 4)
  anchors, contrast = jax.jit(simclr.pair_contrast)(*_f32(z1, z2))
  chex.assert_shape(
      [contrast.pos, contrast.batch, contrast.batch_mask],
      [(2 * b,), (2 * b, 2 * b), (2 * b, 2 * b)],
  )
  u = np.concatenate([z1, z2])
  np.testing.assert_allclose(anchors, u, rtol=1e-6)
  assert contrast.queue is None and contrast.extra == ()
  np.testing.assert_allclose(contrast.batch, u @ u.T, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(contrast.pos, np.concatenate([np.sum(z1 * z2, 1)] * 2), rtol=1e-5)
  expected_mask = np.ones((2 * b, 2 * b), bool)
  for i in range(2 * b):
    expected_mask[i, i] = expected_mask[i, (i + b) % (2 * b)] = False
  np.testing.assert_array_equal(contrast.batch_mask, expected_mask)


def test_large_logits_stay_finite():
  # T = 0.01: logits up to 100 must not overflow.
  rng = np.random.default_rng(5)
  z1 = _unit(rng, 4, 6)
  z2 = z1 + 0.05 * rng.normal(size=z1.shape)
  z2 /= np.linalg.norm(z2, axis=1, keepdims=True)
  loss, _, (g1, g2) = _loss_and_grads(*_f32(z1, z2), None, 0.01)
  np.testing.assert_allclose(loss, _np_loss(z1, z2, 0.01), rtol=1e-4, atol=1e-6)
  assert np.all(np.isfinite(g1)) and np.all(np.isfinite(g2))


@pytest.mark.slow
def test_batch_sharded_over_eight_devices_gives_the_same_loss_and_gradients():
  rng = np.random.default_rng(6)
  b, dim = 16, 8
  z1, z2 = _unit(rng, b, dim), _unit(rng, b, dim)
  mesh = parallel.make_mesh(jax.devices()[:8])
  rows = parallel.batch_sharding(mesh)
  s1, s2 = (jax.device_put(x, rows) for x in _f32(z1, z2))
  loss, stats, (g1, _) = _loss_and_grads(s1, s2, None, 0.2)
  one_loss, one_stats, (one_g1, _) = _loss_and_grads(*_f32(z1, z2), None, 0.2)
  np.testing.assert_allclose(loss, _np_loss(z1, z2, 0.2), rtol=2e-5)
  np.testing.assert_allclose(loss, one_loss, rtol=1e-6)
  np.testing.assert_allclose(g1, one_g1, rtol=1e-5, atol=1e-7)
  for name in one_stats:
    np.testing.assert_allclose(stats[name], one_stats[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "z1_shape,z2_shape,extra_shape,match",
    [
        ((4, 3), (5, 3), None, "same shape"),
        ((4,), (4,), None, r"\(B, d\)"),
        ((1, 3), (1, 3), None, "B >= 2"),
        ((4, 3), (4, 3), (4, 2), r"extra negatives must be \(N, M\) with N = 8"),
    ],
)
def test_bad_shapes_raise(z1_shape, z2_shape, extra_shape, match):
  extra = None if extra_shape is None else jax.ShapeDtypeStruct(extra_shape, jnp.float32)
  z1, z2 = (jax.ShapeDtypeStruct(s, jnp.float32) for s in (z1_shape, z2_shape))
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(lambda a, b, e: simclr.nt_xent_loss(a, b, 0.2, e), z1, z2, extra)


def test_non_positive_temperature_raises():
  z = jax.ShapeDtypeStruct((2, 3), jnp.float32)
  with pytest.raises(ValueError, match="temperature"):
    jax.eval_shape(lambda a, b: simclr.nt_xent_loss(a, b, 0.0), z, z)
