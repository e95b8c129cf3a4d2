# ruff: noqa: E501 (HLO text keeps its long lines)
"""The step profile: HLO parsing, trace reading and the summary, on hand-made cases and on
a real trace of the benchmark's step."""

import gzip
import json
import os

import pytest

from cl_jax.bench import profile as step_profile
from cl_jax.bench import step as bench
from configs import mocov2_patchns

# A small optimized HLO module in XLA's text form: a CPU-style fusion around a convolution
# without metadata, a cuDNN convolution, a dot, an all-reduce, a copy, a while loop.
HLO = """HloModule jit_train_step, is_scheduled=true, entry_computation_layout={(f32[2]{0})->f32[2]{0}}

%fused_computation.1 (param_0: f32[8,4,4,3], param_1: f32[3,3,3,8]) -> f32[8,4,4,8] {
  %param_0 = f32[8,4,4,3]{3,2,1,0} parameter(0)
  %param_1 = f32[3,3,3,8]{3,2,1,0} parameter(1)
  ROOT %convolution.3 = f32[8,4,4,8]{3,2,1,0} convolution(%param_0, %param_1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, metadata={op_name="jit(train_step)/transpose(jvp(Encoder))/backbone/stem/conv_general_dilated"}
}

%fused_computation.2 (param_0.1: f32[8]) -> f32[8] {
  %param_0.1 = f32[8]{0} parameter(0)
  %convert.1 = bf16[8]{0} convert(%param_0.1)
  ROOT %convert.2 = f32[8]{0} convert(%convert.1), metadata={op_name="jit(train_step)/augment/mul"}
}

%body (p: (s32[], f32[2])) -> (s32[], f32[2]) {
  ROOT %p = (s32[], f32[2]{0}) parameter(0)
}

%cond (p.1: (s32[], f32[2])) -> pred[] {
  %p.1 = (s32[], f32[2]{0}) parameter(0)
  ROOT %c = pred[] constant(false)
}

ENTRY %main.9 (Arg_0.1: f32[2]) -> f32[2] {
  %Arg_0.1 = f32[2]{0} parameter(0)
  %ynn_fusion.1 = f32[8,4,4,8]{3,2,1,0} fusion(%a, %b), kind=kCustom, calls=%fused_computation.1, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %loop_fusion.2 = f32[8]{0} fusion(%c), kind=kLoop, calls=%fused_computation.2
  %cudnn-conv.1 = (bf16[8,4,4,8]{3,2,1,0}, u8[0]{0}) custom-call(%x, %y), custom_call_target="__cudnn$convForward", metadata={op_name="jit(train_step)/jvp(Encoder)/backbone/stem/conv_general_dilated"}
  %dot.4 = f32[8,8]{1,0} dot(%u, %v), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/Encoder/head/dense/dot_general"}
  %all-reduce-start.1 = f32[8]{0} all-reduce-start(%g), replica_groups={}, to_apply=%add, metadata={op_name="jit(train_step)/optimizer/add"}
  %copy.5 = f32[8,8]{0,1} copy(%dot.4), metadata={op_name="jit(train_step)/jvp()/mul"}
  %while.6 = (s32[], f32[2]{0}) while(%t), condition=%cond, body=%body, metadata={op_name="jit(train_step)/jit(_uniform)/while"}
  ROOT %neg.7 = f32[2]{0} negate(%Arg_0.1)
}
"""


def test_hlo_instructions_read_opcodes_names_targets_and_fusions():
  ins = step_profile.hlo_instructions(HLO)
  assert ins["ynn_fusion.1"]["opcode"] == "fusion"
  assert ins["ynn_fusion.1"]["fused"] == {"parameter", "convolution"}
  # No metadata on the fusion: it takes its convolution's name.
  assert ins["ynn_fusion.1"]["op_name"].startswith("jit(train_step)/transpose(jvp(Encoder))")
  assert ins["loop_fusion.2"]["op_name"] == "jit(train_step)/augment/mul"
  assert ins["cudnn-conv.1"]["target"] == "__cudnn$convForward"
  assert ins["while.6"]["opcode"] == "while"
  assert ins["neg.7"] == {
      "opcode": "negate",
      "op_name": "",
      "target": "",
      "fused": set(),
      "fused_op_names": set(),
      "bytes": 16,  # its f32[2] and its operand's
      "kernel": "neg.7",
  }
  assert ins["convolution.3"]["opcode"] == "convolution"


