"""LooC++ (Xiao et al. 2021, Sec. 4): LooC whose heads each start with their own conv5 stage;
the probe reads the heads' pooled conv5 features concatenated (probe.features = "heads").

python -m cl_jax.main --config=configs/loocpp.py[:imagenet100]
"""

from cl_jax import config_defaults
from cl_jax.runtime import config_files

apply_looc = config_files.sibling_config(__file__, "looc").apply_looc


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  apply_looc(c, arg)
  c.looc.conv5_heads = True
  c.probe.features = "heads"
  return c
