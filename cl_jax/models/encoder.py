"""Encoder = backbone + projection head, and its builder from the ``model`` config block."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from cl_jax.models.heads import MLPHead, l2_normalize
from cl_jax.models.resnet import ResNet, base_width

_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


class Encoder(nn.Module):
  """f (backbone) followed by g (projection head); z = g(f(x)) / ||g(f(x))||_2; optionally
  a predictor q on top, p = q(g(f(x))) (BYOL, SimSiam).

  Attributes:
    backbone: module mapping (x, train) to dict(pooled=(B, D), feature_map=(B, h, w, D)).
    head: module mapping (pooled, train) to (B, out_dim).
    predictor: module mapping (projection, train) to (B, out_dim), or None.
  """

  backbone: nn.Module
  head: nn.Module
  predictor: nn.Module | None = None

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, predict: bool = False) -> dict[str, jax.Array]:
    """Images (B, H, W, 3) -> dict(pooled (B, D) float32, feature_map (B, h, w, D),
    z (B, out_dim) float32, unit L2 norm; with predict=True also p (B, out_dim) float32,
    the predictor's unnormalised output on the unnormalised projection).

    The predictor's variables are created at init; a call with predict=False (the
    target network of BYOL) does not touch them."""
    features = self.backbone(x, train=train)
    projection = self.head(features['pooled'], train=train).astype(jnp.float32)
    out = {**features, 'z': l2_normalize(projection)}
    if self.predictor is not None and (predict or self.is_initializing()):
      out['p'] = self.predictor(projection, train=train).astype(jnp.float32)
    elif predict:
      raise ValueError(
          'predict=True needs an encoder built with a predictor ' '(model.predictor_hidden_dim > 0)'
      )
    return out


def _positive_int(cfg: ml_collections.ConfigDict, field: str) -> int:
  value = cfg[field]
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f'model.{field} must be a positive integer, got {value!r}')
  return value


def build_encoder(model_cfg: ml_collections.ConfigDict) -> Encoder:
  """Builds the ResNet + MLP-head encoder from the ``model`` config block.

  Fields: depth (18 | 50), stem ('imagenet' | 'cifar'), width_multiplier (64 * w a positive
  integer), head_hidden_dim, head_out_dim, head_layers (positive integers), head_bn,
  head_out_bn (bools), predictor_hidden_dim (0: no predictor; else the hidden width of a
  Linear-BN-ReLU-Linear predictor back to head_out_dim), dtype ('float32' | 'bfloat16'),
  bn_groups (positive integer, used by every BN).
  """
  fields = (
      'depth',
      'stem',
      'width_multiplier',
      'head_hidden_dim',
      'head_out_dim',
      'head_layers',
      'head_bn',
      'head_out_bn',
      'predictor_hidden_dim',
      'dtype',
      'bn_groups',
  )
  missing = [field for field in fields if field not in model_cfg]
  if missing:
    raise ValueError(f'model config is missing field(s) {missing}')
  depth = model_cfg.depth
  if isinstance(depth, bool) or not isinstance(depth, int) or depth not in (18, 50):
    raise ValueError(f'model.depth must be 18 or 50, got {depth!r}')
  if model_cfg.stem not in ('imagenet', 'cifar'):
    raise ValueError(f"model.stem must be 'imagenet' or 'cifar', got {model_cfg.stem!r}")
  try:
    base_width(model_cfg.width_multiplier)
  except ValueError as error:
    raise ValueError(f'model.{error}') from None
  if model_cfg.dtype not in _DTYPES:
    raise ValueError(f"model.dtype must be 'float32' or 'bfloat16', got {model_cfg.dtype!r}")
  for field in ('head_hidden_dim', 'head_out_dim', 'head_layers', 'bn_groups'):
    _positive_int(model_cfg, field)

  backbone = ResNet(
      depth=model_cfg.depth,
      stem=model_cfg.stem,
      width_multiplier=model_cfg.width_multiplier,
      dtype=_DTYPES[model_cfg.dtype],
      bn_groups=model_cfg.bn_groups,
  )
  groups = model_cfg.bn_groups
  head = MLPHead(
      hidden_dim=model_cfg.head_hidden_dim,
      out_dim=model_cfg.head_out_dim,
      num_layers=model_cfg.head_layers,
      use_bn=model_cfg.head_bn,
      out_bn=model_cfg.head_out_bn,
      bn_groups=groups,
  )
  hidden = model_cfg.predictor_hidden_dim
  if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 0:
    raise ValueError(f'model.predictor_hidden_dim must be a non-negative integer, got {hidden!r}')
  predictor = (
      MLPHead(
          hidden_dim=hidden,
          out_dim=model_cfg.head_out_dim,
          num_layers=2,
          use_bn=True,
          bn_groups=groups,
      )
      if hidden
      else None
  )
  return Encoder(backbone=backbone, head=head, predictor=predictor)
