"""What the methods' objectives share: their inputs (Views), and the forward passes:
online features with their batch-norm update, no-gradient target features (with
shuffle-BN), and the non-semantic images of a batch of views."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from cl_jax.addons import nonsemantic


class Views(NamedTuple):
  """The step's inputs after on-device augmentation.

  v1, v2: (B, S, S, 3) float32 normalised views, rows sharded over `data`.
  r_key: PRNG key of the target forward (shuffle-BN permutations).
  r_ns: PRNG key of the non-semantic images.
  r_ft: PRNG key of the feature-transformation coefficients.
  """

  v1: jax.Array
  v2: jax.Array
  r_key: jax.Array
  r_ns: jax.Array
  r_ft: jax.Array


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


def encode_keys(encoder, params, batch_stats, images: jax.Array, rng: jax.Array, shuffle: bool):
  """Key / target features of `images`, in train-mode batch norm, without gradient.

  With shuffle=True the batch is permuted before the encoder and un-permuted
  after it (shuffle-BN, He et al. 2020 Sec. 3.3): with grouped batch norm,
  key i is normalised with the statistics of a random group of other images,
  not with those of the group that holds query i.

  Args:
    images: (N, S, S, 3) normalised views.
  Returns:
    ((N, d) unit keys, updated batch_stats).
  """
  if shuffle:
    perm = jax.random.permutation(rng, images.shape[0])
    images = images[perm]
  out, batch_stats = encode(encoder, params, batch_stats, images)
  z = out["z"]
  if shuffle:
    z = jnp.zeros_like(z).at[perm].set(z)
  return jax.lax.stop_gradient(z), batch_stats


def ns_features(
    encoder,
    params,
    batch_stats,
    views: jax.Array,
    rng: jax.Array,
    ns: ml_collections.ConfigDict,
    shuffle: bool,
):
  """Features of M patch-based NS images of each view (Ge et al. 2021, Sec. 2.3).

  Args:
    views: (B, S, S, 3) augmented views the NS images are built from.
    ns: the `nonsemantic` config block (num_ns, patch_min, patch_max).
  Returns:
    ((B, M, d) unit features without gradient, updated batch_stats).
  """
  r_patch, r_shuffle = jax.random.split(rng)
  images = nonsemantic.patch_negatives(r_patch, views, ns.num_ns, ns.patch_min, ns.patch_max)
  flat = images.reshape((-1,) + views.shape[1:])
  t, batch_stats = encode_keys(encoder, params, batch_stats, flat, r_shuffle, shuffle)
  return t.reshape(views.shape[0], ns.num_ns, -1), batch_stats
