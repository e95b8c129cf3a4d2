"""Feature transformation in MoCo's loss (Zhu et al. 2021, Sec. 4), against NumPy:
cl_jax.objectives.moco.pair_loss with the add-on cl_jax.addons.feature_transform_contrast.
FeatureTransform (its on_queue), and feature_transform_contrast.mix_slots.

The reference draws the same coefficients (lambda, mu, slot order) from the same PRNG
keys, then recomputes in float64: q' = l q + (1-l) k, k' = l k + (1-l) q, the mixed
queue in ring order (key i of slot t with key i of slot order[t]), and InfoNCE.
For the hard negatives of App. G.2 it builds the (B, K, d) tensor
h_ij = lam q'_i + (1 - lam) n_j explicitly, and takes dL/dq by central differences.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax import train
from cl_jax import train_step as step_lib
from cl_jax.addons import feature_transform_contrast
from cl_jax.addons.feature_transform_contrast import FeatureTransform
from cl_jax.addons.from_config import AddOns
from cl_jax.losses import memory_queue as queue_lib
from cl_jax.objectives import moco
from cl_jax.runtime import parallel
from configs import mocov2_patchns_ft_ifm

B, DIM, P, K, T = 8, 6, 8, 32, 0.2


def _unit(rng, *shape):
  x = rng.normal(size=shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


HARD_A, HARD_B = 2.0, 1.0


def _ft(
    negative="interpolate",
    union=False,
    coefficients="scalar",
    renormalize=False,
    positive=True,
    alpha_ex=2.0,
    alpha_in=1.6,
):
  return FeatureTransform(
      positive_extrapolation=positive,
      positive_interpolation=False,
      alpha_ex=alpha_ex,
      negative=negative,
      alpha_in=alpha_in,
      hard_a=HARD_A,
      hard_b=HARD_B,
      union=union,
      coefficients=coefficients,
      renormalize=renormalize,
      start_step=0,
  )


def _shape(ft, rows):
  """Coefficient shape (Sec. 4.3, Eq. 6): one per step, one (d,) vector per step, or one
  (d,) vector per row (positive pair, query, or queue key in ring order)."""
  return {"scalar": (), "dimension": (DIM,), "sample_dimension": (rows, DIM)}[ft.coefficients]


@functools.partial(jax.jit, static_argnames=("devices", "ft_key", "active"))
def _jax_loss(q, k, ring_queue, rng, devices, ft_key, active):
  """(loss, stats, dL/dq) of pair_loss at step 0; inactive (active=False) is a start step
  of 1, the steps before the transformation's start epoch."""
  mesh = parallel.make_mesh(jax.devices()[:devices])
  ft = None if ft_key is None else _ft(*ft_key)
  if ft is not None and not active:
    ft = dataclasses.replace(ft, start_step=1)
  queue = jax.lax.with_sharding_constraint(
      queue_lib.to_sharded_layout(ring_queue, devices, P), parallel.batch_sharding(mesh)
  )
  fn = lambda qq: moco.pair_loss(
      qq, k, queue, None, AddOns(ft=ft), T, mesh, rng, step=0, num_keys=P
  )
  (loss, stats), grad = jax.value_and_grad(fn, has_aux=True)(q)
  return loss, stats, grad


