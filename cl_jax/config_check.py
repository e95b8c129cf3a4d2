"""Validation of a run config: every field is checked before anything runs.

Each error names the field, the value and the allowed range.
"""

import math

import ml_collections

from cl_jax.addons import dicr
from cl_jax.data import photometric
from cl_jax.evaluators import MONITORS
from cl_jax.runtime.errors import UsageError

METHODS = ("moco", "simclr", "byol", "simsiam")
BN_MODES = ("sync", "local", "shuffle")
NS_KINDS = ("patch", "texture")
LOOC_AUGMENTATIONS = ("colour", "rotation", "texture")
PROBE_FEATURES = ("backbone", "heads")
ALPHA_MODES = ("in", "out")
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


class ConfigError(UsageError, ValueError):
  """A config field holds a value outside its allowed range."""


def _fail(field: str, value, allowed: str):
  raise ConfigError(f"config field {field} = {value!r} is invalid: {allowed}")


def _get(c, path: str):
  node = c
  for part in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise ConfigError(f"config field {path} is missing")
    node = node[part]
  return node


def _int(c, path, lo=None, hi=None):
  v = _get(c, path)
  if isinstance(v, bool) or not isinstance(v, int):
    _fail(path, v, "must be an integer")
  if (lo is not None and v < lo) or (hi is not None and v > hi):
    _fail(path, v, f"must be an integer in [{lo}, {hi if hi is not None else 'inf'}]")
  return v


def _float(c, path, lo=None, hi=None, lo_open=False):
  v = _get(c, path)
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    _fail(path, v, "must be a finite number")
  below = v <= lo if lo_open else v < lo if lo is not None else False
  if below or (hi is not None and v > hi):
    left = "(" if lo_open else "["
    _fail(path, v, f"must be in {left}{lo}, {hi if hi is not None else 'inf'}]")
  return float(v)


def _choice(c, path, allowed):
  v = _get(c, path)
  if v not in allowed:
    _fail(path, v, f"must be one of {', '.join(map(str, allowed))}")
  return v


def _bool(c, path):
  v = _get(c, path)
  if not isinstance(v, bool):
    _fail(path, v, "must be True or False")
  return v


def _range(c, path, lo, hi):
  v = _get(c, path)
  if (
      not isinstance(v, (tuple, list))
      or len(v) != 2
      or not all(isinstance(x, (int, float)) for x in v)
      or not lo <= v[0] <= v[1] <= hi
  ):
    _fail(path, v, f"must be a pair (a, b) with {lo} <= a <= b <= {hi}")
  return tuple(v)


def _dataset_names():
  from cl_jax.data import sources  # light: imports no TensorFlow

  return sources.DATASET_NAMES


def _check_queue(c, queue: int, keys_per_step: int) -> None:
  """The MoCo queue holds whole steps of keys (cl_jax.memory_queue's layout)."""
  if queue % keys_per_step:
    _fail(
        "moco.queue_size",
        queue,
        f"must be divisible by the keys enqueued per step "
        f"({keys_per_step} = global batch"
        f"{' x 2 views (symmetric)' if keys_per_step > _get(c, 'optim.batch_size') else ''})",
    )
  if queue < keys_per_step:
    _fail("moco.queue_size", queue, f"must be at least the keys per step ({keys_per_step})")
  if (
      _get(c, "ft.enabled")
      and _get(c, "ft.negative") in ("interpolate", "extrapolate")
      and queue < 2 * keys_per_step
  ):
    _fail(
        "moco.queue_size",
        queue,
        f"negative transforms pair keys of different steps: the "
        f"queue must hold at least 2 steps of keys ({2 * keys_per_step})",
    )


