"""Validation of a run config: every field is checked before anything runs.

Each error names the field, the value and the allowed range.
"""

import math

import ml_collections

from cl_jax.addons import dicr
from cl_jax.addons.nonsemantic import ALPHA_MODES
from cl_jax.data import photometric
from cl_jax.evaluators import MONITORS
from cl_jax.models import resnet
from cl_jax.objectives import METHODS
from cl_jax.objectives.forward import SHUFFLE_BN_MODES
from cl_jax.runtime.config_fields import ConfigError as ConfigError  # callers catch it here
from cl_jax.runtime.config_fields import boolean, choice, fail, get, integer, interval, number
from cl_jax.runtime.errors import UsageError

BN_MODES = ("sync", "local", "shuffle", "shuffle_stats")
NS_KINDS = ("patch", "texture")
LOOC_AUGMENTATIONS = ("colour", "rotation", "texture")
PROBE_FEATURES = ("backbone", "heads")
FT_NEGATIVE = ("none", "interpolate", "extrapolate", "hard")
FT_COEFFICIENTS = ("scalar", "dimension", "sample_dimension")
OPTIMIZERS = ("sgd", "lars")
PROBE_PROTOCOLS = ("fast", "logreg", "paper")
DTYPES = ("float32", "bfloat16")
# Named learning-rate recipes for MoCo-v2 on ImageNet-100 (lr, global batch).
LR_RECIPES = {
    "moco_0.03_b128": (0.03, 128),  # original MoCo lr, batch of Ge et al. App. C.1
    "ifm_0.8_b512": (0.8, 512),  # Robinson et al. 2021 IN-100 runs
    "custom": None,
}


def _check_queue(c, queue: int, keys_per_step: int) -> None:
  """The MoCo queue holds whole steps of keys (cl_jax.memory_queue's layout)."""
  if queue % keys_per_step:
    fail(
        "moco.queue_size",
        queue,
        f"must be divisible by the keys enqueued per step "
        f"({keys_per_step} = global batch"
        f"{' x 2 views (symmetric)' if keys_per_step > get(c, 'optim.batch_size') else ''})",
    )
  if queue < keys_per_step:
    fail("moco.queue_size", queue, f"must be at least the keys per step ({keys_per_step})")
  if (
      get(c, "ft.enabled")
      and get(c, "ft.negative") in ("interpolate", "extrapolate")
      and queue < 2 * keys_per_step
  ):
    fail(
        "moco.queue_size",
        queue,
        f"negative transforms pair keys of different steps: the "
        f"queue must hold at least 2 steps of keys ({2 * keys_per_step})",
    )


def _check_looc(c, method: str, symmetric: bool) -> None:
  """LooC (Xiao et al. 2021) is built on MoCo's asymmetric step, alone."""
  if method != "moco":
    fail(
        "looc.enabled", True, f"LooC is built on MoCo's key encoder and queue; method is {method!r}"
    )
  if symmetric:
    fail("moco.symmetric", True, "LooC contrasts one query view with its key views; set False")
  for addon in ("nonsemantic", "ft", "ifm"):
    if get(c, f"{addon}.enabled"):
      fail("looc.enabled", True, f"LooC does not combine with {addon}; switch off {addon}.enabled")
  augs = get(c, "looc.augmentations")
  if (
      not isinstance(augs, (tuple, list))
      or len(set(augs)) != len(augs)
      or not set(augs) <= set(LOOC_AUGMENTATIONS)
  ):
    fail(
        "looc.augmentations",
        augs,
        f"must be distinct names out of {', '.join(LOOC_AUGMENTATIONS)} (may be empty: one head)",
    )
  switches = {
      "colour": ("aug.jitter_prob", "aug.grayscale_prob"),
      "rotation": ("aug.rotation_prob",),
      "texture": ("aug.texture_prob",),
  }
  for aug in augs:
    if not any(get(c, p) > 0 for p in switches[aug]):
      fail(
          "looc.augmentations",
          augs,
          f"{aug!r} has a head but is never applied: set {' or '.join(switches[aug])} > 0",
      )
  boolean(c, "looc.conv5_heads")


