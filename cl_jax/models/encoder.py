"""Encoder = backbone + projection head(s), and its builder from the ``model`` config block.

With LooC (Xiao et al. 2021, Sec. 3) the encoder has n + 1 projection heads on the shared
backbone, one embedding space Z_i per head; with LooC++ each head starts with its own copy of
the last residual stage (conv5), and the backbone stops after conv4.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax.models.heads import Conv5Head, MLPHead, l2_normalize
from cl_jax.models.resnet import DEPTHS, ResNet, base_width

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}  # model.dtype values


class Encoder(nn.Module):
  """f (backbone) followed by g (projection head); z = g(f(x)) / ||g(f(x))||_2; optionally
  a predictor q on top, p = q(g(f(x))) (BYOL, SimSiam), and extra heads g_1..g_n (LooC).

  Attributes:
    backbone: module mapping (x, train) to dict(pooled=(B, D), feature_map=(B, h, w, D)).
    head: module mapping (pooled, train) to (B, out_dim); with conv5_heads a Conv5Head
      mapping (feature_map, train) to ((B, D5) pooled conv5 features, (B, out_dim)).
    predictor: module mapping (projection, train) to (B, out_dim), or None.
    extra_heads: LooC's heads g_1..g_n, each of the same kind as `head` (head 0).
    conv5_heads: the heads are Conv5Heads (LooC++): they read the backbone's feature map.
    region_head: ICR's projector of region representations (DICR paper, Sec. 4.2), module
      mapping ((N, D), train) to (N, d), used through project_regions; or None.
  """

  backbone: nn.Module
  head: nn.Module
  predictor: nn.Module | None = None
  extra_heads: tuple[nn.Module, ...] = ()
  conv5_heads: bool = False
  region_head: nn.Module | None = None

  def project_regions(self, h: jax.Array, train: bool) -> jax.Array:
    """ICR's region embeddings: (N, D) region representations -> (N, d) float32."""
    return self.region_head(h, train=train).astype(jnp.float32)

  def _project(self, head: nn.Module, features: dict, train: bool, groups: jax.Array | None):
    """(head features: pooled conv5 (B, D5) or the projection itself, (B, out_dim) float32)."""
    if self.conv5_heads:
      conv5, projection = head(features['feature_map'], train=train, groups=groups)
      return conv5, projection.astype(jnp.float32)
    projection = head(features['pooled'], train=train, groups=groups).astype(jnp.float32)
    return projection, projection

  @nn.compact
  def __call__(
      self,
      x: jax.Array,
      train: bool,
      predict: bool = False,
      groups: jax.Array | None = None,
  ) -> dict[str, jax.Array]:
    """Images (B, H, W, 3) -> dict(pooled (B, D) float32, feature_map (B, h, w, D),
    projection (B, out_dim) float32, the head's output; z, the projection at unit L2 norm;
    with predict=True also p (B, out_dim) float32, the predictor's unnormalised output on the
    projection).

    With extra heads (LooC) also z_heads (B, n + 1, out_dim), the unit embeddings of every
    head (z_heads[:, 0] = z); with more than one head or with conv5 heads also head_features
    (B, (n + 1) F), the heads' features concatenated in head order (LooC++'s representation:
    the pooled conv5 features, F = D5; otherwise the unnormalised projections, F = out_dim).
    pooled and feature_map are the shared backbone's (conv4 with conv5 heads).

    The predictor's variables are created at init; a call with predict=False (the
    target network of BYOL) does not touch them. groups: (B,) batch-norm group of each image
    for every BN of the backbone and heads (shuffle-BN by statistics, see
    cl_jax.models.batchnorm.scattered_group_normalise), or None (model.bn_groups contiguous
    groups); not with predict."""
    if groups is not None and predict:
      raise ValueError('groups is for the key encoder, which has no predictor: predict=False')
    features = self.backbone(x, train=train, groups=groups)
    head_features, projection = self._project(self.head, features, train, groups)
    out = {**features, 'projection': projection, 'z': l2_normalize(projection)}
    if self.extra_heads or self.conv5_heads:
      extra = [self._project(h, features, train, groups) for h in self.extra_heads]
      out['z_heads'] = jnp.stack([out['z']] + [l2_normalize(p) for _, p in extra], axis=1)
      out['head_features'] = jnp.concatenate(
          [head_features] + [f for f, _ in extra], axis=1
      ).astype(jnp.float32)
    if self.region_head is not None and self.is_initializing():
      self.region_head(features['pooled'], train=train)
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


def head_layout(config: ml_collections.ConfigDict) -> dict:
  """build_encoder's head arguments for a whole run config: n + 1 heads for LooC with n
  atomic augmentations (looc.augmentations), conv5 heads for LooC++; one plain head
  otherwise (also for configs saved before the looc block existed); a region head of
  dicr.icr_layers layers for DICR's ICR variant."""
  looc, dicr = config.get('looc'), config.get('dicr')
  layout = {'heads': 1, 'conv5_heads': False, 'region_head_layers': 0}
  if looc is not None and looc.enabled:
    layout.update(heads=1 + len(looc.augmentations), conv5_heads=bool(looc.conv5_heads))
  if dicr is not None and dicr.enabled and dicr.variant == 'icr':
    layout['region_head_layers'] = dicr.icr_layers
  return layout


