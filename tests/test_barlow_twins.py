"""Barlow Twins (Zbontar et al. 2021): its loss against a NumPy re-derivation of Eq. 1-2 and
hand-checked cases, one device against eight, and the add-ons its config check accepts."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cl_jax import config_check
from cl_jax.analysis import fingerprint
from cl_jax.losses import barlow_twins
from cl_jax.runtime import parallel
from configs import barlow_twins as config_file


def _eq1(za: np.ndarray, zb: np.ndarray, lam: float) -> float:
  """Eq. 1 with Eq. 2's C written as its sums, on embeddings mean-centred along the batch."""
  za = za - za.mean(axis=0)
  zb = zb - zb.mean(axis=0)
  d = za.shape[1]
  c = np.zeros((d, d))
  for i in range(d):
    for j in range(d):
      c[i, j] = np.sum(za[:, i] * zb[:, j]) / (
          np.sqrt(np.sum(za[:, i] ** 2)) * np.sqrt(np.sum(zb[:, j] ** 2))
      )
  on = sum((1 - c[i, i]) ** 2 for i in range(d))
  off = sum(c[i, j] ** 2 for i in range(d) for j in range(d) if i != j)
  return on + lam * off


def test_the_loss_is_eq_1_of_the_cross_correlation_of_eq_2():
  rng = np.random.default_rng(0)
  za = rng.normal(size=(16, 6)) * rng.uniform(0.5, 3, size=6) + rng.normal(size=6)
  zb = 0.7 * za + 0.5 * rng.normal(size=(16, 6))
  loss, stats = barlow_twins.barlow_twins_loss(
      np.float32(za), np.float32(zb), off_diagonal_weight=0.3, eps=0.0
  )
  np.testing.assert_allclose(loss, _eq1(za, zb, 0.3), rtol=1e-5)
  c = np.corrcoef(za.T, zb.T)[:6, 6:]  # Pearson correlations: C of centred embeddings
  np.testing.assert_allclose(stats["pos_mean"], np.mean(np.diag(c)), rtol=1e-5)
  off = c[~np.eye(6, dtype=bool)]
  np.testing.assert_allclose(stats["off_diagonal_rms"], np.sqrt(np.mean(off**2)), rtol=1e-5)


def test_hand_checked_cross_correlations():
  """Orthogonal centred columns, the same in both views: C = I and the loss is 0. Two equal
  columns: C_01 = C_10 = 1, loss 2 lambda. Opposite views: C_ii = -1, each term (1 + 1)^2."""
  cols = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], np.float32)
  loss, _ = barlow_twins.barlow_twins_loss(cols, cols, 0.5, eps=0.0)
  assert abs(float(loss)) < 1e-6
  twin = cols.copy()
  twin[:, 1] = twin[:, 0]
  loss, _ = barlow_twins.barlow_twins_loss(twin, twin, 0.5, eps=0.0)
  np.testing.assert_allclose(loss, 2 * 0.5 + 0 * 1, atol=1e-6)
  loss, stats = barlow_twins.barlow_twins_loss(cols, -cols, 0.5, eps=0.0)
  np.testing.assert_allclose(loss, 3 * 4.0, rtol=1e-6)
  assert float(stats["pos_mean"]) == pytest.approx(-1.0)


def test_eps_keeps_a_constant_dimension_finite():
  z = np.ones((8, 3), np.float32)
  z[:, 1] = np.arange(8)
  loss, _ = barlow_twins.barlow_twins_loss(z, z, 5e-3)
  assert np.isfinite(loss)
  # The constant dimension has C_00 = 0 (its (1 - 0)^2 = 1 counts), the others C_11 = 1 - eps'.
  np.testing.assert_allclose(loss, 2.0, atol=1e-3)


def test_eight_devices_sum_over_the_global_batch():
  """The batch split over eight devices gives the loss and gradient of one device: the
  centring and the sums run over the global batch."""
  rng = np.random.default_rng(1)
  za, zb = (np.float32(rng.normal(size=(32, 5))) for _ in range(2))
  loss_and_grad = jax.jit(
      jax.value_and_grad(lambda a, b: barlow_twins.barlow_twins_loss(a, b, 5e-3)[0], (0, 1))
  )
  one = loss_and_grad(za, zb)
  mesh = parallel.make_mesh(jax.devices()[:8])
  split = NamedSharding(mesh, P(parallel.DATA_AXIS))
  eight = loss_and_grad(jax.device_put(za, split), jax.device_put(zb, split))
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(eight)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "block, fields",
    [
        ("nonsemantic", {}),
        ("ft", {"negative": "none"}),
        ("ifm", {}),
        ("hcl", {}),
        ("looc", {}),
    ],
)
def test_the_config_check_refuses_the_addons_it_has_no_meaning_for(block, fields):
  c = config_file.get_config(None)
  c[block].update(enabled=True, **fields)
  with pytest.raises(config_check.ConfigError) as e:
    config_check.validate(c, reads_data=False)
  assert "\n" not in str(e.value)
  assert f"{block}.enabled" in str(e.value)


@pytest.mark.parametrize("preset", [None, "imagenet100"])
def test_its_presets_and_dicr_pass_the_check(preset):
  c = config_file.get_config(preset)
  config_check.validate(c, reads_data=False)
  c.dicr.enabled = True
  config_check.validate(c, reads_data=False)
  assert {"barlow_twins", "barlow_twins+dicr"} <= set(fingerprint.components(c))
  for component in fingerprint.components(c):
    config_check.validate(fingerprint.canonical_config(component), reads_data=False)
