"""Export the pretrained backbone of a run's checkpoint for use outside cl_jax.

python -m cl_jax.export --workdir=W --format=torchvision|flax [--step=N] [--out=PATH]

Only the ResNet backbone of the online (query) encoder is exported, its params and BN
statistics, not the projection heads, predictor, EMA target or queue.
  torchvision  W/export/backbone_step<N>.safetensors: torchvision's resnet18 / resnet50
               state dict without fc.* (cl_jax.models.torchvision_export says how to load it), the
               run's facts in the safetensors metadata (all strings).
  flax         W/export/backbone_step<N>.msgpack: flax.serialization.msgpack_serialize of
               {"params", "batch_stats"} (numpy float32) of cl_jax.models.resnet.ResNet, and
               beside it <that path>.json: depth, stem, width, stages, input normalisation
               and how to load it. A LooC++ backbone (conv4 only, stages 3) exports here.
Either way the network expects what the probe and kNN jobs feed it
(cl_jax.evaluators.features.features_fn): RGB images scaled to [0, 1] (uint8 / 255), then
(x - mean) / std per channel with PhotometricSpec's ImageNet mean and std, whatever the
run's augmentations; its output is the globally average-pooled last stage ("pooled").
Files are written to a temporary file beside the destination and renamed, so a failed
export never leaves a partial file under the final name.
"""

import functools
import json
import os

import flax.serialization
import jax
import ml_collections
import numpy as np
import safetensors.numpy
from absl import app, flags
from etils import epath

from cl_jax.data import photometric
from cl_jax.models import torchvision_export
from cl_jax.models.encoder import Encoder, encoder_for
from cl_jax.models.torchvision_export import TORCHVISION_DEPTHS, arch_name, torchvision_state_dict
from cl_jax.runtime import checkpoint, cli, parallel, run_config, write_faults
from cl_jax.runtime.errors import UsageError
from cl_jax.runtime.metrics import write_atomically
from cl_jax.state import init_variables

# Format -> file suffix.
FORMATS = {"torchvision": ".safetensors", "flax": ".msgpack"}


def restore_online(
    config: ml_collections.ConfigDict, encoder: Encoder, workdir: str, step: int | None = None
) -> tuple[int, dict]:
  """(step, {"params", "batch_stats"} of the online encoder as numpy arrays) of checkpoint
  `step` (default: the latest) of the run in `workdir`, of config `config` and encoder
  `encoder` (encoder_for(config)); read onto one device."""
  mesh = parallel.make_mesh(jax.local_devices()[:1])
  init = jax.jit(
      functools.partial(init_variables, config.seed, encoder, config.data.image_size),
      out_shardings=parallel.replicated(mesh),
  )
  step, variables = checkpoint.restore_encoder(workdir, init, step)
  return step, jax.tree.map(np.asarray, variables)


def description(
    config: ml_collections.ConfigDict, encoder: Encoder, step: int, workdir: str
) -> dict:
  """What an exported backbone is and what input it expects (JSON-ready)."""
  backbone = encoder.backbone
  spec = photometric.PhotometricSpec()
  return {
      "depth": backbone.depth,
      "stem": backbone.stem,
      "width_multiplier": backbone.width_multiplier,
      "stages": backbone.stages,
      "feature_dim": backbone.feature_dim,
      "dtype": "float32",
      "run_compute_dtype": config.model.dtype,
      "step": step,
      "workdir": workdir if "://" in workdir else os.path.abspath(workdir),
      "input": "RGB in [0, 1] (uint8 / 255), then (x - mean) / std per channel",
      "mean": list(spec.mean),
      "std": list(spec.std),
  }


def safetensors_metadata(about: dict) -> dict[str, str]:
  """The safetensors metadata (strings only) of a torchvision export described by `about`."""
  metadata = {"format": "torchvision", "arch": arch_name(about["depth"])}
  metadata["load"] = torchvision_export.loading_line(
      about["depth"], about["stem"], about["width_multiplier"]
  )
  for key, value in about.items():
    metadata[key] = value if isinstance(value, str) else json.dumps(value)
  return metadata


