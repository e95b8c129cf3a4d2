"""Feature transformation (Zhu et al. 2021, Sec. 4 and App. D, E.2, F, G).

Mixing coefficients are sampled by the caller (`sample_coefficient`, with the shape of
`coefficient_shape`) and passed in, so every function here is deterministic. A
coefficient is a scalar (one value per step, the paper's default), a (d,) vector
(dimension-level mixing, Sec. 4.3, one vector per step) or an (n, d) array (dimension-
level mixing with one vector per sample: per positive pair, per negative; the form of
the authors' code). Features are float32 (..., d) arrays, normally unit-norm;
`renormalize` projects the mixed features back onto the unit sphere, which the paper
recommends offering (App. F.2) but does not use by default.

Identities used for the score-space forms, for unit vectors and a scalar
coefficient c:
  |c a + (1 - c) b|^2 = c^2 + (1 - c)^2 + 2 c (1 - c) a.b = 1 - 2 c (1 - c) (1 - a.b).
"""

import jax
import jax.numpy as jnp

from cl_jax.losses.queue_contrast import dot_scores
from cl_jax.models.heads import l2_normalize

# Floor of a norm before division, the eps of l2_normalize (torch's F.normalize).
_NORM_EPS = 1e-12


def sample_coefficient(rng: jax.Array, a: float, b: float, shape: tuple[int, ...]) -> jax.Array:
  """Beta(a, b) draws, float32 of `shape`, values in (0, 1).

  shape () gives one coefficient per step; shape (d,) gives one per feature
  dimension (dimension-level mixing, Sec. 4.3). The paper's coefficients:
    positive extrapolation   lambda_ex = 1 + Beta(a_ex, a_ex)   (Sec. 4.1, default a_ex = 2.0)
    negative interpolation   lambda_in = Beta(a_in, a_in)       (Eq. 5, default a_in = 1.6)
    negative extrapolation   lambda_ex = 1 + Beta(a_ex, a_ex)   (App. G.1, Eq. 7)
    hard negatives           lambda_in = Beta(a, b)             (App. G.2, Eq. 8; (2, 1), (5, 2))
  The "+ 1" is the caller's: this function returns the Beta draw only.
  """
  if not (a > 0 and b > 0):
    raise ValueError(f"Beta parameters must be > 0, got a={a!r}, b={b!r}")
  return jax.random.beta(rng, a, b, shape, jnp.float32)


def positive_coefficient(
    rng: jax.Array, alpha_ex: float, interpolate: bool, shape: tuple[int, ...]
) -> jax.Array:
  """lam of the positive transform (Eq. 3), float32 of `shape`:

  extrapolation   lam = 1 + Beta(a_ex, a_ex)   in (1, 2): harder positives, q'.k' <= q.k (Eq. 4)
  interpolation   lam = Beta(a_ex, a_ex)       in (0, 1): easier positives, q'.k' >= q.k, the
                                               comparison arm of Table 3
  """
  draw = sample_coefficient(rng, alpha_ex, alpha_ex, shape)
  return draw if interpolate else 1.0 + draw


def negative_coefficient(
    rng: jax.Array, negative: str, alpha_in: float, alpha_ex: float, shape: tuple[int, ...]
) -> jax.Array:
  """mu of the negative transform mu n + (1 - mu) n', float32 of `shape`:

  "interpolate"   mu = Beta(a_in, a_in)        in (0, 1)   (Eq. 5, Sec. 4.2)
  "extrapolate"   mu = 1 + Beta(a_ex, a_ex)    in (1, 2)   (App. G.1, Eq. 7)
  """
  if negative == "interpolate":
    return sample_coefficient(rng, alpha_in, alpha_in, shape)
  if negative == "extrapolate":
    return 1.0 + sample_coefficient(rng, alpha_ex, alpha_ex, shape)
  raise ValueError(f"negative must be 'interpolate' or 'extrapolate', got {negative!r}")


COEFFICIENTS = ("scalar", "dimension", "sample_dimension")


