"""Where a compiled train step's time goes: a jax.profiler trace of a few steps, summarised.

trace_steps runs a few calls of the compiled step under jax.profiler.trace, which writes
the trace for TensorBoard's profile plugin or Perfetto (ui.perfetto.dev opens the
perfetto_trace.json.gz it writes). summarise reads the XLA op events of that trace (events
whose args name an hlo_op of the step's HLO module; on GPUs and TPUs the ones on the
device's own lines, so host-side launches are not counted twice) and adds their durations
up two ways, using the optimized HLO of the compiled step (compiled.as_text()):
  - by phase of the step, from each instruction's op_name metadata (the JAX name stack):
    augmentation (the "augment" scope of cl_jax.train_step), backward (transposes of the
    forward, "transpose(" in the stack), online forward (the encoder under jvp), target
    forward (the encoder without gradient: MoCo's keys and NS negatives, BYOL's target),
    optimizer (the "optimizer" scope), the rest (loss, queue, EMA, random numbers,
    statistics), and ops that XLA's passes made without a name stack;
  - by kind of op: convolution, matmul, collective, copy/transpose, reduction (a fusion or op
    that reduces, e.g. batch norm's statistics), fusion (the other fusions: elementwise work),
    other; with the bytes each kind's kernels read and write per step (the sizes of each
    instruction's operands and outputs in the HLO: every operand counted once, whether the
    kernel reads it once, in part or several times) and so their rate in GB/s, against the
    device's memory bandwidth.
profile_compiled does both for a compiled step (cl_jax.bench.step --profile).
Times are op time per step: on a CPU, ops running at once on several threads each count,
so they add up to more than the step's wall time; on an accelerator the kernels of the
device's streams add up (to its busy time where one stream runs at a time). A fused op is
named by its root in the HLO, so elementwise work that XLA fused across phases lands in one
of them: the phases are a guide to the split, the kinds are exact.

Hand-written because neither jax nor XProf gives such a summary as data: XProf's op profile
needs its server or TensorBoard.
"""

import gzip
import json
import re
from collections import defaultdict

import jax
from etils import epath

from cl_jax.bench import hlo_arrays

PHASES = (
    "augmentation",
    "online forward",
    "backward",
    "target forward",
    "optimizer",
    "loss, queue, EMA, RNG, statistics",
    "unnamed (made by XLA passes)",
)
KINDS = ("convolution", "matmul", "collective", "copy/transpose", "reduction", "fusion", "other")
_CONTAINERS = ("while", "conditional", "call", "async-start", "async-done")
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ")
_OPCODE = re.compile(r" ([a-z][a-z0-9\-]*)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")


def _operands(line: str, start: int) -> list[str]:
  """The operand names of an instruction whose operand list opens at line[start - 1]."""
  depth, end = 1, start
  while end < len(line) and depth:
    depth += {"(": 1, ")": -1}.get(line[end], 0)
    end += 1
  names = []
  for operand in line[start : end - 1].split(","):
    operand = re.sub(r"/\*.*?\*/", "", operand).strip()
    if operand:
      names.append(operand.split()[-1].lstrip("%"))
  return names


def trace_steps(compiled, state, data, steps: int, out_dir: str):
  """Runs `steps` calls of compiled(state, data) under jax.profiler.trace(out_dir) and
  returns (the last state, the path of the Perfetto trace it wrote)."""
  with jax.profiler.trace(out_dir, create_perfetto_trace=True):
    for _ in range(steps):
      state, metrics = compiled(state, data)
    jax.block_until_ready((state, metrics))
  traces = sorted(epath.Path(out_dir).glob("plugins/profile/*/perfetto_trace.json.gz"))
  if not traces:
    raise RuntimeError(f"jax.profiler.trace wrote no perfetto_trace.json.gz under {out_dir}")
  return state, str(max(traces, key=lambda p: p.stat().mtime))


def profile_compiled(compiled, state, data, steps: int, out_dir: str):
  """trace_steps, then the summary of the trace against the step's optimized HLO, which is
  written to out_dir/step_hlo.txt beside the trace.

  Returns:
    (the last state, summarise's dict with "trace": the trace's path).
  """
  state, trace = trace_steps(compiled, state, data, steps, out_dir)
  hlo = compiled.as_text()
  (epath.Path(out_dir) / "step_hlo.txt").write_text(hlo)
  module = re.match(r"HloModule ([\w.\-]+)", hlo).group(1)
  summary = summarise(op_events(trace, module), hlo_instructions(hlo), steps)
  return state, {**summary, "trace": trace}


