"""MoCo v1 (He et al. 2020): linear head, T 0.07, no blur, ColorJitter(0.4, 0.4, 0.4, 0.4) always.

python -m cl_jax.main --config=configs/mocov1.py[:imagenet100|:cifar10|:stl10]
"""
from configs import default


def get_config(arg: str | None = None):
  c = default.with_preset(default.base_config(), arg)
  c.model.head_layers = 1
  c.moco.temperature = 0.07
  c.aug.update(jitter_prob=1.0, hue=0.4, blur_prob=0.0)
  if c.preset in ("imagenet100", "stl10"):
    c.moco.momentum = 0.999
  return c