# A GPU-style module: two identical batch-norm reductions that share one kernel (XLA's
# deduplicated_name), one in the online forward and one in the target forward, and a cuDNN
# convolution whose output tuple holds a workspace.
GPU_HLO = """HloModule jit_train_step, is_scheduled=true

%fused_reduce.1 (param_0: bf16[5000,10000]) -> f32[10000] {
  %param_0 = bf16[5000,10000]{1,0} parameter(0)
  %convert.0 = f32[5000,10000]{1,0} convert(%param_0)
  %constant.0 = f32[] constant(0)
  ROOT %reduce.0 = f32[10000]{0} reduce(%convert.0, %constant.0), dimensions={0}, to_apply=%add
}

ENTRY %main (p0: bf16[5000,10000], p1: bf16[5000,10000]) -> f32[10000] {
  %p0 = bf16[5000,10000]{1,0} parameter(0)
  %p1 = bf16[5000,10000]{1,0} parameter(1)
  %input_reduce_fusion.1 = f32[10000]{0} fusion(%p0), kind=kInput, calls=%fused_reduce.1, metadata={op_name="jit(train_step)/jvp(Encoder)/bn/reduce_sum"}
  %input_reduce_fusion.2 = f32[10000]{0} fusion(%p1), kind=kInput, calls=%fused_reduce.1, metadata={op_name="jit(train_step)/Encoder/bn/reduce_sum" deduplicated_name="input_reduce_fusion.1"}
  %cudnn-conv.3 = (bf16[5000,10000]{1,0}, u8[4096]{0}) custom-call(%p0, /*index=1*/%p1), custom_call_target="__cudnn$convForward", metadata={op_name="jit(train_step)/jvp(Encoder)/conv"}
  ROOT %add.4 = f32[10000]{0} add(%input_reduce_fusion.1, %input_reduce_fusion.2)
}
"""


def test_bytes_reductions_and_shared_kernels():
  ins = step_profile.hlo_instructions(GPU_HLO)
  # Output and operands: f32[10000] and bf16[5000,10000].
  assert ins["input_reduce_fusion.1"]["bytes"] == 40_000 + 100_000_000
  # The convolution's first output, not its u8 workspace, and both operands.
  assert ins["cudnn-conv.3"]["bytes"] == 3 * 100_000_000
  assert ins["add.4"]["bytes"] == 3 * 40_000
  assert ins["input_reduce_fusion.2"]["kernel"] == "input_reduce_fusion.1"
  assert ins["input_reduce_fusion.1"]["kernel"] == "input_reduce_fusion.1"
  kind = step_profile.kind_of(
      *(ins["input_reduce_fusion.1"][k] for k in ("opcode", "target", "fused"))
  )
  assert kind == "reduction"
  # Inside a CUDA graph both reductions run as the kernel input_reduce_fusion_1: its time is
  # shared equally by the two instructions' phases; the convolution's hlo_op names its two
  # cuDNN kernels, whose bytes are the instruction's once.
  events = [
      ("input_reduce_fusion_1", 50.0),
      ("input_reduce_fusion_1", 50.0),
      ("cudnn-conv.3", 60.0),
      ("cudnn-conv.3", 40.0),
  ]
  s = step_profile.summarise(events, ins, steps=1)
  assert s["by_kind"] == {"convolution": 0.1, "reduction": 0.1}
  assert s["by_phase"] == {"online forward": 0.15, "target forward": 0.05}
  assert s["gb_by_kind"] == {"convolution": 0.3, "reduction": 0.2001}
  assert step_profile.gb_per_s(s, "reduction") == pytest.approx(2001.0)
  table = step_profile.format_summary(s)
  assert "GB/s" in table and " 2001" in table and " 3000" in table
  # An event that names an instruction (outside a graph) is that instruction's alone.
  s = step_profile.summarise([("input_reduce_fusion.2", 50.0)], ins, steps=1)
  assert s["by_phase"] == {"target forward": 0.05}


def test_kinds():
  ins = step_profile.hlo_instructions(HLO)
  kind = lambda name: step_profile.kind_of(
      ins[name]["opcode"], ins[name]["target"], ins[name]["fused"]
  )
  assert kind("ynn_fusion.1") == "convolution"
  assert kind("cudnn-conv.1") == "convolution"
  assert kind("loop_fusion.2") == "fusion"  # converts are not convolutions
  assert kind("dot.4") == "matmul"
  assert kind("all-reduce-start.1") == "collective"
  assert kind("copy.5") == "copy/transpose"
  assert kind("neg.7") == "other"
  assert step_profile.kind_of("custom-call", "__cublas$lt$matmul") == "matmul"


@pytest.mark.parametrize(
    "op_name, phase",
    [
        ("jit(train_step)/augment/jit(_apply_batch)/vmap()/mul", "augmentation"),
        ("jit(train_step)/transpose(jvp(Encoder))/backbone/stage1_block0/conv1", "backward"),
        ("jit(train_step)/jvp(Encoder)/backbone/stage1_block0/conv1", "online forward"),
        ("jit(train_step)/Encoder/backbone/stage1_block0/conv1", "target forward"),
        ("jit(train_step)/optimizer/mul", "optimizer"),
        ("jit(train_step)/jvp()/exp", "loss, queue, EMA, RNG, statistics"),
        ("", "unnamed (made by XLA passes)"),
    ],
)
def test_phase_of_name_stacks(op_name, phase):
  assert step_profile.phase_of(op_name) == phase


