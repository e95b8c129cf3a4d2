"""A PyTorch reference of the MoCo-v2 train step, built from a cl_jax config and timed.

python -m cl_jax.bench.torch_reference --config=configs/mocov2.py[:preset] [--compile] [--steps=10]

(`python -m cl_jax.bench.step --compare=torch` runs it beside the JAX step.) Needs PyTorch and
torchvision, which cl_jax does not depend on: `pip install torch torchvision`, on CPU-only
machines `pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu`.

The step is MoCo-v2 (He et al. 2020, Alg. 1; Chen et al. 2020) as cl_jax.objectives.moco
takes it without add-ons:
  1. EMA of the key encoder, theta_k <- m theta_k + (1 - m) theta_q;
  2. keys of the key view from the key encoder, without gradient; with model.bn_mode
     "shuffle" or "shuffle_stats" (the same maths) the key batch is permuted before the key
     encoder and un-permuted after it;
  3. InfoNCE of the queries against their keys and the (K, d) queue at temperature T;
  4. SGD with momentum and coupled weight decay (torch.optim.SGD, as cl_jax.optim's "sgd"),
     at the constant lr optim.lr;
  5. the step's keys replace the oldest keys of the queue.
moco.symmetric contrasts both ways and enqueues both pairs' keys, as the JAX step does.

The encoder is torchvision's ResNet (v1.5) with every stage width times
model.width_multiplier and the ImageNet or CIFAR stem (3x3/1 conv, no max-pool), its fc
replaced by the projection head of cl_jax.models.heads.MLPHead (Linear, optional BN, ReLU,
..., Linear). Every batch norm takes its training statistics per contiguous group of
model.bn_groups groups of the batch (GroupBatchNorm2d / 1d, the idea of the SplitBatchNorm
of the MoCo CIFAR-10 demo), which emulates per-device BN and shuffle-BN on one device as
cl_jax.models.batchnorm.GroupBatchNorm does; "sync" is one group.

Like for like with the JAX step: the step augments its uint8 views photometrically on the
device (colour jitter, grayscale, blur, solarize) with the JAX step's ops and parameters
(cl_jax.bench.torch_augment; measure_torch draws the parameters once with
cl_jax.data.photometric.sample_photometric and uses them at every step), then converts and
normalises them; make_step's step without parameters takes views already augmented. With
--logging_step the JAX step also computes its logged statistics (score statistics, embedding
health, per-layer gradient norms), which this one does not. The non-semantic negatives,
feature transformation, IFM, LooC and DICR add-ons are not implemented: a config with one of
them on is refused.

Precision and layout. On CUDA: channels_last, and with model.dtype "bfloat16" the backbone
under bf16 autocast (cudnn.benchmark on). The pooled features, head and loss run in float32
with autocast off, and batch-norm statistics in float32, as in the JAX model. On CPU:
float32 and contiguous (NCHW) tensors, which ran faster than channels_last with oneDNN here.

Modes: eager, or `torch.compile` (Inductor, mode "default", no CUDA graphs;
"max-autotune-no-cudagraphs" would add kernel autotuning to the compile time) of the forward
passes and the loss, whose backward AOTAutograd compiles too; the EMA (foreach lerp), SGD
(its foreach kernels on CUDA) and enqueue run eagerly around it. In eager mode the grouped
batch norm runs as generic ops (var_mean, addcmul and their backward), not as cuDNN's fused
batch norm, so eager is a lower bound for torch there; the compiled step fuses them.
"""

import copy
import json
import sys
import time

import jax
import numpy as np
from absl import app, flags

from cl_jax import config_check
from cl_jax.data import photometric
from cl_jax.models.resnet import base_width
from cl_jax.objectives import forward, looc, moco
from cl_jax.runtime import cli

try:
  import torch
  import torch.nn.functional as F
  from torch import nn
  from torchvision.models import resnet

  from cl_jax.bench import torch_augment
except ImportError as error:
  _NEEDS_TORCH = (
      "cl_jax.bench.torch_reference needs PyTorch and torchvision, which cl_jax does not install: "
      "pip install torch torchvision (on CPU-only machines add "
      "--index-url https://download.pytorch.org/whl/cpu)"
  )
  if __name__ == "__main__":  # the command: one line, not a traceback
    sys.exit(f"error: {_NEEDS_TORCH}")
  raise ImportError(_NEEDS_TORCH) from error

