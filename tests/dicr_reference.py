"""NumPy re-derivations of DICR (2025 submission, Sec. 3.2) for the tests, in float64 loops."""

import math

import numpy as np

REGION_PAIRS = [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)]  # {x, y} != {o1, o2} of (o1, n1, o2, n2)


def roi_mean(f, region, samples):
  """Bilinear samples at the centres of samples x samples cells of the region, by loops."""
  h, w, _ = f.shape
  total = np.zeros(f.shape[-1])
  for i in range(samples):
    for j in range(samples):
      y = (region[0] + (i + 0.5) / samples * (region[2] - region[0])) * h - 0.5
      x = (region[1] + (j + 0.5) / samples * (region[3] - region[1])) * w - 0.5
      y, x = min(max(y, 0.0), h - 1), min(max(x, 0.0), w - 1)
      y0, x0 = int(np.floor(y)), int(np.floor(x))
      y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
      dy, dx = y - y0, x - x0
      total += (
          f[y0, x0] * (1 - dy) * (1 - dx)
          + f[y0, x1] * (1 - dy) * dx
          + f[y1, x0] * dy * (1 - dx)
          + f[y1, x1] * dy * dx
      )
  return total / samples**2


def overlap_share(box1, box2):
  """(S_o1, S_o2): the overlap's area over each crop's area."""
  dy = max(0.0, min(box1[2], box2[2]) - max(box1[0], box2[0]))
  dx = max(0.0, min(box1[3], box2[3]) - max(box1[1], box2[1]))
  area = lambda b: (b[2] - b[0]) * (b[3] - b[1])
  return dy * dx / area(box1), dy * dx / area(box2)


def regions(f, region, s_o, eps):
  """(h_o, h_n) of one view: RoIAlign (Eq. 6) and Eq. 3 solved for h_n (h where S_n < eps)."""
  f = np.asarray(f, np.float64)
  h_o = roi_mean(f, region, max(f.shape[:2]))
  h = f.mean(axis=(0, 1))
  h_n = (h - s_o * h_o) / (1 - s_o) if 1 - s_o >= eps else h
  return h_o, h_n


def sim(hx, hy, sx, sy, eps):
  """Eq. 7."""
  if sx >= eps and sy >= eps:
    return float(hx @ hy / (max(np.linalg.norm(hx), 1e-12) * max(np.linalg.norm(hy), 1e-12)))
  return 1.0 if (sx < eps and sy < eps) else 0.0


def loss(h, areas, eps, tau, constant_positive=None):
  """Eq. 5 per image, averaged: h (B, 4, C) regions (o1, n1, o2, n2), areas (B, 4)."""
  total = 0.0
  for hb, ab in zip(np.asarray(h, np.float64), np.asarray(areas, np.float64)):
    pos = sim(hb[0], hb[2], ab[0], ab[2], eps) if constant_positive is None else constant_positive
    neg = [sim(hb[x], hb[y], ab[x], ab[y], eps) for x, y in REGION_PAIRS]
    denominator = math.exp(pos / tau) + sum(math.exp(s / tau) for s in neg)
    total += -tau * math.log(math.exp(pos / tau) / denominator)
  return total / len(h)


def overlap_in_view(box, flip, other):
  """The overlap of crop `box` (shown flipped when `flip`) with crop `other`, as [y0, x0, y1,
  x1] in box's view coordinates; None when they do not overlap."""
  y0, x0 = max(box[0], other[0]), max(box[1], other[1])
  y1, x1 = min(box[2], other[2]), min(box[3], other[3])
  if y1 <= y0 or x1 <= x0:
    return None
  height, width = box[2] - box[0], box[3] - box[1]
  top, bottom = (y0 - box[0]) / height, (y1 - box[0]) / height
  left, right = (x0 - box[1]) / width, (x1 - box[1]) / width
  if flip:
    left, right = 1 - right, 1 - left
  return np.array([top, left, bottom, right])
