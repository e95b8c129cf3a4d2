"""Validation of a run config: every field is checked before anything runs.

Each error names the field, the value and the allowed range.
"""

import math

import ml_collections

from cl_jax import addons, objectives, optim
from cl_jax.data import photometric
from cl_jax.evaluators import MONITORS, linear_probe
from cl_jax.evaluators import features as evaluator_features
from cl_jax.models import encoder, resnet
from cl_jax.objectives import METHODS
from cl_jax.objectives.forward import BN_MODES, SHUFFLE_BN_MODES
from cl_jax.runtime.config_fields import ConfigError as ConfigError  # callers catch it here
from cl_jax.runtime.config_fields import boolean, choice, fail, get, integer, interval, number
from cl_jax.runtime.errors import UsageError

# Named learning-rate recipes for MoCo-v2 on ImageNet-100 (lr, global batch).
LR_RECIPES = {
    "moco_0.03_b128": (0.03, 128),  # original MoCo lr, batch of Ge et al. App. C.1
    "ifm_0.8_b512": (0.8, 512),  # Robinson et al. 2021 IN-100 runs
    "custom": None,
}


def _check_gpu_decoder(c, name: str, reads_data: bool) -> None:
  """data.decoder=gpu (cl_jax.data.gpu_views): JPEG folders, no texture negatives, and where
  the data is read, nvImageCodec and a GPU."""
  from cl_jax.data import gpu_views

  if name != "folder":
    fail(
        "data.decoder",
        "gpu",
        f"it decodes the JPEG files of data.name=folder, not {name}: set data.decoder=pil",
    )
  if get(c, "nonsemantic.enabled") and get(c, "nonsemantic.kind") == "texture":
    fail(
        "data.decoder",
        "gpu",
        "texture negatives crop texture images decoded on the host: set data.decoder=fast",
    )
  reason = gpu_views.unavailable() if reads_data else None
  if reason:
    fail("data.decoder", "gpu", f"{reason}; or set data.decoder=fast")


def _check_data(c, reads_data: bool) -> None:
  """The dataset, its location, the view size and the augmentations."""
  from cl_jax.data import fast_views, sources  # light: imports no TensorFlow

  name = choice(c, "data.name", sources.DATASET_NAMES)
  choice(c, "data.bad_images", ("stop", "skip"))
  decoder = choice(c, "data.decoder", fast_views.DECODERS)
  missing = fast_views.missing_packages() if reads_data and decoder == "fast" else []
  if missing:
    fail(
        "data.decoder",
        decoder,
        f"it needs {' and '.join(missing)}, not installed here: {fast_views.INSTALL} "
        "(PyTorch's CPU build is enough), or set data.decoder=pil",
    )
  if decoder == "gpu":
    _check_gpu_decoder(c, name, reads_data)
  if reads_data and name == "folder" and not get(c, "data.folder"):
    fail("data.folder", "", "data.name folder reads your images: set data.folder to their folder")
  if reads_data and name not in ("trifeature", "folder") and not get(c, "data.data_dir"):
    fail(
        "data.data_dir",
        "",
        f"dataset {name} is read through TFDS: set data.data_dir "
        "to the directory where it was prepared",
    )
  integer(c, "data.image_size", 16, 1024)
  interval(c, "data.crop_scale", 1e-3, 1.0)
  number(c, "data.eval_crop_fraction", 0.0, 1.0, lo_open=True)
  integer(c, "data.workers", 0, 256)
  integer(c, "data.trifeature_seed", 0, 2**31 - 1)
  integer(c, "data.trifeature_train", 1)
  integer(c, "data.trifeature_test", 1)
  number(c, "data.trifeature_max_angle", 0.0, 180.0)
  number(c, "data.trifeature_texture_angle", 0.0, 360.0)
  for p in photometric.PROBABILITY_FIELDS:
    number(c, f"aug.{p}", 0.0, 1.0)
  for p in ("brightness", "contrast", "saturation"):
    number(c, f"aug.{p}", 0.0, 1.0)
  number(c, "aug.hue", 0.0, 0.5)
  interval(c, "aug.blur_sigma", 1e-3, 100.0)


