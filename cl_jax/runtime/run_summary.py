"""The start-up summary of a pretraining run: what runs where, printed before the first step."""

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from cl_jax.runtime.errors import UsageError

# The data line's note on the decoding path (data.decoder; "pil" has none).
_DECODERS = {
    "fast": "; fast decoder (libjpeg-turbo, PyTorch's resize)",
    "gpu": "; GPU decoder (nvImageCodec's crops, resized on the devices)",
}


def addons(config: ml_collections.ConfigDict) -> list[str]:
  """The add-ons a config switches on, each with its main settings."""
  out = []
  if config.nonsemantic.enabled:
    ns = config.nonsemantic
    source = (
        f"patch {ns.patch_min}-{ns.patch_max} px"
        if ns.kind == "patch"
        else f"from {config.data.texture_dir}"
    )
    out.append(
        f"non-semantic negatives ({ns.kind}, {ns.num_ns} per query, alpha {ns.alpha} "
        f"{ns.alpha_mode}, {source})"
    )
  if config.ft.enabled:
    positive = "interpolation" if config.ft.positive_interpolation else "extrapolation"
    parts = ([f"positive {positive}"] if config.ft.positive_extrapolation else []) + (
        [f"negative {config.ft.negative}"] if config.ft.negative != "none" else []
    )
    out.append(f"feature transformation ({', '.join(parts) or 'nothing transformed'})")
  if config.ifm.enabled:
    out.append(f"implicit feature modification (epsilon {config.ifm.epsilon})")
  if config.looc.enabled:
    augs = ", ".join(config.looc.augmentations) or "none"
    plus = "LooC++: conv5 heads, " if config.looc.conv5_heads else ""
    out.append(f"leave-one-out heads ({plus}{1 + len(config.looc.augmentations)} heads: {augs})")
  dicr = config.get("dicr")
  if dicr is not None and dicr.enabled:
    variant = {"dicr": "DICR", "dirr": f"DIRR, s {dicr.dirr_similarity}"}.get(
        dicr.variant, f"ICR, {dicr.icr_layers}-layer projector"
    )
    out.append(
        f"intra-image regularisation ({variant}, lambda {dicr.weight} reached at epoch "
        f"{dicr.warmup_epochs}, tau {dicr.temperature}, epsilon {dicr.epsilon_area} px)"
    )
  if config.hcl.enabled:
    out.append(f"hard-negative sampling (beta {config.hcl.beta}, tau+ {config.hcl.tau_plus})")
  return out


def split_sizes(config: ml_collections.ConfigDict, pretrain_size: int) -> str:
  """'pretrain N, probe train N, test N' of the run's dataset."""
  from cl_jax.data import sources

  sizes = {"pretrain": str(pretrain_size)}
  for role in ("probe_train", "test"):
    if config.data.name == "trifeature":
      sizes[role] = str(
          config.data.trifeature_test if role == "test" else config.data.trifeature_train
      )
    else:
      try:
        sizes[role] = str(len(sources.open_source(config.data, role)))
      except UsageError:
        sizes[role] = "not prepared"
  return ", ".join(f"{role.replace('_', ' ')} {n}" for role, n in sizes.items())


def startup(
    config: ml_collections.ConfigDict,
    *,
    workdir: str,
    mesh: Mesh,
    start: int,
    steps_per_epoch: int,
    total: int,
    params,
    pretrain_size: int,
    changes: list[str],
) -> str:
  """The lines printed when a run starts (or resumes at step `start`)."""
  devices = mesh.devices.size
  platform = mesh.devices.flat[0].platform
  batch = config.optim.batch_size
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  m = config.model
  model = (
      f"ResNet-{m.depth} ({m.stem} stem, width x{m.width_multiplier}, {m.dtype}), "
      f"{m.head_layers}-layer head -> {m.head_out_dim}"
      + (f", predictor {m.predictor_hidden_dim}" if m.predictor_hidden_dim else "")
  )
  run = f"resuming from the checkpoint at step {start} of {total}" if start else "new run"
  lines = [
      f"cl_jax pretraining: {config.method}" + "".join(f" + {a}" for a in addons(config)),
      f"  workdir   {workdir} ({run})",
      f"  devices   {jax.process_count()} process(es), {devices} {platform} device(s); "
      f"mesh {dict(mesh.shape)}",
      f"  batch     {batch} global, {batch // devices} per device",
      f"  steps     {steps_per_epoch} per epoch x {config.optim.epochs} epochs = {total}",
      f"  model     {model}; {num_params / 1e6:.2f} M parameters",
      f"  data      {config.data.name} {config.data.image_size} px: "
      f"{split_sizes(config, pretrain_size)}" + _DECODERS.get(config.data.decoder, ""),
  ]
  lines += [f"  changed   {change}" for change in changes]
  return "\n".join(lines)