COMPILE_MODE = "default"
# The add-ons of the MoCo step that this reference leaves out (cl_jax.bench.step --compare=torch
# switches the same ones off for both steps).
ADDONS = moco.METHOD.addons + (looc.METHOD.block,)
_ARCHS = {18: (resnet.BasicBlock, (2, 2, 2, 2)), 50: (resnet.Bottleneck, (3, 4, 6, 3))}


def check_supported(config) -> None:
  """cl_jax.config_check's error for an invalid config (on one device); ValueError unless it
  is a plain MoCo config with SGD, which this reference runs."""
  config_check.validate(config, num_devices=1, reads_data=False)
  if config.method != "moco":
    raise ValueError(f"the PyTorch reference runs MoCo only, got method {config.method!r}")
  if config.optim.optimizer != "sgd":
    raise ValueError(
        f"the PyTorch reference trains with SGD, got optim.optimizer {config.optim.optimizer!r}"
    )
  enabled = [name for name in ADDONS if config[name].enabled]
  if enabled:
    overrides = " ".join(f"--config.{name}.enabled=False" for name in enabled)
    raise ValueError(
        f"the PyTorch reference implements plain MoCo-v2, without {', '.join(enabled)}; "
        f"switch them off ({overrides})"
    )


def group_batch_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    groups: int,
    momentum: float,
    eps: float,
) -> torch.Tensor:
  """Training-mode batch norm with statistics per contiguous group of the batch.

  x (B, C, ...) is split into G = `groups` groups (B/G, C, ...); each group is normalised
  with its own float32 mean and biased variance over every axis but C, then scaled by
  weight (C,) and shifted by bias (C,). The running statistics move towards the mean over
  groups of the groups' means and biased variances (cl_jax.models.batchnorm's convention;
  torch's BN keeps the unbiased variance): r <- (1 - momentum) r + momentum s.

  Returns:
    (B, C, ...) in x's dtype and memory layout.
  """
  batch, channels = x.shape[:2]
  if batch % groups:
    raise ValueError(f"batch size {batch} is not divisible by the {groups} batch-norm groups")
  grouped = x.reshape(groups, batch // groups, *x.shape[1:]).float()
  var, mean = torch.var_mean(grouped, dim=[1, *range(3, grouped.dim())], correction=0, keepdim=True)
  shape = (1, 1, channels) + (1,) * (x.dim() - 2)
  scale = weight.reshape(shape) * torch.rsqrt(var + eps)
  shift = bias.reshape(shape) - mean * scale
  with torch.no_grad():
    running_mean.lerp_(mean.reshape(groups, channels).mean(0), momentum)
    running_var.lerp_(var.reshape(groups, channels).mean(0), momentum)
  return torch.addcmul(shift, grouped, scale).reshape(x.shape).to(x.dtype)


class _GroupStatistics:
  """Training-mode forward by group_batch_norm over `groups` groups; eval mode is torch's."""

  def __init__(self, num_features: int, groups: int):
    super().__init__(num_features)
    self.groups = groups

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    if not self.training:
      return super().forward(x)
    return group_batch_norm(
        x,
        self.weight,
        self.bias,
        self.running_mean,
        self.running_var,
        self.groups,
        self.momentum,
        self.eps,
    )


class GroupBatchNorm2d(_GroupStatistics, nn.BatchNorm2d):
  """BatchNorm2d with per-group training statistics (group_batch_norm); (B, C, H, W)."""


class GroupBatchNorm1d(_GroupStatistics, nn.BatchNorm1d):
  """BatchNorm1d with per-group training statistics (group_batch_norm); (B, C)."""


class Float32Pool(nn.Module):
  """Global average pooling in float32: (B, C, H, W) -> (B, C, 1, 1) float32."""

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return x.float().mean(dim=(2, 3), keepdim=True)


class MLPHead(nn.Sequential):
  """cl_jax.models.heads.MLPHead: (layers - 1) x [Linear(hidden), optional GroupBatchNorm1d,
  ReLU], Linear(out), optional GroupBatchNorm1d; (B, D) -> (B, out) float32, autocast off."""

  def __init__(self, model, in_dim: int):
    layers, width = [], in_dim
    for _ in range(model.head_layers - 1):
      layers.append(nn.Linear(width, model.head_hidden_dim))
      if model.head_bn:
        layers.append(GroupBatchNorm1d(model.head_hidden_dim, model.bn_groups))
      layers.append(nn.ReLU(inplace=True))
      width = model.head_hidden_dim
    layers.append(nn.Linear(width, model.head_out_dim))
    if model.head_out_bn:
      layers.append(GroupBatchNorm1d(model.head_out_dim, model.bn_groups))
    super().__init__(*layers)
    for layer in self:
      if isinstance(layer, nn.Linear):
        nn.init.zeros_(layer.bias)  # cl_jax's heads start with zero biases

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast(x.device.type, enabled=False):
      return super().forward(x.float())


class ScaledResNet(resnet.ResNet):
  """torchvision's ResNet-18 / 50 with stage widths w (64, 128, 256, 512) x expansion, w =
  64 * width_multiplier, the ImageNet stem (7x7/2 conv, 3x3/2 max-pool) or the CIFAR stem
  (3x3/1 conv, no max-pool), GroupBatchNorm2d everywhere, float32 pooling and `head` as fc.

  Initialised as cl_jax.models.resnet: Kaiming-normal (fan_out) convolutions, BN scale 1 and
  bias 0, the last BN of each residual branch at scale 0. Forward is torchvision's:
  (B, 3, H, W) -> head(pooled (B, C)).
  """

  def __init__(self, model):
    nn.Module.__init__(self)
    block, blocks = _ARCHS[model.depth]
    width = base_width(model.width_multiplier)
    self._norm_layer = lambda channels: GroupBatchNorm2d(channels, model.bn_groups)
    self.inplanes, self.dilation, self.groups, self.base_width = width, 1, 1, 64
    if model.stem == "cifar":
      self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
      self.maxpool = nn.Identity()
    else:
      self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
      self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
    self.bn1 = self._norm_layer(width)
    self.relu = nn.ReLU(inplace=True)
    self.layer1 = self._make_layer(block, width, blocks[0])
    self.layer2 = self._make_layer(block, 2 * width, blocks[1], stride=2)
    self.layer3 = self._make_layer(block, 4 * width, blocks[2], stride=2)
    self.layer4 = self._make_layer(block, 8 * width, blocks[3], stride=2)
    self.avgpool = Float32Pool()
    self.fc = MLPHead(model, 8 * width * block.expansion)
    for m in self.modules():
      if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
      elif isinstance(m, (resnet.BasicBlock, resnet.Bottleneck)):
        nn.init.zeros_(m.bn2.weight if isinstance(m, resnet.BasicBlock) else m.bn3.weight)


def infonce(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float):
  """mean_i -log softmax([q_i.k_i, q_i.queue_j (j < K)] / T)_0 in float32, autocast off.

  q, k: (B, d) unit queries and keys; queue: (K, d) unit keys. Returns a scalar.
  """
  with torch.autocast(q.device.type, enabled=False):
    logits = torch.cat([(q * k).sum(dim=1, keepdim=True), q @ queue.T], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device))