def flax_sidecar(about: dict, path: str) -> dict:
  """The JSON beside a flax export at `path`: `about` plus how to load it."""
  module = (
      f"cl_jax.models.resnet.ResNet(depth={about['depth']}, stem={about['stem']!r}, "
      f"width_multiplier={about['width_multiplier']}, stages={about['stages']})"
  )
  return {
      "format": "flax",
      **about,
      "layout": "NHWC images (B, H, W, 3) float32",
      "load": (
          f"variables = flax.serialization.msgpack_restore(open({os.path.basename(path)!r}, "
          f"'rb').read()); pooled = {module}.apply(variables, images, train=False)['pooled']"
          f"  # (B, {about['feature_dim']})"
      ),
  }


def export(workdir: str, fmt: str, step: int | None = None, out: str | None = None) -> dict:
  """Write the backbone of checkpoint `step` (default: the latest) of the run in `workdir` in
  format `fmt` to `out` (default: workdir/export/backbone_step<N><suffix>).

  Returns:
    {"path", "format", "step", "tensors" (entries written), "parameters" (learned values,
    conv kernels and BN scales and biases; BN statistics not counted)}.
  """
  if fmt not in FORMATS:
    raise UsageError(
        f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}: torchvision writes a "
        "safetensors state dict for torchvision's ResNet, flax a msgpack of the Flax variables"
    )
  config = run_config.read(workdir)
  write_faults.check_writable(
      os.path.dirname(os.path.abspath(out)) if out else f"{workdir}/export", "the export"
  )
  encoder = encoder_for(config)
  if fmt == "torchvision" and encoder.backbone.stages != 4:
    raise UsageError(
        f"the backbone of {workdir} stops after conv4 (LooC++, looc.conv5_heads: each "
        "projection head has its own conv5), which torchvision's ResNet cannot hold; "
        "use --format=flax to export it"
    )
  if fmt == "torchvision" and config.model.depth not in TORCHVISION_DEPTHS:
    raise UsageError(
        f"the backbone of {workdir} is a ResNet-{config.model.depth}, which torchvision does "
        f"not build (it has ResNet-{' and ResNet-'.join(map(str, TORCHVISION_DEPTHS))}); "
        "use --format=flax to export it"
    )
  step, variables = restore_online(config, encoder, workdir, step)
  params, stats = variables["params"]["backbone"], variables["batch_stats"]["backbone"]
  path = out or str(epath.Path(workdir) / "export" / f"backbone_step{step}{FORMATS[fmt]}")
  about = description(config, encoder, step, workdir)
  if fmt == "torchvision":
    tensors = torchvision_state_dict(params, stats, encoder.backbone.depth)
    data = safetensors.numpy.save(tensors, metadata=safetensors_metadata(about))
    count = len(tensors)
  else:
    tree = {"params": params, "batch_stats": stats}
    data = flax.serialization.msgpack_serialize(tree)
    count = len(jax.tree.leaves(tree))
  epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
  write_atomically(path, data)
  if fmt == "flax":
    write_atomically(f"{path}.json", json.dumps(flax_sidecar(about, path), indent=2))
  backbone = encoder.backbone
  return {
      "path": path,
      "format": fmt,
      "step": step,
      "tensors": count,
      "parameters": sum(x.size for x in jax.tree.leaves(params)),
      "load": (
          torchvision_export.loading_line(backbone.depth, backbone.stem, backbone.width_multiplier)
          if fmt == "torchvision"
          else f"load it with flax.serialization.msgpack_restore; {path}.json describes it"
      ),
  }


def _define_flags():
  """The command's flags (defined only when it runs as a program, so that importing this module
  next to the other commands defines no flag twice)."""
  flags.DEFINE_string("workdir", None, "Run directory with a checkpoint.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).", lower_bound=1)
  flags.DEFINE_string(
      "format",
      None,
      "torchvision (safetensors state dict of torchvision's ResNet) or flax (msgpack of the "
      "Flax variables).",
  )
  flags.DEFINE_string(
      "out", None, "Output file (default: <workdir>/export/backbone_step<N>.safetensors|.msgpack)."
  )


def main(argv):
  f = flags.FLAGS
  cli.start_reader(argv, f.workdir, "export from")
  with cli.report():
    if f.format is None:
      raise UsageError(f"--format is required: one of {', '.join(FORMATS)}")
    result = export(f.workdir, f.format, f.step, f.out)
    print(
        f"wrote {result['path']} ({result['format']}, step {result['step']}): "
        f"{result['tensors']} tensors, {result['parameters']:,} parameters"
    )
    print(result["load"])


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
