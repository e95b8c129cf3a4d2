"""What the methods' objectives share: their inputs (Views), and the forward passes:
online features with their batch-norm update, no-gradient target features (with
shuffle-BN), and the features of the non-semantic images of a batch of views."""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax.addons import dicr, nonsemantic
from cl_jax.runtime import parallel


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


def encode(encoder, params, batch_stats, images: jax.Array, predict: bool = False):
  """Online forward in train-mode batch norm.

  Args:
    images: (N, S, S, 3) normalised views.
    predict: also return the predictor's output "p" (BYOL, SimSiam).
  Returns:
    (encoder outputs: dict with z (N, d) unit and, with predict, p (N, d); updated
    batch_stats).
  """
  out, mutated = encoder.apply(
      {"params": params, "batch_stats": batch_stats},
      images,
      train=True,
      predict=predict,
      mutable=["batch_stats"],
  )
  return out, mutated["batch_stats"]


def _unit_embedding(out: dict) -> jax.Array:
  return out["z"]


def encode_keys(
    encoder,
    params,
    batch_stats,
    images: jax.Array,
    rng: jax.Array,
    shuffle: bool,
    output: Callable[[dict], jax.Array] = _unit_embedding,
    mesh: Mesh | None = None,
):
  """Key / target features of `images`, in train-mode batch norm, without gradient.

  With shuffle=True the batch is permuted before the encoder and un-permuted
  after it (shuffle-BN, He et al. 2020 Sec. 3.3): with grouped batch norm,
  key i is normalised with the statistics of a random group of other images,
  not with those of the group that holds query i. The permuted batch is kept split over
  `mesh`'s data axis (given a mesh), so the key forward stays data-parallel: a random gather
  gives XLA no sharding to propagate, and it would otherwise run the whole batch on every
  device.

  Args:
    images: (N, S, S, 3) normalised views.
    output: picks the keys from the encoder's outputs, (N, ...) rows per image
      (default z, the unit embedding).
  Returns:
    ((N, d) unit keys (or output's (N, ...)), updated batch_stats).
  """
  if shuffle:
    perm = jax.random.permutation(rng, images.shape[0])
    images = _split_over(images[perm], mesh)
  out, batch_stats = encode(encoder, params, batch_stats, images)
  z = output(out)
  if shuffle:
    z = _split_over(jnp.zeros_like(z).at[perm].set(z), mesh)
  return jax.lax.stop_gradient(z), batch_stats


def _split_over(x: jax.Array, mesh: Mesh | None) -> jax.Array:
  """x with its rows constrained to be split over mesh's data axis (x itself without a mesh)."""
  return x if mesh is None else jax.lax.with_sharding_constraint(x, parallel.batch_sharding(mesh))


def ns_features(
    encoder,
    params,
    batch_stats,
    views: jax.Array,
    rng: jax.Array,
    ns: ml_collections.ConfigDict,
    shuffle: bool,
    texture: jax.Array | None = None,
    mesh: Mesh | None = None,
):
  """Features of the M NS images of each view (Ge et al. 2021, Sec. 2.2-2.3).

  ns.kind "patch": M patch-based NS images built from each augmented view
  (Sec. 2.3); "texture": M = 1, the view's texture image (Sec. 2.2), given.

  Args:
    views: (B, S, S, 3) augmented views the patch NS images are built from.
    ns: the `nonsemantic` config block (kind, num_ns, patch_min, patch_max).
    texture: (B, S, S, 3) the views' texture images under the views' own augmentation
      parameters (ns.kind "texture"), else None.
    mesh: the device mesh, which keeps a shuffled forward data-parallel (encode_keys).
  Returns:
    ((B, M, d) unit features without gradient, updated batch_stats).
  """
  r_patch, r_shuffle = jax.random.split(rng)
  if ns.kind == "texture":
    if texture is None:
      raise ValueError("nonsemantic.kind 'texture' needs the views' texture images")
    images, num = texture, 1
  else:
    images = nonsemantic.patch_negatives(r_patch, views, ns.num_ns, ns.patch_min, ns.patch_max)
    num = ns.num_ns
  flat = images.reshape((-1,) + views.shape[1:])
  t, batch_stats = encode_keys(encoder, params, batch_stats, flat, r_shuffle, shuffle, mesh=mesh)
  return t.reshape(views.shape[0], num, -1), batch_stats


def texture_of(x: Views, i: int) -> jax.Array | None:
  """The texture NS images of view i (0: v1, 1: v2), or None without texture negatives."""
  return x.textures[i] if x.textures else None
