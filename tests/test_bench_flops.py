"""The analytic FLOP count of cl_jax.bench.flops: kernel taps by hand, ResNet-50's published
multiply-adds, and the methods it refuses (its agreement with XLA's count of compiled steps:
tests/test_bench.py, tests/test_compile_targets.py)."""

import pytest

from cl_jax.bench import flops
from configs import dicr, looc, loocpp, mocov2_patchns, mocov2_texturens, simclr


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
  c = simclr.get_config(None)
  c.nonsemantic.enabled = True
  with pytest.raises(ValueError, match="non-semantic negatives outside MoCo"):
    flops.step_flops_per_image(c)
  c = dicr.get_config(None)
  c.dicr.variant = "icr"
  with pytest.raises(ValueError, match="ICR's region heads"):
    flops.step_flops_per_image(c)


def test_texture_negatives_and_dicr_cost_what_their_base_costs():
  """A texture negative is one more key forward per query, as one patch negative; DICR's
  region means are elementwise, so it counts as its base method."""
  assert flops.step_flops_per_image(mocov2_texturens.get_config(None)) == (
      flops.step_flops_per_image(mocov2_patchns.get_config(None))
  )
  assert flops.step_flops_per_image(dicr.get_config(None)) == (
      flops.step_flops_per_image(simclr.get_config(None))
  )


def _tiny(module):
  """A CIFAR ResNet-18 at 32 px, batch 8, float32, queue 512 of a config module."""
  c = module.get_config(None)
  c.data.image_size = 32
  c.model.update(depth=18, stem="cifar", width_multiplier=1.0, dtype="float32")
  c.moco.queue_size = 512
  c.optim.batch_size = 8
  return c


@pytest.mark.parametrize("module", [looc, loocpp], ids=["looc", "loocpp"])
def test_looc_count_matches_xla_on_the_lowered_step(module):
  """LooC's and LooC++'s counts (2 heads and 2 key views, LooC++'s heads with their own conv5)
  against XLA's FLOPs of the unoptimised step: within the BN, activation and augmentation work
  the count leaves out (as for MoCo, tests/test_bench.py)."""
  import jax

  from cl_jax.bench import compile as bench_compile

  c = _tiny(module)
  lowered, _ = bench_compile.lower_step(c, jax.devices("cpu")[:1])
  xla = lowered.cost_analysis()["flops"] / c.optim.batch_size
  analytic = flops.step_flops_per_image(c)["per_image"]
  assert 0.99 * analytic <= xla <= 1.03 * analytic


def test_loocpp_counts_one_more_conv5_stage_per_extra_head():
  """LooC++ = LooC + (heads - 1) copies of conv5, each run by the query (forward, backward:
  3x) and by every key view (2 views): 5 x conv5 forward more, with 2 heads."""
  conv5 = sum(flops.convolution_flops(flops.backbone_convolutions(18, "cifar", 1.0, 32)[-5:]))
  extra = flops.step_flops_per_image(_tiny(loocpp))["per_image"] - (
      flops.step_flops_per_image(_tiny(looc))["per_image"]
  )
  assert extra == pytest.approx(5 * conv5)


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