def _check_model(c, method) -> None:
  """The network (backbone, heads, predictor, BN) for the entry `method` that trains it."""
  choice(c, "model.depth", resnet.DEPTHS)
  choice(c, "model.stem", ("imagenet", "cifar"))
  width = number(c, "model.width_multiplier", 0.0, 16.0, lo_open=True)
  if (64 * width) != int(64 * width) or 64 * width < 1:
    fail(
        "model.width_multiplier",
        width,
        f"64 x width_multiplier (the stem's channels) must be a positive integer, not "
        f"{64 * width:g}; use e.g. 0.125, 0.25, 0.5, 1, 2",
    )
  integer(c, "model.head_hidden_dim", 1)
  integer(c, "model.head_out_dim", 1)
  integer(c, "model.head_layers", 1, 3)
  boolean(c, "model.head_bn")
  boolean(c, "model.head_out_bn")
  predictor = integer(c, "model.predictor_hidden_dim", 0)
  if method.predictor and predictor == 0:
    fail(
        "model.predictor_hidden_dim",
        predictor,
        f"method {method.name!r} needs a predictor: set the width of its hidden layer (> 0)",
    )
  if not method.predictor and predictor:
    fail("model.predictor_hidden_dim", predictor, f"method {method.name!r} has no predictor; set 0")
  choice(c, "model.dtype", tuple(encoder.DTYPES))
  choice(c, "model.grad_reduce_dtype", tuple(encoder.DTYPES))
  choice(c, "model.bn_mode", BN_MODES)
  choice(c, "model.shuffle_bn_above_8_chips", ("",) + SHUFFLE_BN_MODES)
  integer(c, "model.bn_groups", 1)


def _check_optim(c) -> None:
  """The optimizer, the lr (a named recipe or base_lr scaling) and its schedule."""
  choice(c, "optim.optimizer", optim.OPTIMIZERS)
  integer(c, "optim.batch_per_chip", 0)
  integer(c, "optim.large_batch", 1)
  integer(c, "optim.large_batch_warmup_epochs", 0)
  integer(c, "optim.lr_reference_batch", 0)
  recipe = choice(c, "optim.lr_recipe", tuple(LR_RECIPES))
  if get(c, "optim.batch_per_chip") and recipe != "custom":
    fail(
        "optim.batch_per_chip",
        get(c, "optim.batch_per_chip"),
        f"the lr recipe {recipe!r} fixes the batch: set optim.batch_per_chip=0 or "
        "optim.lr_recipe=custom",
    )
  lr = number(c, "optim.lr", 0.0, None, lo_open=True)
  batch = integer(c, "optim.batch_size", 1)
  if LR_RECIPES[recipe] is not None and (lr, batch) != LR_RECIPES[recipe]:
    fail(
        "optim.lr_recipe",
        recipe,
        f"recipe fixes (lr, batch_size) = {LR_RECIPES[recipe]} "
        f"but the config has ({lr}, {batch}); set optim.lr_recipe = 'custom' to change them",
    )
  if "base_lr" in get(c, "optim"):
    base = number(c, "optim.base_lr", 0.0, None, lo_open=True)
    if not math.isclose(lr, base * batch / 256, rel_tol=1e-9):
      fail(
          "optim.lr",
          lr,
          f"this config scales the lr with the batch, optim.base_lr x "
          f"optim.batch_size / 256 = {base * batch / 256:g}: set optim.base_lr instead",
      )
  number(c, "optim.momentum", 0.0, 1.0)
  number(c, "optim.weight_decay", 0.0, 1.0)
  epochs = integer(c, "optim.epochs", 1)
  warmup = integer(c, "optim.warmup_epochs", 0, epochs - 1)
  schedule = choice(c, "optim.schedule", ("cosine", "step"))
  lr_decay = get(c, "optim.decay_epochs")
  if schedule == "step" and (
      not isinstance(lr_decay, (tuple, list))
      or list(lr_decay) != sorted(set(lr_decay))
      or not all(isinstance(e, int) and warmup < e < epochs for e in lr_decay)
  ):
    fail(
        "optim.decay_epochs",
        lr_decay,
        f"the step schedule needs increasing integer epochs in (optim.warmup_epochs = "
        f"{warmup}, optim.epochs = {epochs})",
    )