def _coefficients(rng, ft, dim):
  r_pos, r_neg, r_perm = jax.random.split(rng, 3)
  lam = 1 + np.asarray(jax.random.beta(r_pos, 2.0, 2.0, _shape(ft, B), jnp.float32), np.float64)
  # Eq. 5: mu ~ Beta(a_in, a_in); App. G.1, Eq. 7: mu ~ 1 + Beta(a_ex, a_ex).
  a = ft.alpha_ex if ft.negative == "extrapolate" else ft.alpha_in
  mu = np.asarray(jax.random.beta(r_neg, a, a, _shape(ft, K), jnp.float32), np.float64)
  mu = mu + 1 if ft.negative == "extrapolate" else mu
  order = np.asarray(jax.random.permutation(r_perm, K // P))
  return lam, mu, order


def _np_loss(q, k, queue, rng, ft):
  lam, mu, order = _coefficients(rng, ft, q.shape[1])
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q2, k2 = lam * q + (1 - lam) * k, lam * k + (1 - lam) * q
  partner = (order[:, None] * P + np.arange(P)[None]).reshape(-1)
  mixed = mu * queue + (1 - mu) * queue[partner]
  if ft.renormalize:
    q2, k2, mixed = unit(q2), unit(k2), unit(mixed)
  negs = np.concatenate([queue, mixed]) if ft.union else mixed
  total = 0.0
  for i in range(len(q)):
    pos = np.exp(q2[i] @ k2[i] / T)
    total += -np.log(pos / (pos + np.exp(negs @ q2[i] / T).sum()))
  return total / len(q), q2 @ negs.T, np.sum(q2 * k2, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "ft_key",
    [
        ("interpolate", False, "scalar", False),
        ("extrapolate", False, "scalar", True),
        ("interpolate", True, "dimension", False),
        ("interpolate", False, "sample_dimension", True),
        ("extrapolate", True, "sample_dimension", False),
    ],
)
@pytest.mark.parametrize("devices", [1, 4])
def test_ft_loss_matches_numpy_on_any_device_count(ft_key, devices):
  rng = np.random.default_rng(0)
  q, k, queue = _unit(rng, B, DIM), _unit(rng, B, DIM), _unit(rng, K, DIM)
  key = jax.random.key(7)
  loss, stats, grad = _jax_loss(
      *[jnp.asarray(x, jnp.float32) for x in (q, k, queue)], key, devices, ft_key, True
  )
  want, s, pos = _np_loss(q, k, queue, key, _ft(*ft_key))
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  # Statistics on the transformed features (Zhu et al. 2021, Sec. 3).
  np.testing.assert_allclose(stats["pos_mean"], pos.mean(), rtol=1e-5)
  np.testing.assert_allclose(stats["neg_mean"], s.mean(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(stats["neg_var"], s.var(axis=1).mean(), rtol=1e-4)
  assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0


@pytest.mark.slow
def test_negative_extrapolation_draws_its_coefficient_from_alpha_ex():
  """App. G.1, Eq. 7: the extrapolated queue is mu n + (1 - mu) n' with mu ~ 1 + Beta(a_ex,
  a_ex). With a_ex = 500, mu = 1.5 +- 0.08 (5 sd), so each mixed key is 1.5 n - 0.5 n' and the
  negative scores' variance is about (1.5^2 + 0.5^2) = 2.5 times the plain queue's; with
  mu drawn from a_in = 0.05 instead it would sit near 1 or 5 times."""
  rng = np.random.default_rng(3)
  q, k, queue = _unit(rng, B, DIM), _unit(rng, B, DIM), _unit(rng, K, DIM)
  ft_key = ("extrapolate", False, "scalar", False, False, 500.0, 0.05)
  args = [jnp.asarray(x, jnp.float32) for x in (q, k, queue)]
  _, stats, _ = _jax_loss(*args, jax.random.key(5), 1, ft_key, True)
  order = np.asarray(jax.random.permutation(jax.random.split(jax.random.key(5), 3)[2], K // P))
  partner = (order[:, None] * P + np.arange(P)[None]).reshape(-1)
  mixed = 1.5 * queue + (1 - 1.5) * queue[partner]  # Eq. 7 at mu = E[1 + Beta(a, a)]
  want = (q @ mixed.T).var(axis=1).mean()
  np.testing.assert_allclose(stats["neg_var"], want, rtol=0.2)


@pytest.mark.slow
def test_positive_extrapolation_lowers_the_positive_score():
  rng = np.random.default_rng(1)
  q, k, queue = _unit(rng, B, DIM), _unit(rng, B, DIM), _unit(rng, K, DIM)
  args = [jnp.asarray(x, jnp.float32) for x in (q, k, queue)]
  _, with_ft, _ = _jax_loss(*args, jax.random.key(0), 1, ("none", False, "scalar", False), True)
  _, plain, _ = _jax_loss(*args, jax.random.key(0), 1, None, True)
  assert with_ft["pos_mean"] < plain["pos_mean"]


@pytest.mark.parametrize(
    "ft_key",
    [
        ("interpolate", False, "scalar", False),
        ("extrapolate", True, "dimension", True),
        ("hard", True, "sample_dimension", True),
    ],
)
@pytest.mark.slow
def test_before_the_start_epoch_the_loss_is_bit_identical_to_ft_off(ft_key):
  rng = np.random.default_rng(2)
  args = [
      jnp.asarray(x, jnp.float32)
      for x in (_unit(rng, B, DIM), _unit(rng, B, DIM), _unit(rng, K, DIM))
  ]
  off = _jax_loss(*args, jax.random.key(0), 1, None, True)
  inactive = _jax_loss(*args, jax.random.key(0), 1, ft_key, False)
  np.testing.assert_array_equal(off[0], inactive[0])
  np.testing.assert_array_equal(off[2], inactive[2])
  for name in off[1]:
    np.testing.assert_array_equal(off[1][name], inactive[1][name])


def _hard_coefficients(rng, ft, dim):
  """(lambda_ex or None, lambda of Eq. 8), drawn from the keys FeatureTransform.on_queue uses."""
  r_pos, r_neg, _ = jax.random.split(rng, 3)
  draw = lambda r, a, b: np.asarray(
      jax.random.beta(r, a, b, _shape(ft, B), jnp.float32), np.float64
  )
  lam_ex = 1 + draw(r_pos, 2.0, 2.0) if ft.positive_extrapolation else None
  return lam_ex, draw(r_neg, HARD_A, HARD_B)


def _np_hard_loss(q, k, queue, lam_ex, lam, ft):
  """(loss, (B, K or 2K) negative scores, (B,) positive scores), float64, with the
  hard negatives h_ij = lam q'_i + (1 - lam) n_j built as a (B, K, d) tensor."""
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q2, k2 = (
      (q, k) if lam_ex is None else (lam_ex * q + (1 - lam_ex) * k, lam_ex * k + (1 - lam_ex) * q)
  )
  if ft.renormalize and lam_ex is not None:
    q2, k2 = unit(q2), unit(k2)
  lam = lam[:, None, :] if np.ndim(lam) == 2 else lam  # one per query
  hard = lam * q2[:, None, :] + (1 - lam) * queue[None, :, :]  # (B, K, d)
  if ft.renormalize:
    hard = unit(hard)
  neg = np.einsum("bd,bkd->bk", q2, hard)
  if ft.union:
    neg = np.concatenate([q2 @ queue.T, neg], axis=1)
  pos = np.sum(q2 * k2, axis=1)
  logits = np.concatenate([pos[:, None], neg], axis=1) / T
  top = logits.max(axis=1, keepdims=True)
  lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
  return np.mean(lse - pos / T), neg, pos


def _np_hard_grad(q, k, queue, lam_ex, lam, ft, step=1e-6):
  """dL/dq of _np_hard_loss by central differences (float64)."""
  grad = np.zeros_like(q)
  for idx in np.ndindex(*q.shape):
    bump = np.zeros_like(q)
    bump[idx] = step
    up = _np_hard_loss(q + bump, k, queue, lam_ex, lam, ft)[0]
    down = _np_hard_loss(q - bump, k, queue, lam_ex, lam, ft)[0]
    grad[idx] = (up - down) / (2 * step)
  return grad


# (negative, union, coefficients, renormalize, positive extrapolation)
HARD_KEYS = [
    ("hard", False, "scalar", False, False),  # scalar lam, scores from q.n
    ("hard", False, "scalar", False, True),  # scalar lam, q' off the unit sphere
    ("hard", False, "scalar", True, True),  # scalar lam, re-normalised
    ("hard", False, "dimension", True, False),  # per-dimension lam, re-normalised
    ("hard", True, "dimension", False, True),  # union (2K negatives)
    ("hard", False, "sample_dimension", True, True),
]  # one lam vector per query


@pytest.mark.slow
@pytest.mark.parametrize("ft_key", HARD_KEYS)
def test_hard_negative_loss_and_grad_match_numpy_on_four_devices(ft_key):
  rng = np.random.default_rng(4)
  q, k, queue = _unit(rng, B, DIM), _unit(rng, B, DIM), _unit(rng, K, DIM)
  key = jax.random.key(11)
  loss, stats, grad = _jax_loss(
      *[jnp.asarray(x, jnp.float32) for x in (q, k, queue)], key, 4, ft_key, True
  )
  ft = _ft(*ft_key)
  lam_ex, lam = _hard_coefficients(key, ft, DIM)
  want, neg, pos = _np_hard_loss(q, k, queue, lam_ex, lam, ft)
  want_grad = _np_hard_grad(q, k, queue, lam_ex, lam, ft)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  # The part of dL/dq tangent to the unit sphere is what an l2-normalising head passes
  # on to the encoder. The scalar score form built from q.n (unit queries) leaves the
  # radial part undefined, so the whole gradient is compared only for the exact form.
  tangent = lambda g: g - np.sum(g * q, axis=1, keepdims=True) * q
  np.testing.assert_allclose(
      tangent(np.asarray(grad, np.float64)), tangent(want_grad), rtol=1e-4, atol=1e-6
  )
  if ft.coefficients != "scalar" or (ft.positive_extrapolation and not ft.renormalize):
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
  # Statistics on the transformed scores, all 2K for the union (Sec. 3).
  np.testing.assert_allclose(stats["pos_mean"], pos.mean(), rtol=1e-5)
  np.testing.assert_allclose(stats["neg_mean"], neg.mean(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(stats["neg_var"], neg.var(axis=1).mean(), rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("ft_key", [HARD_KEYS[0], HARD_KEYS[4], HARD_KEYS[5]])
def test_hard_negatives_give_the_same_loss_and_grad_on_one_and_four_devices(ft_key):
  rng = np.random.default_rng(4)
  args = [
      jnp.asarray(x, jnp.float32)
      for x in (_unit(rng, B, DIM), _unit(rng, B, DIM), _unit(rng, K, DIM))
  ]
  one = _jax_loss(*args, jax.random.key(11), 1, ft_key, True)
  four = _jax_loss(*args, jax.random.key(11), 4, ft_key, True)
  np.testing.assert_allclose(four[0], one[0], rtol=1e-5)
  np.testing.assert_allclose(four[2], one[2], rtol=1e-5, atol=1e-7)
  for name in one[1]:
    np.testing.assert_allclose(four[1][name], one[1][name], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_hard_negatives_raise_every_negative_score():
  # App. G.2: for unit vectors and lam in (0, 1), q.h_ij >= q.n_j, so the mean negative
  # score and the loss (increasing in every negative logit, positive unchanged) go up.
  rng = np.random.default_rng(5)
  args = [
      jnp.asarray(x, jnp.float32)
      for x in (_unit(rng, B, DIM), _unit(rng, B, DIM), _unit(rng, K, DIM))
  ]
  key = jax.random.key(2)
  hard = _jax_loss(*args, key, 1, HARD_KEYS[0], True)
  plain = _jax_loss(*args, key, 1, None, True)
  assert hard[1]["neg_mean"] > plain[1]["neg_mean"]
  assert hard[0] > plain[0]
  np.testing.assert_array_equal(hard[1]["pos_mean"], plain[1]["pos_mean"])


def test_mix_slots_leaves_the_stored_queue_unchanged():
  rng = np.random.default_rng(3)
  queue = jnp.asarray(_unit(rng, K, DIM), jnp.float32)
  saved = np.asarray(queue).copy()
  mesh = parallel.make_mesh(jax.devices()[:1])
  mixed = feature_transform_contrast.mix_slots(queue, jnp.array([1, 0, 3, 2]), 0.3, mesh, P, False)
  np.testing.assert_array_equal(np.asarray(queue), saved)
  np.testing.assert_allclose(mixed[:P], 0.3 * saved[:P] + 0.7 * saved[P : 2 * P], rtol=1e-6)


@pytest.mark.slow
def test_all_add_ons_combine_in_one_step():
  # MoCo-v2 + patch NS + FT + IFM: one step of the combined config trains.
  c = mocov2_patchns_ft_ifm.get_config(None)
  c.data.image_size = 16
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.moco.queue_size = 64
  c.nonsemantic.update(patch_min=2, patch_max=6)
  c.optim.batch_size = 16
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(c, 64, mesh)
  state = make_state()
  fn = jax.jit(step_lib.make_train_step(c, encoder, tx, schedule, mesh, 4))
  rng = np.random.default_rng(0)
  batch = {
      v: jnp.asarray(rng.integers(0, 256, (16, 16, 16, 3), dtype=np.uint8))
      for v in ("view1", "view2")
  }
  after, metrics = fn(state, batch)
  assert int(after.step) == 1 and np.isfinite(float(metrics["loss"]))
  assert {"pos_mean", "neg_mean", "neg_var", "ns_mean"} <= set(metrics)
