"""Tests for cl_jax.addons.feature_transform (Zhu et al. 2021, Sec. 4, App. E.2, F, G).

References are NumPy float64 re-derivations written from the paper:
  Eq. 3  q' = l q + (1 - l) k,  k' = l k + (1 - l) q     (elementwise for a (d,) l)
  Eq. 4  q'.k' = S + 2 l (1 - l) (1 - S)                  (unit q, k; S = q.k)
  Eq. 5 / 7  n'_j = m n_j + (1 - m) n_{partner[j]}
  Eq. 8  h_ij = l q_i + (1 - l) n_j, scored as q_i.h_ij (or q_i.h_ij / |h_ij|)
and, for L = q'.k' with scalar l,
  dL/dq = l k' + (1 - l) q' = (l^2 + (1 - l)^2) k + 2 l (1 - l) q.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.addons import feature_transform as ft

DIM = 8


def _unit(rng, *shape):
  x = rng.normal(size=shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _np_normalize(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _np_extrapolate(q, k, lam, renormalize):
  q_new, k_new = lam * q + (1 - lam) * k, lam * k + (1 - lam) * q
  if renormalize:
    q_new, k_new = _np_normalize(q_new), _np_normalize(k_new)
  return q_new, k_new


def _f32(x):
  return jnp.asarray(x, jnp.float32)


# --- positive extrapolation -------------------------------------------------------------


def test_vector_form_reproduces_eq4_for_unit_vectors():
  rng = np.random.default_rng(0)
  n = 512
  q, k = _unit(rng, n, DIM), _unit(rng, n, DIM)
  lam = np.concatenate([[1.0, 2.0], rng.uniform(1.0, 2.0, size=n - 2)])
  s = np.sum(q * k, axis=1)
  eq4 = s - 2 * lam * (lam - 1) * (1 - s)

  one_pair = lambda a, b, l: ft.positive_extrapolation(a, b, l, renormalize=False)
  q_new, k_new = jax.vmap(one_pair)(_f32(q), _f32(k), _f32(lam))
  np.testing.assert_allclose(np.sum(np.asarray(q_new) * np.asarray(k_new), axis=1), eq4, atol=2e-5)
  score = jax.vmap(lambda s_, l: ft.positive_extrapolation_score(s_, l, False))(_f32(s), _f32(lam))
  np.testing.assert_allclose(score, eq4, atol=2e-5)


def test_renormalized_score_form_matches_normalized_vectors():
  rng = np.random.default_rng(1)
  n = 256
  q, k = _unit(rng, n, DIM), _unit(rng, n, DIM)
  lam = rng.uniform(1.0, 2.0, size=n)
  ref = np.array([np.dot(*_np_extrapolate(q[i], k[i], lam[i], True)) for i in range(n)])
  s = np.sum(q * k, axis=1)
  score = jax.vmap(lambda s_, l: ft.positive_extrapolation_score(s_, l, True))(_f32(s), _f32(lam))
  np.testing.assert_allclose(score, ref, atol=2e-5)
  q_new, k_new = jax.vmap(lambda a, b, l: ft.positive_extrapolation(a, b, l, True))(
      _f32(q), _f32(k), _f32(lam)
  )
  np.testing.assert_allclose(np.linalg.norm(q_new, axis=1), 1.0, atol=1e-5)
  np.testing.assert_allclose(np.sum(np.asarray(q_new) * np.asarray(k_new), axis=1), ref, atol=2e-5)


@pytest.mark.parametrize("renormalize", [False, True])
def test_extrapolation_lowers_positive_score_and_lam_one_is_identity(renormalize):
  rng = np.random.default_rng(2)
  q, k = _unit(rng, 64, DIM), _unit(rng, 64, DIM)
  s = np.sum(q * k, axis=1)
  for lam in (1.0, 1.1, 1.5, 2.0):
    q_new, k_new = ft.positive_extrapolation(_f32(q), _f32(k), lam, renormalize)
    s_new = np.sum(np.asarray(q_new) * np.asarray(k_new), axis=1)
    assert np.all(s_new <= s + 1e-6)
    if lam > 1.0:
      assert np.all(s_new < s - 1e-3)
  q_same, k_same = ft.positive_extrapolation(_f32(q), _f32(k), 1.0, renormalize)
  np.testing.assert_allclose(q_same, q, atol=1e-6)
  np.testing.assert_allclose(k_same, k, atol=1e-6)


def test_gradient_through_q_matches_analytic_and_flows_into_both_outputs():
  rng = np.random.default_rng(3)
  q, k = _unit(rng, 4, DIM), _unit(rng, 4, DIM)
  a, b = rng.normal(size=(4, DIM)), rng.normal(size=(4, DIM))
  lam = 1.7

  loss = lambda q_: jnp.sum(
      jnp.prod(jnp.stack(ft.positive_extrapolation(q_, _f32(k), lam, False)), axis=0)
  )
  expected = (lam**2 + (1 - lam) ** 2) * k + 2 * lam * (1 - lam) * q
  np.testing.assert_allclose(jax.grad(loss)(_f32(q)), expected, atol=1e-5)

  # d/dq (q'.a) = lam a and d/dq (k'.b) = (1 - lam) b: both nonzero for lam != 1.
  via_q = jax.grad(
      lambda q_: jnp.sum(ft.positive_extrapolation(q_, _f32(k), lam, False)[0] * _f32(a))
  )(_f32(q))
  via_k = jax.grad(
      lambda q_: jnp.sum(ft.positive_extrapolation(q_, _f32(k), lam, False)[1] * _f32(b))
  )(_f32(q))
  np.testing.assert_allclose(via_q, lam * a, atol=1e-5)
  np.testing.assert_allclose(via_k, (1 - lam) * b, atol=1e-5)
  assert np.all(np.abs(via_k) > 0) and np.all(np.abs(via_q) > 0)


def test_gradient_with_renormalization_matches_finite_differences():
  rng = np.random.default_rng(4)
  q, k = _unit(rng, 1, DIM)[0], _unit(rng, 1, DIM)[0]
  lam = rng.uniform(1.0, 2.0, size=DIM)

  def np_loss(q_):
    return np.dot(*_np_extrapolate(q_, k, lam, True))

  h = 1e-6
  expected = np.array([(np_loss(q + h * e) - np_loss(q - h * e)) / (2 * h) for e in np.eye(DIM)])
  loss = lambda q_: jnp.dot(*ft.positive_extrapolation(q_, _f32(k), _f32(lam), True))
  np.testing.assert_allclose(jax.grad(loss)(_f32(q)), expected, atol=1e-4)
  assert np.linalg.norm(expected) > 1e-2


@pytest.mark.parametrize("renormalize", [False, True])
def test_per_dimension_lam_matches_numpy_loop(renormalize):
  rng = np.random.default_rng(5)
  q, k = _unit(rng, 3, DIM), _unit(rng, 3, DIM)
  lam = rng.uniform(1.0, 2.0, size=DIM)
  q_ref, k_ref = np.zeros_like(q), np.zeros_like(k)
  for i in range(3):
    for j in range(DIM):
      q_ref[i, j] = lam[j] * q[i, j] + (1 - lam[j]) * k[i, j]
      k_ref[i, j] = lam[j] * k[i, j] + (1 - lam[j]) * q[i, j]
  if renormalize:
    q_ref, k_ref = _np_normalize(q_ref), _np_normalize(k_ref)
  q_new, k_new = ft.positive_extrapolation(_f32(q), _f32(k), _f32(lam), renormalize)
  np.testing.assert_allclose(q_new, q_ref, atol=1e-6)
  np.testing.assert_allclose(k_new, k_ref, atol=1e-6)


def test_positive_extrapolation_rejects_bad_shapes():
  q = jnp.zeros((2, DIM))
  with pytest.raises(ValueError, match="lam"):
    ft.positive_extrapolation(q, q, jnp.ones(DIM + 1), False)
  with pytest.raises(ValueError, match="same shape"):
    ft.positive_extrapolation(q, jnp.zeros((3, DIM)), 1.5, False)
  with pytest.raises(ValueError, match="scalar lam"):
    ft.positive_extrapolation_score(jnp.zeros(2), jnp.ones(DIM), False)


# --- negative interpolation / extrapolation -------------------------------------------------


@pytest.mark.parametrize("mu_kind", ["scalar", "vector"])
@pytest.mark.parametrize("renormalize", [False, True])
def test_negative_interpolation_matches_numpy_and_leaves_input(mu_kind, renormalize):
  rng = np.random.default_rng(6)
  n = _unit(rng, 12, DIM)
  partner = rng.permutation(12)
  mu = rng.uniform(0, 1) if mu_kind == "scalar" else rng.uniform(0, 1, size=DIM)
  ref = np.stack([mu * n[j] + (1 - mu) * n[partner[j]] for j in range(12)])
  if renormalize:
    ref = _np_normalize(ref)

  queue = _f32(n)
  saved = np.array(queue)
  out = jax.jit(ft.negative_interpolation, static_argnums=3)(
      queue, jnp.asarray(partner, jnp.int32), _f32(mu), renormalize
  )
  np.testing.assert_allclose(out, ref, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(queue), saved)


def test_negative_interpolation_honours_partner_and_mu_one_is_identity():
  rng = np.random.default_rng(7)
  n = _unit(rng, 6, DIM)
  partner = np.array([3, 0, 5, 1, 2, 4])
  out = np.asarray(ft.negative_interpolation(_f32(n), partner, 0.0, False))
  np.testing.assert_allclose(out, n[partner], atol=1e-7)  # mu = 0 returns the partners
  out = np.asarray(ft.negative_interpolation(_f32(n), partner, 0.25, False))
  np.testing.assert_allclose(out[2], 0.25 * n[2] + 0.75 * n[5], atol=1e-6)
  np.testing.assert_allclose(ft.negative_interpolation(_f32(n), partner, 1.0, False), n, atol=1e-7)


def test_negative_extrapolation_is_mu_in_one_to_two():
  rng = np.random.default_rng(8)
  n = _unit(rng, 5, DIM)
  partner = np.array([1, 2, 3, 4, 0])
  mu = 1.6
  out = ft.negative_interpolation(_f32(n), partner, mu, False)
  np.testing.assert_allclose(out, 1.6 * n - 0.6 * n[partner], atol=1e-6)


def test_negative_interpolation_rejects_bad_partner_and_mu():
  n = jnp.zeros((4, DIM))
  with pytest.raises(ValueError, match="partner"):
    ft.negative_interpolation(n, jnp.arange(3), 0.5, False)
  with pytest.raises(ValueError, match="partner"):
    ft.negative_interpolation(n, jnp.arange(4, dtype=jnp.float32), 0.5, False)
  with pytest.raises(ValueError, match="mu"):
    ft.negative_interpolation(n, jnp.arange(4), jnp.ones((2, DIM)), False)
  with pytest.raises(ValueError, match="negatives"):
    ft.negative_interpolation(jnp.zeros(DIM), jnp.arange(DIM), 0.5, False)


# --- hard negatives ---------------------------------------------------------------------------


def _np_hard_scores(q, n, lam, renormalize):
  """Explicit (B, K, d) hard negatives of Eq. 8, scored against their query."""
  h = lam * q[:, None, :] + (1 - lam) * n[None, :, :]
  if renormalize:
    h = _np_normalize(h)
  return np.einsum("bd,bkd->bk", q, h)


@pytest.mark.parametrize("renormalize", [False, True])
def test_hard_negative_scores_from_similarity_match_explicit_vectors(renormalize):
  rng = np.random.default_rng(9)
  q, n = _unit(rng, 5, DIM), _unit(rng, 7, DIM)
  for lam in (0.0, 0.3, 2 / 3, 1.0):
    ref = _np_hard_scores(q, n, lam, renormalize)
    got = ft.hard_negative_scores_from_similarity(_f32(q @ n.T), lam, renormalize)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert np.all(np.asarray(got) >= q @ n.T - 1e-6)  # the negatives get harder


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("lam_kind", ["scalar", "vector"])
def test_hard_negative_scores_match_explicit_vectors(renormalize, lam_kind):
  rng = np.random.default_rng(10)
  # Non-unit features: the vector form is exact for any norms.
  q, n = rng.normal(size=(5, DIM)), rng.normal(size=(7, DIM))
  lam = rng.uniform(0, 1) if lam_kind == "scalar" else rng.uniform(0, 1, size=DIM)
  ref = _np_hard_scores(q, n, lam, renormalize)
  got = ft.hard_negative_scores(_f32(q), _f32(n), _f32(lam), renormalize)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_hard_negative_gradient_flows_through_query_in_both_places():
  rng = np.random.default_rng(11)
  q, n = _unit(rng, 2, DIM), _unit(rng, 3, DIM)
  lam = 0.4
  # d/dq_i sum_j q_i.(lam q_i + (1 - lam) n_j) = 2 K lam q_i + (1 - lam) sum_j n_j.
  expected = 2 * 3 * lam * q + (1 - lam) * n.sum(axis=0)
  grad = jax.grad(lambda q_: jnp.sum(ft.hard_negative_scores(q_, _f32(n), lam, False)))(_f32(q))
  np.testing.assert_allclose(grad, expected, atol=1e-5)
  grad_s = jax.grad(
      lambda q_: jnp.sum(ft.hard_negative_scores_from_similarity(q_ @ _f32(n).T, lam, False))
  )(_f32(q))
  # The similarity form assumes |q| = 1, so its lam |q|^2 term is the constant lam.
  np.testing.assert_allclose(grad_s, (1 - lam) * np.tile(n.sum(axis=0), (2, 1)), atol=1e-5)


def test_hard_negative_scores_reject_bad_input():
  with pytest.raises(ValueError, match="scalar lam"):
    ft.hard_negative_scores_from_similarity(jnp.zeros((2, 3)), jnp.ones(DIM), False)
  with pytest.raises(ValueError, match="same d"):
    ft.hard_negative_scores(jnp.zeros((2, DIM)), jnp.zeros((3, DIM + 1)), 0.5, False)
  with pytest.raises(ValueError, match="lam"):
    ft.hard_negative_scores(jnp.zeros((2, DIM)), jnp.zeros((3, DIM)), jnp.ones(3), False)


# --- BYOL / SimSiam ----------------------------------------------------------------------------


def test_siamese_extrapolation_normalizes_then_mixes():
  rng = np.random.default_rng(12)
  p, z = rng.normal(size=(4, DIM)) * 3.0, rng.normal(size=(4, DIM)) * 0.2
  lam = 1.4
  p_ref, z_ref = _np_extrapolate(_np_normalize(p), _np_normalize(z), lam, False)
  p_new, z_new = ft.siamese_positive_extrapolation(_f32(p), _f32(z), lam, False)
  np.testing.assert_allclose(p_new, p_ref, atol=1e-6)
  np.testing.assert_allclose(z_new, z_ref, atol=1e-6)
  cos = lambda a, b: np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
  assert np.all(cos(np.asarray(p_new), np.asarray(z_new)) < cos(p, z))
  # Gradient reaches p through the mixed target too: d/dp (z'.b) != 0.
  b = _f32(rng.normal(size=(4, DIM)))
  g = jax.grad(
      lambda p_: jnp.sum(
          ft.siamese_positive_extrapolation(p_, jax.lax.stop_gradient(_f32(z)), lam, True)[1] * b
      )
  )(_f32(p))
  assert np.linalg.norm(g) > 1e-3


# --- coefficient sampling ------------------------------------------------------------------------


@pytest.mark.parametrize("a,b", [(2.0, 2.0), (1.6, 1.6), (2.0, 1.0), (5.0, 2.0)])
@pytest.mark.slow
def test_beta_sampling_moments(a, b):
  n = 20000
  x = np.asarray(ft.sample_coefficient(jax.random.key(0), a, b, (n,)), np.float64)
  assert np.all((x >= 0) & (x <= 1))
  mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
  assert abs(x.mean() - mean) < 5 * np.sqrt(var / n)
  assert abs(x.var() - var) < 0.05 * var


def test_sample_coefficient_shapes_and_errors():
  # eval_shape: shapes and dtypes without compiling the sampler for each shape.
  sample = lambda shape: jax.eval_shape(
      lambda r: ft.sample_coefficient(r, 2.0, 2.0, shape), jax.random.key(1)
  )
  assert sample(()).shape == () and sample(()).dtype == jnp.float32
  assert sample((DIM,)).shape == (DIM,) and sample((DIM,)).dtype == jnp.float32
  with pytest.raises(ValueError, match="Beta"):
    ft.sample_coefficient(jax.random.key(1), 0.0, 2.0, ())
  with pytest.raises(ValueError, match="Beta"):
    ft.sample_coefficient(jax.random.key(1), 2.0, -1.0, ())


@pytest.mark.slow
def test_negative_coefficient_follows_eq5_and_eq7():
  """Interpolation mu ~ Beta(a_in, a_in) (Eq. 5); extrapolation mu ~ 1 + Beta(a_ex, a_ex)
  (App. G.1, Eq. 7). a_in = 0.05 puts the Beta mass near 0 and 1; a_ex = 500 near 0.5."""
  rng = jax.random.key(0)
  interp = np.asarray(ft.negative_coefficient(rng, "interpolate", 0.05, 500.0, (4000,)))
  extrap = np.asarray(ft.negative_coefficient(rng, "extrapolate", 0.05, 500.0, (4000,)))
  assert np.all((interp >= 0) & (interp <= 1)) and np.mean((interp < 0.1) | (interp > 0.9)) > 0.8
  assert np.all((extrap > 1.42) & (extrap < 1.58)) and abs(extrap.mean() - 1.5) < 0.002
  with pytest.raises(ValueError, match="interpolate"):
    ft.negative_coefficient(rng, "hard", 1.0, 1.0, ())


@pytest.mark.slow
def test_positive_interpolation_draws_lam_in_0_1_and_raises_the_positive_score():
  key = jax.random.key(3)
  extrapolate = np.asarray(ft.positive_coefficient(key, 2.0, False, (500,)))
  interpolate = np.asarray(ft.positive_coefficient(key, 2.0, True, (500,)))
  np.testing.assert_allclose(extrapolate - 1.0, interpolate, atol=1e-6)  # the same Beta draw
  assert (interpolate > 0).all() and (interpolate < 1).all() and (extrapolate > 1).all()
  rng = np.random.default_rng(4)
  q, k = _unit(rng, 500, DIM), _unit(rng, 500, DIM)
  s = np.sum(q * k, axis=1)
  pairs = jax.vmap(lambda a, b, l: ft.positive_extrapolation(a, b, l, False))
  for lam, above in ((interpolate, True), (extrapolate, False)):
    q_new, k_new = pairs(_f32(q), _f32(k), _f32(lam))
    got = np.sum(np.asarray(q_new, np.float64) * np.asarray(k_new, np.float64), axis=1)
    np.testing.assert_allclose(got, s + 2 * lam * (1 - lam) * (1 - s), atol=1e-5)  # Eq. 4
    assert (got >= s - 1e-6).all() if above else (got <= s + 1e-6).all()


def test_positive_interpolation_needs_the_positive_transform():
  from cl_jax import config_check
  from configs import mocov2

  c = mocov2.get_config()
  c.ft.update(enabled=True, positive_extrapolation=False, positive_interpolation=True)
  with pytest.raises(config_check.ConfigError, match=r"ft\.positive_interpolation"):
    config_check.validate(c, num_devices=1)
  c.ft.positive_extrapolation = True
  config_check.validate(c, num_devices=1)
