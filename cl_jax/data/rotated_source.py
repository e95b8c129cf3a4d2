"""The 4-way rotation task of LooC's rotation probe (Xiao et al. 2021, Sec. 4, Table 1).

Every image of a source is rotated by k x 90 degrees counter-clockwise, k drawn
uniformly from {0, 1, 2, 3} per image as a function of (seed, index) only, and
labelled with k. The linear probe trained on these labels measures how much
rotation information the frozen features keep.
"""

import numpy as np

ROTATION_LABEL = "rotation"


def rotation_of(seed: int, index: int) -> int:
  """k in {0, 1, 2, 3}, the quarter turns of image `index`."""
  return int(np.random.default_rng([seed, index]).integers(4))


class RotatedSource:
  """Random-access source of rotated images: src[i] -> {"image": np.rot90(image, k),
  "rotation": k} with k = rotation_of(seed, i); num_classes = {"rotation": 4}."""

  def __init__(self, source, seed: int):
    self._source = source
    self._seed = seed
    self.num_classes = {ROTATION_LABEL: 4}

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict:
    k = rotation_of(self._seed, index)
    image = np.ascontiguousarray(np.rot90(self._source[index]["image"], k))
    return {"image": image, ROTATION_LABEL: np.int32(k)}