def _check_dicr(c, method: str, symmetric: bool, size: int, epochs: int) -> None:
  """DICR (2025 submission, Sec. 3.2) regularises the online feature maps of both views."""
  if get(c, "looc.enabled"):
    fail("dicr.enabled", True, "DICR does not combine with LooC; switch off looc.enabled")
  if method == "moco" and not symmetric:
    fail(
        "moco.symmetric",
        False,
        "DICR needs both views through the query encoder, as in the paper's symmetric MoCo "
        "(its footnote 6); set moco.symmetric = True",
    )
  variant = choice(c, "dicr.variant", dicr.VARIANTS)
  number(c, "dicr.weight", 0.0, None, lo_open=True)
  integer(c, "dicr.warmup_epochs", 0, epochs)
  number(c, "dicr.temperature", 0.0, None, lo_open=True)
  number(c, "dicr.epsilon_area", 0.0, float(size * size))
  if variant == "dirr":
    number(c, "dicr.dirr_similarity", -1.0, 1.0)
  if variant == "icr":
    integer(c, "dicr.icr_layers", 1)


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


def _check_model(c) -> None:
  """The network (backbone, heads, predictor, BN) and the MoCo, SimCLR and BYOL blocks."""
  method = get(c, "method")
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
  if METHODS[method].predictor and predictor == 0:
    fail(
        "model.predictor_hidden_dim",
        predictor,
        f"method {method!r} needs a predictor: " "set the width of its hidden layer (> 0)",
    )
  if not METHODS[method].predictor and predictor:
    fail("model.predictor_hidden_dim", predictor, f"method {method!r} has no predictor; " "set 0")
  choice(c, "model.dtype", DTYPES)
  choice(c, "model.grad_reduce_dtype", DTYPES)
  choice(c, "model.bn_mode", BN_MODES)
  choice(c, "model.shuffle_bn_above_8_chips", ("",) + SHUFFLE_BN_MODES)
  integer(c, "model.bn_groups", 1)
  integer(c, "moco.queue_size", 1)
  number(c, "moco.temperature", 0.0, None, lo_open=True)
  number(c, "moco.momentum", 0.0, 1.0)
  boolean(c, "moco.symmetric")
  number(c, "simclr.temperature", 0.0, None, lo_open=True)
  number(c, "byol.base_momentum", 0.0, 1.0)


def _check_nonsemantic(c, method: str, reads_data: bool) -> None:
  """Non-semantic negatives (Ge et al. 2021): patch or texture images.

  reads_data=False skips the texture dataset's location, as for the dataset's.
  """
  if method == "simsiam":
    fail(
        "nonsemantic.enabled",
        True,
        "non-semantic negatives are defined for MoCo, SimCLR "
        "(Ge et al. 2021, Eq. 1) and BYOL (Eq. 2), not for SimSiam",
    )
  kind = choice(c, "nonsemantic.kind", NS_KINDS)
  num_ns = integer(c, "nonsemantic.num_ns", 1, 64)
  if kind == "texture" and num_ns != 1:
    fail("nonsemantic.num_ns", num_ns, "texture negatives are one image per view; set 1")
  if reads_data and kind == "texture" and not get(c, "data.texture_dir"):
    fail(
        "data.texture_dir",
        "",
        "texture negatives read the texture version of every image: make it with "
        "python -m cl_jax.data.make_texture and set data.texture_dir to its --out",
    )
  number(c, "nonsemantic.alpha", 0.0, None, lo_open=True)
  choice(c, "nonsemantic.alpha_mode", ALPHA_MODES)
  d_min = integer(c, "nonsemantic.patch_min", 1)
  d_max = integer(c, "nonsemantic.patch_max", 1)
  size = get(c, "data.image_size")
  if d_max > size:
    fail(
        "nonsemantic.patch_max",
        d_max,
        f"the patch size must not exceed the view " f"size data.image_size = {size}",
    )
  if d_min > d_max:
    fail("nonsemantic.patch_min", d_min, f"must be <= nonsemantic.patch_max = {d_max}")


