"""Gradient-norm landscape: per-layer gradient L2 norm by epoch (Zhu et al. 2021, Fig. 4, App. C).

The train step logs, at every logged step, the L2 norm of each layer's gradient
under "grad_norm/<layer path>". The landscape averages them over the logged
steps of each epoch,

  G[l, e] = mean_{s logged, epoch(s) = e} ||grad_l(s)||_2,   epoch(s) = (s - 1) // steps_per_epoch

(steps count from 1), and draws G as a layers x epochs heat map with a log
colour scale: a smooth landscape along the epoch axis marks stable training,
a spiky one the collapse of too small an EMA momentum.

The logged keys come in the sorted order of a pytree's dict keys (stage4 before
stem), so the rows are put in network order from the encoder itself: the
order in which its forward pass first calls each module (network_order).
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np
from matplotlib import colors, ticker
from matplotlib.figure import Figure

from cl_jax.models.encoder import build_encoder

PREFIX = "grad_norm/"


class Landscape(NamedTuple):
  """layers: L layer paths (without PREFIX), in network order; epochs: (E,) int64
  consecutive epochs; norms: (L, E) float64 mean gradient norm, NaN where an epoch
  logged no norm of that layer."""

  layers: tuple[str, ...]
  epochs: np.ndarray
  norms: np.ndarray


def network_order(
    model: ml_collections.ConfigDict, image_size: int, heads: dict | None = None
) -> list[str]:
  """Module paths ("backbone/stem_conv", ...) of the encoder of the `model` config block,
  in the order its forward pass first calls them (traced abstractly: no arrays are made).
  heads: build_encoder's head arguments (cl_jax.models.encoder.head_layout of the run's
  config; None: one head)."""
  encoder = build_encoder(model, **(heads or {}))
  paths = []

  def record(next_fun, args, kwargs, context):
    if context.method_name == "__call__":
      paths.append("/".join(context.module.path))
    return next_fun(*args, **kwargs)

  example = jax.ShapeDtypeStruct((model.bn_groups, image_size, image_size, 3), jnp.float32)
  with nn.intercept_methods(record):
    jax.eval_shape(lambda x: encoder.init(jax.random.key(0), x, train=False), example)
  return list(dict.fromkeys(paths))


def layer_keys(records: Sequence[Mapping[str, Any]]) -> list[str]:
  """The "grad_norm/..." keys of the records, in order of first appearance."""
  return list(dict.fromkeys(k for r in records for k in r if k.startswith(PREFIX)))


def epoch_means(
    records: Sequence[Mapping[str, Any]], steps_per_epoch: int, order: Sequence[str] | None = None
) -> Landscape:
  """G[l, e] above, for the epochs from the first to the last that logged a gradient norm.

  Args:
    records: metrics.jsonl records (dicts with an int "step" >= 1 and float
      "grad_norm/<layer>" entries).
    steps_per_epoch: optimizer steps per epoch, >= 1.
    order: layer paths in network order (network_order) to sort the rows by;
      None keeps the records' key order.
  Raises:
    ValueError: no record holds a gradient norm, steps_per_epoch < 1, or a
      logged layer is not in `order`.
  """
  if steps_per_epoch < 1:
    raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
  keys = layer_keys(records)
  if not keys:
    raise ValueError(
        f"no record holds a '{PREFIX}<layer>' entry: the run logged no " "per-layer gradient norms"
    )
  if order is not None:
    rank = {layer: i for i, layer in enumerate(order)}
    unknown = [k[len(PREFIX) :] for k in keys if k[len(PREFIX) :] not in rank]
    if unknown:
      raise ValueError(
          f"logged layers {unknown} are not modules of the run's encoder: the "
          "metrics do not belong to this config's model"
      )
    keys.sort(key=lambda k: rank[k[len(PREFIX) :]])
  logged = [r for r in records if any(k in r for k in keys)]
  epoch_of = np.asarray([(r["step"] - 1) // steps_per_epoch for r in logged], dtype=np.int64)
  first, last = int(epoch_of.min()), int(epoch_of.max())
  sums = np.zeros((len(keys), last - first + 1))
  counts = np.zeros_like(sums)
  for r, e in zip(logged, epoch_of - first):
    for i, k in enumerate(keys):
      if k in r:
        sums[i, e] += r[k]
        counts[i, e] += 1
  with np.errstate(invalid="ignore", divide="ignore"):
    norms = np.where(counts > 0, sums / counts, np.nan)
  return Landscape(
      tuple(k[len(PREFIX) :] for k in keys), np.arange(first, last + 1, dtype=np.int64), norms
  )


def plot_landscape(landscape: Landscape, title: str) -> Figure:
  """Heat map of landscape.norms: layers (rows, first layer on top) x epochs (columns).

  Log colour scale over the positive norms; cells without a logged norm, or with
  a zero norm (which has no logarithm), are grey.
  """
  layers, epochs, norms = landscape
  positive = norms[np.isfinite(norms) & (norms > 0)]
  if positive.size == 0:
    raise ValueError(
        "every logged gradient norm is zero or missing: nothing to draw on a " "log scale"
    )
  height = min(2.5 + 0.16 * len(layers), 40.0)
  fig = Figure(figsize=(max(8.0, 4.0 + 0.25 * len(epochs)), height), layout="constrained")
  ax = fig.subplots()
  cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.75")
  mesh = ax.pcolormesh(
      np.append(epochs, epochs[-1] + 1) - 0.5,
      np.arange(len(layers) + 1) - 0.5,
      np.ma.masked_invalid(np.where(norms > 0, norms, np.nan)),
      cmap=cmap,
      norm=colors.LogNorm(vmin=positive.min(), vmax=positive.max()),
  )
  ax.set_yticks(np.arange(len(layers)), layers, fontsize=max(4.0, min(8.0, 400 / len(layers))))
  ax.invert_yaxis()
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  ax.set_xlabel("epoch")
  ax.set_ylabel("layer")
  ax.set_title(title, fontsize=10)
  fig.colorbar(mesh, ax=ax, label="mean gradient L2 norm")
  return fig
