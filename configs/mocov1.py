"""MoCo v1 (He et al. 2020): linear head, T 0.07, no blur, ColorJitter(0.4, 0.4, 0.4, 0.4) always.

The quick Trifeature run puts a batch norm after the linear head
(model.head_out_bn): without it the run collapses at this size (embedding
std x sqrt(d) 0.2, positive and negative cosines 0.95 and 0.91 after 312
steps); the presets keep the paper's plain linear head.

python -m cl_jax.main --config=configs/mocov1.py[:imagenet100|:cifar10|:stl10]
"""

from cl_jax import config_defaults


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  c.model.head_layers = 1
  c.moco.temperature = 0.07
  c.aug.update(jitter_prob=1.0, hue=0.4, blur_prob=0.0)
  if c.preset == "trifeature":
    c.model.head_out_bn = True
  if c.preset in ("imagenet100", "stl10"):
    c.moco.momentum = 0.999
  return c
