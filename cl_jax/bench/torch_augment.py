"""The photometric augmentation of cl_jax.data.photometric written with PyTorch ops, for the
PyTorch reference step (cl_jax.bench.torch_reference) to do the JAX step's work.

The same ops, in the same order and with the same parameters (a dict of sample_photometric's
arrays as tensors), on a batch of float images (B, H, W, 3) in [0, 1], per example:
  x <- jitter(x) if jitter: brightness f x, contrast f x + (1 - f) mean(gray(x)), saturation
       f x + (1 - f) gray(x), hue (H + h) mod 1 in HSV, each clipped to [0, 1], in the order
       `order` (cl_jax.data.colour_jitter: hue computed once, at its position);
  x <- gray(x) on every channel if grayscale (gray = 0.299 R + 0.587 G + 0.114 B);
  x <- clip(blur(x, sigma)) if blur: separable Gaussian taps exp(-k^2 / (2 sigma^2)) / sum,
       k = -r..r, reflect-padded borders;
  x <- where(x < 0.5, x, 1 - x) if solarize.
Vectorised over the batch with torch.where, as the JAX version is under vmap, so eager and
compiled torch do the same work as the JAX step. MoCo-v2's ops only: a params dict with
texture or rotation keys is refused.
"""

import torch

LUMA = (0.299, 0.587, 0.114)
KEYS = frozenset(
    ("jitter", "brightness", "contrast", "saturation", "hue", "order", "grayscale", "blur")
    + ("sigma", "solarize")
)


def _per_image(value: torch.Tensor) -> torch.Tensor:
  """(B,) -> (B, 1, 1, 1), to broadcast over (B, H, W, 3)."""
  return value.reshape(-1, 1, 1, 1)


def gray(x: torch.Tensor) -> torch.Tensor:
  """(B, H, W, 3) -> (B, H, W, 1) BT.601 luma."""
  weights = torch.tensor(LUMA, dtype=x.dtype, device=x.device)
  return (x * weights).sum(dim=-1, keepdim=True)


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
  f = _per_image(factor)
  return (f * x + (1.0 - f) * other).clamp(0.0, 1.0)


def _cheap(op: int, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
  """Jitter op 0 (brightness), 1 (contrast) or 2 (saturation) on every image."""
  if op == 0:
    return (_per_image(p["brightness"]) * x).clamp(0.0, 1.0)
  if op == 1:
    return _blend(x, gray(x).mean(dim=(1, 2, 3), keepdim=True), p["contrast"])
  return _blend(x, gray(x), p["saturation"])


def _select_cheap(which: torch.Tensor, x: torch.Tensor, p: dict) -> torch.Tensor:
  """Per image, cheap op which[b] (in 0..2) of x."""
  out = _cheap(2, x, p)
  for op in (0, 1):
    out = torch.where(_per_image(which == op), _cheap(op, x, p), out)
  return out


def _hue(x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
  """Hue rotated by delta turns through HSV (dm-pix's adjust_hue planes), clipped to [0, 1]."""
  red, green, blue = x.unbind(dim=-1)
  value = torch.maximum(torch.maximum(red, green), blue)
  range_ = value - torch.minimum(torch.minimum(red, green), blue)
  safe_value = torch.where(value > 0, value, torch.ones_like(value))
  safe_range = torch.where(range_ > 0, range_, torch.ones_like(range_))
  saturation = torch.where(value > 0, range_ / safe_value, torch.zeros_like(value))
  norm = 1.0 / (6.0 * safe_range)
  hue = torch.where(
      value == green, norm * (blue - red) + 2.0 / 6.0, norm * (red - green) + 4.0 / 6.0
  )
  hue = torch.where(value == red, norm * (green - blue), hue)
  hue = torch.where(range_ > 0, hue, torch.zeros_like(hue)) + (hue < 0).to(hue.dtype)
  hue = torch.remainder(hue + delta.reshape(-1, 1, 1), 1.0)
  dh = torch.remainder(hue, 1.0) * 6.0
  planes = (
      ((dh - 3.0).abs() - 1.0).clamp(0.0, 1.0),
      (2.0 - (dh - 2.0).abs()).clamp(0.0, 1.0),
      (2.0 - (dh - 4.0).abs()).clamp(0.0, 1.0),
  )
  rgb = [value * (1.0 - saturation + saturation * d) for d in planes]
  return torch.stack(rgb, dim=-1).clamp(0.0, 1.0)


def jitter(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
  """The four ColorJitter ops in each image's order (B, 4) (3 = hue): the cheap ops up to hue's
  position, hue once, the cheap ops after it (cl_jax.data.colour_jitter.jitter)."""
  order = p["order"]
  hue_position = torch.argmax((order == 3).to(torch.int32), dim=1)
  # The cheap ops in their relative order: a stable sort puts hue (key 1) last.
  cheap = torch.gather(order, 1, torch.sort((order == 3).to(torch.int32), dim=1, stable=True)[1])
  states = [x]
  for j in range(3):
    states.append(_select_cheap(cheap[:, j], states[-1], p))
  at_hue = states[3]
  for j in (2, 1, 0):
    at_hue = torch.where(_per_image(hue_position == j), states[j], at_hue)
  y = _hue(at_hue, p["hue"])
  for j in range(3):
    y = torch.where(_per_image(hue_position <= j), _select_cheap(cheap[:, j], y, p), y)
  return y


def _reflect_index(n: int, radius: int, device) -> torch.Tensor:
  """Indices of a reflect-padded axis of n (d c b | a b c d | c b a)."""
  i = torch.arange(-radius, n + radius, device=device).abs()
  return torch.where(i > n - 1, 2 * (n - 1) - i, i)


def blur(x: torch.Tensor, sigma: torch.Tensor, radius: int) -> torch.Tensor:
  """Separable Gaussian blur of (B, H, W, 3), sigma (B,), taps k = -radius..radius."""
  if radius == 0:
    return x
  height, width = x.shape[1:3]
  taps = torch.arange(-radius, radius + 1, dtype=x.dtype, device=x.device)
  weights = torch.exp(-(taps**2) / (2.0 * sigma.reshape(-1, 1) ** 2))
  weights = weights / weights.sum(dim=1, keepdim=True)
  padded = x.index_select(1, _reflect_index(height, radius, x.device))
  padded = padded.index_select(2, _reflect_index(width, radius, x.device))
  w = weights.reshape(-1, 2 * radius + 1, 1, 1, 1)
  rows = sum(w[:, k] * padded[:, :, k : k + width] for k in range(2 * radius + 1))
  return sum(w[:, k] * rows[:, k : k + height] for k in range(2 * radius + 1))


def apply_photometric(x: torch.Tensor, p: dict[str, torch.Tensor], radius: int) -> torch.Tensor:
  """(B, H, W, 3) float in [0, 1] -> the same shape: jitter, grayscale, blur, solarize, each where
  its per-image flag in p is set (module docstring); radius: the blur's
  (cl_jax.data.photometric.blur_radius)."""
  if set(p) != KEYS:
    raise ValueError(
        f"params must have the keys of MoCo-v2's photometric views {sorted(KEYS)}, got "
        f"{sorted(p)} (texture and rotation are not in the PyTorch reference)"
    )
  x = torch.where(_per_image(p["jitter"]), jitter(x, p), x)
  x = torch.where(_per_image(p["grayscale"]), gray(x).expand_as(x), x)
  x = torch.where(_per_image(p["blur"]), blur(x, p["sigma"], radius), x).clamp(0.0, 1.0)
  return torch.where(_per_image(p["solarize"]) & (x >= 0.5), 1.0 - x, x)