def coefficient_shape(mode: str, rows: int, dim: int) -> tuple[int, ...]:
  """Shape of the coefficients mixing `rows` features of dimension `dim`:

  "scalar"             ()           one value per step (Sec. 4.1, 4.2)
  "dimension"          (dim,)       one vector per step, shared by every row (Eq. 6)
  "sample_dimension"   (rows, dim)  one vector per row (Eq. 6, as the authors' code draws it)
  """
  shapes = {"scalar": (), "dimension": (dim,), "sample_dimension": (rows, dim)}
  if mode not in shapes:
    raise ValueError(f"coefficient mode must be one of {COEFFICIENTS}, got {mode!r}")
  return shapes[mode]


def _coefficient(coef, rows: int, dim: int, name: str, dtype) -> jax.Array:
  """coef as an array of `dtype`, after checking its shape is (), (dim,) or (rows, dim)."""
  shape = jnp.shape(coef)
  if shape not in ((), (dim,), (rows, dim)):
    raise ValueError(
        f"{name} must be a scalar, a ({dim},) vector or a ({rows}, {dim}) array "
        f"matching the features, got shape {shape}"
    )
  return jnp.asarray(coef, dtype)


def _scalar_lam(lam, dtype, fn: str, vector_fn: str) -> jax.Array:
  """lam as a scalar of `dtype`; ValueError naming `vector_fn` (the function that takes the
  feature vectors) if lam is per dimension, since `fn` sees only their scores."""
  if jnp.ndim(lam) != 0:
    raise ValueError(
        f"{fn} takes a scalar lam only, got shape {jnp.shape(lam)}; for dimension-level "
        f"lam use {vector_fn} with the feature vectors"
    )
  return jnp.asarray(lam, dtype)


def _mix(x: jax.Array, y: jax.Array, coef: jax.Array) -> jax.Array:
  """coef * x + (1 - coef) * y, coef broadcast over the last axis."""
  return coef * x + (1.0 - coef) * y


def positive_extrapolation(
    q: jax.Array, k: jax.Array, lam, renormalize: bool
) -> tuple[jax.Array, jax.Array]:
  """Positive extrapolation, Eq. 3 (Sec. 4.1):

    q' = lam q + (1 - lam) k,    k' = lam k + (1 - lam) q.

  lam = 1 + Beta(a_ex, a_ex) in [1, 2] (the caller adds the 1); then q'.k' <= q.k
  (Eq. 4). lam = 1 is the identity. The gradient flows through q into both q'
  and k' (k' contains (1 - lam) q); k is used as given, so its gradient is
  whatever the caller left on it (e.g. none for a momentum-encoder key).

  Args:
    q: (..., d) float32 query features (normally unit-norm).
    k: (..., d) float32 positive-key features, same shape as q.
    lam: scalar, (d,) or, for (B, d) features, (B, d) (coefficient_shape).
    renormalize: l2-normalise q' and k' after mixing (App. F.2).

  Returns:
    (q', k'), each of q's shape.
  """
  if q.shape != k.shape:
    raise ValueError(f"q and k must have the same shape, got {q.shape} and {k.shape}")
  lam = _coefficient(lam, q.shape[0] if q.ndim == 2 else -1, q.shape[-1], "lam", q.dtype)
  q_new, k_new = _mix(q, k, lam), _mix(k, q, lam)
  if renormalize:
    q_new, k_new = l2_normalize(q_new), l2_normalize(k_new)
  return q_new, k_new


