"""Where a train step's memory goes: the online backward's saved residuals, the compiled step's
memory analysis, and the largest batch that fits a device of a given size.

python -m cl_jax.bench.memory --config=configs/mocov2.py:imagenet100 [--budget_gib=80] [--json]

1. Residuals: what autodiff keeps from the online encoder's forward (train-mode batch norm,
   the config's resolution and dtype) for its backward, read with JAX's own residual
   inspection (jax.ad_checkpoint's saved_residuals, the function behind
   print_saved_residuals) on abstract shapes: nothing is computed. Traced at two batch sizes,
   what grows with the batch is reported per image, split by dtype and by the primitive that
   produced it; the rest (the weights' compute-dtype copies, per-group statistics) is a fixed
   cost of the step.
2. The compiled lean train step's memory analysis (XLA's buffer assignment on this backend):
   argument, output, aliased (donated), temporary and peak bytes.
3. The largest batch whose step fits --budget_gib: the step is compiled (not run) at two
   batch sizes and its peak bytes fitted as fixed + per-image x batch. It is an estimate:
   another backend (a GPU's) assigns buffers and fuses differently, and the compiled step is
   this machine's.
"""

import collections
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags
from jax._src.ad_checkpoint import saved_residuals  # no public form returns the records

from cl_jax import config_check, train
from cl_jax.models.encoder import encoder_for
from cl_jax.objectives.forward import encode
from cl_jax.runtime import cli

_OP = re.compile(r"output of (?:jitted function '(\w+)'|(\w+))")


def _op_of(description: str) -> str:
  """The primitive (or jit(name)) a saved_residuals description names as the producer."""
  match = _OP.search(description)
  if match is None:
    return "other"
  return f"jit({match.group(1)})" if match.group(1) else match.group(2)


def _bytes_by(records: list) -> tuple[collections.Counter, collections.Counter, int]:
  """(bytes by dtype, bytes by "op dtype", bytes of the function's own arguments) of
  saved_residuals records (aval, description)."""
  by_dtype, by_op, arguments = collections.Counter(), collections.Counter(), 0
  for aval, description in records:
    nbytes = int(np.prod(aval.shape)) * aval.dtype.itemsize
    if description.startswith("from the argument"):
      arguments += nbytes
    else:
      by_dtype[str(aval.dtype)] += nbytes
      by_op[f"{_op_of(description)} {aval.dtype}"] += nbytes
  return by_dtype, by_op, arguments


def residual_table(records: dict[int, list]) -> dict:
  """Residual bytes per image and per step from saved_residuals records of the same forward
  at two batch sizes ({batch: records}): what grows with the batch is per image, the rest
  (weight casts, per-group statistics) is per step.

  Returns dict: per_image_bytes, by_dtype and by_op ({name: bytes per image}, largest first),
  fixed_bytes (per step, not growing with the batch) and argument_bytes (at the smaller batch:
  residuals that are the function's own arguments, such as the weights, held by the state
  anyway and counted in neither).
  """
  (b1, small), (b2, large) = sorted(records.items())
  (d1, o1, arguments), (d2, o2, _) = _bytes_by(small), _bytes_by(large)
  per_image = lambda c1, c2: {
      k: v
      for k, v in sorted(((k, (c2[k] - c1[k]) / (b2 - b1)) for k in c2), key=lambda i: -i[1])
      if v
  }
  by_dtype = per_image(d1, d2)
  total = sum(by_dtype.values())
  return {
      "per_image_bytes": total,
      "by_dtype": by_dtype,
      "by_op": per_image(o1, o2),
      "fixed_bytes": sum(d1.values()) - total * b1,
      "argument_bytes": arguments,
  }


def online_residuals(config: ml_collections.ConfigDict, batch: int) -> dict:
  """residual_table of the online encoder's forward (train-mode BN, predictor where the
  method has one) on normalised float32 views at config.data.image_size, traced at `batch`
  and twice `batch` images."""
  encoder = encoder_for(config)
  size = config.data.image_size
  variables = jax.eval_shape(
      lambda: encoder.init(jax.random.key(0), jnp.zeros((2, size, size, 3)), train=False)
  )
  predict = config.method in ("byol", "simsiam")

  def forward(params, batch_stats, images):
    out, _ = encode(encoder, params, batch_stats, images, predict=predict)
    return out["p" if predict else "z"].sum()

  records = {
      n: saved_residuals(
          forward,
          variables["params"],
          variables["batch_stats"],
          jax.ShapeDtypeStruct((n, size, size, 3), jnp.float32),
      )
      for n in (batch, 2 * batch)
  }
  return residual_table(records)


