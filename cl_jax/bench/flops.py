"""Analytic FLOP count of a train step per image, from the architecture alone: the yardstick
for the FLOPs XLA reports for a compiled step (cl_jax.bench.compile).

A k x k convolution with C_in input and C_out output channels costs 2 C_in C_out FLOPs (one
multiply and one add) per kernel tap that lies inside the input, summed over the output
positions: the zero padding's taps are not counted, as TPU's compiler does not count them
(He et al. 2016 count the same multiply-adds). A dense layer costs 2 x in x out. The backward
pass of a layer costs twice its forward (the gradients of its input and of its weights), less
the first convolution's input gradient, which nothing needs: a forward and backward costs
3 F - F_stem. Batch norm, activations, pooling and the optimizer are elementwise and not
counted (a few percent of a ResNet's step).

Per image of the global batch, with F the forward of the encoder (backbone and projection
head), P the predictor's and K the queue's length:
  MoCo (He et al. 2020, Alg. 1): the query's forward and backward, the key's forward, and the
    logits against the queue, 2 d K, and their gradient with respect to the query, 2 d K:
    3 F - F_stem + F + 4 d K; symmetric: both views both ways (twice that); patch negatives
    (Ge et al. 2021, Sec. 2.3): num_ns more key forwards and logits per query (4 d num_ns);
    texture negatives (Sec. 2.2) likewise, one per query.
  LooC (Xiao et al. 2021, Sec. 3) on MoCo, with H = n + 1 heads and H key views: the query
    through the backbone and every head forward and backward, every key view through the
    backbone and every head, and per head the logits against its queue and the H keys of the
    image with their gradient: 3 F_H - F_stem + H F_H + 4 d H (K + H), where
    F_H = F_backbone + H F_head; LooC++ (Sec. 4) moves the conv5 stage into each head
    (F_backbone without conv5, F_head with it).
  SimCLR (Chen et al. 2020): both views forward and backward, and the 2N x 2N similarities of
    the batch and their gradient (6 d 2N per view): 2 (3 F - F_stem) + 24 d N.
  BYOL (Grill et al. 2020): both views through the online encoder and predictor forward and
    backward, and through the target forward: 2 (3 (F + P) - F_stem) + 2 F.
  SimSiam (Chen & He 2021): both views through the encoder and predictor forward and backward:
    2 (3 (F + P) - F_stem).
DICR (2025 submission, Sec. 3.2) adds the RoIAlign means of the feature map and a loss over
four regions per pair: elementwise, not counted, so its count is its base method's. ICR's
region heads and patch negatives outside MoCo have no count here.
"""

import ml_collections

from cl_jax.models import resnet

_STAGE_BLOCKS = {10: ("basic", (1, 1, 1, 1)), 18: ("basic", (2, 2, 2, 2))}
_STAGE_BLOCKS[50] = ("bottleneck", (3, 4, 6, 3))


def valid_taps(size: int, kernel: int, stride: int) -> tuple[int, int]:
  """(output side, kernel taps inside the input summed over the output positions) of a k x k
  convolution with padding k // 2 along one axis of `size` pixels."""
  pad = kernel // 2
  out = (size + 2 * pad - kernel) // stride + 1
  inside = sum(0 <= o * stride - pad + j < size for o in range(out) for j in range(kernel))
  return out, inside


def backbone_convolutions(
    depth: int, stem: str, width_multiplier: float, size: int
) -> list[tuple[int, int, int, int, int]]:
  """(C_in, C_out, k, stride, input side) of every convolution of the ResNet of
  cl_jax.models.resnet on `size` x `size` images: the stem (3x3/1, or 7x7/2 and a 3x3/2 max
  pool), then the four stages (stride 2 on the first block of stages 2-4, on the 3x3 of a
  bottleneck), with a 1x1 projection where the stride or the width changes."""
  kind, blocks = _STAGE_BLOCKS[depth]
  width = resnet.base_width(width_multiplier)
  expansion = 4 if kind == "bottleneck" else 1
  if stem == "cifar":
    convs, side = [(3, width, 3, 1, size)], size
  else:
    convs = [(3, width, 7, 2, size)]
    side = valid_taps(valid_taps(size, 7, 2)[0], 3, 2)[0]
  c_in = width
  for stage, count in enumerate(blocks):
    planes = width * 2**stage
    for block in range(count):
      stride = 2 if stage > 0 and block == 0 else 1
      out_side = valid_taps(side, 3, stride)[0]
      if kind == "basic":
        convs += [(c_in, planes, 3, stride, side), (planes, planes, 3, 1, out_side)]
      else:
        convs += [
            (c_in, planes, 1, 1, side),
            (planes, planes, 3, stride, side),
            (planes, planes * expansion, 1, 1, out_side),
        ]
      if stride != 1 or c_in != planes * expansion:
        convs.append((c_in, planes * expansion, 1, stride, side))
      c_in, side = planes * expansion, out_side
  return convs