def hlo_instructions(hlo_text: str) -> dict[str, dict]:
  """{instruction name: {"opcode", "op_name", "target", "fused", "fused_op_names", "bytes",
  "kernel"}} of an optimized HLO module's text: target is a custom-call's target, "" otherwise;
  fused is the set of opcodes and custom-call targets inside the computation a fusion calls (on
  CPUs convolutions run inside fusions, on GPUs cuDNN and Triton GEMM fusions), empty
  otherwise, and fused_op_names the op_names of the instructions inside it;
  bytes are those of its outputs and of its operands' outputs (a custom call's output: its
  first array, not the workspace beside it); kernel names the instructions that share one
  compiled kernel (XLA's GPU backend compiles identical fusions once: their deduplicated_name
  metadata), the instruction's own name otherwise. A fusion without op_name metadata takes
  that of an instruction inside it (_fusion_op_name)."""
  instructions, computations, current = {}, defaultdict(set), None
  names = defaultdict(list)  # computation -> [(opcode, op_name)] of its named instructions
  operands = {}
  for line in hlo_text.splitlines():
    computation = _COMPUTATION.match(line)
    if computation:
      current = computation.group(1)
      continue
    head = _INSTRUCTION.match(line)
    opcode = _OPCODE.search(line, head.end()) if head else None
    if not opcode:
      continue
    op_name = re.search(r'op_name="([^"]*)"', line)
    deduplicated = re.search(r'deduplicated_name="([^"]*)"', line)
    target = re.search(r'custom_call_target="([^"]*)"', line)
    calls = re.search(r"calls=%?([\w.\-]+)", line)
    computations[current].add(opcode.group(1))
    if op_name:
      names[current].append((opcode.group(1), op_name.group(1)))
    if target:
      computations[current].add(target.group(1))
    instructions[head.group(1)] = {
        "opcode": opcode.group(1),
        "op_name": op_name.group(1) if op_name else "",
        "target": target.group(1) if target else "",
        "calls": calls.group(1) if calls and opcode.group(1) == "fusion" else None,
        "bytes": hlo_arrays.type_bytes(line[head.end() : opcode.start()], first_only=bool(target)),
        "kernel": deduplicated.group(1) if deduplicated else head.group(1),
    }
    operands[head.group(1)] = _operands(line, opcode.end())
  outputs = {name: inst["bytes"] for name, inst in instructions.items()}
  for name, inst in instructions.items():
    calls = inst.pop("calls")
    inst["fused"] = computations.get(calls, set())
    inst["fused_op_names"] = {op_name for _, op_name in names.get(calls, ())}
    if not inst["op_name"] and names.get(calls):
      inst["op_name"] = _fusion_op_name(names[calls])
    inst["bytes"] += sum(outputs.get(operand, 0) for operand in operands[name])
  return instructions


def _fusion_op_name(named: list[tuple[str, str]]) -> str:
  """The op_name of a fusion that has none (XLA's CPU fusions): that of its first convolution
  or dot, else of its last named instruction (nearest the root)."""
  heavy = [name for opcode, name in named if opcode in ("convolution", "dot")]
  return heavy[0] if heavy else named[-1][1]


def phase_of(op_name: str) -> str:
  """The step's phase (one of PHASES) of an instruction from its JAX name stack ("" for ops
  that XLA's passes made without one, e.g. rewritten weight-gradient convolutions on CPUs)."""
  if not op_name:
    return PHASES[-1]
  if "/augment/" in op_name or op_name.endswith("/augment"):
    return "augmentation"
  if "transpose(" in op_name:
    return "backward"
  if "/optimizer/" in op_name:
    return "optimizer"
  if "jvp(" in op_name and "Encoder" in op_name:
    return "online forward"
  if "Encoder" in op_name:
    return "target forward"
  return "loss, queue, EMA, RNG, statistics"


def kind_of(opcode: str, target: str, fused: set[str] = frozenset()) -> str:
  """The kind (one of KINDS) of an instruction from its opcode, custom-call target and, for
  a fusion, the opcodes and targets inside it (a fusion with a convolution counts as one)."""
  inside = {opcode, target.lower(), *(op.lower() for op in fused)}
  if "convolution" in inside or any("cudnn$conv" in op for op in inside):
    return "convolution"
  if "dot" in inside or any(w in op for op in inside for w in ("gemm", "matmul", "cublas")):
    return "matmul"
  if opcode.removesuffix("-start").removesuffix("-done") in _COLLECTIVES:
    return "collective"
  if opcode in ("copy", "transpose", "copy-start", "copy-done"):
    return "copy/transpose"
  if "reduce" in inside:
    return "reduction"
  if opcode == "fusion":
    return "fusion"
  return "other"


def op_events(trace_path: str, module: str) -> list[tuple[str, float]]:
  """(op, duration in microseconds) of every event of HLO module `module` in a Perfetto
  trace (gzipped JSON); on a trace with device lines ("/device:..." processes) only theirs.
  op is the event's hlo_op, except for a kernel that XLA's GPU runtime launched inside a CUDA
  graph, whose hlo_op names the graph ("command_buffer_N"): then it is the kernel's own name,
  which is its instruction's with "_" for "." (summarise matches both forms)."""
  with gzip.open(epath.Path(trace_path).open("rb")) as f:
    events = json.load(f)["traceEvents"]
  processes = {
      e["pid"]: e["args"]["name"]
      for e in events
      if e.get("ph") == "M" and e.get("name") == "process_name"
  }
  devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
  out = []
  for e in events:
    args = e.get("args", {})
    if e.get("ph") != "X" or "hlo_op" not in args:
      continue
    if not args.get("hlo_module", "").startswith(module):
      continue
    if devices and e["pid"] not in devices:
      continue
    op = args["hlo_op"]
    if op.startswith("command_buffer"):
      op = e.get("name", op)
    out.append((op, float(e.get("dur", 0.0))))
  return out


