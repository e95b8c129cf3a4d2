"""What the methods' objectives share: their inputs (Views), the forward passes (online
features with their batch-norm update, no-gradient target features with shuffle-BN, the
features of the non-semantic images of a batch of views), the gradient of a loss with its
batch statistics, and the DICR term added to any method's loss."""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from cl_jax.addons import dicr
from cl_jax.addons.nonsemantic import NonSemantic
from cl_jax.objectives.health import embedding_health
from cl_jax.runtime import parallel

# model.bn_mode values that shuffle-BN a momentum encoder's keys (MoCo's; shuffle_keys).
SHUFFLE_BN_MODES = ("shuffle", "shuffle_stats")
# Every model.bn_mode: statistics over the global batch ("sync"), over model.bn_groups groups
# ("local"), or a shuffle mode (the key encoder's groups drawn at random).
BN_MODES = ("sync", "local") + SHUFFLE_BN_MODES


class Views(NamedTuple):
  """The step's inputs after on-device augmentation.

  v1, v2: (B, S, S, 3) float32 normalised views, rows sharded over `data`.
  r_key: PRNG key of the target forward (shuffle-BN permutations).
  r_ns: PRNG key of the non-semantic images.
  r_ft: PRNG key of the feature-transformation coefficients.
  extra: LooC's key views k_1..k_n, each (B, S, S, 3) like v2 (k_0).
  textures: texture-based NS images of (v1, v2) (Ge et al. 2021, Sec. 2.2), each
    (B, S, S, 3) normalised with its view's augmentation parameters; () without.
  regions: cl_jax.addons.dicr.Regions, the overlap of v1 and v2 (DICR); None without.
  """

  v1: jax.Array
  v2: jax.Array
  r_key: jax.Array
  r_ns: jax.Array
  r_ft: jax.Array
  extra: tuple = ()
  textures: tuple = ()
  regions: dicr.Regions | None = None


def encode(
    encoder,
    params,
    batch_stats,
    images: jax.Array,
    predict: bool = False,
    groups: jax.Array | None = None,
):
  """Online forward in train-mode batch norm.

  Args:
    images: (N, S, S, 3) normalised views.
    predict: also return the predictor's output "p" (BYOL, SimSiam).
    groups: (N,) batch-norm group of each image (cl_jax.models.encoder.Encoder), or None.
  Returns:
    (encoder outputs: dict with z (N, d) unit and, with predict, p (N, d); updated
    batch_stats).
  """
  out, mutated = encoder.apply(
      {"params": params, "batch_stats": batch_stats},
      images,
      train=True,
      predict=predict,
      groups=groups,
      mutable=["batch_stats"],
  )
  return out, mutated["batch_stats"]


def _unit_embedding(out: dict) -> jax.Array:
  return out["z"]


def shuffle_mode(config) -> str | None:
  """The key encoder's shuffle-BN of a run config: its model.bn_mode when that is one of
  SHUFFLE_BN_MODES ("shuffle": permute the images; "shuffle_stats": permute the
  statistics), else None."""
  mode = config.model.bn_mode
  return mode if mode in SHUFFLE_BN_MODES else None