def _write_trace(path, events, processes):
  meta = [
      {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
      for pid, name in processes.items()
  ]
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": meta + events}, f)


def _event(pid, op, dur, module="jit_train_step"):
  return {"ph": "X", "pid": pid, "tid": 1, "ts": 0, "dur": dur, "name": op,
          "args": {"hlo_op": op, "hlo_module": module}}  # fmt: skip


def test_op_events_keep_the_device_lines_and_the_module(tmp_path):
  path = str(tmp_path / "t.json.gz")
  events = [
      _event(1, "dot.4", 5.0),  # host launch of a device kernel
      _event(2, "dot.4", 7.0),
      _event(2, "copy.5", 1.0, module="jit_other"),
      {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 3.0, "name": "python"},
  ]
  _write_trace(path, events, {1: "/host:CPU", 2: "/device:GPU:0"})
  assert step_profile.op_events(path, "jit_train_step") == [("dot.4", 7.0)]
  _write_trace(path, events[:1], {1: "/host:CPU"})  # a CPU trace: the host's events
  assert step_profile.op_events(path, "jit_train_step") == [("dot.4", 5.0)]


def test_kernels_inside_a_cuda_graph_are_named_by_their_instruction(tmp_path):
  """XLA's GPU runtime launches most of a step's kernels inside CUDA graphs: their events'
  hlo_op names the graph ("command_buffer_N") and the kernel is named after its instruction
  with "_" for "." (loop_fusion_2 for loop_fusion.2), as on an H200."""
  path = str(tmp_path / "t.json.gz")
  graph = {"hlo_op": "command_buffer_1", "hlo_module": "jit_train_step", "cuda_graph_id": "5"}
  events = [
      {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 4.0, "name": "loop_fusion_2", "args": graph},
      _event(1, "cudnn-conv.1", 6.0),  # launched on its own: hlo_op names it
  ]
  _write_trace(path, events, {1: "/device:GPU:0"})
  got = step_profile.op_events(path, "jit_train_step")
  assert got == [("loop_fusion_2", 4.0), ("cudnn-conv.1", 6.0)]
  s = step_profile.summarise(got, step_profile.hlo_instructions(HLO), steps=1)
  assert s["by_kind"] == {"convolution": 0.006, "fusion": 0.004}
  assert s["by_phase"] == {"augmentation": 0.004, "online forward": 0.006}
  assert s["unmatched_ms_per_step"] == 0.0


def test_summary_adds_up_by_phase_and_kind_per_step():
  ins = step_profile.hlo_instructions(HLO)
  events = [
      ("ynn_fusion.1", 4000.0),
      ("ynn_fusion.1", 2000.0),
      ("cudnn-conv.1", 3000.0),
      ("dot.4", 1000.0),
      ("loop_fusion.2", 500.0),
      ("while.6", 9000.0),  # a container: its ops have their own events
      ("neg.7", 100.0),
      ("gone.8", 300.0),
  ]
  s = step_profile.summarise(events, ins, steps=2)
  assert s["by_phase"] == {
      "augmentation": 0.25,
      "online forward": 1.5,
      "backward": 3.0,
      "target forward": 0.5,
      "unnamed (made by XLA passes)": 0.05,
  }
  assert s["by_kind"] == {"convolution": 4.5, "matmul": 0.5, "fusion": 0.25, "other": 0.05}
  assert s["op_ms_per_step"] == 5.3
  assert s["unmatched_ms_per_step"] == 0.15
  table = step_profile.format_summary(s)
  assert "backward" in table and "56.6%" in table  # 3.0 / 5.3


@pytest.mark.slow
def test_bench_profile_traces_the_step(tmp_path):
  """A real trace of the benchmark's step: every phase of a MoCo-v2 + NS step shows, the
  convolutions take time, and the trace and the HLO are left in the folder."""
  c = mocov2_patchns.get_config(None)
  c.data.image_size = 16
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.moco.queue_size, c.optim.batch_size = 256, 32
  out = bench.measure(c, 1, steps=1, warmup=0, profile_dir=str(tmp_path), profile_steps=2)
  profile = out["profile"]
  assert os.path.exists(profile["trace"])
  assert (tmp_path / "step_hlo.txt").read_text().startswith("HloModule")
  phases = profile["by_phase"]
  for phase in ("augmentation", "online forward", "backward", "target forward", "optimizer"):
    assert phases.get(phase, 0) > 0, phases
  assert profile["by_kind"]["convolution"] > 0
  # The traced ops are the step's: their time per step is of the order of the timed step's
  # wall time (more where ops overlap on the CPU's threads, less by the dispatch gaps).
  assert 0.3 * out["step_ms"] < profile["op_ms_per_step"] < 4 * out["step_ms"], out
  assert profile["unmatched_ms_per_step"] == 0.0
  assert out["step"] == "lean"
