"""Our Flax ResNet backbone (cl_jax.models.resnet) as a torchvision ResNet state dict.

cl_jax.models.resnet follows torchvision's v1.5 layout (stride on the bottleneck's 3x3 conv,
bias-free convs with the same padding, 1x1 conv + BN projection shortcuts, the 3x3/2 max-pool
padded by 1), so the backbone maps onto `torchvision.models.resnet18` / `resnet50` name for
name:

  stem_conv / stem_bn                        -> conv1 / bn1
  stage{s}_block{i}/conv{k}, bn{k}           -> layer{s}.{i - 1}.conv{k}, bn{k}
  stage{s}_block{i}/proj_conv, proj_bn       -> layer{s}.{i - 1}.downsample.0, downsample.1
  GroupBatchNorm scale, bias, mean, var      -> weight, bias, running_mean, running_var

Conv kernels go from Flax's HWIO (kh, kw, in, out) to torch's OIHW (out, in, kh, kw). Both
frameworks cross-correlate (no kernel flip) and normalise in eval mode as
(x - running_mean) / sqrt(running_var + 1e-5) * weight + bias: GroupBatchNorm's epsilon is
1e-5, torchvision's BatchNorm2d default. bn_groups plays no part in eval mode (running
statistics only), so runs with any bn_groups export alike. Our running variance averages the
groups' biased batch variances (flax's convention) where torch keeps the unbiased one; this
only matters to a user who goes on training BN in torch. num_batches_tracked is written as
a 0-d int64 zero: torch reads it only when BN momentum is None.

The state dict has no fc.* entries (the export has no classifier): load it without strict
checking and drop fc, or replace fc by Identity before a strict load:

  model = torchvision.models.resnet18()
  missing, unexpected = model.load_state_dict(safetensors.torch.load_file(path), strict=False)
  # missing == ["fc.weight", "fc.bias"], unexpected == []
  model.fc = torch.nn.Identity()
  model.eval()

The model then maps (B, 3, H, W) float32 images, RGB in [0, 1] normalised as
(x - mean) / std per channel (the export's metadata gives mean and std), to our (B, D)
`pooled` features.

A run with the CIFAR stem (3x3/1 conv, no max-pool) maps onto conv1 too, with a (w, 3, 3, 3)
kernel, and a width_multiplier other than 1 scales every channel count (the names stay the
same). torchvision's constructors build neither (`width_per_group` widens the bottleneck's inner
convs only): `torch_resnet(depth, stem, width_multiplier)` builds torchvision's own ResNet class
at that stem and those widths, into which such a file loads strictly after `fc` is replaced by
Identity (`loading_line` names the call for an export).

A backbone that stops after conv4 (LooC++'s conv5 heads, ResNet stages=3) has no torchvision
counterpart and is refused.
"""

import numpy as np

# (torchvision constructor, residual blocks per stage, convs per block) per depth.
_ARCHS = {18: ("resnet18", (2, 2, 2, 2), 2), 50: ("resnet50", (3, 4, 6, 3), 3)}
TORCHVISION_DEPTHS = tuple(sorted(_ARCHS))


def is_stock(stem: str, width_multiplier: float) -> bool:
  """Whether a backbone loads into torchvision's own constructor (ImageNet stem, width 1)."""
  return stem == "imagenet" and width_multiplier == 1


def loading_line(depth: int, stem: str, width_multiplier: float) -> str:
  """One line saying how to load an export of this backbone into PyTorch."""
  if is_stock(stem, width_multiplier):
    return (
        f"load it into torchvision.models.{arch_name(depth)}() with strict=False (no fc), "
        "then model.fc = torch.nn.Identity()"
    )
  return (
      f"not a stock torchvision ResNet-{depth} ({stem} stem, width x{width_multiplier:g}): load "
      f"it into cl_jax.models.torchvision_export.torch_resnet({depth}, stem={stem!r}, "
      f"width_multiplier={width_multiplier:g}), torchvision's ResNet built at this layout"
  )


