"""Positive extrapolation for the methods without negatives, BYOL and SimSiam
(Zhu et al. 2021, App. E and E.2)."""

import jax
import jax.numpy as jnp
import ml_collections

from cl_jax.addons import feature_transform


def uses_extrapolation(ft: ml_collections.ConfigDict) -> bool:
  """Whether the config's feature transformation touches the positive pairs."""
  return bool(ft.enabled and ft.positive_extrapolation)


def extrapolate_pairs(
    pairs: list[tuple[jax.Array, jax.Array]],
    ft: ml_collections.ConfigDict,
    rng: jax.Array,
    active: jax.Array,
) -> list[tuple[jax.Array, jax.Array]]:
  """(p', z') of each (prediction, target) pair, Eq. 3 on the unit vectors.

  p' = l p^ + (1 - l) z^ and z' = l z^ + (1 - l) p^, l = 1 + Beta(a_ex, a_ex) drawn per
  pair (a scalar, a (d,) vector or one (d,) vector per sample: ft.coefficients). The
  target z is stopped before the mixing and z' is not stopped after it, so the gradient
  reaches p through both (the loss must be called with stop_gradient=False). While
  `active` is False (before ft.start_epoch) the pairs come back as (p,
  stop_gradient(z)), so the loss is the untransformed one (to float32 rounding: XLA may
  fuse the selection differently from the plain graph).

  Args:
    pairs: [(p (B, d), z (B, d))], online predictions and target projections.
    ft: the `ft` config block.
    rng: PRNG key of the step's coefficients.
    active: () bool.
  """
  shape = feature_transform.coefficient_shape(ft.coefficients, *pairs[0][0].shape)
  out = []
  for i, (p, z) in enumerate(pairs):
    z = jax.lax.stop_gradient(z)
    lam = feature_transform.positive_coefficient(
        jax.random.fold_in(rng, i), ft.alpha_ex, ft.positive_interpolation, shape
    )
    p2, z2 = feature_transform.siamese_positive_extrapolation(p, z, lam, ft.renormalize)
    out.append((jnp.where(active, p2, p), jnp.where(active, z2, z)))
  return out
