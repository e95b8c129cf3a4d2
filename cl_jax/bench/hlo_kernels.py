"""The kernels a compiled GPU program launches per step, what each kind of them moves, and a
model of their time: a CPU proxy of the step's speed on a GPU.

A GPU runs an optimized HLO module as one kernel (or library call) per top-level instruction
of the computations it executes: the entry computation and those it calls, loops over, or
branches to, not the computations a fusion or a reduction calls. Each such instruction that
is not bookkeeping (parameters, tuples, bitcasts, constants) is a kernel here: fusions, cuDNN
and cuBLAS custom calls, copies, sorts. Its bytes are those of its result and of its operands,
read once each (cl_jax.bench.profile.hlo_instructions): the traffic the kernel needs at least,
which the memory-bound kernels of a train step come close to.

Every kernel has one of KINDS, from its op_name (the JAX name stack) and what it fuses:
  - "augmentation": a kernel that computes anything under the train step's "augment" scope
    (its matrix products included, and the pass that XLA fuses with the views' consumers: the
    key views' shuffle, the ImageNet stem's stacking of the views);
  - "optimizer": under the train step's "optimizer" scope;
  - "convolution", "matmul": the other cuDNN or cuBLAS calls, and fusions that hold one;
  - "pooling": reduce-window or select-and-scatter, or what XLA rewrote them into, and the
    kernels of the ImageNet stem's max-pool (its own op under the "max_pool" scope; its
    forward under autodiff and its gradient);
  - "BN statistics", "BN backward", "BN elementwise": a kernel that computes anything under a
    batch-norm module (bn, bn1, ..., stem_bn, proj_bn; the ReLUs and residual adds that XLA
    fuses with it included; not MoCo's "shuffle_bn" scope, which permutes the key views): the
    reductions of the forward, the reductions of the backward (under autodiff's
    "transpose("), and the other fusions, forward and backward;
  - "small kernels": the rest below SMALL_BYTES (scalars, per-channel vectors, the EMA and
    loss bookkeeping), whose time is set by their launch, not their bytes;
  - "other": the rest (the loss's products, ReLUs and adds outside batch norm, the queue).
model_ms turns a table of kinds into a modelled time with per-kind rates calibrated on a
profiled step (calibrate): a kind's time is its bytes over its measured rate, plus a launch
time per small kernel. It is a model, exact only for the program it was calibrated on.

Hand-written because neither jax nor XLA reports per-kernel bytes of a GPU program compiled
ahead of time: the compiled module's cost_analysis() is None there.
"""

import gzip
import json
import os
import re
from collections import defaultdict

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import app, flags

from cl_jax.bench import profile

KINDS = (
    "BN statistics",
    "BN backward",
    "BN elementwise",
    "convolution",
    "matmul",
    "augmentation",
    "pooling",
    "optimizer",
    "small kernels",
    "other",
)
SMALL_BYTES = 1 << 20
RATES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "h200_kernel_rates.json")
_NOT_KERNELS = frozenset(
    (
        "parameter",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "constant",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "partition-id",
        "replica-id",
        "while",
        "conditional",
        "call",
        "async-start",
        "async-update",
        "async-done",
    )
)
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ")
_CALLED = re.compile(
    r"\b(?:body|condition|to_apply|calls|branch_computations)=\{?(%?[\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?"
)
_BN = re.compile(r"(^|/)(?!shuffle_bn/)(\w+_)?bn\d*(/|$)|batch_?norm", re.I)
_POOLING = ("reduce-window", "select-and-scatter")
# The scope of the stem's max-pool, whose gradient (off TPUs) and forward under autodiff take
# neither op (cl_jax.models.pooling): a kernel whose own op (its root's) is under it is pooling;
# one that only fuses some of its ops, such as the batch norm passes that read the max-pool's
# gradient, is not.
_POOLING_SCOPE = "max_pool"


