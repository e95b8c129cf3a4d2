# ruff: noqa: E501 (HLO text keeps its long lines)
"""Tests for cl_jax.bench.hlo_kernels: the kernels of a compiled program, their bytes by kind,
the calibration on the committed H200 trace and the modelled time."""

import gzip
import os

import jax
import jax.numpy as jnp
import pytest

from cl_jax.bench import hlo_kernels
from cl_jax.models.resnet import ResNet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M2 = 2 * 1024 * 1024  # bytes of a bf16[1024,1024] or an f32[512,1024]

# A GPU-style module: batch-norm statistics, their backward, a normalisation whose root is
# named after a ReLU but which fuses batch-norm work, a cuDNN convolution (output tuple with a
# workspace), a copy, the augmentation, a max-pool, and a while loop whose body and condition
# each run one kernel. Fused computations' instructions are not kernels.
HLO = """HloModule jit_step, is_scheduled=true

%fused_stats (param_0: bf16[1024,1024]) -> f32[1024] {
  %param_0 = bf16[1024,1024]{1,0} parameter(0)
  %convert.0 = f32[1024,1024]{1,0} convert(%param_0)
  %constant.0 = f32[] constant(0)
  ROOT %reduce.0 = f32[1024]{0} reduce(%convert.0, %constant.0), dimensions={0}, to_apply=%add
}

%fused_norm (param_0.1: bf16[1024,1024], param_1.1: f32[1024]) -> bf16[1024,1024] {
  %param_0.1 = bf16[1024,1024]{1,0} parameter(0)
  %param_1.1 = f32[1024]{0} parameter(1)
  %convert.1 = f32[1024,1024]{1,0} convert(%param_0.1)
  %broadcast.1 = f32[1024,1024]{1,0} broadcast(%param_1.1), dimensions={1}
  %mul.1 = f32[1024,1024]{1,0} multiply(%convert.1, %broadcast.1), metadata={op_name="jit(step)/jvp(Encoder)/backbone/stage1_block1/bn1/mul"}
  ROOT %convert.2 = bf16[1024,1024]{1,0} convert(%mul.1), metadata={op_name="jit(step)/jvp(Encoder)/backbone/max"}
}

%body (arg: (s32[], f32[4])) -> (s32[], f32[4]) {
  %arg = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %one = s32[] constant(1)
  %inc = s32[] add(%i, %one)
  %v = f32[4]{0} get-tuple-element(%arg), index=1
  ROOT %t = (s32[], f32[4]{0}) tuple(%inc, %v)
}

%cond (arg.1: (s32[], f32[4])) -> pred[] {
  %arg.1 = (s32[], f32[4]{0}) parameter(0)
  %j = s32[] get-tuple-element(%arg.1), index=0
  %ten = s32[] constant(10)
  ROOT %lt = pred[] compare(%j, %ten), direction=LT
}

ENTRY %main (p0: bf16[1024,1024], p1: f32[512,1024], p2: s32[], p3: bf16[1024,1024]) -> bf16[1024,1024] {
  %p0 = bf16[1024,1024]{1,0} parameter(0)
  %p1 = f32[512,1024]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %p3 = bf16[1024,1024]{1,0} parameter(3)
  %stats = f32[1024]{0} fusion(%p0), kind=kInput, calls=%fused_stats, metadata={op_name="jit(step)/jvp(Encoder)/backbone/stage1_block1/bn1/reduce_sum"}
  %bwd = f32[1024]{0} fusion(%p0, %p3), kind=kInput, calls=%fused_stats, metadata={op_name="jit(step)/transpose(jvp(Encoder))/backbone/stage1_block1/bn1/reduce_sum"}
  %norm = bf16[1024,1024]{1,0} fusion(%p0, %stats), kind=kLoop, calls=%fused_norm
  %conv = (bf16[1024,1024]{1,0}, u8[65536]{0}) custom-call(%norm, %p0), custom_call_target="__cudnn$convForward", metadata={op_name="jit(step)/jvp(Encoder)/backbone/conv"}
  %gte = bf16[1024,1024]{1,0} get-tuple-element(%conv), index=0
  %copy.1 = bf16[1024,1024]{1,0} copy(%gte)
  %aug = f32[512,1024]{1,0} fusion(%p1), kind=kLoop, calls=%fused_stats, metadata={op_name="jit(step)/augment/mul"}
  %zero = bf16[] constant(0)
  %pool = bf16[512,1024]{1,0} reduce-window(%norm, %zero), window={size=2x1 stride=2x1}, to_apply=%max
  %c4 = f32[4]{0} constant({1, 2, 3, 4})
  %tuple.0 = (s32[], f32[4]{0}) tuple(%p2, %c4)
  %while.0 = (s32[], f32[4]{0}) while(%tuple.0), condition=%cond, body=%body
  ROOT %bitcast.0 = bf16[1024,1024]{1,0} bitcast(%copy.1)
}
"""


