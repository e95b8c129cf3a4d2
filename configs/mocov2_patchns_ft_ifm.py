"""MoCo-v2 + patch non-semantic negatives + feature transformation + IFM.

The add-ons combined: NS negatives (Ge et al. 2021), positive extrapolation
and negative interpolation (Zhu et al. 2021; a_ex 2.0, a_in 1.6) and implicit
feature modification (Robinson et al. 2021; eps 0.1, alpha 1).

python -m cl_jax.main --config=configs/mocov2_patchns_ft_ifm.py[:imagenet100|:cifar10|:stl10]
"""

from cl_jax import config_defaults


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  c.nonsemantic.enabled = True
  c.ft.enabled = True
  c.ifm.enabled = True
  return c