def torch_resnet(depth: int, stem: str = "imagenet", width_multiplier: float = 1.0):
  """torchvision's ResNet class (resnet18 / resnet50 blocks) built with `stem` ("imagenet":
  7x7/2 conv and max-pool; "cifar": 3x3/1 conv, no max-pool) and every channel count scaled by
  `width_multiplier`, with fc = Identity: the module whose state dict is
  torchvision_state_dict's for that backbone, (B, 3, H, W) -> (B, D) pooled features. Needs
  torch and torchvision."""
  import torch
  import torchvision

  width = 64 * width_multiplier
  if width != int(width) or width < 1:
    raise ValueError(f"64 x width_multiplier must be a positive integer, got {width}")
  width = int(width)
  block = torchvision.models.resnet.BasicBlock if depth == 18 else None
  block = block or torchvision.models.resnet.Bottleneck
  model = getattr(torchvision.models, arch_name(depth))()
  model.inplanes = width
  if stem == "cifar":
    model.conv1 = torch.nn.Conv2d(3, width, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
  else:
    model.conv1 = torch.nn.Conv2d(3, width, 7, 2, 3, bias=False)
  model.bn1 = torch.nn.BatchNorm2d(width)
  blocks = _ARCHS[depth][1]
  for i, count in enumerate(blocks):
    layer = model._make_layer(block, width * 2**i, count, stride=1 if i == 0 else 2)  # noqa: SLF001
    setattr(model, f"layer{i + 1}", layer)
  model.fc = torch.nn.Identity()
  return model


def arch_name(depth: int) -> str:
  """The torchvision constructor of a depth: 'resnet18' or 'resnet50'."""
  if depth not in _ARCHS:
    raise ValueError(f"ResNet depth must be one of {sorted(_ARCHS)}, got {depth!r}")
  return _ARCHS[depth][0]


def conv_weight(kernel) -> np.ndarray:
  """A Flax conv kernel (kh, kw, in, out) as a torch Conv2d weight (out, in, kh, kw) float32."""
  return np.ascontiguousarray(np.transpose(np.asarray(kernel, np.float32), (3, 2, 0, 1)))


def bn_entries(prefix: str, params: dict, stats: dict) -> dict[str, np.ndarray]:
  """A GroupBatchNorm's params {scale, bias} and batch_stats {mean, var}, each (C,), as the
  five entries of torch BatchNorm2d `prefix`."""
  return {
      f"{prefix}.weight": np.asarray(params["scale"], np.float32),
      f"{prefix}.bias": np.asarray(params["bias"], np.float32),
      f"{prefix}.running_mean": np.asarray(stats["mean"], np.float32),
      f"{prefix}.running_var": np.asarray(stats["var"], np.float32),
      f"{prefix}.num_batches_tracked": np.array(0, np.int64),
  }


def _layers(depth: int, params: dict) -> list[tuple[tuple[str, ...], tuple[str, ...], str, str]]:
  """(flax conv path, flax BN path, torch conv name, torch BN name) of every conv and the BN
  after it, in network order; projection shortcuts where `params` has them."""
  _, blocks, convs = _ARCHS[depth]
  layers = [(("stem_conv",), ("stem_bn",), "conv1", "bn1")]
  for stage, count in enumerate(blocks, start=1):
    for index in range(1, count + 1):
      block, torch_block = f"stage{stage}_block{index}", f"layer{stage}.{index - 1}"
      layers += [
          ((block, f"conv{k}"), (block, f"bn{k}"), f"{torch_block}.conv{k}", f"{torch_block}.bn{k}")
          for k in range(1, convs + 1)
      ]
      if "proj_conv" in params[block]:
        layers.append(
            (
                (block, "proj_conv"),
                (block, "proj_bn"),
                f"{torch_block}.downsample.0",
                f"{torch_block}.downsample.1",
            )
        )
  return layers


def _check_modules(params: dict, depth: int) -> None:
  """ValueError unless `params` has exactly the stem and the four stages of a ResNet-`depth`."""
  _, blocks, _ = _ARCHS[depth]
  expected = {"stem_conv", "stem_bn"} | {
      f"stage{s}_block{i}" for s, count in enumerate(blocks, start=1) for i in range(1, count + 1)
  }
  missing, unexpected = sorted(expected - set(params)), sorted(set(params) - expected)
  if missing or unexpected:
    raise ValueError(
        f"not the backbone of a whole ResNet-{depth} (stem and four stages): missing modules "
        f"{missing}, unexpected {unexpected}"
    )


def _at(tree: dict, path: tuple[str, ...]) -> dict:
  for key in path:
    tree = tree[key]
  return tree


def torchvision_state_dict(
    backbone_params: dict, backbone_batch_stats: dict, depth: int
) -> dict[str, np.ndarray]:
  """torchvision's resnet{depth} state dict (without fc.*) of our backbone's variables.

  Args:
    backbone_params: the ResNet's params (stem_conv, stem_bn, stage{s}_block{i}/...), conv
      kernels (kh, kw, in, out), BN scale and bias (C,).
    backbone_batch_stats: its batch_stats, BN mean and var (C,).
    depth: 18 or 50.
  Returns:
    torch name -> array: conv weights (out, in, kh, kw) float32; BN weight, bias,
    running_mean, running_var (C,) float32 and num_batches_tracked () int64.
  """
  arch_name(depth)
  _check_modules(backbone_params, depth)
  out = {}
  for conv, bn, torch_conv, torch_bn in _layers(depth, backbone_params):
    out[f"{torch_conv}.weight"] = conv_weight(_at(backbone_params, conv)["kernel"])
    out.update(bn_entries(torch_bn, _at(backbone_params, bn), _at(backbone_batch_stats, bn)))
  return out