def summarise(events: list[tuple[str, float]], instructions: dict[str, dict], steps: int) -> dict:
  """Op time per step by phase and by kind, and the bytes each kind moves.

  Args:
    events: (instruction or kernel name, microseconds) from op_events.
    instructions: hlo_instructions of the step's optimized HLO.
    steps: the number of traced steps.

  Returns:
    {"op_ms_per_step": total, "by_phase": {phase: ms per step}, "by_kind": {kind: ms per
    step}, "gb_by_kind": {kind: GB (1e9 bytes) its kernels read and write per step, the bytes
    of each instruction that ran counted once (an instruction run several times per step, in
    a loop, once)}, "unmatched_ms_per_step": time of events naming no instruction of the
    module}. Containers (while, conditional, call, async wrappers) are
    left out: the ops they run have events of their own.
  """
  by_phase, by_kind, bytes_by_kind = defaultdict(float), defaultdict(float), defaultdict(float)
  sharing = defaultdict(list)  # kernel -> the instructions that run it
  for name, inst in instructions.items():
    sharing[inst["kernel"]].append(name)
  kernels = {re.sub(r"[^\w]", "_", name): name for name in instructions}
  unmatched, counted = 0.0, set()
  for event, micros in events:
    if event in instructions:
      group = [event]
    elif event in kernels:
      # A kernel name (an event inside a CUDA graph) stands for every instruction that shares
      # the kernel: identical programs on identical shapes, so each takes an equal part.
      group = sharing[instructions[kernels[event]]["kernel"]]
    else:
      group = []
    if not group:
      unmatched += micros
      continue
    first = instructions[group[0]]
    if first["opcode"] in _CONTAINERS:
      continue
    kind = kind_of(first["opcode"], first["target"], first["fused"])
    for member in group:
      by_phase[phase_of(instructions[member]["op_name"])] += micros / len(group)
      # Bytes once per instruction that ran: a cuDNN convolution launches several kernels,
      # each an event of its instruction.
      if member not in counted:
        counted.add(member)
        bytes_by_kind[kind] += instructions[member]["bytes"]
    by_kind[kind] += micros
  per_step = lambda micros: round(micros / steps / 1e3, 3)
  return {
      "op_ms_per_step": per_step(sum(by_phase.values())),
      "by_phase": {p: per_step(by_phase[p]) for p in PHASES if p in by_phase},
      "by_kind": {k: per_step(by_kind[k]) for k in KINDS if k in by_kind},
      "gb_by_kind": {k: round(bytes_by_kind[k] / 1e9, 4) for k in KINDS if k in by_kind},
      "unmatched_ms_per_step": per_step(unmatched),
  }


def gb_per_s(summary: dict, kind: str) -> float | None:
  """The rate at which a kind's kernels moved their bytes: GB per step / its seconds per step
  (None where the summary has no bytes or the kind took no time)."""
  gb, ms = summary.get("gb_by_kind", {}).get(kind), summary["by_kind"].get(kind)
  return gb / (ms / 1e3) if gb is not None and ms else None


def kind_rows(summary: dict) -> list[tuple[str, float, float, str, str]]:
  """The by-kind rows, longest first: (kind, ms per step, share of the op time in %, GB per
  step, GB/s), the last two as text ("n/a" where the summary has no bytes)."""
  total = summary["op_ms_per_step"] or 1.0
  rows = []
  for name, ms in sorted(summary["by_kind"].items(), key=lambda item: -item[1]):
    gb, rate = summary.get("gb_by_kind", {}).get(name), gb_per_s(summary, name)
    gb_text = "n/a" if gb is None else f"{gb:.3f}"
    rows.append((name, ms, 100 * ms / total, gb_text, "n/a" if rate is None else f"{rate:.0f}"))
  return rows


def format_summary(summary: dict) -> str:
  """Two small tables: ms per step and share by phase; by kind, also GB moved per step and
  GB/s."""
  total = summary["op_ms_per_step"] or 1.0
  lines = [f"op time per step: {summary['op_ms_per_step']:.2f} ms"]
  lines.append(f"  {'by phase':<40} {'ms/step':>9} {'share':>7}")
  for name, ms in sorted(summary["by_phase"].items(), key=lambda item: -item[1]):
    lines.append(f"  {name:<40} {ms:>9.2f} {100 * ms / total:>6.1f}%")
  lines.append(f"  {'by op kind':<40} {'ms/step':>9} {'share':>7} {'GB/step':>9} {'GB/s':>8}")
  for name, ms, share, gb, rate in kind_rows(summary):
    lines.append(f"  {name:<40} {ms:>9.2f} {share:>6.1f}% {gb:>9} {rate:>8}")
  return "\n".join(lines)
