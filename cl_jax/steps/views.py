"""What a method's step receives: the two augmented views and its random keys."""

from typing import NamedTuple

import jax


class Views(NamedTuple):
  """The step's inputs after on-device augmentation.

  v1, v2: (B, S, S, 3) float32 normalised views, rows sharded over `data`.
  r_key: PRNG key of the target forward (shuffle-BN permutations).
  r_ns: PRNG key of the non-semantic images.
  r_ft: PRNG key of the feature-transformation coefficients.
  """

  v1: jax.Array
  v2: jax.Array
  r_key: jax.Array
  r_ns: jax.Array
  r_ft: jax.Array
