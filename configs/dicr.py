"""DICR (2025 submission "Direct intra-image contrastive regularisation"): a base method plus
lambda L_DICR on the online feature maps of the two views' overlap and non-overlap regions.

  python -m cl_jax.main --config=configs/dicr.py[:<method>[,<dataset>]]

method: simclr (default) | moco (symmetric, the paper's footnote 6) | simsiam | byol.
dataset: trifeature (default: the method's quick recipe with DICR switched on) | cifar10 |
cifar100 | stl10 | tiny_imagenet, with the paper's settings (Sec. 4.1):
  - ResNet-18 with the 3x3 stride-1 stem and no max-pool (model.stem = "cifar");
  - SGD, momentum 0.9, weight decay 1e-4, cosine schedule without warm-up;
  - lr 0.5, batch 512, 500 epochs on CIFAR-10/100; lr 0.25, batch 256, 250 epochs on
    Tiny-ImageNet and STL-10 (both lr = 0.25 x batch / 256);
  - final lambda / tau: SimCLR 40 / 0.05, MoCo 10 / 0.02, SimSiam 2 / 0.005 (BYOL, not in
    the paper: 8 / 0.005, configs/byol.py); lambda rises from 0 once per epoch and reaches
    its final value in the last epoch;
  - epsilon 2 x 2 px on CIFAR (32 px views), 3 x 3 px on Tiny-ImageNet (64 px) and STL-10
    (96 px).
Heads, temperatures of the base loss and the probe are the base method's CIFAR-10 preset.
Variants: --config.dicr.variant=dirr (--config.dicr.dirr_similarity=s) or icr
(--config.dicr.icr_layers=1|2, and the paper's tau 0.2: --config.dicr.temperature=0.2).
"""

import ml_collections

from cl_jax import config_defaults
from cl_jax.runtime import config_files

# method: its base config file in this folder
BASE_FILES = {"simclr": "simclr", "moco": "mocov2", "simsiam": "simsiam", "byol": "byol"}
METHODS = {m: config_files.sibling_config(__file__, f) for m, f in BASE_FILES.items()}
# dataset: (image size, epochs, batch size, epsilon side in pixels)
PAPER_DATASETS = {
    "cifar10": (32, 500, 512, 2),
    "cifar100": (32, 500, 512, 2),
    "tiny_imagenet": (64, 250, 256, 3),
    "stl10": (96, 250, 256, 3),
}


def apply_paper(c: ml_collections.ConfigDict, dataset: str) -> None:
  """The paper's pretraining settings for `dataset` (Sec. 4.1) on a CIFAR-10 method preset."""
  size, epochs, batch, side = PAPER_DATASETS[dataset]
  c.preset = f"dicr_{dataset}"
  c.data.update(name=dataset, image_size=size, crop_scale=(0.08, 1.0))
  c.model.update(depth=18, stem="cifar", width_multiplier=1)
  c.optim.update(
      optimizer="sgd",
      lr_recipe="custom",
      batch_size=batch,
      momentum=0.9,
      weight_decay=1e-4,
      warmup_epochs=0,
      epochs=epochs,
      schedule="cosine",
  )
  config_defaults.scale_lr_with_batch(c.optim, 0.25)
  c.dicr.epsilon_area = float(side * side)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  method, _, dataset = (arg or "simclr").partition(",")
  if method not in METHODS:
    raise ValueError(f"configs/dicr.py: method must be one of {', '.join(METHODS)}, got {method!r}")
  dataset = dataset or "trifeature"
  if dataset != "trifeature" and dataset not in PAPER_DATASETS:
    raise ValueError(
        f"configs/dicr.py: dataset must be trifeature or one of {', '.join(PAPER_DATASETS)}, "
        f"got {dataset!r}"
    )
  c = METHODS[method].get_config(None if dataset == "trifeature" else "cifar10")
  if method == "moco":
    c.moco.symmetric = True
  c.dicr.enabled = True
  if dataset != "trifeature":
    apply_paper(c, dataset)
  return c