def _check_ft(c, method: str) -> None:
  """Feature transformations: positive extrapolation, transformed negatives, their union."""
  if boolean(c, "ft.positive_interpolation") and not boolean(c, "ft.positive_extrapolation"):
    fail(
        "ft.positive_interpolation",
        True,
        "interpolation replaces the extrapolation coefficient: set ft.positive_extrapolation "
        "= True too",
    )
  boolean(c, "ft.positive_extrapolation")
  number(c, "ft.alpha_ex", 0.0, None, lo_open=True)
  negative = choice(c, "ft.negative", FT_NEGATIVE)
  for p in ("alpha_in", "hard_a", "hard_b"):
    number(c, f"ft.{p}", 0.0, None, lo_open=True)
  if method in ("byol", "simsiam") and negative != "none":
    fail(
        "ft.negative",
        negative,
        f"method {method!r} has no negatives: only positive "
        "extrapolation applies (App. E.2); set ft.negative = 'none'",
    )
  if method == "simclr" and negative == "hard":
    fail(
        "ft.negative",
        negative,
        "hard negatives (App. G.2) are built against the MoCo "
        "queue; for SimCLR use 'interpolate' or 'extrapolate'",
    )
  union = boolean(c, "ft.union")
  choice(c, "ft.coefficients", FT_COEFFICIENTS)
  boolean(c, "ft.renormalize")
  integer(c, "ft.start_epoch", 0, integer(c, "optim.epochs", 1) - 1)
  if union and negative == "none":
    fail(
        "ft.union",
        union,
        "the union needs transformed negatives: set ft.negative to "
        "'interpolate' or 'extrapolate'",
    )


def _check_addons(c, reads_data: bool) -> None:
  """The add-on blocks that are enabled, in order: hcl, nonsemantic, ft, ifm, dicr, looc."""
  method, symmetric = get(c, "method"), get(c, "moco.symmetric")
  if boolean(c, "hcl.enabled"):
    if method != "simclr":
      fail(
          "hcl.enabled",
          True,
          f"hard-negative sampling is implemented for SimCLR's "
          f"in-batch negatives; method is {method!r}",
      )
    number(c, "hcl.beta", 0.0, None)
    number(c, "hcl.tau_plus", 0.0, 1.0)
    if get(c, "hcl.tau_plus") >= 1.0:
      fail("hcl.tau_plus", get(c, "hcl.tau_plus"), "the class prior must be < 1")
    others = [f"{a}.enabled" for a in ("nonsemantic", "ifm", "ft") if get(c, f"{a}.enabled")]
    if others:
      fail(
          "hcl.enabled",
          True,
          f"hard-negative sampling is a comparator of its own; "
          f"switch off {' and '.join(others)} to use it",
      )
  if boolean(c, "nonsemantic.enabled"):
    _check_nonsemantic(c, method, reads_data)
  if boolean(c, "ft.enabled"):
    _check_ft(c, method)
  if boolean(c, "ifm.enabled"):
    if method in ("byol", "simsiam"):
      fail(
          "ifm.enabled",
          True,
          f"IFM perturbs the logits of an InfoNCE loss; method "
          f"{method!r} has none (use moco or simclr)",
      )
    number(c, "ifm.epsilon", 0.0, 2.0, lo_open=True)
    number(c, "ifm.alpha", 0.0, None)
  if boolean(c, "dicr.enabled"):
    _check_dicr(c, method, symmetric, get(c, "data.image_size"), integer(c, "optim.epochs", 1))
  if boolean(c, "looc.enabled"):
    _check_looc(c, method, symmetric)


def _check_optim(c) -> None:
  """The optimizer, the lr (a named recipe or base_lr scaling) and its schedule."""
  choice(c, "optim.optimizer", OPTIMIZERS)
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


def _check_batch_split(c, num_devices: int) -> None:
  """How the global batch splits over devices and BN groups, and the MoCo queue it fills."""
  method, batch = get(c, "method"), get(c, "optim.batch_size")
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
  if method != "moco":
    if bn_mode in SHUFFLE_BN_MODES:
      fail(
          "model.bn_mode",
          bn_mode,
          f"shuffle-BN belongs to MoCo's key encoder; method " f"{method!r} uses 'sync' or 'local'",
      )
  else:
    _check_queue(c, get(c, "moco.queue_size"), batch * (2 if get(c, "moco.symmetric") else 1))


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
  features = choice(c, "probe.features", PROBE_FEATURES)
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
  choice(c, "probe.protocol", PROBE_PROTOCOLS)
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
  _check_model(c)
  _check_addons(c, reads_data)
  _check_optim(c)
  _check_batch_split(c, num_devices)
  _check_train_eval(c)
  boolean(c, "log.wandb")