def executed(hlo_text: str) -> list[str]:
  """The instructions of an optimized module that launch a kernel each time it runs: the
  non-bookkeeping instructions of ENTRY (in order) and of the computations that its while,
  conditional, call and async instructions run (not of fused computations)."""
  bodies, entry, current = defaultdict(list), None, None
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      current = head.group(2)
      entry = current if head.group(1) else entry
      continue
    if current is not None and _INSTRUCTION.match(line):
      bodies[current].append(line)
  if entry is None:
    raise ValueError("the HLO text has no ENTRY computation")
  out, stack, seen = [], [entry], {entry}
  while stack:
    for line in bodies[stack.pop()]:
      name = _INSTRUCTION.match(line).group(1)
      opcode = profile._OPCODE.search(line, _INSTRUCTION.match(line).end()).group(1)
      if opcode in ("while", "conditional", "call") or opcode.startswith("async-"):
        for group in _CALLED.findall(line):
          for called in group.split(","):
            called = called.strip().lstrip("%")
            if called not in seen:
              seen.add(called)
              stack.append(called)
      if opcode not in _NOT_KERNELS:
        out.append(name)
  return out


def kind_of(inst: dict) -> str:
  """The kind (one of KINDS) of a kernel: an entry of profile.hlo_instructions."""
  op_name = inst["op_name"]
  names = {op_name, *inst["fused_op_names"]}
  if any("/augment/" in name for name in names):
    return "augmentation"
  if "/optimizer/" in op_name:
    return "optimizer"
  general = profile.kind_of(inst["opcode"], inst["target"], inst["fused"])
  if general in ("convolution", "matmul"):
    return general
  pooling = {inst["opcode"], *inst["fused"]} & set(_POOLING)
  pooling_names = any(p.replace("-", "_") in name for name in names for p in _POOLING)
  if pooling or pooling_names or _POOLING_SCOPE in op_name:
    return "pooling"
  if inst["bytes"] < SMALL_BYTES:
    return "small kernels"
  if any(_BN.search(name) for name in names):
    if general != "reduction":
      return "BN elementwise"
    backward = any("transpose(" in name for name in names)
    return "BN backward" if backward else "BN statistics"
  return "other"


def kernel_table(hlo_text: str) -> dict:
  """Kernels and bytes per step of an optimized module, by kind.

  Returns:
    {"kernels": total, "bytes": total, "by_kind": {kind: {"kernels", "bytes"}}} (kinds in
    KINDS order, those with no kernel left out).
  """
  instructions = profile.hlo_instructions(hlo_text)
  rows = {kind: {"kernels": 0, "bytes": 0} for kind in KINDS}
  for name in executed(hlo_text):
    inst = instructions[name]
    row = rows[kind_of(inst)]
    row["kernels"] += 1
    row["bytes"] += inst["bytes"]
  by_kind = {kind: row for kind, row in rows.items() if row["kernels"]}
  return {
      "kernels": sum(r["kernels"] for r in by_kind.values()),
      "bytes": sum(r["bytes"] for r in by_kind.values()),
      "by_kind": by_kind,
  }


def calibrate(events: list[tuple[str, float]], hlo_text: str, steps: int) -> dict:
  """Per-kind rates of a profiled step: {"gb_per_s": {kind: its bytes / its time},
  "small_kernel_us": the mean time of a small kernel}, from the trace's op events
  (profile.op_events) and the step's optimized HLO. An event that stands for a kernel shared
  by several instructions (profile.summarise) shares its time equally among them."""
  instructions = profile.hlo_instructions(hlo_text)
  kernels = set(executed(hlo_text))
  sharing = defaultdict(list)
  for name in kernels:
    sharing[instructions[name]["kernel"]].append(name)
  by_event_name = {re.sub(r"[^\w]", "_", name): name for name in kernels}
  micros = defaultdict(float)
  for event, us in events:
    name = event if event in kernels else by_event_name.get(event)
    if name is None:
      continue
    group = [name] if event in kernels else sharing[instructions[name]["kernel"]]
    for member in group:
      micros[kind_of(instructions[member])] += us / len(group) / steps
  table = kernel_table(hlo_text)["by_kind"]
  rates = {
      kind: table[kind]["bytes"] / (micros[kind] * 1e-6) / 1e9
      for kind in table
      if kind != "small kernels" and micros[kind] > 0
  }
  small = table.get("small kernels", {"kernels": 0})["kernels"]
  return {
      "gb_per_s": {k: round(v, 1) for k, v in rates.items()},
      "small_kernel_us": round(micros["small kernels"] / small, 3) if small else 0.0,
  }


