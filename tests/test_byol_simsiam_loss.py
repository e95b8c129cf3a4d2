"""Tests for byol (loss, non-semantic variant, momentum schedule), simsiam, and the
positive extrapolation of their pairs, cl_jax.addons.feature_transform_contrast.
FeatureTransform.on_pairs.

References are NumPy float64: cosines from explicitly normalised vectors,
Ge et al. 2021 Eq. 2 as squared distances of unit vectors, the analytic
gradient of a cosine, d cos(p, z)/dp = (z^ - cos(p, z) p^) / ||p||, and
central finite differences where no closed form is written out.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.addons.feature_transform_contrast import FeatureTransform
from cl_jax.losses import byol, simsiam


def _normalise(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _np_cos(a, b):
  return np.sum(_normalise(a) * _normalise(b), axis=-1)


def _np_dcos_dp(p, z):
  """Row-wise analytic gradient of cos(p_i, z_i) wrt p_i."""
  cos = _np_cos(p, z)[:, None]
  return (_normalise(z) - cos * _normalise(p)) / np.linalg.norm(p, axis=-1, keepdims=True)


def _np_ns_loss(p, z, t, alpha):
  """Eq. 2 with squared distances of unit vectors, NS penalty averaged over M."""
  ph, zh, th = _normalise(p), _normalise(z), _normalise(t)
  pos = np.sum((ph - zh) ** 2, axis=-1)
  ns = np.mean(np.sum((ph[:, None] - th) ** 2, axis=-1), axis=1)
  return np.mean(pos - alpha * ns)


def _inputs(seed, *shapes):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=s) * rng.uniform(0.5, 3.0) for s in shapes]


def _f32(*arrays):
  return [jnp.asarray(a, jnp.float32) for a in arrays]


@jax.jit
def _byol(p, z):
  """(loss, stats, (dL/dp, dL/dz))."""
  (loss, stats), grads = jax.value_and_grad(byol.byol_loss, argnums=(0, 1), has_aux=True)(p, z)
  return loss, stats, grads


@functools.partial(jax.jit, static_argnames=("alpha",))
def _byol_ns(p, z, t, alpha):
  """(loss, stats, (dL/dp, dL/dz, dL/dt))."""
  fn = lambda a, b, c: byol.byol_ns_loss(a, b, c, alpha)
  (loss, stats), grads = jax.value_and_grad(fn, argnums=(0, 1, 2), has_aux=True)(p, z, t)
  return loss, stats, grads


@jax.jit
def _simsiam(p1, p2, z1, z2):
  """(loss, stats, (dL/dp1, dL/dp2, dL/dz1, dL/dz2))."""
  (loss, stats), grads = jax.value_and_grad(
      simsiam.simsiam_loss, argnums=(0, 1, 2, 3), has_aux=True
  )(p1, p2, z1, z2)
  return loss, stats, grads


# ----------------------------------------------------------------------------- BYOL


@pytest.mark.parametrize("batch,dim", [(1, 3), (5, 8), (16, 4)])
def test_byol_loss_and_gradient_match_numpy(batch, dim):
  p, z = _inputs(batch, (batch, dim), (batch, dim))
  loss, stats, (g_p, g_z) = _byol(*_f32(p, z))
  chex.assert_shape(loss, ())
  assert loss.dtype == jnp.float32
  cos = _np_cos(p, z)
  np.testing.assert_allclose(loss, np.mean(2 - 2 * cos), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["pos_mean"], np.mean(cos), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_p, -2 / batch * _np_dcos_dp(p, z), rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(g_z, np.zeros_like(z))  # stop-gradient on the target


def test_byol_loss_hand_checked_directions():
  z = np.array([[1.0, 2.0, -1.0], [0.0, 3.0, 4.0]])
  loss, _, _ = _byol(*_f32(2.5 * z, z))  # same direction: 0
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)
  loss, _, _ = _byol(*_f32(-0.3 * z, z))  # opposite direction: 4
  np.testing.assert_allclose(loss, 4.0, rtol=1e-6)
  orth = np.array([[2.0, -1.0, 0.0], [0.0, 4.0, -3.0]])  # orthogonal: 2
  loss, _, _ = _byol(*_f32(orth, z))
  np.testing.assert_allclose(loss, 2.0, rtol=1e-6)


def test_byol_loss_of_a_zero_prediction_is_finite():
  p, z = np.zeros((2, 4)), _inputs(0, (2, 4))[0]
  loss, _, (g_p, _) = _byol(*_f32(p, z))
  np.testing.assert_allclose(loss, 2.0, rtol=1e-6)
  assert np.all(np.isfinite(g_p))


@pytest.mark.parametrize(
    "batch,num_ns,dim,alpha", [(1, 1, 3, 0.05), (4, 1, 6, 0.5), (3, 3, 5, 2.0)]
)
def test_byol_ns_loss_matches_eq2(batch, num_ns, dim, alpha):
  p, z, t = _inputs(10 + batch, (batch, dim), (batch, dim), (batch, num_ns, dim))
  loss, stats, (g_p, g_z, g_t) = _byol_ns(*_f32(p, z, t), alpha)
  np.testing.assert_allclose(loss, _np_ns_loss(p, z, t, alpha), rtol=1e-5, atol=1e-6)
  # Right-hand side of Eq. 2: 2 - 2 alpha - 2 z_i.z_p + 2 alpha z_i.z_ns (mean over NS).
  ns_cos = _np_cos(p[:, None], t)
  rhs = np.mean(2 - 2 * alpha - 2 * _np_cos(p, z) + 2 * alpha * ns_cos.mean(axis=1))
  np.testing.assert_allclose(loss, rhs, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["pos_mean"], _np_cos(p, z).mean(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["ns_mean"], ns_cos.mean(), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(g_z, np.zeros_like(z))
  np.testing.assert_array_equal(g_t, np.zeros_like(t))


def test_byol_ns_gradient_matches_numpy_finite_differences():
  p, z, t = _inputs(20, (3, 4), (3, 4), (3, 2, 4))
  alpha, eps = 0.5, 1e-6
  _, _, (g_p, _, _) = _byol_ns(*_f32(p, z, t), alpha)
  numeric = np.zeros_like(p)
  for idx in np.ndindex(p.shape):
    dp = np.zeros_like(p)
    dp[idx] = eps
    numeric[idx] = (_np_ns_loss(p + dp, z, t, alpha) - _np_ns_loss(p - dp, z, t, alpha)) / (2 * eps)
  assert np.abs(numeric).max() > 1e-2
  np.testing.assert_allclose(g_p, numeric, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_byol_ns_loss_measures_the_ns_term_from_the_anchor():
  """With positive extrapolation the BYOL step passes the extrapolated pair as (p, z) and
  the original prediction as the anchor of Eq. 2's NS term (Zhu et al. App. E.2)."""
  z = _f32(np.array([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]]))[0]
  t = -z[:, None]
  # p = z: no positive term; the anchor decides the NS distance, 4 (opposite) or 0 (equal).
  far, _ = byol.byol_ns_loss(z, z, t, 0.5, anchor=z)
  near, stats = byol.byol_ns_loss(z, z, t, 0.5, anchor=-z)
  np.testing.assert_allclose([far, near], [-2.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(stats["ns_mean"], 1.0, atol=1e-6)
  # stop_gradient=False lets the gradient reach z (an extrapolated target built from p).
  g = jax.grad(lambda zz: byol.byol_ns_loss(z[::-1], zz, t, 0.5, stop_gradient=False)[0])(z)
  assert np.abs(np.asarray(g)).max() > 0
  g0 = jax.grad(lambda zz: byol.byol_ns_loss(z[::-1], zz, t, 0.5)[0])(z)
  np.testing.assert_array_equal(g0, np.zeros_like(z))


def test_byol_ns_loss_hand_checked_and_alpha_zero():
  z = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
  # p along z, NS opposite: 0 - alpha * 4.
  loss, _, _ = _byol_ns(*_f32(z, z, -z[:, None]), 0.05)
  np.testing.assert_allclose(loss, -0.2, rtol=1e-6)
  # alpha = 0 is plain BYOL, whatever the NS features.
  p, t = _inputs(30, (2, 3), (2, 2, 3))
  loss_ns, _, (g_ns, _, _) = _byol_ns(*_f32(p, z, t), 0.0)
  cos = _np_cos(p, z)
  np.testing.assert_allclose(loss_ns, np.mean(2 - 2 * cos), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_ns, -_np_dcos_dp(p, z), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "p_shape,z_shape,t_shape,alpha,match",
    [
        ((4, 3), (4, 2), (4, 1, 3), 0.05, "same shape"),
        ((4, 3), (4, 3), (4, 3), 0.05, r"\(B, M, d\)"),
        ((4, 3), (4, 3), (2, 1, 3), 0.05, r"\(B, M, d\)"),
        ((4, 3), (4, 3), (4, 1, 3), -0.1, "alpha"),
    ],
)
def test_byol_bad_inputs_raise(p_shape, z_shape, t_shape, alpha, match):
  p, z, t = (jax.ShapeDtypeStruct(s, jnp.float32) for s in (p_shape, z_shape, t_shape))
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(lambda a, b, c: byol.byol_ns_loss(a, b, c, alpha), p, z, t)


def test_target_momentum_schedule():
  base, total = 0.99, 100
  np.testing.assert_allclose(byol.target_momentum(0, total, base), base, rtol=1e-7)
  np.testing.assert_allclose(byol.target_momentum(total, total, base), 1.0, rtol=1e-7)
  np.testing.assert_allclose(
      byol.target_momentum(total // 2, total, base), (1 + base) / 2, rtol=1e-7
  )
  np.testing.assert_allclose(byol.target_momentum(total + 7, total, base), 1.0, rtol=1e-7)
  # Traced step under jit, all steps at once, against the closed form.
  steps = jnp.arange(total + 1)
  taus = np.asarray(jax.jit(jax.vmap(lambda k: byol.target_momentum(k, total, base)))(steps))
  assert taus.dtype == np.float32
  k = np.arange(total + 1)
  np.testing.assert_allclose(taus, 1 - (1 - base) * (np.cos(np.pi * k / total) + 1) / 2, rtol=1e-6)
  assert np.all(np.diff(taus) >= 0) and taus[-1] > taus[0]


@pytest.mark.parametrize(
    "total,base,match",
    [(0, 0.99, "total_steps"), (10, 1.5, "base_momentum"), (10, -0.1, "base_momentum")],
)
def test_target_momentum_bad_arguments_raise(total, base, match):
  with pytest.raises(ValueError, match=match):
    byol.target_momentum(0, total, base)


# -------------------------------------------------------------------------- SimSiam


@pytest.mark.parametrize("batch,dim", [(1, 3), (6, 5)])
def test_simsiam_loss_and_gradients_match_numpy(batch, dim):
  p1, p2, z1, z2 = _inputs(40 + batch, *[(batch, dim)] * 4)
  loss, stats, (g_p1, g_p2, g_z1, g_z2) = _simsiam(*_f32(p1, p2, z1, z2))
  chex.assert_shape(loss, ())
  expected = -(_np_cos(p1, z2).mean() + _np_cos(p2, z1).mean()) / 2
  np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["pos_mean"], -expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_p1, -_np_dcos_dp(p1, z2) / (2 * batch), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(g_p2, -_np_dcos_dp(p2, z1) / (2 * batch), rtol=1e-4, atol=1e-6)
  # Stop-gradient: nothing flows into the projections, though the loss depends on them.
  assert np.abs(g_p1).max() > 1e-3
  np.testing.assert_array_equal(g_z1, np.zeros_like(z1))
  np.testing.assert_array_equal(g_z2, np.zeros_like(z2))


def test_numpy_analytic_cosine_gradient_matches_finite_differences():
  # Validates the reference gradient itself, in float64.
  p, z = _inputs(50, (3, 4), (3, 4))
  eps = 1e-6
  numeric = np.zeros_like(p)
  for idx in np.ndindex(p.shape):
    dp = np.zeros_like(p)
    dp[idx] = eps
    numeric[idx] = (_np_cos(p + dp, z) - _np_cos(p - dp, z)).sum() / (2 * eps)
  np.testing.assert_allclose(_np_dcos_dp(p, z), numeric, atol=1e-8)


def test_simsiam_hand_checked_cases():
  z1 = np.array([[1.0, 0.0, 2.0], [0.0, -1.0, 1.0]])
  z2 = np.array([[0.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
  loss, _, _ = _simsiam(*_f32(4 * z2, 0.5 * z1, z1, z2))  # aligned: -1
  np.testing.assert_allclose(loss, -1.0, rtol=1e-6)
  loss, _, _ = _simsiam(*_f32(-z2, -z1, z1, z2))  # opposite: +1
  np.testing.assert_allclose(loss, 1.0, rtol=1e-6)
  loss, _, _ = _simsiam(*_f32(z2, -z1, z1, z2))  # half each: 0
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)


def test_simsiam_bad_shapes_raise():
  a, b = jax.ShapeDtypeStruct((4, 3), jnp.float32), jax.ShapeDtypeStruct((4, 2), jnp.float32)
  with pytest.raises(ValueError, match="same shape"):
    jax.eval_shape(simsiam.simsiam_loss, a, a, a, b)
  c = jax.ShapeDtypeStruct((4,), jnp.float32)
  with pytest.raises(ValueError, match=r"\(B, d\)"):
    jax.eval_shape(simsiam.simsiam_loss, c, c, c, c)


def test_siamese_extrapolation_draws_one_vector_per_pair():
  """Eq. 3 on unit vectors with ft.coefficients = "sample_dimension": one (d,) lambda per
  pair (Eq. 6, Sec. 4.3), lambda = 1 + Beta(a_ex, a_ex)."""
  ft = FeatureTransform(
      positive_extrapolation=True,
      positive_interpolation=False,
      alpha_ex=2.0,
      negative="none",
      alpha_in=1.0,
      hard_a=1.0,
      hard_b=1.0,
      union=False,
      coefficients="sample_dimension",
      renormalize=False,
      start_step=0,
  )
  p, z = _inputs(40, (4, 3), (4, 3))
  key = jax.random.key(3)
  [(p2, z2)] = ft.on_pairs([tuple(_f32(p, z))], key, jnp.asarray(True))
  lam = 1 + np.asarray(jax.random.beta(jax.random.fold_in(key, 0), 2.0, 2.0, (4, 3)), np.float64)
  assert np.ptp(lam[:, 0]) > 0.05  # the pairs' coefficients differ
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  np.testing.assert_allclose(p2, lam * unit(p) + (1 - lam) * unit(z), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(z2, lam * unit(z) + (1 - lam) * unit(p), rtol=1e-5, atol=1e-6)
