"""The start-up summary of a pretraining run: what runs where, printed before the first step."""

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

# The data line's note on the decoding path (data.decoder; "pil" has none).
_DECODERS = {
    "fast": "; fast decoder (libjpeg-turbo, PyTorch's resize)",
    "gpu": "; GPU decoder (nvImageCodec's crops, resized on the devices)",
}


def startup(
    config: ml_collections.ConfigDict,
    *,
    workdir: str,
    mesh: Mesh,
    start: int,
    steps_per_epoch: int,
    total: int,
    params,
    splits: str,
    notes: list[str],
    changes: list[str],
) -> str:
  """The lines printed when a run starts (or resumes at step `start`): splits, the sizes of
  the dataset's splits (cl_jax.data.sources.split_sizes); notes, the method's and the add-ons'
  one-line descriptions."""
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
      f"cl_jax pretraining: {config.method}" + "".join(f" + {a}" for a in notes),
      f"  workdir   {workdir} ({run})",
      f"  devices   {jax.process_count()} process(es), {devices} {platform} device(s); "
      f"mesh {dict(mesh.shape)}",
      f"  batch     {batch} global, {batch // devices} per device",
      f"  steps     {steps_per_epoch} per epoch x {config.optim.epochs} epochs = {total}",
      f"  model     {model}; {num_params / 1e6:.2f} M parameters",
      f"  data      {config.data.name} {config.data.image_size} px: "
      f"{splits}" + _DECODERS.get(config.data.decoder, ""),
  ]
  lines += [f"  changed   {change}" for change in changes]
  return "\n".join(lines)