class MoCo(nn.Module):
  """Query encoder, EMA key encoder and the (K, d) queue of unit keys (ring buffer)."""

  def __init__(self, config, memory_format: torch.memory_format = torch.contiguous_format):
    super().__init__()
    self.encoder_q = ScaledResNet(config.model)
    self.encoder_k = copy.deepcopy(self.encoder_q).requires_grad_(False)
    queue = torch.randn(config.moco.queue_size, config.model.head_out_dim)
    self.register_buffer("queue", F.normalize(queue, dim=1))
    spec = photometric.config_spec(config)
    self.blur_radius = photometric.blur_radius(config.data.image_size, config.data.image_size, spec)
    self.register_buffer("mean", torch.tensor(spec.mean).reshape(1, 3, 1, 1))
    self.register_buffer("std", torch.tensor(spec.std).reshape(1, 3, 1, 1))
    self.momentum = config.moco.momentum
    self.temperature = config.moco.temperature
    self.symmetric = config.moco.symmetric
    self.memory_format = memory_format
    self.pointer = 0

  def normalize(self, views: torch.Tensor, params: dict | None = None) -> torch.Tensor:
    """(B, S, S, 3) uint8 views -> (B, 3, S, S) float32 (x / 255 - mean) / std, the views
    augmented photometrically with `params` first (torch_augment) unless None."""
    x = views.float().div(255.0)
    if params is not None:
      x = torch_augment.apply_photometric(x, params, self.blur_radius)
    x = x.permute(0, 3, 1, 2)
    return ((x - self.mean) / self.std).contiguous(memory_format=self.memory_format)

  @torch.no_grad()
  def keys(self, x: torch.Tensor, perm: torch.Tensor | None) -> torch.Tensor:
    """(B, d) unit keys of x (B, 3, S, S); with perm (B,), computed on x[perm] and put back in
    x's order (shuffle-BN)."""
    if perm is None:
      return F.normalize(self.encoder_k(x), dim=1)
    z = F.normalize(self.encoder_k(x[perm]), dim=1)
    return torch.empty_like(z).index_copy_(0, perm, z)

  def contrast(
      self,
      view1: torch.Tensor,
      view2: torch.Tensor,
      perms: list[torch.Tensor | None],
      params: list[dict] | None = None,
  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, keys to enqueue (P, d)) of uint8 views (B, S, S, 3): view1 queries against
    view2's keys, and with symmetric also view2 against view1's (loss their mean, keys of one
    image adjacent); perms[i] is pair i's shuffle-BN permutation or None; params: each view's
    photometric parameters, or None for views already augmented."""
    params = params or [None, None]
    x1, x2 = self.normalize(view1, params[0]), self.normalize(view2, params[1])
    pairs = [(x1, x2), (x2, x1)] if self.symmetric else [(x1, x2)]
    keys = [self.keys(xk, perm) for (_, xk), perm in zip(pairs, perms)]
    losses = [
        infonce(F.normalize(self.encoder_q(xq), dim=1), k, self.queue, self.temperature)
        for (xq, _), k in zip(pairs, keys)
    ]
    return sum(losses) / len(losses), torch.stack(keys, dim=1).flatten(0, 1)

  @torch.no_grad()
  def momentum_update(self) -> None:
    """theta_k <- m theta_k + (1 - m) theta_q over the parameters."""
    torch._foreach_lerp_(
        list(self.encoder_k.parameters()), list(self.encoder_q.parameters()), 1.0 - self.momentum
    )

  @torch.no_grad()
  def enqueue(self, keys: torch.Tensor) -> None:
    """The P keys replace the oldest P rows of the queue (P divides K)."""
    self.queue[self.pointer : self.pointer + keys.shape[0]] = keys
    self.pointer = (self.pointer + keys.shape[0]) % self.queue.shape[0]


def autocast_dtype(config, device: torch.device) -> torch.dtype | None:
  """bfloat16 on CUDA for a bfloat16 config; None (float32) otherwise."""
  return torch.bfloat16 if config.model.dtype == "bfloat16" and device.type == "cuda" else None


def build(config, device: torch.device) -> MoCo:
  """The MoCo model of `config` on `device` (channels_last on CUDA), in training mode."""
  check_supported(config)
  layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
  return MoCo(config, layout).to(device=device, memory_format=layout).train()


def make_step(model: MoCo, config, compile: bool):
  """step(view1, view2, perms=None, params=None) -> detached loss: one MoCo-v2 step of `model`
  in place.

  view1, view2: (B, S, S, 3) uint8 views on the model's device, augmented in the step with
  params (each view's photometric parameters, MoCo.contrast), or already augmented. perms:
  the shuffle-BN permutations (B,) of each pair, drawn with torch.randperm when None
  (bn_mode "shuffle" or "shuffle_stats" only). compile: torch.compile (COMPILE_MODE) model.contrast.
  """
  optimizer = torch.optim.SGD(
      model.encoder_q.parameters(),
      lr=config.optim.lr,
      momentum=config.optim.momentum,
      weight_decay=config.optim.weight_decay,
  )
  contrast = torch.compile(model.contrast, mode=COMPILE_MODE) if compile else model.contrast
  device = model.queue.device
  amp = autocast_dtype(config, device)
  pairs = 2 if config.moco.symmetric else 1
  shuffle = config.model.bn_mode in forward.SHUFFLE_BN_MODES

  def step(view1, view2, perms=None, params=None):
    if perms is None:
      batch = view1.shape[0]
      perms = [torch.randperm(batch, device=device) if shuffle else None for _ in range(pairs)]
    model.momentum_update()
    with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
      loss, keys = contrast(view1, view2, perms, params)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    model.enqueue(keys)
    return loss.detach()

  return step


def _synchronize(device: torch.device) -> None:
  if device.type == "cuda":
    torch.cuda.synchronize(device)


def view_params(config, batch: int, device: torch.device) -> list[dict]:
  """Two views' photometric parameters (sample_photometric of the config's aug block, keys 1
  and 2 of seed 0) as tensors on `device`."""
  spec = photometric.config_spec(config)
  return [
      {
          k: torch.from_numpy(np.array(v)).to(device)
          for k, v in jax.device_get(
              photometric.sample_photometric(jax.random.key(view), batch, spec)
          ).items()
      }
      for view in (1, 2)
  ]


def measure_torch(config, steps: int, warmup: int, compile: bool) -> dict:
  """Times `steps` MoCo-v2 steps of `config` on CUDA if available, else on the CPU.

  Random uint8 views of the config's size and global batch, augmented in every step with one
  draw of each view's photometric parameters (the JAX step's work).

  Returns a dict: framework "torch", mode ("eager" or "compiled (inductor, COMPILE_MODE)"),
  device (its name), dtype (the backbone's compute dtype), channels_last, global_batch,
  compile_s (wall time of the first step, compilation included), step_ms (mean wall time per
  step after warmup more steps), img_per_s (global batch / step time), loss (of the last
  step) and, on CUDA, peak_mb (peak allocated memory / 2^20).
  """
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  if device.type == "cuda":
    torch.backends.cudnn.benchmark = True
    torch.cuda.reset_peak_memory_stats(device)
  batch, size = config.optim.batch_size, config.data.image_size
  model = build(config, device)
  step = make_step(model, config, compile)
  views = [
      torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, device=device)
      for _ in range(2)
  ]
  params = view_params(config, batch, device)

  start = time.perf_counter()
  loss = step(*views, params=params)
  _synchronize(device)
  compile_s = time.perf_counter() - start
  for _ in range(warmup):
    loss = step(*views, params=params)
  _synchronize(device)
  start = time.perf_counter()
  for _ in range(steps):
    loss = step(*views, params=params)
  _synchronize(device)
  step_s = (time.perf_counter() - start) / steps

  amp = autocast_dtype(config, device)
  out = {
      "framework": "torch",
      "mode": f"compiled (inductor, {COMPILE_MODE})" if compile else "eager",
      "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
      "dtype": "float32" if amp is None else "bfloat16",
      "channels_last": device.type == "cuda",
      "global_batch": batch,
      "compile_s": round(compile_s, 2),
      "step_ms": round(1e3 * step_s, 2),
      "img_per_s": round(batch / step_s, 1),
      "loss": float(loss),
  }
  if device.type == "cuda":
    out["peak_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
  return out


def _define_flags() -> None:
  """The command line, defined only when the module runs as a program, so that importing it
  beside cl_jax.bench.step defines no flag twice."""
  cli.define_config_flag()
  flags.DEFINE_integer("steps", 10, "Timed steps.", lower_bound=1)
  flags.DEFINE_integer("warmup", 2, "Untimed steps after the first.", lower_bound=0)
  flags.DEFINE_bool("compile", False, "torch.compile the step's forward passes and loss.")
  flags.mark_flag_as_required("config")


def main(argv):
  del argv
  f = flags.FLAGS
  print("RESULT " + json.dumps(measure_torch(f.config, f.steps, f.warmup, f.compile)))


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
