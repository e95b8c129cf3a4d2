"""MoCo-v2 (Chen et al. 2020): MLP head, aug-plus views, T 0.2, cosine lr.

python -m cl_jax.main --config=configs/mocov2.py[:imagenet100|:cifar10|:stl10]
"""

from cl_jax import config_defaults


def get_config(arg: str | None = None):
  return config_defaults.with_preset(config_defaults.base_config(), arg)