def positive_extrapolation_score(sim: jax.Array, lam, renormalize: bool) -> jax.Array:
  """Positive score after extrapolation, from the score S = q.k of unit q and k.

  Without re-normalisation this is Eq. 4:
    S' = q'.k' = S + 2 lam (1 - lam) (1 - S) = S - 2 lam (lam - 1) (1 - S).
  With it, q'.k' is divided by |q'| |k'| = |q'|^2 = 1 - 2 lam (1 - lam) (1 - S)
  (|q'| = |k'| by symmetry, see the module docstring), so
    S' = (S + c (1 - S)) / (1 - c (1 - S)),   c = 2 lam (1 - lam).
  For lam in [1, 2] both are <= S, with equality at lam = 1.

  Args:
    sim: (...) float32 scores q.k of unit vectors.
    lam: scalar; dimension-level lam needs the vectors (use positive_extrapolation).
    renormalize: score of the l2-normalised q' and k'.

  Returns:
    Transformed scores, sim's shape.
  """
  lam = _scalar_lam(lam, sim.dtype, "positive_extrapolation_score", "positive_extrapolation")
  shift = 2.0 * lam * (1.0 - lam) * (1.0 - sim)
  score = sim + shift
  if renormalize:
    score = score / jnp.maximum(1.0 - shift, _NORM_EPS)
  return score


def negative_interpolation(
    negatives: jax.Array, partner: jax.Array, mu, renormalize: bool
) -> jax.Array:
  """Negative interpolation, Eq. 5 (Sec. 4.2), and negative extrapolation, Eq. 7 (App. G.1):

    n'_j = mu n_j + (1 - mu) n_{partner[j]}.

  Interpolation: mu = Beta(a_in, a_in) in (0, 1). Extrapolation: mu =
  1 + Beta(a_ex, a_ex) in [1, 2] (the caller adds the 1). mu = 1 is the
  identity. `partner` is chosen by the caller, e.g. a fresh random permutation
  each step (Z_perm of Eq. 5), drawn so that it respects the queue's sharding.
  Returns a new array: the stored queue keeps its unmixed keys.

  Args:
    negatives: (K, d) float32 negative features (the memory queue or a shard of it).
    partner: (K,) integer indices into negatives' rows.
    mu: scalar, (d,) or (K, d), one vector per negative (coefficient_shape).
    renormalize: l2-normalise each mixed negative (App. F.2).

  Returns:
    (K, d) transformed negatives.
  """
  if negatives.ndim != 2:
    raise ValueError(f"negatives must be (K, d), got shape {negatives.shape}")
  partner = jnp.asarray(partner)
  if partner.shape != negatives.shape[:1] or not jnp.issubdtype(partner.dtype, jnp.integer):
    raise ValueError(
        f"partner must be a ({negatives.shape[0]},) integer index array, got "
        f"shape {partner.shape} and dtype {partner.dtype}"
    )
  mu = _coefficient(mu, negatives.shape[0], negatives.shape[1], "mu", negatives.dtype)
  mixed = _mix(negatives, negatives[partner], mu)
  return l2_normalize(mixed) if renormalize else mixed


def hard_negative_scores_from_similarity(sim: jax.Array, lam, renormalize: bool) -> jax.Array:
  """Scores of the hard negatives of App. G.2 (Eq. 8), from the scores s_ij = q_i.n_j.

  The hard negative of query i and queue entry j is h_ij = lam q_i + (1 - lam) n_j,
  lam = Beta(a, b) in (0, 1). Rather than build the (B, K, d) tensor of h_ij,
  its score against q_i follows from s_ij alone for unit q_i and n_j:
    q_i.h_ij = lam + (1 - lam) s_ij                         (>= s_ij for lam in [0, 1])
  and with re-normalisation it is divided by
    |h_ij| = sqrt(lam^2 + (1 - lam)^2 + 2 lam (1 - lam) s_ij).
  The gradient flows through q_i in both places (through s_ij), as in Eq. 8.

  Args:
    sim: (B, K) float32 scores of unit queries with unit negatives.
    lam: scalar; for dimension-level lam use hard_negative_scores.
    renormalize: score against the l2-normalised h_ij.

  Returns:
    (B, K) transformed negative scores.
  """
  lam = _scalar_lam(lam, sim.dtype, "hard_negative_scores_from_similarity", "hard_negative_scores")
  score = lam + (1.0 - lam) * sim
  if renormalize:
    sq_norm = lam**2 + (1.0 - lam) ** 2 + 2.0 * lam * (1.0 - lam) * sim
    score = score / jnp.sqrt(jnp.maximum(sq_norm, _NORM_EPS**2))
  return score