def conv5_convolutions(depth: int) -> int:
  """How many of backbone_convolutions' entries are the last stage's (conv5): its blocks'
  convolutions and the projection of its strided first block."""
  kind, blocks = _STAGE_BLOCKS[depth]
  return blocks[3] * (3 if kind == "bottleneck" else 2) + 1


def convolution_flops(convs: list[tuple[int, int, int, int, int]]) -> list[float]:
  """The forward FLOPs of each (C_in, C_out, k, stride, side) convolution (square inputs)."""
  return [2.0 * c_in * c_out * valid_taps(side, k, s)[1] ** 2 for c_in, c_out, k, s, side in convs]


def mlp_flops(widths: list[int]) -> float:
  """Forward FLOPs of the dense layers widths[0] -> widths[1] -> ... (biases not counted)."""
  return sum(2.0 * a * b for a, b in zip(widths[:-1], widths[1:]))


def step_flops_per_image(config: ml_collections.ConfigDict) -> dict:
  """The analytic FLOPs of one train step of `config` per image of the global batch (module
  docstring): {"per_image", "forward" (F), "stem" (F_stem), "predictor" (P)}.

  Raises:
    ValueError: the method or an add-on without a count here.
  """
  m = config.model
  unsupported = [
      name
      for name, on in (
          ("ICR's region heads", config.dicr.enabled and config.dicr.variant == "icr"),
          (
              "non-semantic negatives outside MoCo",
              config.nonsemantic.enabled and config.method != "moco",
          ),
      )
      if on
  ]
  if config.method not in ("moco", "simclr", "byol", "simsiam") or unsupported:
    raise ValueError(
        f"no analytic FLOP count for method {config.method!r}"
        + (f" with {', '.join(unsupported)}" if unsupported else "")
    )
  convs = convolution_flops(
      backbone_convolutions(m.depth, m.stem, m.width_multiplier, config.data.image_size)
  )
  feature = resnet.resnet_feature_dim(m.depth, m.width_multiplier)
  d = m.head_out_dim
  head = mlp_flops([feature] + [m.head_hidden_dim] * (m.head_layers - 1) + [d])
  forward, stem = sum(convs) + head, convs[0]
  predictor = mlp_flops([d, m.predictor_hidden_dim, d]) if m.predictor_hidden_dim else 0.0
  if config.looc.enabled:
    heads = 1 + len(config.looc.augmentations)
    conv5 = sum(convs[-conv5_convolutions(m.depth) :]) if config.looc.conv5_heads else 0.0
    forward_h = sum(convs) - conv5 + heads * (conv5 + head)
    per_image = 3 * forward_h - stem + heads * forward_h
    per_image += 4.0 * d * heads * (config.moco.queue_size + heads)
  elif config.method == "moco":
    ns = config.nonsemantic.num_ns if config.nonsemantic.enabled else 0
    one_way = 3 * forward - stem + (1 + ns) * forward + 4.0 * d * (config.moco.queue_size + ns)
    per_image = 2 * one_way if config.moco.symmetric else one_way
  elif config.method == "simclr":
    per_image = 2 * (3 * forward - stem) + 24.0 * d * config.optim.batch_size
  else:
    per_image = 2 * (3 * (forward + predictor) - stem)
    if config.method == "byol":
      per_image += 2 * forward
  return {"per_image": per_image, "forward": forward, "stem": stem, "predictor": predictor}


def step_flops(lowered, devices: int) -> float:
  """FLOPs of one call of a step on one device: XLA's cost analysis of the lowered program
  (the whole step over the global batch, before the backend's passes) / devices. Convolutions
  count 2 per multiply-add over the taps that fall inside the image (padding excluded), as a
  hand count does. The compiled program is not used: on GPUs its convolutions are cuDNN custom
  calls that XLA's cost analysis does not count (a compiled MoCo-v2 ResNet-50 step reported 0.75
  of its 32 GFLOP per image on an H200), and TPU recomputation would count as model work.

  Args:
    lowered: jax.stages.Lowered of the jitted step (step.lower(state, data)).
    devices: the devices the step's global batch is split over.
  """
  analysis = lowered.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
    analysis = analysis[0]
  if not analysis or not analysis.get("flops"):
    raise RuntimeError("XLA's cost analysis of the lowered step reports no FLOP count")
  return float(analysis["flops"]) / devices