def test_kernels_and_bytes_of_a_hand_counted_module():
  assert sorted(hlo_kernels.executed(HLO)) == sorted(
      ["stats", "bwd", "norm", "conv", "copy.1", "aug", "pool", "lt", "inc"]
  )
  table = hlo_kernels.kernel_table(HLO)
  # Result and operands of each: f32[1024] is 4096 bytes, the scalars 4 (pred 1, bf16 2).
  assert table["by_kind"] == {
      "BN statistics": {"kernels": 1, "bytes": 4096 + M2},
      "BN backward": {"kernels": 1, "bytes": 4096 + 2 * M2},
      "BN elementwise": {"kernels": 1, "bytes": M2 + M2 + 4096},
      "convolution": {"kernels": 1, "bytes": 3 * M2},  # its first result, not the workspace
      "augmentation": {"kernels": 1, "bytes": 2 * M2},
      "pooling": {"kernels": 1, "bytes": M2 // 2 + M2 + 2},
      "small kernels": {"kernels": 2, "bytes": (1 + 4 + 4) + (4 + 4 + 4)},
      "other": {"kernels": 1, "bytes": 2 * M2},
  }
  assert table["kernels"] == 9
  assert table["bytes"] == 4096 * 3 + M2 * 13 + M2 // 2 + 2 + 21


def test_the_max_pools_own_kernels_are_pooling_and_the_batch_norm_passes_reading_it_are_not():
  """The stem's max-pool under autodiff takes no reduce-window: its kernels are known by their
  own op's scope, "max_pool"; a batch norm pass that fuses some of the max-pool's ops (its
  gradient's last cast) stays batch norm, and a plain reduce-window is pooling as before."""

  def kernel(op_name, fused_names, fused, opcode="fusion"):
    return {
        "opcode": opcode,
        "op_name": op_name,
        "fused_op_names": set(fused_names),
        "target": "",
        "fused": set(fused),
        "bytes": 10**9,
    }

  stem = "jit(step)/transpose(jvp(Encoder))/backbone"
  forward = kernel(
      "jit(step)/jvp(Encoder)/backbone/max_pool/cond/branch_0_fun/select_n",
      ["jit(step)/jvp(Encoder)/backbone/stem_bn/mul"],
      ["select", "multiply", "slice"],
  )
  gradient = kernel(f"{stem}/max_pool/cond/branch_0_fun/slice", [], ["pad", "select", "add"])
  bn_sums = kernel(
      f"{stem}/stem_bn/cond/branch_0_fun/reduce",
      [f"{stem}/max_pool/cond/branch_0_fun/convert_element_type"],
      ["reduce", "multiply"],
  )
  window = kernel("jit(step)/Encoder/backbone/reduce_window_max", [], ["reduce-window"])
  assert [hlo_kernels.kind_of(k) for k in (forward, gradient, bn_sums, window)] == [
      "pooling",
      "pooling",
      "BN backward",
      "pooling",
  ]


def test_a_cpu_program_is_one_kernel_reading_and_writing_its_arrays():
  x = jnp.zeros((256, 256), jnp.float32)
  hlo = jax.jit(lambda x: jnp.sin(x) * 2).lower(x).compile().as_text()
  table = hlo_kernels.kernel_table(hlo)
  assert table["kernels"] == 1
  assert table["bytes"] == 2 * 256 * 256 * 4


def test_modelled_time_from_rates():
  table = {
      "by_kind": {
          "BN statistics": {"kernels": 3, "bytes": 3e9},
          "pooling": {"kernels": 1, "bytes": 1e9},
          "small kernels": {"kernels": 4, "bytes": 10},
      }
  }
  rates = {"gb_per_s": {"BN statistics": 3000.0, "convolution": 500.0}, "small_kernel_us": 2.0}
  # 3 GB at 3 TB/s; pooling has no rate of its own: the slowest (0.5 TB/s); 4 launches of 2 us.
  assert hlo_kernels.model_ms(table, rates) == {
      "BN statistics": 1.0,
      "pooling": 2.0,
      "small kernels": 0.008,
      "total": 3.008,
  }


@pytest.mark.slow
def test_the_committed_rates_come_from_the_committed_h200_trace():
  bench = os.path.join(ROOT, "results", "bench", "h200")
  rates = hlo_kernels.calibrate_files(
      os.path.join(bench, "step_trace.json.gz"), os.path.join(bench, "step_hlo.txt.gz"), 3
  )
  committed = hlo_kernels.load_rates()
  assert rates["gb_per_s"] == committed["gb_per_s"]
  assert rates["small_kernel_us"] == committed["small_kernel_us"]
  assert "ef9df6c" in committed["source"]
  # The trace's step: the model gives back the op time the profile measured (63.56 ms).
  with open(os.path.join(bench, "report.md")) as f:
    assert "op time 63.56 ms per step" in f.read()
  with gzip.open(os.path.join(bench, "step_hlo.txt.gz"), "rt") as f:
    table = hlo_kernels.kernel_table(f.read())
  assert table["kernels"] == 2205
  assert hlo_kernels.model_ms(table, committed)["total"] == pytest.approx(63.56, abs=0.02)


def test_batch_norm_input_elements_counted_by_hand():
  # ResNet-10, CIFAR stem, 8 base channels, 8 px, batch 2 (B x H x W x C per BN):
  # stem 2*8*8*8; stage 1 bn1, bn2 the same; stage 2 (16 ch, 4 px) bn1, bn2, proj_bn;
  # stage 3 (32 ch, 2 px) and stage 4 (64 ch, 1 px) likewise.
  net = ResNet(depth=10, stem="cifar", width_multiplier=0.125)
  expected = 3 * 1024 + 3 * 512 + 3 * 256 + 3 * 128
  assert hlo_kernels.bn_input_elements(net, 2, 8) == expected


def _kernel(op_name, fused_op_names, fused=("add", "pad", "transpose"), nbytes=200 << 20):
  return {
      "op_name": op_name, "opcode": "fusion", "target": "", "fused": set(fused),
      "fused_op_names": set(fused_op_names), "bytes": nbytes,
  }  # fmt: skip


def test_a_kernel_fusing_the_augmentation_counts_as_augmentation_and_shuffle_bn_is_not_bn():
  """XLA fuses the views' last augmentation pass into their consumers: the stem's stacking of
  the query views (root under stem_conv) and, for the key views, MoCo's shuffle (a gather under
  "shuffle_bn", which is no batch norm); both are augmentation. The same kernels without an
  augmentation op: the stacking is "other", the shuffle's gather too; a real BN stays BN."""
  stem = "jit(train_step)/jvp(Encoder)/backbone/stem_conv/jit(_pad)/pad"
  augment = "jit(train_step)/augment/div"
  shuffle = "jit(train_step)/shuffle_bn/gather"
  assert hlo_kernels.kind_of(_kernel(stem, [stem, augment])) == "augmentation"
  assert hlo_kernels.kind_of(_kernel(stem, [stem, augment, shuffle])) == "augmentation"
  assert hlo_kernels.kind_of(_kernel(stem, [stem])) == "other"
  assert hlo_kernels.kind_of(_kernel(shuffle, [shuffle], fused=("gather",))) == "other"
  bn = "jit(train_step)/jvp(Encoder)/backbone/stem_bn/mul"
  assert hlo_kernels.kind_of(_kernel(bn, [bn, shuffle])) == "BN elementwise"
