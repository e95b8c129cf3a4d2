"""MoCo-v2 + patch-based non-semantic negatives (Ge et al. 2021, Sec. 2.3).

alpha 2 inside the exponential (L_in), one NS image per query, patch size
d ~ U(16, 72) at 224 px (scaled to the resolution in the other presets).

python -m cl_jax.main --config=configs/mocov2_patchns.py[:imagenet100|:cifar10|:stl10]
"""

from cl_jax import config_defaults


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  c.nonsemantic.enabled = True
  return c