def shuffle_groups(perm: jax.Array, num_groups: int) -> jax.Array:
  """Shuffle-BN's random partition of a batch of N: for a permutation perm (N,), groups (N,)
  int32 with groups[perm[p]] = p // (N / G), the group that image perm[p] joins at position p
  of the permuted batch split into G contiguous groups."""
  batch = perm.shape[0]
  return jnp.zeros((batch,), jnp.int32).at[perm].set(jnp.arange(batch) // (batch // num_groups))


def encode_keys(
    encoder,
    params,
    batch_stats,
    images: jax.Array,
    rng: jax.Array,
    shuffle: str | None,
    output: Callable[[dict], jax.Array] = _unit_embedding,
    mesh: Mesh | None = None,
):
  """Key / target features of `images`, in train-mode batch norm, without gradient.

  Shuffle-BN (He et al. 2020, Sec. 3.3): with grouped batch norm, key i is normalised with
  the statistics of a random group of images, not with those of the group that holds query
  i. shuffle "shuffle" does what the paper describes: the batch is permuted before the
  encoder and un-permuted after it. The permuted batch is kept split over `mesh`'s data axis
  (given a mesh), so the key forward stays data-parallel: a random gather gives XLA no
  sharding to propagate, and it would otherwise run the whole batch on every device. The
  images are permuted in the backbone's compute dtype, the first thing the backbone casts
  them to: the same numbers, and on several devices a gather of bfloat16 images in a
  bfloat16 config instead of float32 ones, half the bytes. Each device still receives the
  images of the whole global batch.

  shuffle "shuffle_stats" computes the same normalisation without moving an image: the
  images stay where they are, and every batch norm takes its statistics over the random
  groups of the same partition (shuffle_groups), one (G, 2C) all-reduce of per-group sums per
  BN across devices (cl_jax.models.batchnorm.scattered_group_normalise). The keys equal those
  of "shuffle" up to float rounding (sums in another order).

  Args:
    images: (N, S, S, 3) normalised views.
    shuffle: None (no shuffle-BN), "shuffle" or "shuffle_stats" (SHUFFLE_BN_MODES).
    output: picks the keys from the encoder's outputs, (N, ...) rows per image
      (default z, the unit embedding).
  Returns:
    ((N, d) unit keys (or output's (N, ...)), updated batch_stats).
  """
  if shuffle not in (None,) + SHUFFLE_BN_MODES:
    raise ValueError(f"shuffle must be None or one of {SHUFFLE_BN_MODES}, got {shuffle!r}")
  if shuffle == "shuffle_stats":
    with jax.named_scope("shuffle_groups"):  # not "shuffle_bn": no image gather here
      perm = jax.random.permutation(rng, images.shape[0])  # the permutation of "shuffle"
      groups = shuffle_groups(perm, encoder.backbone.bn_groups)
    out, batch_stats = encode(encoder, params, batch_stats, images, groups=groups)
    return jax.lax.stop_gradient(output(out)), batch_stats
  if shuffle == "shuffle":
    with jax.named_scope("shuffle_bn"):  # names the gathers in the compiled program
      images = images.astype(encoder.backbone.dtype)
      perm = jax.random.permutation(rng, images.shape[0])
      images = _split_over(images[perm], mesh)
  out, batch_stats = encode(encoder, params, batch_stats, images)
  z = output(out)
  if shuffle == "shuffle":
    with jax.named_scope("shuffle_bn"):
      z = _split_over(jnp.zeros_like(z).at[perm].set(z), mesh)
  return jax.lax.stop_gradient(z), batch_stats


def target_keys(
    encoder,
    params,
    batch_stats,
    views: list[jax.Array],
    rng: jax.Array,
    shuffle: str | None,
    mesh: Mesh | None = None,
    output: Callable[[dict], jax.Array] = _unit_embedding,
) -> tuple[list[jax.Array], dict]:
  """encode_keys of each view in turn, view j with the PRNG key fold_in(rng, j); the batch
  statistics pass from one view's forward to the next. Returns (keys, batch_stats)."""
  keys = []
  for j, images in enumerate(views):
    k, batch_stats = encode_keys(
        encoder, params, batch_stats, images, jax.random.fold_in(rng, j), shuffle, output, mesh
    )
    keys.append(k)
  return keys, batch_stats


def momentum_target(state, momentum: float | jax.Array):
  """The EMA target parameters, theta_k <- m theta_k + (1 - m) theta_q (He et al. 2020,
  Eq. 2; Grill et al. 2020, Sec. 3.1), of a state with params and target_params."""
  return optax.incremental_update(state.params, state.target_params, 1.0 - momentum)


def momentum_updates(batch_stats, target_params, target_batch_stats) -> dict:
  """The state updates of a method with a momentum target."""
  return dict(
      batch_stats=batch_stats, target_params=target_params, target_batch_stats=target_batch_stats
  )


def _split_over(x: jax.Array, mesh: Mesh | None) -> jax.Array:
  """x with its rows constrained to be split over mesh's data axis (x itself without a mesh)."""
  return x if mesh is None else jax.lax.with_sharding_constraint(x, parallel.batch_sharding(mesh))


def ns_features(
    encoder,
    params,
    batch_stats,
    views: jax.Array,
    rng: jax.Array,
    ns: NonSemantic,
    shuffle: str | None,
    texture: jax.Array | None = None,
    mesh: Mesh | None = None,
) -> jax.Array:
  """Features of the M NS images of each view (Ge et al. 2021, Sec. 2.2-2.3), without
  gradient; the forward's batch statistics are not kept (the running statistics follow
  the real views only).

  Args:
    views: (B, S, S, 3) augmented views the patch NS images are built from.
    ns: the run's NonSemantic (kind, M, patch sizes).
    texture: (B, S, S, 3) the views' texture images under the views' own augmentation
      parameters (kind "texture"), else None.
    mesh: the device mesh, which keeps a shuffled forward data-parallel (encode_keys).
  Returns:
    (B, M, d) unit features.
  """
  r_patch, r_shuffle = jax.random.split(rng)
  images = ns.images(r_patch, views, texture)
  flat = images.reshape((-1,) + views.shape[1:])
  t, _ = encode_keys(encoder, params, batch_stats, flat, r_shuffle, shuffle, mesh=mesh)
  return t.reshape(views.shape[0], images.shape[1], -1)


def ns_keys(
    encoder,
    params,
    batch_stats,
    views: list[jax.Array],
    x: Views,
    ns: NonSemantic | None,
    shuffle: str | None,
    mesh: Mesh | None = None,
) -> list[jax.Array | None]:
  """ns_features of each view i (0: v1, 1: v2) with the PRNG key fold_in(x.r_ns, i) and
  view i's texture images; [None] * len(views) without NS negatives (ns None)."""
  if ns is None:
    return [None] * len(views)
  return [
      ns_features(
          encoder,
          params,
          batch_stats,
          v,
          jax.random.fold_in(x.r_ns, i),
          ns,
          shuffle,
          texture_of(x, i),
          mesh,
      )
      for i, v in enumerate(views)
  ]


def texture_of(x: Views, i: int) -> jax.Array | None:
  """The texture NS images of view i (0: v1, 1: v2), or None without texture negatives."""
  return x.textures[i] if x.textures else None


def keys_first(params, keys):
  """(params, keys) unchanged, where on TPUs the query encoder's forward, which reads params,
  starts only when every key exists (one optimization barrier over both; keys any pytree of the
  target's outputs): their scheduler would otherwise run part of a key forward while the
  query's activations wait for the backward, and hold both at the step's peak (ResNet-50 at
  224 px on v4:2x2x1: MoCo-v2 with texture negatives at 128 images per chip 5.26 GiB, 4.55
  with the barrier; BYOL on v5p:2x2x1 at 256 per chip 17.23 GiB, 16.98). Elsewhere nothing:
  on GPUs a barrier on the parameters keeps XLA from fusing their conversions (209 kernels more
  per MoCo-v2 step)."""
  return jax.lax.platform_dependent(
      (params, keys), tpu=jax.lax.optimization_barrier, default=lambda values: values
  )


def value_and_grad(loss_fn: Callable, params) -> tuple[jax.Array, dict, dict, dict]:
  """(loss, batch_stats, stats, grads) of loss_fn(params) -> (loss, (batch_stats, stats))."""
  (loss, (batch_stats, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return loss, batch_stats, stats, grads


def online_step(loss_fn: Callable, params) -> tuple[jax.Array, dict, dict, dict]:
  """(loss, grads, {"batch_stats"}, stats) of a method without a target network, from
  loss_fn(params) -> (loss, (batch_stats, stats))."""
  loss, batch_stats, stats, grads = value_and_grad(loss_fn, params)
  return loss, grads, {"batch_stats": batch_stats}, stats


def regularised(
    term: dicr.DICR | None,
    loss: jax.Array,
    stats: dict,
    batch_stats,
    encoder,
    params,
    step: jax.Array,
    outs: tuple[dict, dict],
    regions: dicr.Regions | None,
) -> tuple[jax.Array, tuple[dict, dict]]:
  """(loss + lambda L_DICR, (batch_stats, stats with DICR's)), a loss function's value with
  its auxiliaries, for the two views' online outputs outs (2025 submission, Eq. 8); without
  DICR (term None) (loss, (batch_stats, stats))."""
  if term is None:
    return loss, (batch_stats, stats)
  value, batch_stats, extra = term.regularise(encoder, params, batch_stats, step, *outs, regions)
  return loss + value, (batch_stats, {**stats, **extra})


def two_view_step(
    encoder, addons, state, x: Views, loss_of: Callable, predict: bool = False
) -> tuple[jax.Array, dict, dict, dict]:
  """(loss, grads, {"batch_stats"}, stats) of a method without a target network whose loss
  reads the online outputs of both views: each view through the encoder in its own forward
  (so batch-norm statistics are those of one view's global batch), loss_of(out1, out2) ->
  (loss, stats), the embedding health of the two views' projections z1, z2
  (cl_jax.objectives.health.embedding_health), and with DICR lambda L_DICR of the two views
  (regularised).

  Args:
    addons: the run's add-ons (cl_jax.addons.from_config.AddOns).
    state: the TrainState; x: the step's Views.
    loss_of: the method's loss of the two views' encoder outputs (dicts with z, and p with
      predict), with its add-ons.
    predict: also run the predictor (SimSiam).
  """

  def loss_fn(params):
    out1, batch_stats = encode(encoder, params, state.batch_stats, x.v1, predict=predict)
    out2, batch_stats = encode(encoder, params, batch_stats, x.v2, predict=predict)
    loss, stats = loss_of(out1, out2)
    stats = {**stats, **embedding_health(out1["z"], out2["z"])}
    return regularised(
        addons.dicr, loss, stats, batch_stats, encoder, params, state.step, (out1, out2), x.regions
    )

  return online_step(loss_fn, state.params)