def encoder_for(config: ml_collections.ConfigDict, mesh: Mesh | None = None) -> 'Encoder':
  """The encoder of a run config: build_encoder(config.model, **head_layout(config)), for
  training on `mesh` when given (build_encoder's grad_mesh)."""
  return build_encoder(config.model, **head_layout(config), mesh=mesh)


def _check_model_fields(model_cfg: ml_collections.ConfigDict) -> None:
  """ValueError naming the first field of the ``model`` block that build_encoder cannot use."""
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
  if isinstance(depth, bool) or not isinstance(depth, int) or depth not in DEPTHS:
    raise ValueError(f'model.depth must be one of {DEPTHS}, got {depth!r}')
  if model_cfg.stem not in ('imagenet', 'cifar'):
    raise ValueError(f"model.stem must be 'imagenet' or 'cifar', got {model_cfg.stem!r}")
  try:
    base_width(model_cfg.width_multiplier)
  except ValueError as error:
    raise ValueError(f'model.{error}') from None
  if model_cfg.dtype not in DTYPES:
    raise ValueError(f"model.dtype must be 'float32' or 'bfloat16', got {model_cfg.dtype!r}")
  for field in ('head_hidden_dim', 'head_out_dim', 'head_layers', 'bn_groups'):
    _positive_int(model_cfg, field)


def _make_head(
    model_cfg: ml_collections.ConfigDict, conv5_heads: bool, grad_mesh: Mesh | None
) -> nn.Module:
  """One projection head of the ``model`` block: the MLP head, behind its own conv5 stage
  with `conv5_heads` (LooC++)."""
  groups = model_cfg.bn_groups
  mlp = MLPHead(
      hidden_dim=model_cfg.head_hidden_dim,
      out_dim=model_cfg.head_out_dim,
      num_layers=model_cfg.head_layers,
      use_bn=model_cfg.head_bn,
      out_bn=model_cfg.head_out_bn,
      bn_groups=groups,
  )
  if not conv5_heads:
    return mlp
  return Conv5Head(
      depth=model_cfg.depth,
      width_multiplier=model_cfg.width_multiplier,
      dtype=DTYPES[model_cfg.dtype],
      bn_groups=groups,
      mlp=mlp,
      grad_mesh=grad_mesh,
  )


def build_encoder(
    model_cfg: ml_collections.ConfigDict,
    heads: int = 1,
    conv5_heads: bool = False,
    region_head_layers: int = 0,
    mesh: Mesh | None = None,
) -> Encoder:
  """Builds the ResNet + MLP-head encoder from the ``model`` config block.

  heads: number of projection heads (LooC: n + 1; 1 otherwise). conv5_heads: each head starts
  with its own conv5 stage and the backbone stops after conv4 (LooC++). region_head_layers:
  > 0 adds ICR's region projector, an MLP head of that many layers like the projection head
  (0: none). mesh: the training mesh; with model.grad_reduce_dtype 'float32' a bfloat16
  network's convolution weight gradients are summed across its data axis in float32
  (cl_jax.models.conv), with 'bfloat16' by XLA in bfloat16. None: evaluation (no gradient).

  Fields: depth (10 | 18 | 50), stem ('imagenet' | 'cifar'), width_multiplier (64 * w a positive
  integer), head_hidden_dim, head_out_dim, head_layers (positive integers), head_bn,
  head_out_bn (bools), predictor_hidden_dim (0: no predictor; else the hidden width of a
  Linear-BN-ReLU-Linear predictor back to head_out_dim), dtype ('float32' | 'bfloat16'),
  bn_groups (positive integer, used by every BN).
  """
  _check_model_fields(model_cfg)
  if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
    raise ValueError(f'heads must be a positive integer, got {heads!r}')
  grad_mesh = None
  if mesh is not None:
    reduce_dtype = model_cfg.get('grad_reduce_dtype')
    if reduce_dtype not in DTYPES:
      raise ValueError(
          f"model.grad_reduce_dtype must be 'float32' or 'bfloat16', got {reduce_dtype!r}"
      )
    grad_mesh = mesh if reduce_dtype == 'float32' else None
  backbone = ResNet(
      depth=model_cfg.depth,
      stem=model_cfg.stem,
      width_multiplier=model_cfg.width_multiplier,
      dtype=DTYPES[model_cfg.dtype],
      bn_groups=model_cfg.bn_groups,
      stages=3 if conv5_heads else 4,
      grad_mesh=grad_mesh,
  )
  groups = model_cfg.bn_groups
  head = _make_head(model_cfg, conv5_heads, grad_mesh)
  extra = tuple(_make_head(model_cfg, conv5_heads, grad_mesh) for _ in range(1, heads))
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
  if isinstance(region_head_layers, bool) or not isinstance(region_head_layers, int):
    raise ValueError(f'region_head_layers must be an integer, got {region_head_layers!r}')
  region_head = None
  if region_head_layers > 0:
    region_head = MLPHead(
        hidden_dim=model_cfg.head_hidden_dim,
        out_dim=model_cfg.head_out_dim,
        num_layers=region_head_layers,
        use_bn=model_cfg.head_bn,
        bn_groups=groups,
    )
  return Encoder(
      backbone=backbone,
      head=head,
      predictor=predictor,
      extra_heads=extra,
      conv5_heads=conv5_heads,
      region_head=region_head,
  )
