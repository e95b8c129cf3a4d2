"""Compile a config's train step ahead of time for TPU slices and NVIDIA H100s, on a machine
without them, and read what the compiled program does on each chip.

python -m cl_jax.bench.compile --config=configs/mocov2.py:imagenet100 --target=v5e:2x2
    [--batch_per_chip=N | --max_batch] [--json]

TARGET: a TPU slice FAMILY:SHAPE, FAMILY one of v4, v5e, v5p, v6e and SHAPE its chips per
dimension (v5e:2x2 is 4 chips on one host, v5e:4x4 16 chips on 4 hosts, v5p:2x2x4 16 chips on
4 hosts), or h100:N, N NVIDIA H100 SXM GPUs (8 per host). The compilers come from
requirements-compile.txt: libtpu for TPUs, JAX's CUDA plugin for GPUs (no GPU or CUDA driver
is needed to compile; cuDNN's algorithms are not autotuned, so a convolution's workspace is
not in the memory figures), installed into a folder of their own and named in PYTHONPATH:
    pip install --no-deps --target .compilers -r requirements-compile.txt
    PYTHONPATH=.compilers python -m cl_jax.bench.compile --config=... --target=...

The step, its state and batch shardings are built by the trainer's own code
(cl_jax.train.build, cl_jax.train_step, cl_jax.runtime.parallel) on a mesh over the target's
devices, at the config's batch as the trainer resolves it on that many chips (its
optim.batch_per_chip x chips, or its global optim.batch_size; cl_jax.batch_plan), or at
--batch_per_chip x chips (the learning rate being irrelevant to the program), and compiled,
not run; so is the evaluation jobs' feature forward (cl_jax.evaluators.features) at the
probe's batch. Reported per chip:
  - memory: argument, output, aliased (donated), temporary and peak bytes (XLA's buffer
    assignment for the chip, cl_jax.bench.memory.memory_analysis) against the chip's HBM
    (cl_jax.bench.chips); donated bytes against the state's;
  - FLOPs per step and per image: XLA's cost analysis of the compiled program (TPU), or of the
    program before optimisation, lowered for one CPU device (GPU, whose compiled program reports
    none), beside the analytic count of cl_jax.bench.flops;
  - every collective: kind, count, bytes per chip, replica groups and the operation of the
    JAX program that caused it (its op_name), each classified by what data parallelism needs
    (gradient reduction, batch-norm statistics, the MoCo queue's keys, the shuffled key batch,
    the embeddings of SimCLR's batch contrast) or flagged;
  - a dtype census of convolutions and matrix products (a bf16 config computes them in bf16),
    float64 anywhere, and host transfers or callbacks (none belong in the step);
  - a roofline estimate: step time >= max(FLOPs / peak, bytes accessed / bandwidth);
  - the evaluation forward's memory, collectives (data parallelism needs none) and census.
--max_batch compiles the step at two per-chip batches (--batch_per_chip, by default the
config's, and twice that), fits peak = fixed + per image x batch and compiles the largest batch
the fit allows (the largest the config also accepts: MoCo's queue holds a whole number of
global batches) to check that it fits.
"""

import collections
import dataclasses
import functools
import importlib.util
import json
import math
import os
import re
import time

import jax
import ml_collections
import numpy as np
from absl import app, flags

from cl_jax import batch_plan, config_check, train
from cl_jax import train_step as step_lib
from cl_jax.bench import chips, hlo_arrays, hlo_kernels
from cl_jax.bench import flops as bench_flops
from cl_jax.bench import memory as bench_memory
from cl_jax.data import photometric
from cl_jax.evaluators import features as eval_features
from cl_jax.models.encoder import encoder_for
from cl_jax.runtime import cli, parallel
from cl_jax.runtime.errors import UsageError
from cl_jax.state import init_variables

