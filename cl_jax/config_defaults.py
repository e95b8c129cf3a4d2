"""Shared defaults of every cl_jax config and the dataset presets.

`base_config()` holds the shared fields at the size of the quick MoCo-v2 run on
the built-in Trifeature dataset, with the papers' augmentation and heads; the
presets (`PRESETS`, written over it by `with_preset`) are tables of overrides:
`QUICK` (the default, "trifeature") the quick run's departures from the papers,
the others the fields that the papers' settings fix.

Config files (the repository's `configs/NAME.py`) are loaded by their path, not imported as
a package (cl_jax.runtime.config_files).
"""

import ml_collections

from cl_jax import addons, objectives


def scale_lr_with_batch(optim: ml_collections.ConfigDict, base_lr: float) -> None:
  """optim.lr = base_lr x optim.batch_size / 256, the linear scaling rule of the papers that
  state their lr this way (SimCLR, SimSiam). optim.lr follows later changes of
  optim.batch_size (a command-line override included); to change the lr, set
  optim.base_lr."""
  optim.base_lr = base_lr
  optim.lr = optim.get_ref("base_lr") * optim.get_ref("batch_size") / 256


def base_config() -> ml_collections.ConfigDict:
  """MoCo-v2 fields at the size of the quick 32 px Trifeature run (the papers' views and head)."""
  c = ml_collections.ConfigDict()
  c.method = "moco"  # a method of cl_jax.objectives.METHODS: moco | simclr | byol | simsiam
  c.preset = "trifeature"
  c.seed = 0

  c.data = ml_collections.ConfigDict()
  c.data.name = "trifeature"  # or a TFDS name: cifar10, cifar100, stl10, imagenet2012, imagenet100
  c.data.data_dir = ""  # TFDS data_dir (prepared with --file_format=array_record)
  # data.name "folder": your images, DIR/train/<class>/ + DIR/val/<class>/, or any tree of
  # images for pretraining alone (cl_jax.data.folder_source)
  c.data.folder = ""
  c.data.bad_images = "stop"  # folder images that cannot be read: stop | skip (named, left out)
  # pil | fast: image files decoded by libjpeg-turbo and the pretraining views resampled by
  # PyTorch's vectorised resize, about twice the views per core (cl_jax.data.fast_views)
  c.data.decoder = "pil"
  c.data.image_size = 32
  c.data.crop_scale = (0.2, 1.0)  # RandomResizedCrop area range
  c.data.eval_crop_fraction = 1.0  # probe test views: resize to size/fraction, centre crop
  c.data.workers = 0  # grain worker processes (0: in the main process)
  c.data.trifeature_seed = 0
  c.data.trifeature_train = 5000
  c.data.trifeature_test = 2000
  c.data.trifeature_max_angle = 45.0  # shapes rotated by U[-a, a) degrees (0: upright)
  c.data.trifeature_texture_angle = 360.0  # textures rotated by U[0, a) degrees (0: unrotated)
  c.data.cache_dir = ""  # Trifeature cache ("" = $CL_JAX_CACHE or ~/.cache/cl_jax)
  # Texture versions of the pretraining images (python -m cl_jax.data.make_texture), read by
  # texture-based non-semantic negatives (nonsemantic.kind = "texture").
  c.data.texture_dir = ""

  c.aug = ml_collections.ConfigDict()  # photometric part of "aug-plus", on the device
  c.aug.jitter_prob = 0.8
  c.aug.brightness = 0.4
  c.aug.contrast = 0.4
  c.aug.saturation = 0.4
  c.aug.hue = 0.1
  c.aug.grayscale_prob = 0.2
  c.aug.blur_prob = 0.5
  c.aug.blur_sigma = (0.1, 2.0)
  c.aug.solarize_prob = 0.0
  # Atomic augmentations of LooC (Xiao et al. 2021, Sec. 4), off in the MoCo-v2 recipe:
  # rotation by 90/180/270 degrees and weight-free texture randomisation (random convolutions).
  c.aug.rotation_prob = 0.0
  c.aug.texture_prob = 0.0

  c.model = ml_collections.ConfigDict()
  c.model.depth = 18
  c.model.stem = "cifar"
  c.model.width_multiplier = 0.25
  c.model.head_hidden_dim = 128
  c.model.head_out_dim = 64
  c.model.head_layers = 2
  c.model.head_bn = False  # BN after each hidden head layer (SimCLR, BYOL, SimSiam)
  c.model.head_out_bn = False  # BN after the head's output layer (SimSiam)
  c.model.predictor_hidden_dim = 0  # > 0: predictor MLP d -> hidden -> d (BYOL, SimSiam)
  c.model.dtype = "float32"  # "bfloat16" on accelerators
  # dtype of the cross-device sum of a bfloat16 network's convolution weight gradients:
  # float32 as mixed-precision practice sums them, or bfloat16 for half the bytes
  c.model.grad_reduce_dtype = "float32"
  c.model.bn_mode = "shuffle"  # sync | local | shuffle | shuffle_stats
  # MoCo's shuffle-BN on more than 8 chips (cl_jax.batch_plan): "" keeps bn_mode; "shuffle" or
  # "shuffle_stats" replaces a shuffle bn_mode there (a pod: no image gathered on every chip)
  c.model.shuffle_bn_above_8_chips = ""
  c.model.bn_groups = 4  # virtual batch-norm groups over the global batch

  c.optim = ml_collections.ConfigDict()
  c.optim.optimizer = "sgd"  # sgd (momentum, coupled weight decay) | lars
  c.optim.lr_recipe = "custom"  # see cl_jax/config_check.py LR_RECIPES
  c.optim.lr = 0.06
  c.optim.batch_size = 128  # global batch (with batch_per_chip > 0: the lr's reference batch)
  # > 0: the global batch is batch_per_chip x the run's devices, the lr scaled linearly from
  # (lr, batch_size) (cl_jax.batch_plan); 0: batch_size is the global batch
  c.optim.batch_per_chip = 0
  # with batch_per_chip: the batch at which optim.lr is the paper's lr (0: optim.batch_size);
  # optim.batch_size must then equal it (the batch follows batch_per_chip, not batch_size)
  c.optim.lr_reference_batch = 0
  c.optim.momentum = 0.9
  c.optim.weight_decay = 5e-4
  c.optim.warmup_epochs = 0
  # With batch_per_chip: a global batch above large_batch trains with at least
  # large_batch_warmup_epochs of linear warm-up (Goyal et al. 2017's gradual warm-up for the
  # linear rule at large batches; 0 turns it off).
  c.optim.large_batch = 1024
  c.optim.large_batch_warmup_epochs = 5
  c.optim.epochs = 8
  c.optim.schedule = "cosine"  # cosine | step (x0.1 at each of optim.decay_epochs)
  c.optim.decay_epochs = ()

  # Each method's block (moco, simclr, byol, looc) and each add-on's (hcl, nonsemantic, ft, ifm,
  # dicr), made by its module (cl_jax.objectives, cl_jax.addons), off by default.
  for entry in objectives.ENTRIES:
    if entry.defaults is not None:
      c[entry.block] = entry.defaults(c)
  for name, addon in addons.ADDONS.items():
    c[name] = addon.defaults(c)

  # Weights & Biases beside TensorBoard and metrics.jsonl (cl_jax.runtime.wandb_tracker; the
  # optional wandb package); WANDB_MODE=offline keeps it local.
  c.log = ml_collections.ConfigDict()
  c.log.wandb = False
  c.log.wandb_project = "cl_jax"
  c.log.wandb_entity = ""  # "" = your default entity

  c.train = ml_collections.ConfigDict()
  c.train.log_every = 10
  c.train.checkpoint_every = 100
  c.train.keep_checkpoints = 2
  c.train.score_queries = 64  # score statistics over the first n queries (0 or > batch: all)
  # Divergence: stop (without saving) once the parameter norm exceeds this multiple of its
  # value at initialisation, or the loss or the state is no longer finite.
  c.train.max_param_growth = 100.0
  # Stall watchdog (cl_jax.runtime.stall_watchdog): end the run with exit status 75 once the
  # host has waited this many seconds for one batch or for the device (at a logging step, for
  # the steps queued since the last); compiling, evaluating and saving do not count. 0: off.
  c.train.stall_timeout_s = 1800.0

  # Evaluators run while pretraining (cl_jax.evaluators.MONITORS), every `every` steps and at
  # the end (0: never). The weighted-kNN monitor (Wu et al. 2018): the probe's train split is
  # the memory bank and its test split is classified; logged as knn/<label>.
  c.eval = ml_collections.ConfigDict()
  c.eval.every = 0
  c.eval.evaluators = ("knn",)
  c.eval.knn_k = 200
  c.eval.knn_temperature = 0.1

  # Collapse warnings while training (cl_jax/objectives/health.py).
  c.health = ml_collections.ConfigDict()
  # Warn below these (README, "Health signals"): embedding std x sqrt(d) is about 1 when
  # the embeddings spread over the sphere, 0 when collapsed; a random network starts near
  # 0.3 and healthy MoCo runs dip to 0.24 early on, collapsed ones stay at 0.07-0.2.
  c.health.min_std_sqrt_d = 0.2
  c.health.min_rank = 4.0  # effective rank of a batch of embeddings (1: a single point)

  c.probe = ml_collections.ConfigDict()
  c.probe.after_pretrain = True
  c.probe.protocol = "fast"  # fast | logreg | paper (cl_jax/evaluators/linear_probe.py)
  c.probe.batch_size = 256
  c.probe.epochs = 100
  c.probe.lr = 0.1
  c.probe.weight_decay = 1e-4
  c.probe.decay_epochs = (60, 80)
  # Features the probe reads: "backbone" (the pooled backbone, LooC's V) or "heads" (the
  # heads' features concatenated, LooC++'s Z: conv5 features with looc.conv5_heads).
  c.probe.features = "backbone"
  # Also probe 4-way rotation (0/90/180/270 degrees) of every image (Xiao et al. 2021, Table 1).
  c.probe.rotation = False
  return c