def load_rates(path: str = RATES_FILE) -> dict:
  """The committed calibration (calibrate's dict, with its "source")."""
  with open(path) as f:
    return json.load(f)


def model_ms(table: dict, rates: dict) -> dict:
  """A modelled step time from kernel_table's table and calibrate's rates: {kind: ms} and
  "total". A kind without a calibrated rate (none in the calibrating step) takes the slowest
  calibrated rate."""
  slowest = min(rates["gb_per_s"].values())
  out = {}
  for kind, row in table["by_kind"].items():
    if kind == "small kernels":
      out[kind] = row["kernels"] * rates["small_kernel_us"] / 1e3
    else:
      out[kind] = row["bytes"] / (rates["gb_per_s"].get(kind, slowest) * 1e9) * 1e3
  out["total"] = sum(out.values())
  return {k: round(v, 3) for k, v in out.items()}


def calibrate_files(trace_path: str, hlo_path: str, steps: int) -> dict:
  """calibrate from a profiled step's files (cl_jax.bench.profile.profile_compiled writes
  them: the Perfetto trace of `steps` steps and the compiled step's HLO, either gzipped)."""
  opener = gzip.open if hlo_path.endswith(".gz") else open
  with opener(hlo_path, "rt") as f:
    hlo = f.read()
  module = re.match(r"HloModule ([\w.\-]+)", hlo).group(1)
  return calibrate(profile.op_events(trace_path, module), hlo, steps)


def bn_input_elements(encoder, batch: int, image_size: int) -> int:
  """Elements that enter the encoder's batch norms in one training forward of `batch` images
  (B x H x W x C summed over every GroupBatchNorm): the unit of BN's bytes per element."""
  from cl_jax.models.batchnorm import GroupBatchNorm

  total = [0]

  def count(call, args, kwargs, context):
    if isinstance(context.module, GroupBatchNorm) and context.method_name == "__call__":
      total[0] += args[0].size
    return call(*args, **kwargs)

  images = jnp.zeros((batch, image_size, image_size, 3), jnp.float32)
  with nn.intercept_methods(count):
    jax.eval_shape(lambda: encoder.init(jax.random.key(0), images, train=True))
  return total[0]


def main(argv):
  """python -m cl_jax.bench.hlo_kernels --trace=T --hlo=H --steps=N [--source=TEXT]: the
  calibration of a profiled step, written to the committed rates file."""
  del argv
  f = flags.FLAGS
  rates = calibrate_files(f.trace, f.hlo, f.steps)
  rates["source"] = f.source
  with open(RATES_FILE, "w") as out:
    json.dump(rates, out, indent=1)
    out.write("\n")
  print(json.dumps(rates, indent=1))


if __name__ == "__main__":
  flags.DEFINE_string("trace", None, "The step's Perfetto trace (perfetto_trace.json.gz).")
  flags.DEFINE_string("hlo", None, "The compiled step's HLO text (step_hlo.txt[.gz]).")
  flags.DEFINE_integer("steps", 3, "Steps in the trace.")
  flags.DEFINE_string("source", "", "Where the files come from (device, commit, jax version).")
  flags.mark_flags_as_required(["trace", "hlo"])
  app.run(main)
