"""Projection heads and L2 normalisation."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from cl_jax.models.batchnorm import GroupBatchNorm
from cl_jax.models.relu import relu
from cl_jax.models.resnet import _STAGES, base_width, residual_stage

# torch.nn.Linear's default kernel init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), which the MoCo
# heads are trained with; biases start at zero.
dense_init = nn.initializers.variance_scaling(1.0 / 3.0, 'fan_in', 'uniform')


def l2_normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
  """x / max(||x||_2, eps) along ``axis`` (torch's F.normalize); same shape and dtype as x.

  Written as x / sqrt(max(||x||^2, eps^2)) so that the gradient at x = 0 is finite
  (the derivative of sqrt at 0 is not), which keeps a masked-out branch through a
  zero vector from turning a zero cotangent into NaN.
  """
  sq_norm = jnp.sum(jnp.square(x), axis=axis, keepdims=True)
  return x / jnp.sqrt(jnp.maximum(sq_norm, eps * eps))


class MLPHead(nn.Module):
  """Projection head g(h) or predictor: (num_layers - 1) x [Linear(hidden_dim), optional
  BN, ReLU] followed by Linear(out_dim) and an optional BN.

  num_layers=2 is MoCo-v2's 2048-2048-128 MLP; num_layers=1 is MoCo-v1's single linear
  layer (hidden_dim is then unused); use_bn gives the SimCLR / BYOL heads and BYOL's and
  SimSiam's predictors; use_bn with out_bn and num_layers=3 is SimSiam's projector (BN
  after every linear layer, no ReLU after the last). Computed in float32; returns the
  unnormalised output.

  Attributes:
    hidden_dim: width of the hidden layers.
    out_dim: output dimension d.
    num_layers: number of linear layers, >= 1.
    use_bn: GroupBatchNorm after each hidden linear layer (BYOL / SimSiam style).
    out_bn: GroupBatchNorm after the output linear layer (SimSiam's projector).
    bn_groups: ``num_groups`` of those BNs.
  """

  hidden_dim: int
  out_dim: int
  num_layers: int = 2
  use_bn: bool = False
  out_bn: bool = False
  bn_groups: int = 1

  def __post_init__(self):
    for field in ('hidden_dim', 'out_dim', 'num_layers', 'bn_groups'):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'MLPHead.{field} must be a positive integer, got {value!r}')
    super().__post_init__()

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, groups: jax.Array | None = None) -> jax.Array:
    """Features (B, D) -> projections (B, out_dim) float32. groups: (B,) batch-norm group of
    each row, or None (bn_groups contiguous groups), as cl_jax.models.resnet.ResNet's."""
    x = x.astype(jnp.float32)
    for layer in range(self.num_layers - 1):
      x = nn.Dense(self.hidden_dim, kernel_init=dense_init, name=f'hidden{layer + 1}')(x)
      if self.use_bn:
        x = GroupBatchNorm(num_groups=self.bn_groups, name=f'bn{layer + 1}')(x, not train, groups)
      x = relu(x)
    x = nn.Dense(self.out_dim, kernel_init=dense_init, name='out')(x)
    if self.out_bn:
      x = GroupBatchNorm(num_groups=self.bn_groups, name='out_bn')(x, not train, groups)
    return x


class Conv5Head(nn.Module):
  """LooC++'s projection head (Xiao et al. 2021, Sec. 4, "Methods"): the backbone's conv5
  stage (the last residual stage, its own copy per head), global average pooling, then the
  MLP head.

  Attributes:
    depth, width_multiplier, dtype, bn_groups, grad_mesh: those of the ResNet it completes.
    mlp: the MLPHead on the pooled conv5 features.
    zero_init_residual: as the ResNet's.
  """

  depth: int
  width_multiplier: float
  dtype: Any
  bn_groups: int
  mlp: nn.Module
  zero_init_residual: bool = True
  grad_mesh: Mesh | None = None

  @nn.compact
  def __call__(
      self, feature_map: jax.Array, train: bool, groups: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    """conv4 features (B, h, w, C4) -> ((B, C5) float32 pooled conv5 features, (B, out_dim)
    float32 unnormalised projection). groups: as the ResNet's."""
    kind, blocks = _STAGES[self.depth]
    x = residual_stage(
        self, feature_map, train, 3, base_width(self.width_multiplier), kind, blocks[3], groups
    )
    pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    return pooled, self.mlp(pooled, train=train, groups=groups)
