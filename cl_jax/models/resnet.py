"""ResNet-18 and ResNet-50 backbones (He et al. 2016), torchvision v1.5 layout, NHWC, and
ResNet-10, the ResNet-18 layout with one basic block per stage (not in He et al.: a small
network for quick runs and tests).

Layout: stem -> four stages of residual blocks (64, 128, 256, 512 base channels times
``width_multiplier``; stride 1, 2, 2, 2) -> global average pooling. Bottleneck blocks put
their stride on the 3x3 convolution (v1.5). Projection shortcuts (1x1 conv + BN) are used
where the stride or the channel count changes. Convolutions have no bias, use torch-style
explicit padding, and Kaiming-normal (fan_out, untruncated) initialisation; every BN is a
``GroupBatchNorm`` with ``bn_groups`` groups. The ImageNet stem's 7x7 stride-2 convolution runs
in its space-to-depth form (cl_jax.models.conv), the same function of the same parameter.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from cl_jax.models.batchnorm import GroupBatchNorm
from cl_jax.models.conv import Conv

# (block type, blocks per stage) for each supported depth.
_STAGES = {
    10: ('basic', (1, 1, 1, 1)),
    18: ('basic', (2, 2, 2, 2)),
    50: ('bottleneck', (3, 4, 6, 3)),
}
DEPTHS = tuple(sorted(_STAGES))
_EXPANSION = {'basic': 1, 'bottleneck': 4}
_STEMS = ('imagenet', 'cifar')
_BASE_WIDTH = 64

# Kaiming normal, fan_out, gain sqrt(2): std = sqrt(2 / (kh * kw * out_channels)).
conv_init = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')


def base_width(width_multiplier: float) -> int:
  """Channels of the stem and first stage: 64 * width_multiplier, which must be an integer."""
  if isinstance(width_multiplier, bool) or not isinstance(width_multiplier, (int, float)):
    raise ValueError(f'width_multiplier must be a number, got {width_multiplier!r}')
  width = _BASE_WIDTH * width_multiplier
  if width < 1 or width != int(width):
    raise ValueError(
        f'width_multiplier must make 64 * width_multiplier a positive integer, got '
        f'{width_multiplier!r} (64 * w = {width}); use e.g. 0.125, 0.25, 0.5, 1, 2, 4'
    )
  return int(width)


def resnet_feature_dim(depth: int, width_multiplier: float) -> int:
  """Channels of the pooled feature: 512 * w (ResNet-10, ResNet-18) or 2048 * w (ResNet-50)."""
  if depth not in _STAGES:
    raise ValueError(f'ResNet depth must be one of {list(DEPTHS)}, got {depth!r}')
  return 8 * base_width(width_multiplier) * _EXPANSION[_STAGES[depth][0]]


def _conv(
    features: int,
    kernel: int,
    stride: int,
    dtype: Any,
    name: str,
    grad_mesh: Mesh | None,
    space_to_depth: bool = False,
) -> Conv:
  """Bias-free k x k convolution with torch-style symmetric padding k // 2 (space_to_depth:
  computed in that form, see cl_jax.models.conv)."""
  pad = kernel // 2
  return Conv(
      features,
      (kernel, kernel),
      strides=(stride, stride),
      padding=((pad, pad), (pad, pad)),
      dtype=dtype,
      kernel_init=conv_init,
      grad_mesh=grad_mesh,
      space_to_depth=space_to_depth,
      name=name,
  )


class ResidualBlock(nn.Module):
  """Basic (3x3, 3x3) or bottleneck (1x1, 3x3 with stride, 1x1 x4) residual block.

  y = relu(F(x) + shortcut(x)); the last BN of F has zero-initialised scale when
  ``zero_init_residual`` (Goyal et al. 2017), so each block starts as the identity.
  Input (B, H, W, C_in) -> output (B, H/stride, W/stride, planes * expansion) in ``dtype``.
  """

  kind: str
  planes: int
  stride: int
  bn_groups: int
  zero_init_residual: bool
  dtype: Any
  grad_mesh: Mesh | None = None

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, groups: jax.Array | None = None) -> jax.Array:
    """groups: (B,) batch-norm group of each row, or None (GroupBatchNorm)."""
    norm = functools.partial(GroupBatchNorm, num_groups=self.bn_groups, dtype=self.dtype)
    last_scale_init = nn.initializers.zeros if self.zero_init_residual else nn.initializers.ones
    out_features = self.planes * _EXPANSION[self.kind]
    shortcut = x
    if self.stride != 1 or x.shape[-1] != out_features:
      shortcut = _conv(out_features, 1, self.stride, self.dtype, 'proj_conv', self.grad_mesh)(x)
      shortcut = norm(name='proj_bn')(shortcut, not train, groups)
    if self.kind == 'basic':
      y = _conv(self.planes, 3, self.stride, self.dtype, 'conv1', self.grad_mesh)(x)
      y = norm(relu=True, name='bn1')(y, not train, groups)
      y = _conv(self.planes, 3, 1, self.dtype, 'conv2', self.grad_mesh)(y)
      last = 'bn2'
    else:
      y = _conv(self.planes, 1, 1, self.dtype, 'conv1', self.grad_mesh)(x)
      y = norm(relu=True, name='bn1')(y, not train, groups)
      y = _conv(self.planes, 3, self.stride, self.dtype, 'conv2', self.grad_mesh)(y)
      y = norm(relu=True, name='bn2')(y, not train, groups)
      y = _conv(out_features, 1, 1, self.dtype, 'conv3', self.grad_mesh)(y)
      last = 'bn3'
    # The residual branch's last BN adds the shortcut and applies the block's ReLU itself.
    return norm(scale_init=last_scale_init, relu=True, name=last)(
        y, not train, groups, residual=shortcut
    )


class ResNet(nn.Module):
  """ResNet backbone without the classifier.

  Attributes:
    depth: 10 (basic blocks [1, 1, 1, 1]), 18 (basic blocks [2, 2, 2, 2]) or 50 (bottlenecks
      [3, 4, 6, 3], expansion 4).
    stem: 'imagenet' (7x7/2 conv, BN, ReLU, 3x3/2 max-pool) or 'cifar' (3x3/1 conv, BN,
      ReLU, no pool).
    width_multiplier: scales every channel count (base 64); 64 * w must be an integer.
    dtype: computation dtype of convolutions and BN outputs (bfloat16 on accelerators);
      parameters and BN statistics are float32.
    bn_groups: ``num_groups`` of every ``GroupBatchNorm``.
    zero_init_residual: zero-initialise the scale of each residual branch's last BN.
    stages: residual stages to run, 4 (conv2-conv5, the whole network) or 3 (up to conv4;
      LooC++ puts conv5 into each projection head, cl_jax.models.heads.Conv5Head).
    grad_mesh: the training mesh, whose data axis shards the batch: the convolutions' weight
      gradients are then summed across it in float32 (cl_jax.models.conv.Conv); None (the
      evaluation jobs, float32 networks, bfloat16 reduction): autodiff's, summed by XLA.
  """

  depth: int
  stem: str = 'imagenet'
  width_multiplier: float = 1
  dtype: Any = jnp.float32
  bn_groups: int = 1
  zero_init_residual: bool = True
  stages: int = 4
  grad_mesh: Mesh | None = None

  def __post_init__(self):
    if self.depth not in _STAGES:
      raise ValueError(f'ResNet depth must be one of {list(DEPTHS)}, got {self.depth!r}')
    if self.stem not in _STEMS:
      raise ValueError(f'ResNet stem must be one of {_STEMS}, got {self.stem!r}')
    base_width(self.width_multiplier)
    if self.stages not in (3, 4):
      raise ValueError(f'ResNet stages must be 3 or 4, got {self.stages!r}')
    super().__post_init__()

  @property
  def feature_dim(self) -> int:
    """Channels C_out of ``pooled`` and ``feature_map``."""
    return resnet_feature_dim(self.depth, self.width_multiplier) >> (4 - self.stages)

  @nn.compact
  def __call__(
      self, x: jax.Array, train: bool, groups: jax.Array | None = None
  ) -> dict[str, jax.Array]:
    """Images (B, H, W, 3) -> dict(pooled=(B, C_out) float32, feature_map=(B, h, w, C_out)).

    groups: (B,) batch-norm group of each image in training mode (every BN's statistics are
    those of its group, wherever its rows lie), or None (bn_groups contiguous groups).

    ``feature_map`` is the last stage's output in ``dtype``: h = H/32 with the ImageNet stem,
    H/8 with the CIFAR stem (twice that with stages=3). ``pooled`` is its spatial mean,
    computed in float32.
    """
    width = base_width(self.width_multiplier)
    kind, blocks = _STAGES[self.depth]
    x = x.astype(self.dtype)
    if self.stem == 'imagenet':
      x = _conv(width, 7, 2, self.dtype, 'stem_conv', self.grad_mesh, space_to_depth=True)(x)
    else:
      x = _conv(width, 3, 1, self.dtype, 'stem_conv', self.grad_mesh)(x)
    # The ImageNet stem's max-pool runs inside its batch norm (GroupBatchNorm.max_pool).
    x = GroupBatchNorm(
        num_groups=self.bn_groups,
        dtype=self.dtype,
        relu=True,
        max_pool=self.stem == 'imagenet',
        name='stem_bn',
    )(x, not train, groups)
    for stage in range(self.stages):
      x = residual_stage(self, x, train, stage, width, kind, blocks[stage], groups)
    pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    return {'pooled': pooled, 'feature_map': x}


def residual_stage(
    parent: nn.Module,
    x: jax.Array,
    train: bool,
    stage: int,
    width: int,
    kind: str,
    blocks: int,
    groups: jax.Array | None = None,
) -> jax.Array:
  """Residual stage `stage` (0-based; conv{stage + 2} in He et al.'s naming) of `blocks` blocks,
  called inside `parent`'s compact __call__, which owns its blocks (stage{stage + 1}_block{i});
  parent supplies bn_groups, zero_init_residual, dtype and grad_mesh; groups: as ResNet's.
  (B, H, W, C) -> (B, H/s, W/s, width 2^stage e), s the stage's stride, e the expansion.
  """
  for index in range(blocks):
    x = ResidualBlock(
        kind=kind,
        planes=width * 2**stage,
        stride=2 if stage > 0 and index == 0 else 1,
        bn_groups=parent.bn_groups,
        zero_init_residual=parent.zero_init_residual,
        dtype=parent.dtype,
        grad_mesh=parent.grad_mesh,
        name=f'stage{stage + 1}_block{index + 1}',
    )(x, train, groups)
  return x


ResNet18 = functools.partial(ResNet, depth=18)
ResNet50 = functools.partial(ResNet, depth=50)
