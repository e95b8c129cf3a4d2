"""Embedding health statistics (cl_jax.objectives.health) against NumPy float64 re-derivations, the
collapse warning, and the statistics of a train step.

References, on u_i = z_i / ||z_i||:
  std      = 1/d sum_k std_i u_ik                      (Chen & He 2021, Sec. 4.1)
  erank    = exp(-sum_k p_k log p_k), p = sigma / sum(sigma)   (Roy & Vetterli 2007)
  align    = 1/N sum_i ||u_a,i - u_b,i||^alpha          (Wang & Isola 2020, Eq. 5)
  uniform  = log 1/(N(N-1)) sum_{i != j} exp(-t ||u_i - u_j||^2)   (Eq. 6)
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax import config_defaults, train
from cl_jax import train_step as step_lib
from cl_jax.data import photometric
from cl_jax.objectives import health
from cl_jax.runtime import parallel, run_log
from cl_jax.runtime.progress import Progress
from configs import mocov2, simsiam

HEALTH_KEYS = {"health/std", "health/std_sqrt_d", "health/rank", "health/align", "health/uniform"}


def _unit_np(z):
  return z / np.linalg.norm(z, axis=-1, keepdims=True)


def _random(seed, n, d, scale=3.0):
  """(n, d) Gaussian rows of random lengths, so the normalisation is exercised."""
  rng = np.random.default_rng(seed)
  return rng.normal(size=(n, d)) * rng.uniform(0.5, scale, size=(n, 1))


def _f32(x):
  return jnp.asarray(x, jnp.float32)


@pytest.mark.parametrize("n,d", [(16, 8), (5, 12)])
def test_embedding_std_matches_numpy(n, d):
  z = _random(0, n, d)
  want = np.std(_unit_np(z), axis=0, ddof=0).mean()
  got = health.embedding_std(_f32(z))
  chex.assert_shape(got, ())
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("n,d", [(16, 8), (5, 12)])
def test_effective_rank_matches_numpy_svd(n, d):
  z = _random(1, n, d)
  sigma = np.linalg.svd(_unit_np(z), compute_uv=False)
  p = sigma / sigma.sum()
  want = np.exp(-np.sum(p * np.log(p)))
  np.testing.assert_allclose(health.effective_rank(_f32(z)), want, rtol=1e-4)


@pytest.mark.parametrize("alpha", [1, 2, 3])
def test_alignment_matches_explicit_norms(alpha):
  za, zb = _random(2, 12, 6), _random(3, 12, 6)
  ua, ub = _unit_np(za), _unit_np(zb)
  want = np.mean([np.linalg.norm(ua[i] - ub[i]) ** alpha for i in range(len(ua))])
  np.testing.assert_allclose(health.alignment(_f32(za), _f32(zb), alpha), want, rtol=1e-5)


@pytest.mark.parametrize("t", [1.0, 2.0, 5.0])
@pytest.mark.slow
def test_uniformity_matches_a_loop_over_distinct_pairs(t):
  z = _random(4, 10, 6)
  u = _unit_np(z)
  n = len(u)
  total = sum(np.exp(-t * np.sum((u[i] - u[j]) ** 2)) for i in range(n) for j in range(n) if i != j)
  want = np.log(total / (n * (n - 1)))
  np.testing.assert_allclose(health.uniformity(_f32(z), t), want, rtol=1e-5)


@pytest.mark.slow
def test_a_batch_of_one_repeated_vector_is_collapsed():
  rng = np.random.default_rng(5)
  z = _f32(np.tile(rng.normal(size=(1, 16)), (32, 1)))
  np.testing.assert_allclose(health.embedding_std(z), 0.0, atol=1e-6)
  np.testing.assert_allclose(health.effective_rank(z), 1.0, atol=1e-3)
  np.testing.assert_allclose(health.uniformity(z), 0.0, atol=1e-5)
  np.testing.assert_allclose(health.alignment(z, z), 0.0, atol=1e-12)


def test_orthonormal_rows_have_full_effective_rank():
  d = 12
  q, _ = np.linalg.qr(np.random.default_rng(6).normal(size=(d, d)))
  z = q * np.arange(1, d + 1)[:, None]  # orthogonal rows, lengths 1..d
  np.testing.assert_allclose(health.effective_rank(_f32(z)), d, rtol=1e-4)


def test_two_antipodal_points_have_uniformity_minus_8():
  v = _unit_np(np.random.default_rng(7).normal(size=(1, 8)))
  z = _f32(np.concatenate([v, -v]))
  # ||u - (-u)||^2 = 4 for both ordered pairs: log exp(-2 * 4) = -8 at t = 2.
  np.testing.assert_allclose(health.uniformity(z), -8.0, rtol=1e-5)


def test_embedding_health_keys_and_values():
  za, zb = _random(8, 16, 8), _random(9, 16, 8)
  stats = jax.jit(health.embedding_health)(_f32(za), _f32(zb))
  assert set(stats) == HEALTH_KEYS
  ua = _unit_np(za)
  std = np.std(ua, axis=0).mean()
  np.testing.assert_allclose(stats["health/std"], std, rtol=1e-5)
  np.testing.assert_allclose(stats["health/std_sqrt_d"], std * math.sqrt(8), rtol=1e-5)
  np.testing.assert_allclose(
      stats["health/align"], np.mean(np.sum((ua - _unit_np(zb)) ** 2, axis=1)), rtol=1e-5
  )


@pytest.mark.slow
def test_embedding_health_passes_no_gradient():
  za, zb = _f32(_random(10, 8, 4)), _f32(_random(11, 8, 4))
  grads = jax.grad(lambda a, b: sum(health.embedding_health(a, b).values()), argnums=(0, 1))(za, zb)
  for g in grads:
    np.testing.assert_array_equal(g, 0.0)


def _scalars(z):
  return {k: float(v) for k, v in health.embedding_health(_f32(z), _f32(z)).items()}


def _thresholds():
  c = config_defaults.base_config().health
  return c.min_std_sqrt_d, c.min_rank


@pytest.mark.slow
def test_collapse_warning_names_the_signals_of_a_collapsed_batch():
  rng = np.random.default_rng(12)
  z = rng.normal(size=(1, 64)) + 1e-3 * rng.normal(size=(128, 64))
  scalars = _scalars(z)
  min_std, min_rank = _thresholds()
  message = health.collapse_warning(scalars, min_std, min_rank)
  assert message is not None and message.startswith("representation collapse")
  assert f"std x sqrt(d) = {scalars['health/std_sqrt_d']:.3g} < {min_std:g}" in message
  assert f"effective rank of the batch's embeddings = {scalars['health/rank']:.3g}" in message
  # min_rank = 0 switches the rank check off; the std check still fires.
  only_std = health.collapse_warning(scalars, min_std, 0.0)
  assert "std x sqrt(d)" in only_std and "rank" not in only_std


def test_collapse_warning_is_silent_on_a_healthy_batch_and_without_health_keys():
  z = _unit_np(np.random.default_rng(13).normal(size=(128, 64)))
  scalars = _scalars(z)
  assert 0.9 < scalars["health/std_sqrt_d"] <= 1.0
  assert health.collapse_warning(scalars, *_thresholds()) is None
  assert health.collapse_warning({"loss": 1.0, "lr": 0.1}, *_thresholds()) is None


def test_collapse_notice_reports_entry_every_tenth_log_and_recovery(tmp_path):
  count, reported = 0, []
  healthy = {"health/std_sqrt_d": 0.9, "health/rank": 20.0}
  for i in range(26):
    warning = "representation collapse: x" if i < 25 else None
    notice, count = run_log.collapse_notice(warning, count, healthy)
    if notice is not None:
      reported.append(i)
      run_log.report_warning(
          f"step {i}: {notice}", str(tmp_path), Progress(total=26, initial=0, enabled=False)
      )
  assert reported == [0, 10, 20, 25] and count == 0
  lines = (tmp_path / "warnings.log").read_text().splitlines()
  assert lines[:3] == [f"step {i}: representation collapse: x" for i in (0, 10, 20)]
  assert lines[3].startswith("step 25: representation recovered after 25 ")
  assert "health/rank = 20" in lines[3]


# --- a train step ------------------------------------------------------------------------

B, S = 8, 16


def _tiny(module):
  c = module.get_config(None)
  c.data.image_size = S
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  if c.model.predictor_hidden_dim:
    c.model.predictor_hidden_dim = 16
  else:
    c.model.bn_groups = 2
    c.moco.queue_size = 4 * B
  c.optim.update(batch_size=B, epochs=1)
  return c


def _step_and_query_embeddings(config):
  """One step's metrics and the online projections z of both views before it."""
  rng = np.random.default_rng(0)
  batch = {
      v: jnp.asarray(rng.integers(0, 256, (B, S, S, 3), dtype=np.uint8)) for v in ("view1", "view2")
  }
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(config, 4 * B, mesh)
  state = make_state()
  before = jax.device_get(state)
  _, metrics = jax.jit(step_lib.make_train_step(config, encoder, tx, schedule, mesh, 4))(
      state, batch
  )
  # The step's views, re-derived from the state's seed at step 0 (cl_jax.train_step).
  r_aug1, r_aug2, *_ = jax.random.split(
      jax.random.fold_in(jax.random.wrap_key_data(before.rng), 0), 5
  )
  spec = photometric.config_spec(config)
  augment = jax.jit(photometric.augment_batch, static_argnums=2)
  views = [augment(r, batch[v], spec)[0] for r, v in ((r_aug1, "view1"), (r_aug2, "view2"))]
  project = jax.jit(
      lambda x: encoder.apply(
          {"params": before.params, "batch_stats": before.batch_stats},
          x,
          train=True,
          mutable=["batch_stats"],
      )[0]["z"]
  )
  z = [np.asarray(project(v), np.float64) for v in views]
  return jax.device_get(metrics), z


