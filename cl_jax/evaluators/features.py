"""Frozen features of a run's encoder: the one place the evaluators (cl_jax.evaluators) compute
them.

An Extractor holds what computing features of any variables of a run needs: its probe data
(the probe_train and test splits of config.data), the encoder's variables at initialisation,
the jitted feature function and the device mesh the features are computed on. Features are the
globally pooled backbone features of the online (query) encoder in eval mode (BN running
statistics), or with probe.features = "heads" LooC's head features concatenated; images are
normalised with the ImageNet mean and std (cl_jax.data.photometric) and seen in their
evaluation view (resize to size / data.eval_crop_fraction, centre crop).
"""

import functools
from typing import NamedTuple

import jax
import ml_collections
import numpy as np
import tqdm

from cl_jax.data import photometric, pipeline, sources
from cl_jax.data.rotated_source import RotatedSource
from cl_jax.models.encoder import encoder_for
from cl_jax.runtime import parallel
from cl_jax.state import init_variables

FEATURE_OUTPUTS = {"backbone": "pooled", "heads": "head_features"}


def features_fn(encoder, mean, std, which: str = "backbone"):
  """jit: uint8 images (b, S, S, 3) -> (b, D) float32 features (eval-mode BN): the pooled
  backbone features, or (which="heads") the heads' features concatenated (LooC++,
  cl_jax.models.encoder.Encoder's head_features)."""
  spec = photometric.PhotometricSpec(mean=mean, std=std)
  output = FEATURE_OUTPUTS[which]

  @jax.jit
  def features(variables, images):
    x = photometric.normalize(photometric.to_float(images), spec)
    return encoder.apply(variables, x, train=False)[output]

  return features


def sharded_features(features, variables, images: np.ndarray, mesh) -> jax.Array:
  """features(variables, images) for uint8 images (b, S, S, 3), data-parallel: the batch is
  padded with black images to a multiple of the mesh's devices, split over them, and the
  padding's rows dropped; (b, D) on the devices."""
  rows = len(images)
  pad = -rows % mesh.size
  images = np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)])
  return features(variables, jax.device_put(images, parallel.batch_sharding(mesh)))[:rows]


def extract(features, variables, dataset, label_names, desc: str | None, mesh=None):
  """Features and labels of every batch of `dataset` (numpy, in order), under a progress bar
  named `desc` (None: no bar). With `mesh`, each batch is computed data-parallel
  (sharded_features)."""
  feats, labels = [], {k: [] for k in label_names}
  bar = desc is None or jax.process_index() != 0
  for batch in tqdm.tqdm(dataset, desc=desc, leave=False, disable=bar):
    if mesh is not None:
      feats.append(np.asarray(sharded_features(features, variables, batch["image"], mesh)))
    else:
      feats.append(np.asarray(features(variables, batch["image"])))
    for k in label_names:
      labels[k].append(batch[k])
  return np.concatenate(feats), {k: np.concatenate(v) for k, v in labels.items()}


class Extractor(NamedTuple):
  """What computing the features of any variables of a run needs: its probe data, the
  encoder's variables at initialisation (a () -> {"params", "batch_stats"} function, replicated
  over the mesh; jax.eval_shape of it is the template of a checkpoint's variables), the feature
  function and the device mesh the features are computed on."""

  config: ml_collections.ConfigDict
  train_src: object
  test_src: object
  init_variables: object
  features: object
  mesh: object


def setup(config: ml_collections.ConfigDict, devices=None) -> Extractor:
  """The probe's data, initial variables and feature function for a run config; features are
  computed data-parallel over `devices` (default: all)."""
  mesh = parallel.make_mesh(devices)
  train_src = sources.open_source(config.data, "probe_train")
  test_src = sources.open_source(config.data, "test")
  encoder = encoder_for(config)
  init = jax.jit(
      functools.partial(init_variables, config.seed, encoder, config.data.image_size),
      out_shardings=parallel.replicated(mesh),
  )
  spec = photometric.PhotometricSpec()
  which = config.probe.get("features", "backbone")
  return Extractor(
      config, train_src, test_src, init, features_fn(encoder, spec.mean, spec.std, which), mesh
  )


def rotated(ctx: Extractor) -> Extractor:
  """`ctx` on the 4-way rotation task (cl_jax.data.rotated_source) of the same images: every
  image rotated by a random multiple of 90 degrees (train and test drawn with other seeds),
  labelled "rotation"."""
  seed = ctx.config.seed
  return ctx._replace(
      train_src=RotatedSource(ctx.train_src, seed), test_src=RotatedSource(ctx.test_src, seed + 1)
  )


def eval_features(ctx: Extractor, variables: dict, src, desc: str | None, labels=None):
  """(features (N, D), {label: (N,)}) of every image of `src` in its evaluation view (resize
  and centre crop), in order, computed data-parallel; `labels`: the label names to collect
  (default: those of ctx's probe data)."""
  d = ctx.config.data
  labels = tuple(ctx.train_src.num_classes) if labels is None else tuple(labels)
  dataset = pipeline.probe_dataset(
      src,
      labels,
      image_size=d.image_size,
      eval_crop_fraction=d.eval_crop_fraction,
      batch_size=ctx.config.probe.batch_size,
      train_views=False,
  )
  return extract(ctx.features, variables, dataset, labels, desc, ctx.mesh)


def on_local_devices(variables: dict, ctx: Extractor) -> dict:
  """The replicated encoder `variables` of a (possibly multi-process) run, copied onto ctx's
  mesh of this process's devices (setup(config, jax.local_devices()))."""
  replicated = parallel.replicated(ctx.mesh)
  return jax.tree.map(lambda x: jax.device_put(x.addressable_data(0), replicated), variables)
