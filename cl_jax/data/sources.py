"""Dataset sources by name: the built-in Trifeature set, a TFDS dataset, or a folder of your
images (cl_jax.data.folder_source).

A source is random access (`len(src)`, `src[i] -> {"image": (H, W, 3) uint8,
<label name>: int, ...}`) with `src.num_classes -> {label name: classes}`.
TFDS (and so TensorFlow) is imported only when a TFDS dataset is asked for.
"""

import ml_collections

from cl_jax.data import tfds_source, trifeature
from cl_jax.runtime.errors import UsageError

DATASET_NAMES = ("trifeature", "folder") + tuple(tfds_source.DATASETS)
ROLES = ("pretrain", "probe_train", "test")


def open_source(data: ml_collections.ConfigDict, role: str):
  """The source of `data.name` for one role: pretrain, probe_train or test."""
  if role not in ROLES:
    raise ValueError(f"source role must be one of {ROLES}, got {role!r}")
  if data.name == "trifeature":
    split = "test" if role == "test" else "train"
    num = data.trifeature_test if role == "test" else data.trifeature_train
    images = trifeature.load(
        split,
        image_size=data.image_size,
        num_images=num,
        seed=data.trifeature_seed,
        cache_dir=data.cache_dir or None,
        max_shape_angle=data.get("trifeature_max_angle", trifeature.MAX_SHAPE_ANGLE_DEG),
        max_texture_angle=data.get("trifeature_texture_angle", trifeature.MAX_TEXTURE_ANGLE_DEG),
    )
    return trifeature.TrifeatureSource(images)
  if data.name == "folder":
    from cl_jax.data import folder_source

    return folder_source.open_source(data, role)
  return tfds_source.open_source(data.name, role, data.data_dir)


def split_sizes(config: ml_collections.ConfigDict, pretrain_size: int) -> str:
  """'pretrain N, probe train N, test N' of the run's dataset."""
  sizes = {"pretrain": str(pretrain_size)}
  for role in ("probe_train", "test"):
    if config.data.name == "trifeature":
      sizes[role] = str(
          config.data.trifeature_test if role == "test" else config.data.trifeature_train
      )
    else:
      try:
        sizes[role] = str(len(open_source(config.data, role)))
      except UsageError:
        sizes[role] = "not prepared"
  return ", ".join(f"{role.replace('_', ' ')} {n}" for role, n in sizes.items())
