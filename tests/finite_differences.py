"""Central finite differences in float64, the gradient reference of the loss tests."""

import numpy as np


def central_differences(fn, *args, eps: float = 1e-6) -> list[np.ndarray]:
  """[d fn / d args[i]] for a scalar fn of float64 arrays, each entry by
  (fn(x + eps e) - fn(x - eps e)) / (2 eps)."""
  grads = []
  for which, arg in enumerate(args):
    g = np.zeros_like(arg)
    for idx in np.ndindex(g.shape):
      plus, minus = [list(args) for _ in range(2)]
      plus[which], minus[which] = arg.copy(), arg.copy()
      plus[which][idx] += eps
      minus[which][idx] -= eps
      g[idx] = (fn(*plus) - fn(*minus)) / (2 * eps)
    grads.append(g)
  return grads