# The quick Trifeature recipe's departures from the papers, chosen so that a 312-step run on
# 2 CPU cores learns on every seed instead of collapsing (README, "The quick recipe"):
# - batch norm after the projection head's hidden layer (model.head_bn), as in the SimCLR and
#   BYOL heads: MoCo-v2's plain MLP head collapsed at this size (every image mapped near one
#   point, the loss back at log(K + 1));
# - no Gaussian blur: at 32 px the blur of aug-plus (sigma up to 2 px) wipes out Trifeature's
#   textures, whose period is 5 px;
# - random resized crops of 50-100% of the image instead of 20-100%, so that a view keeps
#   enough of the shape and texture at 32 px;
# - 16 epochs (624 steps of batch 128, about 5 minutes): at 8 the MoCo runs gain only a few
#   points on texture over a random network.
# It also switches on the kNN monitor (eval.every), which is not a departure.
QUICK = {
    "optim": {"epochs": 16},
    "eval": {"every": 156},  # the kNN monitor 4 times in 624 steps (2 in 312), and at the end
    "model": {"head_bn": True},
    "aug": {"blur_prob": 0.0},
    "data": {"crop_scale": (0.5, 1.0)},
}

# The papers' full-size settings shared by the ImageNet-100 and STL-10 presets (Ge et al. 2021,
# App. C.1): ResNet-50 in bfloat16, MoCo-v2's head, queue and lr, and the papers' linear probe
# (SGD lr 10, batch 128, 60 epochs, x0.1 at 30/40/50).
_RESNET50 = {
    "depth": 50,
    "stem": "imagenet",
    "width_multiplier": 1,
    "head_hidden_dim": 2048,
    "head_out_dim": 128,
    "dtype": "bfloat16",
    "bn_groups": 8,
    # Above one host of 8 chips, shuffle-BN by statistics: "shuffle" would send every chip the
    # whole global batch of key images (1,235 MB per chip per step on v5e:4x4, docs/scaling-out.md).
    "shuffle_bn_above_8_chips": "shuffle_stats",
}
# The lr and batch scale with the chips: 128 images per chip, lr 0.03 per 128 images
# (cl_jax.batch_plan); PAPER_BATCH keeps the paper's global batch of 128 on any chips.
_PAPER_MOCO = {
    "moco": {"queue_size": 16384, "temperature": 0.2, "momentum": 0.999},
    "optim": {
        "lr_recipe": "custom",
        "lr": 0.03,
        "batch_size": 128,
        "batch_per_chip": 128,
        "lr_reference_batch": 128,
        "weight_decay": 1e-4,
        "epochs": 200,
    },
    "train": {"log_every": 50, "checkpoint_every": 2000, "keep_checkpoints": 3},
    "probe": {
        "protocol": "paper",
        "batch_size": 128,
        "epochs": 60,
        "lr": 10.0,
        "weight_decay": 0.0,
        "decay_epochs": (30, 40, 50),
    },
}