H100_SPEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "h100_sxm.txtpb")
GPUS_PER_HOST = 8
# TPU families whose chips have two TensorCores run as one device each ("megacore"); their
# topology names the generation without its letter (v5p is "v5").
_MEGACORE = {"v4": "v4", "v5p": "v5"}
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_FLOATS = ("bf16", "f16", "f32", "f64")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([\w\-]+)\((.*)$")
_HOST = ("send", "recv", "infeed", "outfeed", "send-done", "recv-done")


@dataclasses.dataclass(frozen=True)
class Target:
  """A compile target: its name, chip and compile-only devices."""

  name: str
  chip: chips.Chip
  devices: tuple
  hosts: int


def _needs(what: str, package: str) -> UsageError:
  return UsageError(
      f"compiling for {what} needs {package}: pip install --no-deps --target .compilers "
      "-r requirements-compile.txt, then run this command with PYTHONPATH=.compilers"
  )


def _installed(module: str) -> bool:
  """Whether `module` can be imported (its parent package may be missing)."""
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:
    return False


def target(name: str) -> Target:
  """The Target of TARGET (see the module docstring); UsageError for a malformed name or a
  missing compiler."""
  from jax.experimental import topologies

  family, _, shape = name.partition(":")
  if family == "h100":
    if not shape.isdigit() or int(shape) < 1:
      raise UsageError(f"--target={name}: give h100:N with N GPUs, e.g. h100:8")
    n = int(shape)
    hosts = max(1, -(-n // GPUS_PER_HOST))
    if n > GPUS_PER_HOST and n % GPUS_PER_HOST:
      raise UsageError(f"--target={name}: more than {GPUS_PER_HOST} GPUs come in whole hosts of 8")
    # JAX's CUDA plugin registers the compiler: requirements-compile.txt's (CUDA 12), or the
    # one a GPU machine's jax[cuda13] installs.
    plugins = [
        f"jax_plugins.xla_cuda{v}" for v in (12, 13) if _installed(f"jax_plugins.xla_cuda{v}")
    ]
    if not plugins:
      raise _needs("H100s", "JAX's CUDA plugin (jax-cuda12-plugin, jax-cuda12-pjrt)")
    importlib.import_module(plugins[0])
    with open(H100_SPEC) as f:
      spec = f.read()
    topology = f"1x{hosts}x{n // hosts}"
    desc = topologies.get_topology_desc(platform="cuda", target_config=spec, topology=topology)
    return Target(name, chips.CHIPS["h100"], tuple(desc.devices), hosts)
  if family not in chips.CHIPS or not re.fullmatch(r"\d+(x\d+){1,2}", shape):
    raise UsageError(
        f"--target={name}: give FAMILY:SHAPE with FAMILY one of v4, v5e, v5p, v6e "
        "(e.g. v5e:2x2, v5p:2x2x1) or h100:N"
    )
  if family in _MEGACORE and shape.count("x") != 2:
    raise UsageError(f"--target={name}: {family} slices are 3-D, e.g. {family}:2x2x1")
  try:
    import libtpu  # noqa: F401
  except ImportError as error:
    raise _needs("TPUs", "libtpu") from error
  # Compile-only devices hold no chip: several compiling processes may load libtpu at once
  # (without this, libtpu's lock file stops the second).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  if family in _MEGACORE:
    desc = topologies.get_topology_desc(
        f"{_MEGACORE[family]}:{shape}",
        "tpu",
        chip_config_name="megacore",
        chips_per_host_bounds=(2, 2, 1),
        num_slices=1,
        wrap=(False, False, False),
    )
  else:
    desc = topologies.get_topology_desc(f"{family}:{shape}", "tpu")
  devices = tuple(desc.devices)
  hosts = len({d.process_index for d in devices})
  return Target(name, chips.CHIPS[family], devices, hosts)


def for_target(config: ml_collections.ConfigDict, chips_n: int, batch_per_chip: int | None):
  """`config` resolved for chips_n devices as the trainer resolves it (cl_jax.batch_plan):
  with `batch_per_chip`, at that per-chip batch (the lr recipe made "custom" and the lr scaled
  linearly: the learning rate does not change the program); without, at the config's own
  (its optim.batch_per_chip, or its global optim.batch_size); validated for chips_n devices."""
  config = config.copy_and_resolve_references()
  if batch_per_chip is not None:
    config.optim.lr_recipe = "custom"
    config.optim.batch_per_chip = batch_per_chip
  config = batch_plan.resolve(config, chips_n)
  config_check.validate(config, num_devices=chips_n, reads_data=False)
  return config


def lower_step(config: ml_collections.ConfigDict, devices) -> tuple:
  """(lowered lean train step, abstract state) of `config` on a mesh over `devices`: the
  trainer's state, step and shardings on abstract arrays."""
  mesh = parallel.make_mesh(list(devices))
  batch = config.optim.batch_size
  built = train.build(config, batch, mesh)
  abstract = jax.eval_shape(built.make_state)
  state_sharding = parallel.state_sharding(abstract, mesh)
  state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, state_sharding
  )
  batch_sharding = parallel.batch_sharding(mesh)
  host = train.synthetic_batch(config, batch, np.random.default_rng(0))
  data = {
      k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding) for k, v in host.items()
  }
  step = step_lib.make_train_step(config, built.encoder, built.tx, built.schedule, mesh, 1, False)
  jitted = step_lib.jit_train_step(step, state_sharding, batch_sharding)
  return jitted.lower(state, data), state


def lower_eval(config: ml_collections.ConfigDict, devices) -> tuple:
  """(lowered forward, its global batch): the evaluation jobs' feature forward
  (cl_jax.evaluators.features: eval-mode batch norm, uint8 images in, features out) on a mesh
  over `devices`, for one probe batch (config.probe.batch_size, padded to a multiple of the
  devices as the evaluators pad it) with the encoder's variables replicated."""
  mesh = parallel.make_mesh(list(devices))
  encoder = encoder_for(config)
  size = config.data.image_size
  abstract = jax.eval_shape(functools.partial(init_variables, config.seed, encoder, size))
  replicated = parallel.replicated(mesh)
  variables = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), abstract
  )
  batch = -(-config.probe.batch_size // mesh.size) * mesh.size
  images = jax.ShapeDtypeStruct(
      (batch, size, size, 3), np.uint8, sharding=parallel.batch_sharding(mesh)
  )
  spec = photometric.PhotometricSpec()
  which = config.probe.get("features", "backbone")
  forward = eval_features.features_fn(encoder, spec.mean, spec.std, which)
  return forward.lower(variables, images), batch


def result_arrays(inst: dict) -> list[tuple[str, str]]:
  """The (dtype, dims) arrays a collective delivers. An asynchronous start (all-gather-start,
  collective-permute-start, ...) returns its operands beside its results: only the results
  count (all-reduce-start returns its results alone)."""
  arrays = hlo_arrays.SHAPE.findall(inst["type"])
  if not inst["op"].endswith("-start") or inst["op"] == "all-reduce-start":
    return arrays
  if inst["op"] == "collective-permute-start":
    return arrays[1:2]
  return arrays[len(arrays) // 2 :]


def instructions(hlo_text: str) -> list[dict]:
  """Every instruction of an HLO module's text: result type, opcode, the rest of its line
  (operands and attributes)."""
  out = []
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      out.append(
          {
              "name": match.group(1),
              "type": match.group(2),
              "op": match.group(3),
              "rest": match.group(4),
          }
      )
  return out


_BN = re.compile(r"(^|[/(:])(\w+_)?bn\d*(/|$)|batch_?norm", re.I)


COMBINED_SMALL = "batch-norm statistics and losses, combined"


def classify(
    op_name: str,
    kind: str,
    sizes: list[int],
    floating: bool,
    param_elements: int | None,
    batch: int | None,
) -> str:
  """What a collective whose result arrays hold `sizes` elements (`floating`: of a float
  dtype) is for, from the JAX operation that caused it (its op_name metadata: the named scopes
  and flax modules on its path), or "unexpected". A floating-point reduction without an op_name
  whose arrays hold more than one value per image of the global batch (`batch`) is gradient
  reduction: the GPU compiler concatenates the gradients, batch-norm statistics and loss into
  such arrays (several, above its combining threshold). Any other all-reduce is a loss's or a
  metric's when each of its arrays (XLA combines several small reductions into one) holds at
  most one value per image, else unexpected (an all-reduce of images is a gather that XLA
  could not keep on the devices that hold them). XLA's combiner drops the op_name of the small
  floating-point reductions it merges (the synchronised batch norm's statistics and its
  hand-written backward's sums, losses): those are COMBINED_SMALL. A loss whose sums over the
  global batch are larger than one value per image (Barlow Twins' cross-correlation) runs under
  the named scope "global_batch_loss"."""
  if "shuffle_bn" in op_name:
    return "shuffled key batch"
  if "queue_contrast" in op_name:
    return "queue contrast"
  if "batch_contrast" in op_name:
    return "batch contrast"
  if "global_batch_loss" in op_name:
    return "loss over the global batch"
  reduction = kind in ("all-reduce", "reduce-scatter")
  combined = (
      not op_name
      and floating
      and param_elements is not None
      and (batch is None or max(sizes) > batch)
  )
  if reduction and ("transpose(" in op_name or combined):
    return "gradient reduction"
  if _BN.search(op_name) and kind == "all-reduce":
    return "batch-norm statistics"
  if kind == "all-reduce" and (batch is None or max(sizes) <= batch):
    if floating and not op_name:
      return COMBINED_SMALL
    return "reduction of a loss or metric"
  return "unexpected"


def collectives(
    insts: list[dict], param_elements: int | None = None, batch: int | None = None
) -> list[dict]:
  """The collectives of a compiled program, grouped by (kind, dtype, purpose; classify): count,
  bytes per chip (their results'), replica groups and the JAX operations that caused them. The
  TPU compiler copies a collective into the fusions that consume its result in pieces (its
  async collective fusions); the copies keep its channel_id, operation and result and are one
  transfer, counted once. (The GPU compiler gives one channel_id to many collectives: the
  operation or the result tells them apart.)"""
  groups = collections.OrderedDict()
  seen = set()
  for inst in insts:
    kind = inst["op"].removesuffix("-start")
    if kind not in _COLLECTIVES or inst["op"].endswith("-done"):
      continue
    op_name = re.search(r'op_name="([^"]*)"', inst["rest"])
    op_name = op_name.group(1) if op_name else ""
    arrays = result_arrays(inst)
    channel = re.search(r"channel_id=(\d+)", inst["rest"])
    if channel:
      transfer = (channel.group(1), op_name, tuple(arrays))
      if transfer in seen:
        continue
      seen.add(transfer)
    replica = re.search(
        r"replica_groups=(\{[^=]*?\}\}|\[[^\]]*\]<=\[[^\]]*\][^,\s]*)", inst["rest"]
    )
    dtypes = sorted(set(d for d, _ in arrays))
    sizes = [hlo_arrays.elements(dims) for _, dims in arrays]
    floating = all(d in _FLOATS for d in dtypes)
    purpose = classify(op_name, kind, sizes, floating, param_elements, batch)
    key = (kind, ",".join(dtypes), purpose)
    g = groups.setdefault(
        key,
        {"kind": kind, "dtype": key[1], "purpose": purpose, "count": 0, "bytes": 0, "ops": []},
    )
    g["count"] += 1
    g["bytes"] += hlo_arrays.arrays_bytes(arrays)
    g["replica_groups"] = replica.group(1) if replica else ""
    if op_name and op_name not in g["ops"] and len(g["ops"]) < 3:
      g["ops"].append(op_name)
  return list(groups.values())


def census(insts: list[dict]) -> dict:
  """Convolutions and dots by operand dtypes; the float32 ones at default precision (a TPU
  computes them in one bfloat16 pass; "high" and "highest" take three and six), by the JAX
  operation that made them; float64 values;
  host transfers or callbacks."""
  types = {inst["name"]: inst["type"] for inst in insts}
  products = collections.Counter()
  default_f32 = collections.Counter()
  for inst in insts:
    op = inst["op"]
    if op == "custom-call" and '"__cudnn$conv' in inst["rest"]:
      op = "convolution"  # the GPU compiler's convolutions are cuDNN calls
    if op in ("convolution", "dot"):
      operands = inst["rest"].split(")")[0]
      # Operands are printed with their types, or by name only: then their definition's.
      dtypes = [d for d, _ in hlo_arrays.SHAPE.findall(operands)] or [
          d
          for name in re.findall(r"%([\w.\-]+)", operands)
          for d, _ in hlo_arrays.SHAPE.findall(types.get(name, ""))[:1]
      ]
      products[f"{op} {'x'.join(dtypes[:2]) or '?'}"] += 1
      precision = re.search(r"operand_precision=\{(\w+),(\w+)\}", inst["rest"])
      full = precision and {p.lower() for p in precision.groups()} <= {"high", "highest"}
      if dtypes[:2] == ["f32", "f32"] and not full:
        op_name = re.search(r'op_name="([^"]*)"', inst["rest"])
        default_f32[op_name.group(1) if op_name else "?"] += 1
  return {
      "products": dict(sorted(products.items())),
      "default_precision_f32": dict(sorted(default_f32.items())),
      "float64": sum("f64[" in inst["type"] for inst in insts),
      "host": sorted(
          {
              inst["op"]
              for inst in insts
              if inst["op"] in _HOST
              or (inst["op"] == "custom-call" and "callback" in inst["rest"].lower())
          }
      ),
  }


def analyse(config, tgt: Target, with_eval: bool = True) -> dict:
  """Compile the lean train step of `config` for `tgt` and read it (module docstring); with
  `with_eval`, the evaluation forward too (result["eval"])."""
  chips_n = len(tgt.devices)
  batch = config.optim.batch_size
  head = {
      "target": tgt.name,
      "chip": tgt.chip.name,
      "chips": chips_n,
      "hosts": tgt.hosts,
      "preset": config.get("preset", ""),
      "global_batch": batch,
      "batch_per_chip": batch // chips_n,
  }
  start = time.perf_counter()
  lowered, state = lower_step(config, tgt.devices)
  param_elements = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(state.params))
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    # The TPU compiler refuses a program that does not fit the chip's HBM.
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return {
        **head,
        "compile_s": round(time.perf_counter() - start, 1),
        "out_of_memory": str(e).strip().splitlines()[0].split("RESOURCE_EXHAUSTED: ")[-1],
        "memory": None,
        "hbm_bytes": tgt.chip.hbm_bytes,
        "fits": False,
        "eval": analyse_eval(config, tgt, param_elements) if with_eval else None,
    }
  compile_s = time.perf_counter() - start
  memory = bench_memory.memory_analysis(compiled)
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  flops_source = "compiled"
  if not cost.get("flops"):
    # The GPU compiler reports no cost analysis: count the unoptimised program of the same
    # global batch on one CPU device instead (all chips' FLOPs together).
    on_cpu, _ = lower_step(config, jax.devices("cpu")[:1])
    unoptimised = on_cpu.cost_analysis() or {}
    cost = {"flops": float(unoptimised.get("flops", 0.0)) / chips_n}
    flops_source = "unoptimised program / chips"
  state_bytes = sum(
      int(np.prod(s.shape)) * s.dtype.itemsize // (chips_n if s.sharding.spec else 1)
      for s in jax.tree.leaves(state)
  )
  hlo = compiled.as_text()
  insts = instructions(hlo)
  layouts = state_layouts(compiled.input_formats[0][0])
  flops = float(cost.get("flops", 0.0))
  try:
    analytic = bench_flops.step_flops_per_image(config)["per_image"]
  except ValueError:
    analytic = None
  kernels = kernel_report(hlo, config, tgt, batch // chips_n)
  accessed = float(cost.get("bytes accessed", 0.0)) or float(kernels["bytes"] if kernels else 0)
  flop_s, byte_s = flops / tgt.chip.peak_bf16_flops, accessed / tgt.chip.hbm_bytes_per_s
  return {
      **head,
      "compile_s": round(compile_s, 1),
      "memory": memory,
      "hbm_bytes": tgt.chip.hbm_bytes,
      "fits": memory["peak"] <= tgt.chip.hbm_bytes,
      "state_bytes": state_bytes,
      "flops_per_chip": flops,
      "flops_per_image": flops * chips_n / batch,
      "flops_source": flops_source,
      "analytic_flops_per_image": analytic,
      "bytes_accessed_per_chip": accessed,
      "bytes_source": "compiled" if cost.get("bytes accessed") else "kernels' operands and results",
      "roofline_img_per_s_per_chip": (batch / chips_n) / max(flop_s, byte_s) if flop_s else None,
      "flop_roofline_img_per_s_per_chip": (batch / chips_n) / flop_s if flop_s else None,
      "byte_roofline_img_per_s_per_chip": (batch / chips_n) / byte_s if byte_s else None,
      "kernels": kernels,
      "state_layouts": layouts,
      "collectives": collectives(insts, param_elements, batch),
      "census": census(insts),
      "eval": analyse_eval(config, tgt, param_elements) if with_eval else None,
  }


def state_layouts(formats) -> dict:
  """How the compiled step keeps the state in a chip's memory (cl_jax.runtime.layouts: the
  compiler's choice): {"arrays": the state's arrays, "not_row_major": those it keeps in another
  order, "orders": {order: count} of those, an order written as its major-to-minor dimensions,
  e.g. "3,0,1,2" for a (kh, kw, C_in, C_out) kernel held as (C_out, kh, kw, C_in)}."""
  orders = collections.Counter()
  leaves = jax.tree.leaves(formats)
  for f in leaves:
    order = tuple(f.layout.major_to_minor)
    if order != tuple(range(len(order))):
      orders[",".join(map(str, order))] += 1
  return {"arrays": len(leaves), "not_row_major": sum(orders.values()), "orders": dict(orders)}


def kernel_report(hlo: str, config, tgt: Target, batch_per_chip: int) -> dict | None:
  """The kernels of a compiled GPU step per chip (cl_jax.bench.hlo_kernels.kernel_table), with
  the batch-norm inputs' elements of one forward of the chip's batch, BN's bytes per such
  element and the modelled time of the kernels (hlo_kernels.model_ms, rates calibrated on the
  committed H200 trace: a model, not a measurement). None on other targets; a TPU program's
  instructions include its DMAs (each prefetch as a copy-start and a copy-done of the same
  bytes, asynchronous slices into on-chip memory), so their operands and results are no count
  of kernels or of HBM traffic; XLA's cost analysis gives the bytes there."""
  if not tgt.name.startswith("h100"):
    return None
  table = hlo_kernels.kernel_table(hlo)
  encoder = encoder_for(config)
  elements = hlo_kernels.bn_input_elements(encoder, batch_per_chip, config.data.image_size)
  bn_bytes = sum(
      table["by_kind"].get(kind, {"bytes": 0})["bytes"]
      for kind in ("BN statistics", "BN backward", "BN elementwise")
  )
  table["bn_input_elements"] = elements
  table["bn_bytes_per_input_element"] = round(bn_bytes / elements, 2) if elements else None
  rates = hlo_kernels.load_rates()
  table["model_ms"] = hlo_kernels.model_ms(table, rates)
  table["model_source"] = rates["source"]
  return table


def analyse_eval(config, tgt: Target, param_elements: int) -> dict:
  """Compile the evaluation forward of `config` for `tgt` (lower_eval) and read it."""
  start = time.perf_counter()
  lowered, batch = lower_eval(config, tgt.devices)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  memory = bench_memory.memory_analysis(compiled)
  insts = instructions(compiled.as_text())
  return {
      "global_batch": batch,
      "batch_per_chip": batch // len(tgt.devices),
      "compile_s": round(compile_s, 1),
      "memory": memory,
      "fits": memory["peak"] <= tgt.chip.hbm_bytes,
      "collectives": collectives(insts, param_elements, batch),
      "census": census(insts),
  }


REFITS = 4


def max_batch(config, tgt: Target, first: int) -> dict:
  """The largest per-chip batch whose step fits the chip. Compiles `first` (the config's batch)
  and 2 x `first`; where `first` does not fit, halves it until a batch does. Then narrows the
  gap between the largest batch that fits and the smallest that does not, up to REFITS more
  compiles: on the line through two peaks (the two batches that fit while none fails; the
  batches either side once one fails, regula falsi), at least 1% below the smallest batch that
  does not fit and twice as far after each line's batch that did not fit either (a TPU compiler
  pads the batch, so its peak grows in steps, and a compiler may change its layouts between two
  batches: the line's batch would otherwise creep down one batch per compile), or halfway
  between them where the TPU compiler refused the batch that does not fit (its peak unknown);
  where the larger of the two batches that fit peaks no higher than the smaller, no line is
  drawn and the batch doubles.
  Each candidate is the largest batch the config accepts (fit["config_batch"]: MoCo's queue
  holds a whole number of global batches, the global batch a multiple of the batch-norm
  groups); a batch is compiled at most once; the search ends within 2% (or one step of the
  groups) or after REFITS, wherever the gap then is. Returns dict(fit: the last line,
  {fixed_bytes, per_image_bytes, batch: memory's alone} or None where no line was drawn, with
  config_batch and refits; peaks {batch: bytes} of the batches that compiled; first: the
  analysis at `first`; checked: the largest batch's that fits, None if none does)."""
  chips_n = len(tgt.devices)
  groups = max(config.model.bn_groups, 1)
  step = groups // math.gcd(groups, chips_n)
  analyses = {}

  def known_peaks() -> dict[int, int]:
    """{batch: peak bytes} of the batches that compiled."""
    return {x: a["memory"]["peak"] for x, a in analyses.items() if a["memory"]}

  def compile_at(b: int) -> dict:
    analyses[b] = analyse(for_target(config, chips_n, b), tgt, b == first)
    return analyses[b]

  def accepted(b: int, above: int) -> int | None:
    """The largest batch in (above, b] that the config accepts, or None."""
    while b > above:
      try:
        for_target(config, chips_n, b)
        return b
      except UsageError:
        b -= step
    return None

  b = first
  while not compile_at(b)["fits"]:
    b = accepted(b // 2, 0)
    if b is None:
      return {"fit": None, "peaks": {}, "first": analyses[first], "checked": None}
  if b == first:
    compile_at(2 * first)
  fit, searched, doubled, misses = None, 0, False, 0
  while searched <= REFITS:
    peaks = known_peaks()
    low = max(x for x, a in analyses.items() if a["fits"])
    failing = [x for x, a in analyses.items() if not a["fits"]]
    high = min(failing) if failing else None
    if high is None and searched and not doubled:  # the fitted batch fits: the line holds
      break
    if high is not None and high - low <= max(step, 0.02 * low):
      break
    if high is None or high in peaks:
      line = sorted(peaks)[-2:] if high is None else [low, high]
      fit = bench_memory.largest_batch({x: peaks[x] for x in line}, tgt.chip.hbm_bytes, step)
      # A peak that does not grow between the two largest batches (the compiler chose another
      # layout) draws no line: double the largest batch that fits.
      doubled = high is None and fit["per_image_bytes"] <= 0
      if doubled:
        guess = 2 * low
      elif high is None:
        guess = fit["batch"]
      else:
        guess = min(fit["batch"], high - max(step, math.ceil(high * 0.01 * 2**misses)))
        if guess <= low:
          guess = (low + high) // 2 // step * step
    else:
      guess = (low + high) // 2 // step * step
    candidate = accepted(guess, low)
    if candidate is None or candidate in analyses:
      break
    searched += 1
    misses = 0 if compile_at(candidate)["fits"] else misses + 1
  best = max(x for x, a in analyses.items() if a["fits"])
  fit = dict(fit or {"fixed_bytes": None, "per_image_bytes": None, "batch": None})
  fit.update(config_batch=best, refits=max(searched - 1, 0))
  return {"fit": fit, "peaks": known_peaks(), "first": analyses[first], "checked": analyses[best]}


def report(result: dict) -> str:
  """The analysis as text."""
  gib = 2**30
  m = result["memory"]
  head = (
      f"{result['target']}: {result['chips']} x {result['chip']} on {result['hosts']} host(s), "
      f"global batch {result['global_batch']} ({result['batch_per_chip']} per chip), "
      f"{'compiled in' if m else 'refused after'} {result['compile_s']} s"
  )
  if m is None:
    lines = [head, f"  DOES NOT FIT: the compiler ran out of HBM ({result['out_of_memory']})"]
    return "\n".join(lines + _eval_lines(result["eval"]))
  lines = [
      head,
      f"  memory per chip: peak {m['peak'] / gib:.2f} GiB of {result['hbm_bytes'] / gib:.1f} GiB "
      f"({'fits' if result['fits'] else 'DOES NOT FIT'}); arguments {m['argument'] / gib:.2f}, "
      f"outputs {m['output'] / gib:.2f}, donated {m['alias'] / gib:.2f} (state "
      f"{result['state_bytes'] / gib:.2f}), temporaries {m['temp'] / gib:.2f} GiB",
      f"  FLOPs per image {result['flops_per_image'] / 1e9:.1f} G ({result['flops_source']})"
      + (
          f"; analytic count {result['analytic_flops_per_image'] / 1e9:.1f} G "
          f"(ratio {result['flops_per_image'] / result['analytic_flops_per_image']:.3f})"
          if result["analytic_flops_per_image"]
          else "; no analytic count for this method"
      ),
  ]
  if result["roofline_img_per_s_per_chip"]:
    lines.append(
        "  roofline (an estimate, not a measurement): at most "
        f"{result['roofline_img_per_s_per_chip']:.0f} img/s per chip (FLOPs alone "
        f"{result['flop_roofline_img_per_s_per_chip']:.0f}, bytes alone "
        f"{result['byte_roofline_img_per_s_per_chip']:.0f}: "
        f"{result['bytes_accessed_per_chip'] / 1e9:.1f} GB per step, {result['bytes_source']})"
    )
  if result["kernels"]:
    lines += kernel_lines(result["kernels"])
  lay = result["state_layouts"]
  lines.append(
      f"  state layouts (the compiler's choice): {lay['not_row_major']} of {lay['arrays']} arrays "
      "not row-major"
      + (
          "".join(f"; {n} in order ({o})" for o, n in lay["orders"].items())
          if lay["orders"]
          else ""
      )
  )
  lines.append("  collectives per step (kind, dtype, purpose: count, MB per chip):")
  for c in result["collectives"]:
    lines.append(
        f"    {c['kind']} {c['dtype']} {c['purpose']}: {c['count']}, {c['bytes'] / 1e6:.1f} MB"
        + (f"  e.g. {c['ops'][0]}" if c["purpose"] == "unexpected" and c["ops"] else "")
    )
  cen = result["census"]
  products = ", ".join(f"{k}: {v}" for k, v in cen["products"].items())
  lines.append(f"  convolutions and dots by operand dtypes: {products or 'none'}")
  default = cen["default_precision_f32"]
  lines.append(
      f"  float32 products at default precision (one bf16 pass on a TPU): {sum(default.values())}"
      + (f", e.g. {next(iter(default))}" if default else "")
  )
  lines.append(f"  float64 values: {cen['float64']}; host transfers: {cen['host'] or 'none'}")
  return "\n".join(lines + _eval_lines(result["eval"]))


def kernel_lines(kernels: dict) -> list[str]:
  """The kernel table's lines of report(): kernels and GB per step by kind, and the model."""
  model = kernels.get("model_ms", {})
  lines = [
      f"  kernels per step: {kernels['kernels']}, {kernels['bytes'] / 1e9:.1f} GB of operands "
      f"and results; batch norm {kernels['bn_bytes_per_input_element']} bytes per BN-input "
      "element (of one forward)",
      f"    {'kind':<16} {'kernels':>8} {'GB/step':>9}" + (f" {'model ms':>9}" if model else ""),
  ]
  for kind, row in kernels["by_kind"].items():
    lines.append(
        f"    {kind:<16} {row['kernels']:>8} {row['bytes'] / 1e9:>9.2f}"
        + (f" {model[kind]:>9.2f}" if model else "")
    )
  if model:
    lines.append(
        f"    modelled time {model['total']:.2f} ms per step: a model from per-kind rates of "
        f"{kernels['model_source']}"
    )
  return lines


def _eval_lines(ev: dict | None) -> list[str]:
  """The evaluation forward's lines of report()."""
  if ev is None:
    return []
  gib = 2**30
  eval_comms = ", ".join(f"{c['kind']} {c['dtype']} {c['purpose']}" for c in ev["collectives"])
  eval_products = ", ".join(f"{k}: {v}" for k, v in ev["census"]["products"].items())
  return [
      f"  evaluation forward (batch {ev['global_batch']}, {ev['batch_per_chip']} per chip), "
      f"compiled in {ev['compile_s']} s: peak {ev['memory']['peak'] / gib:.2f} GiB "
      f"({'fits' if ev['fits'] else 'DOES NOT FIT'}); collectives: {eval_comms or 'none'}",
      f"    convolutions and dots by operand dtypes: {eval_products or 'none'}; float64 "
      f"values: {ev['census']['float64']}; host transfers: {ev['census']['host'] or 'none'}",
  ]


def _define_flags():
  """The command's flags (defined only when it runs as a program)."""
  cli.define_config_flag()
  flags.DEFINE_string("target", None, "v4:2x2x1, v5e:2x2, v5e:4x4, v5p:2x2x1, v6e:2x2, h100:N.")
  flags.DEFINE_integer("batch_per_chip", None, "Images per chip (default: the config's batch).")
  flags.DEFINE_bool("max_batch", False, "Find the largest per-chip batch that fits the chip.")
  flags.DEFINE_bool("json", False, "Print the result as one JSON line.")
  flags.mark_flags_as_required(["config", "target"])


def main(argv):
  del argv
  f = flags.FLAGS
  # Compile-only devices: nothing runs here, and this machine's own backend stays the CPU.
  jax.config.update("jax_platforms", "cpu")
  with cli.report():
    tgt = target(f.target)
    if f.max_batch:
      first = batch_plan.plan(f.config, len(tgt.devices))["per_chip"]  # the config's own
      first = f.batch_per_chip or first
      result = max_batch(f.config, tgt, first)
      fit = result["fit"]
      if fit is None:
        text = f"no batch per chip that the config accepts fits {tgt.name}"
      else:
        text = (
            f"largest batch per chip on {tgt.name}: {fit['config_batch']} that the config accepts"
        )
      if fit and fit["refits"]:
        text += (
            f", after {fit['refits']} more compiles between the largest batch that fits and the "
            "smallest that does not"
        )
      elif fit and fit["batch"]:
        text += (
            f", {fit['batch']} that memory allows (peak = {fit['fixed_bytes'] / 2**30:.2f} GiB + "
            f"{fit['per_image_bytes'] / 2**20:.1f} MiB per image)"
        )
      text += "\n" + report(result["first"])
      if result["checked"]:
        text += "\n" + report(result["checked"])
    else:
      result = analyse(for_target(f.config, len(tgt.devices), f.batch_per_chip), tgt)
      text = report(result)
  print(json.dumps(result) if f.json else text)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