def _check_batch_split(c, method, num_devices: int) -> None:
  """How the global batch splits over devices and BN groups (and shuffle-BN's groups)."""
  batch = get(c, "optim.batch_size")
  bn_mode, groups = get(c, "model.bn_mode"), get(c, "model.bn_groups")
  if batch % num_devices:
    fail("optim.batch_size", batch, f"must be divisible by the number of devices ({num_devices})")
  if bn_mode == "sync" and groups != 1:
    fail(
        "model.bn_groups",
        groups,
        "bn_mode 'sync' takes statistics over the whole global "
        "batch; set model.bn_groups = 1 (or bn_mode 'local' for grouped statistics)",
    )
  if bn_mode != "sync" and groups < 2:
    fail(
        "model.bn_groups",
        groups,
        f"bn_mode {bn_mode!r} needs at least 2 groups (one " "group is bn_mode 'sync')",
    )
  if batch % groups:
    fail("model.bn_groups", groups, f"must divide optim.batch_size = {batch}")
  if groups % num_devices and num_devices % groups:
    fail(
        "model.bn_groups",
        groups,
        f"must be a multiple or a divisor of the number of "
        f"devices ({num_devices}), so that groups map onto devices",
    )
  if not method.shuffle_bn and bn_mode in SHUFFLE_BN_MODES:
    fail(
        "model.bn_mode",
        bn_mode,
        f"shuffle-BN belongs to MoCo's key encoder; method {method.name!r} uses 'sync' or 'local'",
    )


def _check_train_eval(c) -> None:
  """Logging, checkpoints, monitors, health thresholds and the linear probe after pretraining."""
  for p in ("log_every", "checkpoint_every", "keep_checkpoints"):
    integer(c, f"train.{p}", 1)
  integer(c, "train.score_queries", 0)
  number(c, "train.max_param_growth", 1.0, None, lo_open=True)
  number(c, "train.stall_timeout_s", 0.0, None)
  integer(c, "eval.every", 0)
  for name in c.eval.evaluators:
    if name not in MONITORS:
      raise UsageError(
          f"eval.evaluators: {name!r} cannot run during pretraining; those that can: "
          f"{', '.join(MONITORS)} (the others: python -m cl_jax.evaluate after it)"
      )
  integer(c, "eval.knn_k", 1)
  number(c, "eval.knn_temperature", 0.0, None, lo_open=True)
  number(c, "health.min_std_sqrt_d", 0.0, 1.0)
  number(c, "health.min_rank", 0.0, None)  # 0: no rank warning
  boolean(c, "probe.after_pretrain")
  features = choice(c, "probe.features", tuple(evaluator_features.FEATURE_OUTPUTS))
  boolean(c, "probe.rotation")
  if features == "heads" and not (
      get(c, "looc.enabled") and (get(c, "looc.augmentations") or get(c, "looc.conv5_heads"))
  ):
    fail(
        "probe.features",
        features,
        "head features exist with LooC's extra heads or conv5 heads (looc.enabled, with "
        "looc.augmentations or looc.conv5_heads)",
    )
  choice(c, "probe.protocol", linear_probe.PROTOCOLS)
  integer(c, "probe.batch_size", 1)
  probe_epochs = integer(c, "probe.epochs", 1)
  number(c, "probe.lr", 0.0, None, lo_open=True)
  number(c, "probe.weight_decay", 0.0, 1.0)
  decay = get(c, "probe.decay_epochs")
  if (
      not isinstance(decay, (tuple, list))
      or list(decay) != sorted(decay)
      or not all(isinstance(e, int) and 0 < e < probe_epochs for e in decay)
  ):
    fail(
        "probe.decay_epochs",
        decay,
        f"must be increasing integers in (0, probe.epochs = {probe_epochs})",
    )


def validate(
    c: ml_collections.ConfigDict, num_devices: int = 1, *, reads_data: bool = True
) -> None:
  """Raise ConfigError for the first invalid field of config `c`.

  num_devices: devices on the `data` mesh axis. reads_data=False skips the
  dataset location check (for jobs that never open the dataset, the benchmark).
  """
  choice(c, "method", tuple(METHODS))
  integer(c, "seed", 0, 2**31 - 1)
  _check_data(c, reads_data)
  for entry in objectives.ENTRIES:  # every method's block, the run's or not
    if entry.check is not None:
      entry.check(c)
  method = objectives.method_of(c)
  _check_model(c, method)
  addons.check(c, method, objectives.ENTRIES, reads_data)
  _check_optim(c)
  _check_batch_split(c, method, num_devices)
  if method.rules is not None:
    method.rules(c)
  _check_train_eval(c)
  boolean(c, "log.wandb")
