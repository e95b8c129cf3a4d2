"""MoCo-v2 + texture-based non-semantic negatives (Ge et al. 2021, Sec. 2.2).

Each query's negatives include its image's texture version (one per view, alpha 2
inside the exponential, L_in), cropped, flipped and colour-augmented with the
query view's own parameters. The texture versions are made once, offline:

  python -m cl_jax.data.make_texture --dataset=trifeature --out=DIR
  python -m cl_jax.main --config=configs/mocov2_texturens.py --config.data.texture_dir=DIR

python -m cl_jax.main --config=configs/mocov2_texturens.py[:imagenet100|:cifar10|:stl10]
"""

from cl_jax import config_defaults


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  c.nonsemantic.enabled = True
  c.nonsemantic.kind = "texture"
  c.nonsemantic.num_ns = 1
  return c