def compiled_step(config: ml_collections.ConfigDict, batch: int):
  """The lean train step of `config` at global `batch` on this machine's first device,
  lowered and compiled (not run)."""
  config = config.copy_and_resolve_references()
  config.optim.batch_size = batch
  step, state, data = train.synthetic_step(config, 1)
  return step.lower(state, data).compile()


def memory_analysis(compiled) -> dict:
  """The compiled program's buffer sizes in bytes: argument, output, alias (outputs that
  reuse a donated argument), temp, and peak = argument + output - alias + temp, what the
  program holds at once at most under its buffer assignment (XLA's own peak_memory_in_bytes
  is not reported by every backend: the CPU's counts the arguments only)."""
  stats = compiled.memory_analysis()
  out = {
      name: int(getattr(stats, f"{name}_size_in_bytes"))
      for name in ("argument", "output", "alias", "temp")
  }
  out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  return out


def largest_batch(peaks: dict[int, int], budget_bytes: float, multiple: int) -> dict:
  """Fits peak bytes = fixed + per_image x batch through two batch sizes ({batch: peak}) and
  returns dict(fixed_bytes, per_image_bytes, batch: the largest multiple of `multiple` whose
  fitted peak is at most budget_bytes, 0 if none)."""
  (b1, p1), (b2, p2) = sorted(peaks.items())
  per_image = (p2 - p1) / (b2 - b1)
  fixed = p1 - per_image * b1
  fits = int((budget_bytes - fixed) // per_image) if per_image > 0 else 0
  return {"fixed_bytes": fixed, "per_image_bytes": per_image, "batch": fits // multiple * multiple}


def measure(config: ml_collections.ConfigDict, budget_gib: float) -> dict:
  """device_kind, setup (words) and the three reports for config: residuals
  (online_residuals at the config's batch), memory (memory_analysis of the step at the
  config's batch) and largest_batch for budget_gib GiB, fitted through the config's batch
  and half of it."""
  batch = config.optim.batch_size
  multiple = max(config.model.bn_groups, 1)
  small = max(batch // 2 // multiple * multiple, multiple)
  if small == batch:
    small = 2 * batch
  config_check.validate(config, num_devices=1, reads_data=False)
  memory = memory_analysis(compiled_step(config, batch))
  other = memory_analysis(compiled_step(config, small))
  fit = largest_batch({batch: memory["peak"], small: other["peak"]}, budget_gib * 2**30, multiple)
  return {
      "device_kind": jax.devices()[0].device_kind,
      "setup": f"{setup(config, batch)} ({jax.default_backend()})",
      "residuals": online_residuals(config, batch),
      "memory": memory,
      "largest_batch": {**fit, "budget_gib": budget_gib, "fitted_batches": sorted([batch, small])},
  }


def setup(config, batch: int) -> str:
  """The measured step in words: its method, network, view size, dtype, batch and device."""
  return (
      f"{config.method}: {config.model.depth}-layer ResNet, {config.data.image_size} px, "
      f"{config.model.dtype}, global batch {batch}, one {jax.devices()[0].device_kind}"
  )


def format_report(result: dict) -> str:
  """The three reports as text tables (MB = 10^6 bytes, GiB = 2^30 bytes)."""
  res, mem, fit = result["residuals"], result["memory"], result["largest_batch"]
  mb = lambda b: f"{b / 1e6:.2f}"
  lines = [
      result["setup"],
      "",
      f"online backward residuals: {mb(res['per_image_bytes'])} MB per image "
      f"(+ {mb(res['fixed_bytes'])} MB per step without a batch axis)",
      "  by dtype: " + ", ".join(f"{k} {mb(v)}" for k, v in res["by_dtype"].items()),
      "  by op:    " + ", ".join(f"{k} {mb(v)}" for k, v in res["by_op"].items() if v >= 5e3),
      "",
      "compiled step (GiB): "
      + ", ".join(f"{k} {mem[k] / 2**30:.3f}" for k in ("argument", "output", "alias", "temp"))
      + f", peak {mem['peak'] / 2**30:.3f}",
      f"largest batch in {fit['budget_gib']:g} GiB (estimate, fitted at batches "
      f"{fit['fitted_batches']}): {fit['batch']} "
      f"({fit['per_image_bytes'] / 2**20:.1f} MiB per image + {fit['fixed_bytes'] / 2**30:.2f} "
      "GiB fixed)",
  ]
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run_measurement(
      lambda: flags.DEFINE_float(
          "budget_gib", 80.0, "Device memory for the largest batch, in GiB."
      ),
      lambda f: measure(f.config, f.budget_gib),
      format_report,
  )
