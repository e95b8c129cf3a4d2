"""Tests for cl_jax.objectives.simclr.batch_loss, SimCLR's NT-Xent with the add-ons of
cl_jax.addons (built by from_config.from_config): NS negatives (nonsemantic.NonSemantic),
IFM (ifm.IFM), feature transformation (feature_transform_contrast.FeatureTransform.on_batch)
and hard-negative sampling (from_config.HardNegativeSampling, losses.hard_negatives.hcl_loss);
and cl_jax.config_check.validate's refusal of the combinations the maths does not allow.

The reference is a NumPy float64 loop over the 2B anchors u = [z1; z2] that
writes each add-on out from its paper: with anchors a (the extrapolated pairs
under FT, else u), negative sets built from u, positive p(i) = (i + B) mod 2B,
  l_i = -log( e^{a_i.a_p/T} / (e^{a_i.a_p/T} + sum_{n, k != i, p} e^{a_i.n_k/T}
                               + sum_m e^{ns(a_i.t_im)}) ),
IFM's (l + alpha l_eps) / 2 with the similarities shifted by -/+ eps, and HCL's
debiased, reweighted negative term. The FT coefficients and permutation are
drawn in the test with the same jax.random calls the loss makes (split the key
in three: lambda, mu, permutation); the reference gradients are central finite
differences with those coefficients fixed.
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from cl_jax import config_check
from cl_jax.addons.from_config import AddOns, from_config
from cl_jax.addons.nonsemantic import NonSemantic
from cl_jax.losses import simclr
from cl_jax.objectives.simclr import batch_loss
from cl_jax.runtime import parallel
from configs import simclr as simclr_config
from tests.finite_differences import central_differences

B, DIM, T = 4, 5, 0.5


def _unit(rng, *shape):
  x = rng.normal(size=shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _cfg(**kw):
  return ml_collections.ConfigDict(kw)


NS = _cfg(enabled=True, alpha=2.0, alpha_mode="in")
# ft keys: (negative, union, coefficients, renormalize, positive_extrapolation).
FT_INTERPOLATE = ("interpolate", False, "scalar", False, True)
FT_NEGATIVE_ONLY = ("interpolate", False, "scalar", False, False)
FT_UNION = ("extrapolate", True, "dimension", True, True)  # union, per dimension, renormalised
FT_PER_SAMPLE = ("interpolate", False, "sample_dimension", False, True)


def _ft(key):
  negative, union, coefficients, renormalize, positive_extrapolation = key
  return _cfg(
      enabled=True,
      positive_extrapolation=positive_extrapolation,
      positive_interpolation=False,
      alpha_ex=2.0,
      negative=negative,
      alpha_in=1.6,
      union=union,
      coefficients=coefficients,
      renormalize=renormalize,
  )


def _config(with_ns=False, ns_key=("in", 2.0), ifm_key=None, hcl_key=None, ft_key=None):
  """The SimCLR config (configs/simclr.py, T = 0.5) with the add-on blocks of the keys:
  ns_key = (alpha_mode, alpha), ifm_key = (epsilon, alpha), hcl_key = (beta, tau_plus), ft_key
  of _ft. The transformation starts at epoch 1, step 1 at one step per epoch."""
  c = simclr_config.get_config(None)
  c.simclr.temperature = T
  c.nonsemantic.update(enabled=with_ns, alpha_mode=ns_key[0], alpha=ns_key[1])
  if ifm_key is not None:
    c.ifm.update(enabled=True, epsilon=ifm_key[0], alpha=ifm_key[1])
  if hcl_key is not None:
    c.hcl.update(enabled=True, beta=hcl_key[0], tau_plus=hcl_key[1])
  if ft_key is not None:
    c.ft.update(start_epoch=1, **_ft(ft_key))
  return c


@functools.partial(jax.jit, static_argnames=("addons", "score_queries"))
def _jit_run(z1, z2, t, ft_rng, step, addons, score_queries):
  fn = lambda a, b: batch_loss(a, b, t, addons, T, ft_rng, step, score_queries)
  (loss, stats), grads = jax.value_and_grad(fn, argnums=(0, 1), has_aux=True)(z1, z2)
  return loss, stats, grads


def _run(
    z1,
    z2,
    t=None,
    ft_rng=None,
    active=True,
    ns_key=("in", 2.0),
    ifm_key=None,
    hcl_key=None,
    ft_key=None,
    score_queries=0,
):
  """(loss, stats, (dL/dz1, dL/dz2)) of batch_loss, jitted; the add-ons come from
  from_config of the hashable keys' config (_config; NS on when t is given) and the
  arrays and the step are traced, so tests share compilations. active=False is step 0,
  before the transformation's start step 1; active=True step 1."""
  if ft_rng is None:
    ft_rng = jax.random.key(0)
  addons = from_config(_config(t is not None, ns_key, ifm_key, hcl_key, ft_key), 1)
  step = jnp.asarray(1 if active else 0)
  return _jit_run(z1, z2, t, ft_rng, step, addons, score_queries)


