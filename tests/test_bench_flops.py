"""The analytic FLOP count of cl_jax.bench.flops: kernel taps by hand, ResNet-50's published
multiply-adds, and the methods it refuses (its agreement with XLA's count of compiled steps:
tests/test_bench.py, tests/test_compile_targets.py)."""

import pytest

from cl_jax.bench import flops
from configs import looc, mocov2_patchns, simclr


def test_valid_taps_by_hand():
  # 4 px, 3x3, stride 1, padding 1: 4 outputs, the two border ones lose one tap each.
  assert flops.valid_taps(4, 3, 1) == (4, 10)
  # Stride 2: outputs at -1..1 (2 taps inside) and 1..3 (3 taps inside).
  assert flops.valid_taps(4, 3, 2) == (2, 5)
  assert flops.valid_taps(7, 1, 2) == (4, 4)


def test_resnet50_forward_is_its_published_count():
  """torchvision's ResNet-50 (v1.5): 4.09 G multiply-adds at 224 px counting the padded taps
  (He et al. 2016 give 3.8 G for v1, stride on the 1x1); the valid taps are slightly fewer."""
  convs = flops.backbone_convolutions(50, "imagenet", 1.0, 224)
  assert len(convs) == 1 + 16 * 3 + 4  # stem, 16 bottlenecks of 3 convs, 4 projections
  padded = sum(
      c_in * c_out * k * k * flops.valid_taps(side, k, s)[0] ** 2
      for c_in, c_out, k, s, side in convs
  )
  assert 4.08e9 <= padded <= 4.10e9
  valid = sum(flops.convolution_flops(convs)) / 2
  assert 0.96 * padded <= valid < padded


def test_methods_without_a_count_are_named():
  with pytest.raises(ValueError, match="no analytic FLOP count for method 'moco' with looc"):
    flops.step_flops_per_image(looc.get_config(None))
  c = simclr.get_config(None)
  c.nonsemantic.enabled = True
  with pytest.raises(ValueError, match="patch negatives outside MoCo"):
    flops.step_flops_per_image(c)


def test_symmetric_moco_counts_both_directions():
  c = mocov2_patchns.get_config(None)
  one = flops.step_flops_per_image(c)
  c.moco.symmetric = True
  assert flops.step_flops_per_image(c)["per_image"] == 2 * one["per_image"]
  # The patch negatives add one key forward and one logit per query.
  c.moco.symmetric = False
  c.nonsemantic.enabled = False
  plain = flops.step_flops_per_image(c)["per_image"]
  d = c.model.head_out_dim
  assert one["per_image"] - plain == pytest.approx(one["forward"] + 4 * d)
