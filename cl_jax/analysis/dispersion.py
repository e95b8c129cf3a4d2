"""NormStd and NormDist (DICR paper, 2025 submission, Sec. 2.2 and 4.2): how far apart a
layer's representations of one image's views lie, relative to the spread of all views.

  sigma(H) = mean_i ||h_i - mean(H)||_2         ("std": mean L2 distance to the mean)
  NormStd  = E_x[ sigma({h_{v_r^aug(x)}}_r) ] / sigma({h_v}_all views)
  NormDist(v_i, v_j) = ||h_{v_i} - h_{v_j}||_2 / sigma({h_v}_all views)

The denominator is taken over every view of every augmentation on every image, so that values
compare across layers. Pure NumPy (float64).
"""

import numpy as np


def spread(h: np.ndarray) -> np.ndarray:
  """sigma over the second-to-last axis: (..., R, C) -> (...) mean distance to the mean."""
  h = np.asarray(h, np.float64)
  return np.linalg.norm(h - h.mean(axis=-2, keepdims=True), axis=-1).mean(axis=-1)


def norm_std(views: np.ndarray, sigma_all: float) -> float:
  """NormStd of one augmentation at one layer.

  Args:
    views: (N, R, C) representations of R one-vs-rest views of each of N images.
    sigma_all: spread() of all views of all augmentations (the denominator).
  """
  return float(spread(views).mean() / sigma_all)


def pair_iou(boxes: np.ndarray) -> np.ndarray:
  """IoU of every pair of boxes of each image: (N, R, 4) [y0, x0, y1, x1] -> (N, R, R)."""
  b = np.asarray(boxes, np.float64)
  top_left = np.maximum(b[:, :, None, :2], b[:, None, :, :2])
  bottom_right = np.minimum(b[:, :, None, 2:], b[:, None, :, 2:])
  inter = np.prod(np.clip(bottom_right - top_left, 0.0, None), axis=-1)
  area = np.prod(b[..., 2:] - b[..., :2], axis=-1)
  return inter / (area[:, :, None] + area[:, None, :] - inter)


def norm_dist_by_iou(
    views: np.ndarray, boxes: np.ndarray, sigma_all: float, bins: int
) -> tuple[np.ndarray, np.ndarray]:
  """Mean NormDist of the pairs of one image's crop views, binned by the pair's IoU.

  Args:
    views: (N, R, C) representations of R crop views of each of N images.
    boxes: (N, R, 4) the views' crop boxes.
    sigma_all: the NormStd denominator.
    bins: equal IoU bins over [0, 1].

  Returns:
    (mean NormDist per bin, NaN where a bin has no pair; pairs per bin), each (bins,).
  """
  h = np.asarray(views, np.float64)
  dist = np.linalg.norm(h[:, :, None] - h[:, None, :], axis=-1) / sigma_all
  iou = pair_iou(boxes)
  upper = np.triu_indices(h.shape[1], k=1)
  dist, iou = dist[:, upper[0], upper[1]].ravel(), iou[:, upper[0], upper[1]].ravel()
  index = np.minimum((iou * bins).astype(int), bins - 1)
  counts = np.bincount(index, minlength=bins)
  sums = np.bincount(index, weights=dist, minlength=bins)
  with np.errstate(invalid="ignore"):
    return sums / counts, counts