# Each preset: {block: {field: value}} written over base_config(); a top-level field is
# {field: value}. The non-semantic patch sizes scale with the image (Ge et al. 2021, App. C.1).
PRESETS = {
    "trifeature": QUICK,
    # ImageNet-100 MoCo-v2 (Ge et al. 2021, Table 1 and App. C.1).
    "imagenet100": {
        **_PAPER_MOCO,
        "preset": "imagenet100",
        "data": {
            "name": "imagenet100",
            "image_size": 224,
            "eval_crop_fraction": 0.875,
            "workers": 16,
        },
        "model": _RESNET50,
        "nonsemantic": {"alpha": 2.0, "patch_min": 16, "patch_max": 72},
    },
    # Your images at ImageNet scale (cl_jax.data.folder_source): the ImageNet-100 recipe on
    # --config.data.folder=DIR (DIR/train/<class>/ and DIR/val/<class>/ for the probe).
    "folder": {
        **_PAPER_MOCO,
        "preset": "folder",
        "data": {"name": "folder", "image_size": 224, "eval_crop_fraction": 0.875, "workers": 16},
        "model": _RESNET50,
        "nonsemantic": {"alpha": 2.0, "patch_min": 16, "patch_max": 72},
    },
    # STL-10 (unlabelled split for pretraining), ResNet-50 at 96 px, K 16384 (App. C.1).
    "stl10": {
        **_PAPER_MOCO,
        "preset": "stl10",
        "data": {"name": "stl10", "image_size": 96, "workers": 8},
        "model": _RESNET50,
        "nonsemantic": {"alpha": 2.0, "patch_min": 7, "patch_max": 31},
    },
    # CIFAR-10: ResNet-18 with the CIFAR stem, 32 px.
    "cifar10": {
        "preset": "cifar10",
        "data": {"name": "cifar10", "image_size": 32, "workers": 8},
        "model": {**_RESNET50, "depth": 18, "stem": "cifar", "head_hidden_dim": 512},
        "moco": {"queue_size": 4096, "temperature": 0.2, "momentum": 0.99},
        "nonsemantic": {"alpha": 2.0, "patch_min": 3, "patch_max": 10},
        "optim": {
            "lr_recipe": "custom",
            "lr": 0.06,
            "batch_size": 512,
            "weight_decay": 5e-4,
            "epochs": 200,
        },
        "train": {"log_every": 50, "checkpoint_every": 1000, "keep_checkpoints": 3},
        "probe": {"protocol": "fast", "epochs": 100},
    },
    # Robinson et al. 2021's Trifeature setting (Sec. 2.3 and 4.1): ResNet-18 at full width on
    # 128 px images for 200 epochs. Neither the paper nor its authors' public code gives the
    # batch, the optimiser or the training-set size: the training split is the public ports'
    # (2,400 images, 3 renders of each of the 800 training combinations), the test split 2,000
    # renders of the 200 held-out ones (the ports render each once; more renders make the probe
    # less noisy), and the optimiser is the method's small-data recipe (configs/simclr.py).
    "trifeature128": {
        "preset": "trifeature128",
        "data": {
            "image_size": 128,
            "trifeature_train": 2400,
            "trifeature_test": 2000,
            "crop_scale": (0.08, 1.0),
        },
        "model": {
            "depth": 18,
            "stem": "imagenet",
            "width_multiplier": 1,
            "head_hidden_dim": 512,
            "head_out_dim": 128,
            "dtype": "bfloat16",
        },
        "aug": {"blur_prob": 0.0},
        "optim": {"epochs": 200},
        "train": {"log_every": 20, "checkpoint_every": 200},
    },
}


# The paper's exact recipe, reachable by name: <preset>_b128 is <preset> at the global batch of
# 128 and the lr recipe of Ge et al. 2021 (App. C.1) on any number of chips.
PAPER_BATCH = {
    "lr_recipe": "moco_0.03_b128",
    "lr": 0.03,
    "batch_size": 128,
    "batch_per_chip": 0,
    "lr_reference_batch": 0,
}
for _name in ("imagenet100", "stl10"):
  PRESETS[f"{_name}_b128"] = {**PRESETS[_name], "optim": {**PRESETS[_name]["optim"], **PAPER_BATCH}}


def with_preset(c: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
  """Write the named preset's table (PRESETS) over `c` ("" or None: the quick Trifeature
  run, "trifeature")."""
  name = arg or "trifeature"
  if name not in PRESETS:
    raise ValueError(
        f"unknown preset {name!r}: allowed presets are {', '.join(sorted(PRESETS))} "
        f"(or none for the quick Trifeature run)"
    )
  for key, value in PRESETS[name].items():
    if isinstance(value, dict):
      c[key].update(value)
    else:
      c[key] = value
  return c
