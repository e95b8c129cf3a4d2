"""Health signals of a batch of embeddings, to see a representation collapse as it happens.

Every statistic l2-normalises the rows first, so it describes the directions the
loss compares and not the scale of the head's output:

  embedding_std   per-dimension standard deviation (Chen & He 2021, Sec. 4.1);
  effective_rank  exp of the entropy of the normalised singular values
                  (Roy & Vetterli 2007; RankMe, Garrido et al. 2023);
  alignment       mean distance of the positive pairs (Wang & Isola 2020, Sec. 4.1.1);
  uniformity      log of the mean Gaussian potential of distinct pairs (same, Sec. 4.1.2).

A collapsed encoder maps every image to one point: std 0, effective rank 1,
alignment 0 and uniformity 0 (its largest value). collapse_warning turns the
first two into a message for the training log.
"""

import math

import jax
import jax.numpy as jnp

from cl_jax.models.heads import l2_normalize

# Inside the log of the effective rank's entropy, so that p_k = 0 adds 0 and not NaN.
_RANK_EPS = 1e-7


def _unit(z: jax.Array) -> jax.Array:
  """(N, d) rows as float32 unit vectors (a zero row stays zero)."""
  return l2_normalize(z.astype(jnp.float32))


def embedding_std(z: jax.Array) -> jax.Array:
  """Mean per-dimension standard deviation of the l2-normalised embeddings.

  std = 1/d sum_k sqrt( 1/N sum_i (u_ik - mean_i u_ik)^2 ),  u_i = z_i / ||z_i||_2
  (Chen & He 2021, Sec. 4.1, Fig. 2: about 1/sqrt(d) for unit vectors spread over
  the sphere, 0 when every row is the same vector).

  Args:
    z: (N, d) embeddings, any float dtype.

  Returns:
    () float32.
  """
  return jnp.mean(jnp.std(_unit(z), axis=0)).astype(jnp.float32)


def effective_rank(z: jax.Array) -> jax.Array:
  """Effective rank of the (N, d) matrix of l2-normalised embeddings.

  erank = exp( -sum_k p_k log(p_k + eps) ),  p_k = sigma_k / sum_j sigma_j
  over the singular values sigma_k of U = [u_1; ...; u_N], not centred
  (Roy & Vetterli 2007, Def. 1; RankMe, Garrido et al. 2023, Eq. 1). It lies in
  [1, min(N, d)] (up to eps): 1 for a batch collapsed onto one point, min(N, d)
  for orthogonal rows. An all-zero U (no singular value) counts as rank 1.

  Args:
    z: (N, d) embeddings, any float dtype.

  Returns:
    () float32.
  """
  sigma = jnp.linalg.svd(_unit(z), compute_uv=False)
  p = sigma / jnp.maximum(jnp.sum(sigma), jnp.finfo(jnp.float32).tiny)
  return jnp.exp(-jnp.sum(p * jnp.log(p + _RANK_EPS)))


def alignment(z_a: jax.Array, z_b: jax.Array, alpha: float = 2) -> jax.Array:
  """Alignment of positive pairs (Wang & Isola 2020, Eq. 5 on a batch).

  L_align = 1/N sum_i || u_a,i - u_b,i ||_2^alpha,  u = z / ||z||_2 row-wise;
  0 when each pair maps to one point, 4^(alpha/2) at most (antipodal pairs).

  Args:
    z_a, z_b: (N, d) embeddings of the two views, row i of each a positive pair.
    alpha: > 0, the distance's exponent (2 in the paper).

  Returns:
    () float32.
  """
  sq = jnp.sum(jnp.square(_unit(z_a) - _unit(z_b)), axis=-1)
  return jnp.mean(sq ** (alpha / 2))


def uniformity(z: jax.Array, t: float = 2) -> jax.Array:
  """Uniformity of the embeddings (Wang & Isola 2020, Eq. 6 on a batch).

  L_uniform = log( 1/(N (N - 1)) sum_{i != j} exp(-t ||u_i - u_j||_2^2) ),
  u = z / ||z||_2 row-wise, taken as a log-sum-exp of the N (N - 1) exponents;
  0 when every row is the same point, more negative the more uniformly the rows
  cover the sphere (-4t for two antipodal points).

  Args:
    z: (N, d) embeddings, N >= 2.
    t: > 0, the Gaussian potential's scale (2 in the paper).

  Returns:
    () float32.
  """
  u = _unit(z)
  n = u.shape[0]
  sq_norm = jnp.sum(jnp.square(u), axis=-1)
  sq_dist = jnp.maximum(sq_norm[:, None] + sq_norm[None, :] - 2.0 * u @ u.T, 0.0)
  distinct = ~jnp.eye(n, dtype=bool)
  lse = jax.nn.logsumexp(jnp.where(distinct, -t * sq_dist, -jnp.inf))
  return lse - jnp.log(float(n * (n - 1)))


def embedding_health(z_a: jax.Array, z_b: jax.Array) -> dict[str, jax.Array]:
  """The health statistics of one step's embeddings, without gradient.

  Args:
    z_a: (N, d) online embeddings of the first view.
    z_b: (N, d) embeddings of their positives (the other view; MoCo's keys).

  Returns:
    dict of () float32: health/std = embedding_std(z_a); health/std_sqrt_d = that
    times sqrt(d) (about 1 healthy, 0 collapsed); health/rank =
    effective_rank(z_a); health/align = alignment(z_a, z_b); health/uniform =
    uniformity(z_a).
  """
  z_a, z_b = jax.lax.stop_gradient(z_a), jax.lax.stop_gradient(z_b)
  std = embedding_std(z_a)
  return {
      "health/std": std,
      "health/std_sqrt_d": std * math.sqrt(z_a.shape[-1]),
      "health/rank": effective_rank(z_a),
      "health/align": alignment(z_a, z_b),
      "health/uniform": uniformity(z_a),
  }


def collapse_warning(
    scalars: dict[str, float], min_std_sqrt_d: float, min_rank: float
) -> str | None:
  """A one-line message when a logged health signal is below its threshold, else None.

  Args:
    scalars: logged metrics; health/std_sqrt_d and health/rank are read when present.
    min_std_sqrt_d: warn when health/std_sqrt_d < this (healthy is about 1).
    min_rank: warn when health/rank < this; 0 never warns.

  Returns:
    "representation collapse: <signal> = <value> < <threshold> (...)[; ...]", one
    clause per signal below its threshold; None when none is, or the keys are absent.
  """
  problems = []
  std = scalars.get("health/std_sqrt_d")
  if std is not None and std < min_std_sqrt_d:
    problems.append(
        f"embedding std x sqrt(d) = {std:.3g} < {min_std_sqrt_d:g} " "(healthy is about 1)"
    )
  rank = scalars.get("health/rank")
  if rank is not None and rank < min_rank:
    problems.append(
        f"effective rank of the batch's embeddings = {rank:.3g} < {min_rank:g} "
        "(1 is a single point)"
    )
  return "representation collapse: " + "; ".join(problems) if problems else None