def _check_looc(c, method: str, symmetric: bool) -> None:
  """LooC (Xiao et al. 2021) is built on MoCo's asymmetric step, alone."""
  if method != "moco":
    _fail(
        "looc.enabled", True, f"LooC is built on MoCo's key encoder and queue; method is {method!r}"
    )
  if symmetric:
    _fail("moco.symmetric", True, "LooC contrasts one query view with its key views; set False")
  for addon in ("nonsemantic", "ft", "ifm"):
    if _get(c, f"{addon}.enabled"):
      _fail("looc.enabled", True, f"LooC does not combine with {addon}; switch off {addon}.enabled")
  augs = _get(c, "looc.augmentations")
  if (
      not isinstance(augs, (tuple, list))
      or len(set(augs)) != len(augs)
      or not set(augs) <= set(LOOC_AUGMENTATIONS)
  ):
    _fail(
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
    if not any(_get(c, p) > 0 for p in switches[aug]):
      _fail(
          "looc.augmentations",
          augs,
          f"{aug!r} has a head but is never applied: set {' or '.join(switches[aug])} > 0",
      )
  _bool(c, "looc.conv5_heads")


def _check_dicr(c, method: str, symmetric: bool, size: int, epochs: int) -> None:
  """DICR (2025 submission, Sec. 3.2) regularises the online feature maps of both views."""
  if _get(c, "looc.enabled"):
    _fail("dicr.enabled", True, "DICR does not combine with LooC; switch off looc.enabled")
  if method == "moco" and not symmetric:
    _fail(
        "moco.symmetric",
        False,
        "DICR needs both views through the query encoder, as in the paper's symmetric MoCo "
        "(its footnote 6); set moco.symmetric = True",
    )
  variant = _choice(c, "dicr.variant", dicr.VARIANTS)
  _float(c, "dicr.weight", 0.0, None, lo_open=True)
  _int(c, "dicr.warmup_epochs", 0, epochs)
  _float(c, "dicr.temperature", 0.0, None, lo_open=True)
  _float(c, "dicr.epsilon_area", 0.0, float(size * size))
  if variant == "dirr":
    _float(c, "dicr.dirr_similarity", -1.0, 1.0)
  if variant == "icr":
    _int(c, "dicr.icr_layers", 1)


def validate(
    c: ml_collections.ConfigDict, num_devices: int = 1, *, reads_data: bool = True
) -> None:
  """Raise ConfigError for the first invalid field of config `c`.

  num_devices: devices on the `data` mesh axis. reads_data=False skips the
  dataset location check (for jobs that never open the dataset, the benchmark).
  """
  method = _choice(c, "method", METHODS)
  _int(c, "seed", 0, 2**31 - 1)

  name = _choice(c, "data.name", _dataset_names())
  if reads_data and name != "trifeature" and not _get(c, "data.data_dir"):
    _fail(
        "data.data_dir",
        "",
        f"dataset {name} is read through TFDS: set data.data_dir "
        "to the directory where it was prepared",
    )
  size = _int(c, "data.image_size", 16, 1024)
  _range(c, "data.crop_scale", 1e-3, 1.0)
  _float(c, "data.eval_crop_fraction", 0.0, 1.0, lo_open=True)
  _int(c, "data.workers", 0, 256)
  _int(c, "data.trifeature_seed", 0, 2**31 - 1)
  _int(c, "data.trifeature_train", 1)
  _int(c, "data.trifeature_test", 1)
  _float(c, "data.trifeature_max_angle", 0.0, 180.0)
  _float(c, "data.trifeature_texture_angle", 0.0, 360.0)

  for p in photometric.PROBABILITY_FIELDS:
    _float(c, f"aug.{p}", 0.0, 1.0)
  for p in ("brightness", "contrast", "saturation"):
    _float(c, f"aug.{p}", 0.0, 1.0)
  _float(c, "aug.hue", 0.0, 0.5)
  _range(c, "aug.blur_sigma", 1e-3, 100.0)

  _choice(c, "model.depth", (18, 50))
  _choice(c, "model.stem", ("imagenet", "cifar"))
  width = _float(c, "model.width_multiplier", 0.0, 16.0, lo_open=True)
  if (64 * width) != int(64 * width) or 64 * width < 1:
    _fail(
        "model.width_multiplier",
        width,
        f"64 x width_multiplier (the stem's channels) must be a positive integer, not "
        f"{64 * width:g}; use e.g. 0.125, 0.25, 0.5, 1, 2",
    )
  _int(c, "model.head_hidden_dim", 1)
  _int(c, "model.head_out_dim", 1)
  _int(c, "model.head_layers", 1, 3)
  _bool(c, "model.head_bn")
  _bool(c, "model.head_out_bn")
  predictor = _int(c, "model.predictor_hidden_dim", 0)
  if method in ("byol", "simsiam") and predictor == 0:
    _fail(
        "model.predictor_hidden_dim",
        predictor,
        f"method {method!r} needs a predictor: " "set the width of its hidden layer (> 0)",
    )
  if method in ("moco", "simclr") and predictor:
    _fail("model.predictor_hidden_dim", predictor, f"method {method!r} has no predictor; " "set 0")
  _choice(c, "model.dtype", DTYPES)
  bn_mode = _choice(c, "model.bn_mode", BN_MODES)
  groups = _int(c, "model.bn_groups", 1)

  queue = _int(c, "moco.queue_size", 1)
  _float(c, "moco.temperature", 0.0, None, lo_open=True)
  _float(c, "moco.momentum", 0.0, 1.0)
  symmetric = _bool(c, "moco.symmetric")
  _float(c, "simclr.temperature", 0.0, None, lo_open=True)
  _float(c, "byol.base_momentum", 0.0, 1.0)
  if _bool(c, "hcl.enabled"):
    if method != "simclr":
      _fail(
          "hcl.enabled",
          True,
          f"hard-negative sampling is implemented for SimCLR's "
          f"in-batch negatives; method is {method!r}",
      )
    _float(c, "hcl.beta", 0.0, None)
    _float(c, "hcl.tau_plus", 0.0, 1.0)
    if _get(c, "hcl.tau_plus") >= 1.0:
      _fail("hcl.tau_plus", _get(c, "hcl.tau_plus"), "the class prior must be < 1")
    for addon in ("nonsemantic", "ifm", "ft"):
      if _get(c, f"{addon}.enabled"):
        _fail(
            "hcl.enabled",
            True,
            f"hard-negative sampling is a comparator of its own; "
            f"switch off {addon}.enabled to use it",
        )

  if _bool(c, "nonsemantic.enabled"):
    if method == "simsiam":
      _fail(
          "nonsemantic.enabled",
          True,
          "non-semantic negatives are defined for MoCo, SimCLR "
          "(Ge et al. 2021, Eq. 1) and BYOL (Eq. 2), not for SimSiam",
      )
    kind = _choice(c, "nonsemantic.kind", NS_KINDS)
    num_ns = _int(c, "nonsemantic.num_ns", 1, 64)
    if kind == "texture" and num_ns != 1:
      _fail("nonsemantic.num_ns", num_ns, "texture negatives are one image per view; set 1")
    if kind == "texture" and not _get(c, "data.texture_dir"):
      _fail(
          "data.texture_dir",
          "",
          "texture negatives read the texture version of every image: make it with "
          "python -m cl_jax.data.make_texture and set data.texture_dir to its --out",
      )
    _float(c, "nonsemantic.alpha", 0.0, None, lo_open=True)
    _choice(c, "nonsemantic.alpha_mode", ALPHA_MODES)
    d_min = _int(c, "nonsemantic.patch_min", 1)
    d_max = _int(c, "nonsemantic.patch_max", 1)
    if d_max > size:
      _fail(
          "nonsemantic.patch_max",
          d_max,
          f"the patch size must not exceed the view " f"size data.image_size = {size}",
      )
    if d_min > d_max:
      _fail("nonsemantic.patch_min", d_min, f"must be <= nonsemantic.patch_max = {d_max}")

  if _bool(c, "ft.enabled"):
    if _bool(c, "ft.positive_interpolation") and not _bool(c, "ft.positive_extrapolation"):
      _fail(
          "ft.positive_interpolation",
          True,
          "interpolation replaces the extrapolation coefficient: set ft.positive_extrapolation "
          "= True too",
      )
    _bool(c, "ft.positive_extrapolation")
    _float(c, "ft.alpha_ex", 0.0, None, lo_open=True)
    negative = _choice(c, "ft.negative", FT_NEGATIVE)
    _float(c, "ft.alpha_in", 0.0, None, lo_open=True)
    _float(c, "ft.hard_a", 0.0, None, lo_open=True)
    _float(c, "ft.hard_b", 0.0, None, lo_open=True)
    if method in ("byol", "simsiam") and negative != "none":
      _fail(
          "ft.negative",
          negative,
          f"method {method!r} has no negatives: only positive "
          "extrapolation applies (App. E.2); set ft.negative = 'none'",
      )
    if method == "simclr" and negative == "hard":
      _fail(
          "ft.negative",
          negative,
          "hard negatives (App. G.2) are built against the MoCo "
          "queue; for SimCLR use 'interpolate' or 'extrapolate'",
      )
    union = _bool(c, "ft.union")
    _choice(c, "ft.coefficients", FT_COEFFICIENTS)
    _bool(c, "ft.renormalize")
    _int(c, "ft.start_epoch", 0, _int(c, "optim.epochs", 1) - 1)
    if union and negative == "none":
      _fail(
          "ft.union",
          union,
          "the union needs transformed negatives: set ft.negative to "
          "'interpolate' or 'extrapolate'",
      )

  if _bool(c, "ifm.enabled"):
    if method in ("byol", "simsiam"):
      _fail(
          "ifm.enabled",
          True,
          f"IFM perturbs the logits of an InfoNCE loss; method "
          f"{method!r} has none (use moco or simclr)",
      )
    _float(c, "ifm.epsilon", 0.0, 2.0, lo_open=True)
    _float(c, "ifm.alpha", 0.0, None)

  if _bool(c, "dicr.enabled"):
    _check_dicr(c, method, symmetric, size, _int(c, "optim.epochs", 1))
  if _bool(c, "looc.enabled"):
    _check_looc(c, method, symmetric)

  _choice(c, "optim.optimizer", OPTIMIZERS)
  recipe = _choice(c, "optim.lr_recipe", tuple(LR_RECIPES))
  lr = _float(c, "optim.lr", 0.0, None, lo_open=True)
  batch = _int(c, "optim.batch_size", 1)
  if LR_RECIPES[recipe] is not None and (lr, batch) != LR_RECIPES[recipe]:
    _fail(
        "optim.lr_recipe",
        recipe,
        f"recipe fixes (lr, batch_size) = {LR_RECIPES[recipe]} "
        f"but the config has ({lr}, {batch}); set optim.lr_recipe = 'custom' to change them",
    )
  if "base_lr" in _get(c, "optim"):
    base = _float(c, "optim.base_lr", 0.0, None, lo_open=True)
    if not math.isclose(lr, base * batch / 256, rel_tol=1e-9):
      _fail(
          "optim.lr",
          lr,
          f"this config scales the lr with the batch, optim.base_lr x "
          f"optim.batch_size / 256 = {base * batch / 256:g}: set optim.base_lr instead",
      )
  _float(c, "optim.momentum", 0.0, 1.0)
  _float(c, "optim.weight_decay", 0.0, 1.0)
  epochs = _int(c, "optim.epochs", 1)
  warmup = _int(c, "optim.warmup_epochs", 0, epochs - 1)
  schedule = _choice(c, "optim.schedule", ("cosine", "step"))
  lr_decay = _get(c, "optim.decay_epochs")
  if schedule == "step" and (
      not isinstance(lr_decay, (tuple, list))
      or list(lr_decay) != sorted(set(lr_decay))
      or not all(isinstance(e, int) and warmup < e < epochs for e in lr_decay)
  ):
    _fail(
        "optim.decay_epochs",
        lr_decay,
        f"the step schedule needs increasing integer epochs in (optim.warmup_epochs = "
        f"{warmup}, optim.epochs = {epochs})",
    )

  if batch % num_devices:
    _fail(
        "optim.batch_size", batch, f"must be divisible by the number of devices " f"({num_devices})"
    )
  if bn_mode == "sync" and groups != 1:
    _fail(
        "model.bn_groups",
        groups,
        "bn_mode 'sync' takes statistics over the whole global "
        "batch; set model.bn_groups = 1 (or bn_mode 'local' for grouped statistics)",
    )
  if bn_mode != "sync" and groups < 2:
    _fail(
        "model.bn_groups",
        groups,
        f"bn_mode {bn_mode!r} needs at least 2 groups (one " "group is bn_mode 'sync')",
    )
  if batch % groups:
    _fail("model.bn_groups", groups, f"must divide optim.batch_size = {batch}")
  if groups % num_devices and num_devices % groups:
    _fail(
        "model.bn_groups",
        groups,
        f"must be a multiple or a divisor of the number of "
        f"devices ({num_devices}), so that groups map onto devices",
    )
  if method != "moco":
    if bn_mode == "shuffle":
      _fail(
          "model.bn_mode",
          bn_mode,
          f"shuffle-BN belongs to MoCo's key encoder; method " f"{method!r} uses 'sync' or 'local'",
      )
  else:
    _check_queue(c, queue, batch * (2 if symmetric else 1))

  _int(c, "train.log_every", 1)
  _int(c, "train.checkpoint_every", 1)
  _int(c, "train.keep_checkpoints", 1)
  _int(c, "train.score_queries", 0)
  _float(c, "train.max_param_growth", 1.0, None, lo_open=True)

  _int(c, "eval.every", 0)
  for name in c.eval.evaluators:
    if name not in MONITORS:
      raise UsageError(
          f"eval.evaluators: {name!r} cannot run during pretraining; those that can: "
          f"{', '.join(MONITORS)} (the others: python -m cl_jax.evaluate after it)"
      )
  _int(c, "eval.knn_k", 1)
  _float(c, "eval.knn_temperature", 0.0, None, lo_open=True)

  _float(c, "health.min_std_sqrt_d", 0.0, 1.0)
  _float(c, "health.min_rank", 0.0, None)  # 0: no rank warning

  _bool(c, "probe.after_pretrain")
  features = _choice(c, "probe.features", PROBE_FEATURES)
  _bool(c, "probe.rotation")
  if features == "heads" and not (
      _get(c, "looc.enabled") and (_get(c, "looc.augmentations") or _get(c, "looc.conv5_heads"))
  ):
    _fail(
        "probe.features",
        features,
        "head features exist with LooC's extra heads or conv5 heads (looc.enabled, with "
        "looc.augmentations or looc.conv5_heads)",
    )
  _choice(c, "probe.protocol", PROBE_PROTOCOLS)
  _int(c, "probe.batch_size", 1)
  probe_epochs = _int(c, "probe.epochs", 1)
  _float(c, "probe.lr", 0.0, None, lo_open=True)
  _float(c, "probe.weight_decay", 0.0, 1.0)
  decay = _get(c, "probe.decay_epochs")
  if (
      not isinstance(decay, (tuple, list))
      or list(decay) != sorted(decay)
      or not all(isinstance(e, int) and 0 < e < probe_epochs for e in decay)
  ):
    _fail(
        "probe.decay_epochs",
        decay,
        f"must be increasing integers in (0, probe.epochs = " f"{probe_epochs})",
    )