def hard_negative_scores(q: jax.Array, negatives: jax.Array, lam, renormalize: bool) -> jax.Array:
  """Scores q_i.h_ij of the hard negatives h_ij = lam q_i + (1 - lam) n_j (App. G.2, Eq. 8).

  Exact for features of any norm and for a scalar, (d,) or per-query (B, d) lam,
  without the (B, K, d) tensor of h_ij; with sums over the feature axis and lam_i
  the coefficient of query i:
    q_i.h_ij  = sum(lam_i q_i^2) + ((1 - lam_i) q_i).n_j
    |h_ij|^2  = sum(lam_i^2 q_i^2) + (1 - lam_i)^2.n_j^2 + 2 (lam_i (1 - lam_i) q_i).n_j
  i.e. one (B, K) matrix product for the score and two more for the norm. The
  gradient flows through q_i in both the query and the hard negative.

  Args:
    q: (B, d) float32 queries.
    negatives: (K, d) float32 negatives (the memory queue or a shard of it).
    lam: scalar, (d,) or (B, d), one vector per query (coefficient_shape).
    renormalize: score against the l2-normalised h_ij.

  Returns:
    (B, K) hard-negative scores.
  """
  if q.ndim != 2 or negatives.ndim != 2 or q.shape[1] != negatives.shape[1]:
    raise ValueError(
        f"q must be (B, d) and negatives (K, d) with the same d, got "
        f"{q.shape} and {negatives.shape}"
    )
  lam = _coefficient(lam, q.shape[0], q.shape[1], "lam", q.dtype)
  q_sq = jnp.square(q)
  score = jnp.sum(lam * q_sq, axis=1, keepdims=True) + dot_scores((1.0 - lam) * q, negatives)
  if renormalize:
    # sum_k (1 - lam_ik)^2 n_jk^2: a (B, K) product when lam differs per query.
    neg_sq = dot_scores(jnp.broadcast_to((1.0 - lam) ** 2, q.shape), jnp.square(negatives))
    sq_norm = (
        jnp.sum(lam**2 * q_sq, axis=1, keepdims=True)
        + neg_sq
        + 2.0 * dot_scores(lam * (1.0 - lam) * q, negatives)
    )
    score = score / jnp.sqrt(jnp.maximum(sq_norm, _NORM_EPS**2))
  return score


def siamese_positive_extrapolation(
    prediction: jax.Array, target: jax.Array, lam, renormalize: bool
) -> tuple[jax.Array, jax.Array]:
  """Positive extrapolation for BYOL / SimSiam (App. E and E.2, Table 13).

  These methods have no negatives, so only positive extrapolation applies
  (App. E). The paper does not name the tensors; the pair whose score enters
  their loss is the online prediction p = q(z_1) and the target projection z_2
  (the target network's in BYOL, the stop-gradient online one in SimSiam), so
  they take the roles of z_q and z_{k+} of Eq. 3. Their loss is a cosine of
  unnormalised vectors, while Eq. 3 mixes unit features, so both are
  l2-normalised first:

    p' = lam p^ + (1 - lam) z^,   z' = lam z^ + (1 - lam) p^,   p^ = p/|p|, z^ = z/|z|.

  lam = 1 + Beta(a_ex, a_ex) (the caller adds the 1). The gradient flows through
  p into both outputs; the caller applies stop_gradient to the target as the
  method requires. For the symmetrised loss, call once per (p_1, z_2) and
  (p_2, z_1) pair.

  Args:
    prediction: (B, d) float32 online predictions p.
    target: (B, d) float32 target projections z.
    lam: scalar, (d,) or (B, d) (coefficient_shape).
    renormalize: l2-normalise p' and z' after mixing (App. F.2).

  Returns:
    (p', z'), each (B, d).
  """
  return positive_extrapolation(l2_normalize(prediction), l2_normalize(target), lam, renormalize)
