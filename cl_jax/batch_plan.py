"""The global batch and learning rate of a run on N chips: per-chip batches and the linear rule.

python -m cl_jax.batch_plan --config=configs/NAME.py[:preset] --chips=1,8,16,64 [--config.FIELD=V]

`optim.batch_per_chip` = b > 0 makes the batch follow the chips: a run on N data-parallel
devices takes a global batch of b x N, and its learning rate follows the global batch by the
linear scaling rule (Goyal et al. 2017) from the config's reference point, optim.lr at
optim.batch_size: lr(B) = optim.lr x B / optim.batch_size. A global batch above
optim.large_batch (1,024) trains with at least optim.large_batch_warmup_epochs (5) of linear
warm-up (at most epochs - 1), the gradual warm-up with which Goyal et al. (Sec. 2.2) keep the
linear rule working at large batches (16 chips of 128: batch 2,048 at lr 0.48, 5 warm-up
epochs). A config that names its reference
batch (optim.lr_reference_batch, the presets below) refuses an optim.batch_size other than it:
the batch is then set per chip. The full-size MoCo presets
(:imagenet100, :stl10, :folder) take b = 128 with the reference point of Ge et al. 2021, App.
C.1 (lr 0.03 at batch 128): one chip runs the paper's recipe, 8 chips batch 1,024 at lr 0.24.
`:imagenet100_b128` and `:stl10_b128` keep the paper's batch of 128 on any number of chips
(optim.batch_per_chip 0, as every other config: optim.batch_size is then the global batch).

On more than POD_CHIPS chips, a config whose model.shuffle_bn_above_8_chips names a shuffle-BN
mode runs MoCo's shuffle-BN in that mode (the ResNet-50 presets: "shuffle_stats", which moves
no key image between chips) wherever model.bn_mode is a shuffle mode; other bn_modes stay.

The trainer resolves a config this way before it validates it and stores the resolved values
in the run's config.json (cl_jax.train); this command prints, for each chip count, the per-chip
batch, the global batch and the lr the run would use. It reads the config only: no device, no
JAX computation.
"""

import ml_collections
from absl import app, flags

from cl_jax.runtime import cli
from cl_jax.runtime.errors import UsageError

POD_CHIPS = 8
_SHUFFLE = ("shuffle", "shuffle_stats")


def resolve(config: ml_collections.ConfigDict, devices: int) -> ml_collections.ConfigDict:
  """`config` for a run on `devices` data-parallel devices (module docstring): with
  optim.batch_per_chip = b > 0, a copy whose optim.batch_size is b x devices and whose optim.lr
  is optim.lr x b x devices / optim.batch_size; on more than POD_CHIPS devices, a copy whose
  shuffle bn_mode is model.shuffle_bn_above_8_chips where that is set; else `config` itself."""
  resolved = _resolve_batch(config, devices)
  pods = config.model.get("shuffle_bn_above_8_chips", "")
  if devices > POD_CHIPS and pods and config.model.bn_mode in _SHUFFLE:
    resolved = resolved.copy_and_resolve_references() if resolved is config else resolved
    resolved.model.bn_mode = pods
  return resolved


def _resolve_batch(config: ml_collections.ConfigDict, devices: int) -> ml_collections.ConfigDict:
  """resolve's batch and lr (module docstring)."""
  per_chip = config.optim.get("batch_per_chip", 0)
  if not per_chip:
    return config
  if config.optim.lr_recipe != "custom":
    raise UsageError(
        f"optim.lr_recipe={config.optim.lr_recipe!r} fixes the batch, but optim.batch_per_chip="
        f"{per_chip} makes it follow the chips: set optim.batch_per_chip=0, or "
        "optim.lr_recipe=custom"
    )
  reference = config.optim.get("lr_reference_batch", 0)
  if reference and config.optim.batch_size != reference:
    raise UsageError(
        f"optim.batch_size={config.optim.batch_size}: this config's batch follows the chips "
        f"(optim.batch_per_chip={per_chip}, lr {config.optim.lr:g} per {reference} images): set "
        "optim.batch_per_chip for the batch of each chip, or optim.batch_per_chip=0 and "
        "optim.lr_reference_batch=0 to fix the global batch"
    )
  resolved = config.copy_and_resolve_references()
  batch = per_chip * devices
  with resolved.ignore_type():
    resolved.optim.lr = float(config.optim.lr) * batch / config.optim.batch_size
  resolved.optim.batch_size = batch
  if reference:
    resolved.optim.lr_reference_batch = batch
  if "base_lr" in resolved.optim:  # the lr is no longer base_lr x batch / 256's reference
    resolved.optim.base_lr = resolved.optim.lr * 256 / batch
  if batch > config.optim.get("large_batch", batch):
    warmup = min(config.optim.get("large_batch_warmup_epochs", 0), config.optim.epochs - 1)
    resolved.optim.warmup_epochs = max(resolved.optim.warmup_epochs, warmup)
  return resolved


def plan(config: ml_collections.ConfigDict, chips: int) -> dict:
  """{"chips", "per_chip", "global_batch", "lr", "warmup_epochs", "bn_mode"} of `config` on
  `chips` devices."""
  resolved = resolve(config, chips)
  batch = resolved.optim.batch_size
  if batch % chips:
    raise UsageError(
        f"global batch {batch} does not split over {chips} chips: set optim.batch_per_chip"
    )
  return {
      "chips": chips,
      "per_chip": batch // chips,
      "global_batch": batch,
      "lr": float(resolved.optim.lr),
      "warmup_epochs": resolved.optim.warmup_epochs,
      "bn_mode": resolved.model.bn_mode,
  }


def line(p: dict) -> str:
  """One plan as the launch scripts' --dry-run prints it."""
  return (
      f"{p['chips']} chip{'s' if p['chips'] != 1 else ''}: per-chip batch {p['per_chip']}, "
      f"global batch {p['global_batch']}, lr {p['lr']:.6g}, warm-up {p['warmup_epochs']} "
      f"epochs, bn_mode {p['bn_mode']}"
  )


def _define_flags():
  cli.define_config_flag()
  flags.DEFINE_list("chips", ["1", "8", "16", "64"], "Chip counts (data-parallel devices).")


def main(argv):
  del argv
  f = flags.FLAGS
  with cli.report():
    try:
      counts = [int(c) for c in f.chips]
    except ValueError as e:
      raise UsageError(f"--chips={','.join(f.chips)}: give chip counts, e.g. 1,8") from e
    if any(c < 1 for c in counts):
      raise UsageError(f"--chips={','.join(f.chips)}: chip counts are at least 1")
    for c in counts:
      print(line(plan(f.config, c)))


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