@pytest.mark.slow
@pytest.mark.parametrize("module", [mocov2, simsiam])
def test_a_train_step_logs_the_health_of_the_first_views_projections(module):
  config = _tiny(module)
  metrics, (z1, z2) = _step_and_query_embeddings(config)
  assert HEALTH_KEYS <= set(metrics)
  assert all(np.isfinite(metrics[k]) for k in HEALTH_KEYS)
  d = config.model.head_out_dim
  np.testing.assert_allclose(metrics["health/std"], np.std(_unit_np(z1), axis=0).mean(), rtol=1e-4)
  sigma = np.linalg.svd(_unit_np(z1), compute_uv=False)
  p = sigma / sigma.sum()
  np.testing.assert_allclose(metrics["health/rank"], np.exp(-np.sum(p * np.log(p))), rtol=1e-4)
  assert 1.0 <= metrics["health/rank"] <= min(B, d) + 1e-4
  assert -8.0 <= metrics["health/uniform"] <= 0.0
  if module is simsiam:  # the positive partner is the online z of view 2
    np.testing.assert_allclose(
        metrics["health/align"],
        np.mean(np.sum((_unit_np(z1) - _unit_np(z2)) ** 2, axis=1)),
        rtol=1e-4,
    )
  else:  # the key of view 2, from the EMA key encoder
    assert 0.0 <= metrics["health/align"] <= 4.0