def _coefficients(key, ft, dim, n):
  """(lambda, mu, perm) from the same draws as the loss; lambda 1 without extrapolation."""
  r_pos, r_neg, r_perm = jax.random.split(key, 3)
  # Eq. 6 (Sec. 4.3): one coefficient per step, one (d,) vector per step, or one per row
  # (each of the n / 2 positive pairs, each of the n negatives).
  shape = lambda rows: {"scalar": (), "dimension": (dim,), "sample_dimension": (rows, dim)}[
      ft.coefficients
  ]
  lam = 1 + np.asarray(jax.random.beta(r_pos, ft.alpha_ex, ft.alpha_ex, shape(n // 2)), np.float64)
  # Eq. 5: mu ~ Beta(a_in, a_in); App. G.1, Eq. 7: mu ~ 1 + Beta(a_ex, a_ex).
  a = ft.alpha_ex if ft.negative == "extrapolate" else ft.alpha_in
  mu = np.asarray(jax.random.beta(r_neg, a, a, shape(n)), np.float64)
  mu = mu + 1 if ft.negative == "extrapolate" else mu
  perm = np.asarray(jax.random.permutation(r_perm, n))
  return (lam if ft.positive_extrapolation else 1.0), mu, perm


def _np_features(z1, z2, ft, coef):
  """(anchors (2B, d), list of negative sets (2B, d)) of the reference."""
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  u = np.concatenate([z1, z2])
  if ft is None:
    return u, [u]
  lam, mu, perm = coef
  e1, e2 = lam * z1 + (1 - lam) * z2, lam * z2 + (1 - lam) * z1
  anchors = np.concatenate([e1, e2])
  if ft.renormalize and ft.positive_extrapolation:
    anchors = unit(anchors)
  if ft.negative == "none":
    return anchors, [u]
  mixed = mu * u + (1 - mu) * u[perm]
  if ft.renormalize:
    mixed = unit(mixed)
  return anchors, ([u, mixed] if ft.union else [mixed])


def _np_ce(sp, sn, sns, temperature, alpha, mode):
  """-log softmax of the positive among [sp, sn, ns logits], similarities before T."""
  ns_logits = (
      []
      if sns is None
      else list(alpha * sns / temperature if mode == "in" else sns / temperature + np.log(alpha))
  )
  den = np.exp(sp / temperature) + np.exp(np.asarray(sn) / temperature).sum()
  den += np.exp(ns_logits).sum() if ns_logits else 0.0
  return -np.log(np.exp(sp / temperature) / den)


def _np_loss(
    z1, z2, temperature=T, t=None, ns=NS, ifm=None, ft=None, coef=None, hcl=None, rows=None
):
  """(loss, stats) of the reference; ifm = (eps, alpha), hcl = (beta, tau_plus)."""
  anchors, sets = _np_features(z1, z2, ft, coef)
  b, n = len(z1), 2 * len(z1)
  losses, pos_all, neg_means, neg_vars, ns_all = [], [], [], [], []
  for i in range(n):
    p = (i + b) % n
    sp = anchors[i] @ anchors[p]
    sn = np.array([anchors[i] @ s[k] for s in sets for k in range(n) if k not in (i, p)])
    sns = None if t is None else t[i] @ anchors[i]
    if hcl is not None:
      beta, tau_plus = hcl
      s, s_pos, count = sn / temperature, sp / temperature, len(sn)
      w = np.exp(beta * s) / np.exp(beta * s).sum()
      ng = max(
          (count * np.sum(w * np.exp(s)) - tau_plus * count * np.exp(s_pos)) / (1 - tau_plus),
          count * np.exp(-1 / temperature),
      )
      l = -np.log(np.exp(s_pos) / (np.exp(s_pos) + ng))
    else:
      l = _np_ce(sp, sn, sns, temperature, ns.alpha, ns.alpha_mode)
    if ifm is not None:
      eps, alpha = ifm
      adv = _np_ce(
          sp - eps,
          sn + eps,
          None if sns is None else sns + eps,
          temperature,
          ns.alpha,
          ns.alpha_mode,
      )
      l = (l + alpha * adv) / 2
    losses.append(l)
    pos_all.append(sp)
    neg_means.append(sn.mean())
    neg_vars.append(sn.var())
    ns_all.append(sns)
  rows = rows or n
  stats = {
      "pos_mean": np.mean(pos_all[:rows]),
      "neg_mean": np.mean(neg_means[:rows]),
      "neg_var": np.mean(neg_vars[:rows]),
  }
  if t is not None:
    stats["ns_mean"] = np.mean(ns_all[:rows])
  return np.mean(losses), stats


def _f32(*arrays):
  return [jnp.asarray(a, jnp.float32) for a in arrays]


def _pair(seed, b=B, dim=DIM):
  rng = np.random.default_rng(seed)
  return _unit(rng, b, dim), _unit(rng, b, dim)


def _assert_close(got, want, grads=None, want_grads=None, rtol=2e-5):
  np.testing.assert_allclose(got, want, rtol=rtol)
  if grads is not None:
    for g, w in zip(grads, want_grads):
      assert np.abs(w).max() > 1e-3
      np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-6)


# --- add-ons off -------------------------------------------------------------------------


def test_every_add_on_off_is_bit_identical_to_nt_xent():
  # No add-ons, given directly (AddOns()) and from a config with every block off.
  z1, z2 = _f32(*_pair(0))
  from_off = from_config(_config(), 1)
  assert from_off == AddOns()
  rng, step = jax.random.key(0), jnp.asarray(0)

  @jax.jit
  def both(a, b):
    grad = lambda f: jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(a, b)
    return (
        grad(lambda x, y: batch_loss(x, y, None, AddOns(), T, rng, step)),
        grad(lambda x, y: batch_loss(x, y, None, from_off, T, rng, step)),
        grad(lambda x, y: simclr.nt_xent_loss(x, y, T)),
    )

  *runs, ((want, want_stats), want_grads) = both(z1, z2)
  for (loss, stats), grads in runs:
    assert jnp.array_equal(loss, want)
    for g, w in zip(grads, want_grads):
      assert jnp.array_equal(g, w)
    assert set(stats) == set(want_stats)
    for name in stats:
      assert jnp.array_equal(stats[name], want_stats[name])


@pytest.mark.parametrize("ft_key,with_others", [(FT_INTERPOLATE, False), (FT_UNION, True)])
@pytest.mark.slow
def test_inactive_feature_transformation_is_bit_identical_to_off(ft_key, with_others):
  # Before ft.start_epoch (step 0 < start step 1) the loss is FT off's bit for bit;
  # statistics and gradients to float32 rounding (summed in another order).
  z1, z2 = _f32(*_pair(1))
  t = jnp.asarray(_unit(np.random.default_rng(10), 2 * B, 2, DIM), jnp.float32)
  others = dict(t=t, ifm_key=(0.1, 1.0)) if with_others else {}
  key = jax.random.key(3)
  off = _run(z1, z2, **others)
  inactive = _run(z1, z2, ft_rng=key, active=False, ft_key=ft_key, **others)
  assert jnp.array_equal(inactive[0], off[0])
  assert set(inactive[1]) == set(off[1])
  for name in off[1]:
    np.testing.assert_allclose(inactive[1][name], off[1][name], rtol=1e-6, atol=1e-7)
  for g, w in zip(inactive[2], off[2]):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
  active = _run(z1, z2, ft_rng=key, active=True, ft_key=ft_key, **others)
  assert abs(float(active[0]) - float(off[0])) > 1e-3  # active, it does transform


# --- non-semantic negatives --------------------------------------------------------------


@pytest.mark.parametrize("mode,num_ns", [("in", 1), ("out", 3)])
def test_ns_negatives_enter_the_denominator(mode, num_ns):
  z1, z2 = _pair(2)
  t = _unit(np.random.default_rng(20), 2 * B, num_ns, DIM)
  ns = _cfg(enabled=True, alpha=3.0, alpha_mode=mode)
  loss, stats, grads = _run(*_f32(z1, z2), t=jnp.asarray(t, jnp.float32), ns_key=(mode, 3.0))
  want, want_stats = _np_loss(z1, z2, t=t, ns=ns)
  fd = central_differences(lambda a, b: _np_loss(a, b, t=t, ns=ns)[0], z1, z2)
  _assert_close(loss, want, grads, fd)
  assert set(stats) == {"pos_mean", "neg_mean", "neg_var", "ns_mean"}
  np.testing.assert_allclose(stats["ns_mean"], want_stats["ns_mean"], rtol=1e-5, atol=1e-7)
  assert float(loss) > _np_loss(z1, z2)[0] + 1e-3  # the NS logits add to the loss


def test_ns_features_get_no_gradient():
  z1, z2 = _f32(*_pair(3))
  t = jnp.asarray(_unit(np.random.default_rng(30), 2 * B, 2, DIM), jnp.float32)
  addons = AddOns(nonsemantic=NonSemantic("patch", 2, NS.alpha, NS.alpha_mode, 3, 10))
  fn = lambda tt: batch_loss(z1, z2, tt, addons, T, jax.random.key(0), jnp.asarray(0))[0]
  np.testing.assert_array_equal(jax.jit(jax.grad(fn))(t), 0.0)


# --- IFM ---------------------------------------------------------------------------------


@pytest.mark.parametrize("eps,alpha,with_ns", [(0.1, 1.0, False), (0.2, 0.5, True)])
def test_ifm_matches_numpy(eps, alpha, with_ns):
  z1, z2 = _pair(4)
  t = _unit(np.random.default_rng(40), 2 * B, 2, DIM) if with_ns else None
  loss, _, grads = _run(
      *_f32(z1, z2), t=None if t is None else jnp.asarray(t, jnp.float32), ifm_key=(eps, alpha)
  )
  ref = lambda a, b: _np_loss(a, b, t=t, ifm=(eps, alpha))[0]
  _assert_close(loss, ref(z1, z2), grads, central_differences(ref, z1, z2))
  # L_eps > L, so (L + alpha L_eps) / 2 > (1 + alpha) L / 2.
  assert float(loss) > (1 + alpha) / 2 * _np_loss(z1, z2, t=t)[0] + 1e-3


# --- feature transformation --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("ft_key", [FT_INTERPOLATE, FT_PER_SAMPLE])
def test_feature_transformation_matches_numpy(ft_key):
  # Positive extrapolation and negative interpolation, with one coefficient per step or
  # one (d,) vector per pair and per negative; negative-only FT is in the sharded test,
  # the union and extrapolation in test_all_add_ons_but_hcl_combine.
  z1, z2 = _pair(5)
  ft, key = _ft(ft_key), jax.random.key(11)
  coef = _coefficients(key, ft, DIM, 2 * B)
  assert not np.array_equal(coef[2], np.arange(2 * B))  # a real permutation
  loss, stats, grads = _run(*_f32(z1, z2), ft_rng=key, ft_key=ft_key)
  ref = lambda a, b: _np_loss(a, b, ft=ft, coef=coef)
  want, want_stats = ref(z1, z2)
  _assert_close(loss, want, grads, central_differences(lambda a, b: ref(a, b)[0], z1, z2))
  for name in ("pos_mean", "neg_mean", "neg_var"):  # on the transformed features
    np.testing.assert_allclose(stats[name], want_stats[name], rtol=1e-4, atol=1e-6)
  assert abs(float(loss) - _np_loss(z1, z2)[0]) > 1e-3
  # Extrapolation lowers the positive score (Eq. 4).
  assert float(stats["pos_mean"]) < _np_loss(z1, z2)[1]["pos_mean"] - 1e-3


@pytest.mark.slow
def test_all_add_ons_but_hcl_combine():
  # NS + IFM + FT with negative extrapolation, the union, per-dimension
  # coefficients and re-normalisation; the statistics pool the union's negatives.
  z1, z2 = _pair(7)
  t = _unit(np.random.default_rng(70), 2 * B, 2, DIM)
  ft, key = _ft(FT_UNION), jax.random.key(5)
  coef = _coefficients(key, ft, DIM, 2 * B)
  assert coef[0].shape == (DIM,) and np.all(coef[1] > 1)
  loss, stats, grads = _run(
      *_f32(z1, z2), t=jnp.asarray(t, jnp.float32), ft_rng=key, ifm_key=(0.1, 1.0), ft_key=FT_UNION
  )
  ref = lambda a, b: _np_loss(a, b, t=t, ifm=(0.1, 1.0), ft=ft, coef=coef)
  want, want_stats = ref(z1, z2)
  _assert_close(loss, want, grads, central_differences(lambda a, b: ref(a, b)[0], z1, z2))
  for name in want_stats:
    np.testing.assert_allclose(stats[name], want_stats[name], rtol=1e-4, atol=1e-6)


# --- hard-negative sampling --------------------------------------------------------------


@pytest.mark.parametrize("beta,tau_plus", [(1.0, 0.1), (0.0, 0.0), (5.0, 0.05)])
def test_hcl_matches_numpy(beta, tau_plus):
  z1, z2 = _pair(8)
  loss, stats, grads = _run(*_f32(z1, z2), hcl_key=(beta, tau_plus))
  ref = lambda a, b: _np_loss(a, b, hcl=(beta, tau_plus))[0]
  _assert_close(loss, ref(z1, z2), grads, central_differences(ref, z1, z2))
  if beta == 0.0 and tau_plus == 0.0:
    np.testing.assert_allclose(loss, _np_loss(z1, z2)[0], rtol=2e-5)
  else:
    assert abs(float(loss) - _np_loss(z1, z2)[0]) > 1e-3
  assert set(stats) == {"pos_mean", "neg_mean", "neg_var"}


@pytest.mark.parametrize(
    "others,names",
    [
        (dict(ifm=True), ["ifm.enabled"]),
        (dict(ns=True), ["nonsemantic.enabled"]),
        (dict(ft=True), ["ft.enabled"]),
        (dict(ns=True, ft=True), ["nonsemantic.enabled", "ft.enabled"]),
    ],
)
def test_hcl_with_another_add_on_is_refused_naming_the_fields(others, names):
  # config_check is the one place deciding combinations: HCL replaces NT-Xent's negative
  # term and is not combined with NS, IFM or FT.
  config_check.validate(_config(hcl_key=(1.0, 0.1)))  # alone it is allowed
  c = _config(
      with_ns=others.get("ns", False),
      ifm_key=(0.1, 1.0) if others.get("ifm") else None,
      hcl_key=(1.0, 0.1),
      ft_key=FT_INTERPOLATE if others.get("ft") else None,
  )
  with pytest.raises(config_check.ConfigError, match=r"hcl\.enabled") as err:
    config_check.validate(c)
  for name in names:
    assert name in str(err.value)


# --- statistics, sharding and errors -----------------------------------------------------


@pytest.mark.parametrize("score_queries,rows", [(2, 2), (B, 2 * B), (0, 2 * B), (B + 3, 2 * B)])
def test_statistics_over_the_first_view_one_anchors(score_queries, rows):
  z1, z2 = _pair(9)
  t = _unit(np.random.default_rng(90), 2 * B, 2, DIM)
  _, stats, _ = _run(*_f32(z1, z2), t=jnp.asarray(t, jnp.float32), score_queries=score_queries)
  _, want = _np_loss(z1, z2, t=t, rows=rows)
  _, everything = _np_loss(z1, z2, t=t)
  for name in want:
    np.testing.assert_allclose(stats[name], want[name], rtol=1e-5, atol=1e-7)
  if rows < 2 * B:
    assert abs(float(stats["neg_var"]) - everything["neg_var"]) > 1e-4


@pytest.mark.slow
def test_batch_sharded_over_eight_devices_matches_numpy():
  # One pair per device: the permutation's gather and the similarity matrix cross
  # shards. Negative interpolation alone, with NS and IFM.
  b = 8
  z1, z2 = _pair(10, b=b)
  t = _unit(np.random.default_rng(100), 2 * b, 1, DIM)
  ft, key = _ft(FT_NEGATIVE_ONLY), jax.random.key(1)
  coef = _coefficients(key, ft, DIM, 2 * b)
  rows = parallel.batch_sharding(parallel.make_mesh(jax.devices()[:8]))
  s1, s2 = (jax.device_put(x, rows) for x in _f32(z1, z2))
  loss, _, grads = _run(
      s1, s2, t=jnp.asarray(t, jnp.float32), ft_rng=key, ifm_key=(0.1, 1.0), ft_key=FT_NEGATIVE_ONLY
  )
  ref = lambda a, c: _np_loss(a, c, t=t, ifm=(0.1, 1.0), ft=ft, coef=coef)[0]
  _assert_close(loss, ref(z1, z2), grads, central_differences(ref, z1, z2))


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(ft=_ft(("hard", False, "scalar", False, True))), r"ft\.negative = 'hard'"),
        (dict(simclr=dict(temperature=0.0)), r"simclr\.temperature"),
        (dict(train=dict(score_queries=-1)), r"train\.score_queries"),
    ],
)
def test_bad_config_is_refused(fields, match):
  # The loss no longer checks its settings: config_check refuses them, naming the field.
  config_check.validate(_config(ft_key=FT_INTERPOLATE))  # the config before the change
  c = _config(ft_key=FT_INTERPOLATE)
  for block, values in fields.items():
    c[block].update(values)
  with pytest.raises(config_check.ConfigError, match=match):
    config_check.validate(c)


def test_feature_transformation_without_a_prng_key_raises():
  # The coefficients and the permutation are drawn from rng: FT needs a PRNG key.
  z = jax.ShapeDtypeStruct((B, DIM), jnp.float32)
  addons = from_config(_config(ft_key=FT_INTERPOLATE), 1)
  with pytest.raises(TypeError, match="PRNG key"):
    jax.eval_shape(lambda a, b: batch_loss(a, b, None, addons, T, None, jnp.asarray(1)), z, z)


def test_ns_features_of_the_wrong_shape_raise():
  # One row of NS features per anchor: (2B, M, d), not (B, M, d).
  z = jax.ShapeDtypeStruct((B, DIM), jnp.float32)
  t = jax.ShapeDtypeStruct((B, 1, DIM), jnp.float32)
  addons = from_config(_config(with_ns=True), 1)
  with pytest.raises(ValueError, match=r"\(N, M, d\) = \(8, M, 5\)"):
    jax.eval_shape(
        lambda a, b, tt: batch_loss(a, b, tt, addons, T, jax.random.key(0), jnp.asarray(0)),
        z,
        z,
        t,
    )
