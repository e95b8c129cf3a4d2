"""MoCo-v2 (Chen et al. 2020): MLP head, aug-plus views, T 0.2, cosine lr.

python -m cl_jax.main --config=configs/mocov2.py[:imagenet100|:cifar10|:stl10]
"""

from configs import default


def get_config(arg: str | None = None):
  return default.with_preset(default.base_config(), arg)
