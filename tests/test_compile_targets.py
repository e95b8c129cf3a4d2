"""The quick default (MoCo-v2 + patch negatives) and SimCLR compiled ahead of time for a TPU v5e
slice (v5e:2x2) and two H100s (h100:2) in bfloat16, as on accelerators: they compile and fit,
communicate only what data parallelism needs (no image gathered in float32), donate their
state (on H100s held in the layouts cuDNN reads), and their FLOPs per image agree with the
analytic count. A residual block's batch norms,
compiled for an H100, move the bytes they need and no more; the stem's batch norm and max-pool,
compiled for a TPU v5p chip, keep x and not its normalised output for the backward.

The compilers (requirements-compile.txt, about 1.2 GB) live in a folder of their own, by default
.compilers at the repository's root (docs/benchmarks.md, "Compiled for TPUs and H100s"; another
with CL_JAX_COMPILERS=<folder>), which only `python -m cl_jax.bench.compile`'s process imports
from: where JAX sees the CUDA plugin, it logs to the process's stderr. Without it these tests
are skipped with the line saying what to install, unless CL_JAX_REQUIRE_COMPILERS=1
(`.ci/run` sets it): then they fail."""

import json
import os
import subprocess
import sys

import pytest

from tests import conftest

pytestmark = pytest.mark.slow  # each compile takes one to four minutes on 2 CPU cores

# What data parallelism needs of each method's step; anything else is a failure.
EXPECTED = {
    "mocov2_patchns": {
        "gradient reduction",
        "shuffled key batch",
        "queue contrast",
        "reduction of a loss or metric",
        "batch-norm statistics",
        "batch-norm statistics and losses, combined",
    },
    "simclr": {
        "gradient reduction",
        "batch contrast",
        "batch-norm statistics",
        "reduction of a loss or metric",
        "batch-norm statistics and losses, combined",
    },
}
# The analytic count (cl_jax.bench.flops) leaves out batch norm, activations, augmentation and
# the optimizer: at 32 px they add 3-6% (v5e:2x2, quick default: 1.056; at :imagenet100's
# 224 px ResNet-50, 1.031).
FLOPS_RATIO = (1.0, 1.08)
# The state's convolution kernels: ResNet-18's 20 in the online parameters and in their momentum,
# and for MoCo in the EMA target.
KERNELS_IN_STATE = {"mocov2_patchns": 3 * 20, "simclr": 2 * 20}


def _compilers() -> str:
  """The compilers' folder (module docstring); skip or fail without it."""
  folder = os.environ.get("CL_JAX_COMPILERS") or os.path.join(conftest.ROOT, ".compilers")
  if not all(os.path.isdir(os.path.join(folder, package)) for package in ("libtpu", "jax_plugins")):
    message = (
        f"no compilers in {folder}: pip install --no-deps --target {folder} "
        "-r requirements-compile.txt"
    )
    if os.environ.get("CL_JAX_REQUIRE_COMPILERS") == "1":
      pytest.fail(message)
    pytest.skip(message)
  return folder


def _run(args: list[str], timeout: int) -> dict:
  """The JSON object of the last line that `python ARGS` prints, run in a process of its own
  with the compilers on its path."""
  path = os.pathsep.join(p for p in (_compilers(), os.environ.get("PYTHONPATH")) if p)
  proc = subprocess.run(
      [sys.executable, *args],
      cwd=conftest.ROOT,
      env={**os.environ, "PYTHONPATH": path},
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_script(script: str) -> dict:
  """_run of a Python script given as text."""
  return _run(["-c", script], timeout=600)


def _compile(config_name: str, target_name: str) -> dict:
  """`python -m cl_jax.bench.compile --json` of the config in bfloat16, with the compilers,
  at XLA's default optimisation level, as every test subprocess (tests/conftest.py): the
  target's program as users get it."""
  args = ["-m", "cl_jax.bench.compile", f"--config=configs/{config_name}.py"]
  args += ["--config.model.dtype=bfloat16", f"--target={target_name}", "--json"]
  return _run(args, timeout=1200)


@pytest.mark.parametrize("target_name", ["v5e:2x2", "h100:2"])
@pytest.mark.parametrize("config_name", sorted(EXPECTED))
def test_the_quick_config_compiles_for_the_target_and_needs_only_data_parallel_traffic(
    config_name, target_name
):
  result = _compile(config_name, target_name)
  size = 32  # the quick default's image side
  assert result["target"] == target_name and result["fits"], result["memory"]
  found = {c["purpose"] for c in result["collectives"]}
  assert found <= EXPECTED[config_name], result["collectives"]
  assert "gradient reduction" in found
  # The gradients are summed across chips in float32 (model.grad_reduce_dtype's default), the
  # bfloat16 convolutions' weight gradients included.
  reductions = [c for c in result["collectives"] if c["purpose"] == "gradient reduction"]
  assert {c["dtype"] for c in reductions} == {"f32"}, reductions
  # No image crosses devices in float32: every float32 gather is smaller than a tenth of the
  # batch's images in float32 (the keys' and embeddings' gathers are).
  images_f32 = result["global_batch"] * size * size * 3 * 4
  gathered_f32 = sum(
      c["bytes"] for c in result["collectives"] if c["kind"] == "all-gather" and "f32" in c["dtype"]
  )
  assert gathered_f32 < images_f32 / 10, result["collectives"]
  if config_name == "mocov2_patchns":  # the shuffled key batch: its images in bfloat16
    (images,) = [
        c
        for c in result["collectives"]
        if c["purpose"] == "shuffled key batch" and c["dtype"] == "bf16"
    ]
    assert images["bytes"] >= result["global_batch"] * size * size * 3 * 2
  # The state is donated: every output but the loss and the lr reuses an argument's buffer, and
  # the arguments are the state and the batch: within 5% of their bytes on the GPU, within 60%
  # on the TPU, whose layouts pad each small array (a bias, a batch-norm scale) to whole tiles.
  memory, state = result["memory"], result["state_bytes"]
  assert state <= memory["alias"] and memory["output"] - memory["alias"] < 2**16, memory
  views = result["batch_per_chip"] * size * size * 3 * 3  # at most 3 uint8 views per image
  padding = 1.05 if target_name.startswith("h100") else 1.6
  assert state <= memory["argument"] <= padding * (state + views), (memory, state)
  assert not result["census"]["float64"] and not result["census"]["host"]
  if target_name.startswith("h100"):
    # Left to choose, the GPU's compiler keeps every kernel of the state in the order cuDNN
    # reads it, (C_out, kh, kw, C_in), and nothing else out of row-major order.
    assert result["state_layouts"]["orders"] == {"3,0,1,2": KERNELS_IN_STATE[config_name]}
    # Its kernels are counted and their bytes are the step's traffic.
    assert result["kernels"]["bytes"] == result["bytes_accessed_per_chip"] > 0
  else:
    # A TPU program's instructions include its DMAs: no kernel table; XLA counts the bytes.
    assert result["kernels"] is None and result["bytes_source"] == "compiled"
  # Every contrastive score is a float32 product at full precision (a TPU computes a
  # default-precision one in one bf16 pass): only the heads' float32 layers use the default.
  default = result["census"]["default_precision_f32"]
  assert all("/head/" in op for op in default), default
  # The evaluation forward fits, communicates nothing and stays on the device.
  ev = result["eval"]
  assert ev["fits"] and ev["collectives"] == [], ev
  assert not ev["census"]["float64"] and not ev["census"]["host"]
  ratio = result["flops_per_image"] / result["analytic_flops_per_image"]
  assert FLOPS_RATIO[0] <= ratio <= FLOPS_RATIO[1], ratio


# One identity bottleneck block of ResNet-50's second stage (512 -> 128 -> 512 channels, 28 x 28,
# batch 256, bfloat16), its forward and backward compiled for one H100; prints the bytes each of
# its batch norms moves per element of its input, from the compiled kernels' operands and results.
_BLOCK_SCRIPT = """
import json, re
import jax
jax.config.update("jax_platforms", "cpu")  # the H100 is a compile-only target
import jax.numpy as jnp
from cl_jax.bench import compile as bench_compile, hlo_kernels, profile
from cl_jax.models.resnet import ResidualBlock
block = ResidualBlock(kind="bottleneck", planes=128, stride=1, bn_groups=1,
                      zero_init_residual=True, dtype=jnp.bfloat16)
x = jax.ShapeDtypeStruct((256, 28, 28, 512), jnp.bfloat16)
small = jnp.zeros((2, 28, 28, 512), jnp.bfloat16)
variables = jax.eval_shape(lambda: block.init(jax.random.key(0), small, True))
def step(variables, x, g):
  def loss(params):
    y, _ = block.apply({**variables, "params": params}, x, True, mutable=["batch_stats"])
    return jnp.sum(y.astype(jnp.float32) * g)
  return jax.grad(loss)(variables["params"])
sharding = jax.sharding.SingleDeviceSharding(bench_compile.target("h100:1").devices[0])
spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
hlo = jax.jit(step).lower(*jax.tree.map(spec, (variables, x, x))).compile().as_text()
instructions = profile.hlo_instructions(hlo)
moved = {}
for name in hlo_kernels.executed(hlo):
  inst = instructions[name]
  if hlo_kernels.kind_of(inst).startswith("BN"):
    names = (inst["op_name"], *inst["fused_op_names"])
    (bn,) = {m.group(1) for n in names for m in [re.search(r"/(bn\\d)/", n)] if m}
    moved[bn] = moved.get(bn, 0) + inst["bytes"]
masks = len(re.findall(r"-> \\(?pred\\[256,28,28", hlo))
elements = {"bn1": 256 * 28 * 28 * 128, "bn2": 256 * 28 * 28 * 128, "bn3": 256 * 28 * 28 * 512}
print(json.dumps({"per_element": {k: v / elements[k] for k, v in moved.items()}, "masks": masks}))
"""


def test_batch_norm_moves_the_bytes_it_needs_in_a_compiled_h100_block():
  """A residual block's batch norms in one forward and its backward, compiled for an H100
  (bfloat16, 2 bytes per element): the two followed by a ReLU move 16 bytes per element (the
  statistics read x; the normalisation reads x and writes y; the backward's sums read dy and x,
  its dx pass reads them again and writes dx) and store no ReLU mask; the last, with the
  residual's add, 22 (its normalisation also reads the shortcut; its sums read y for the mask and
  write the shortcut's gradient, which its dx pass reads instead of dy). 0.5% covers the
  (C,)-sized statistics."""
  result = _run_script(_BLOCK_SCRIPT)
  per_element = result["per_element"]
  assert per_element["bn1"] == pytest.approx(16, rel=5e-3), per_element
  assert per_element["bn2"] == pytest.approx(16, rel=5e-3), per_element
  assert per_element["bn3"] == pytest.approx(22, rel=5e-3), per_element
  assert result["masks"] == 0, result


# The stem's batch norm, ReLU and max-pool (32 images of 112 x 112 x 64, bfloat16) followed by a
# 1x1 convolution to 1,024 channels and a ReLU, whose forward and backward hold memory while the
# stem's residuals wait for its backward; compiled for one TPU v5p chip in the TPU form
# (normalise_then_pool) and as autodiff of group_normalise then max_pool_3x3_s2.
_STEM_SCRIPT = """
import functools, json
import jax
jax.config.update("jax_platforms", "cpu")  # the TPU is a compile-only target
import jax.numpy as jnp
from cl_jax.bench import compile as bench_compile
from cl_jax.models import batchnorm, pooling
bf16 = jnp.dtype(jnp.bfloat16)
def stem(form, x, scale, bias):
  shift = jnp.zeros_like(scale)
  if form == "tpu":
    return batchnorm.normalise_then_pool(x, scale, bias, shift, 1, 1e-5, bf16)[0]
  y = batchnorm.group_normalise(x, None, scale, bias, shift, 1, 1e-5, bf16, True)[0]
  return pooling.max_pool_3x3_s2(y)
def step(form, x, scale, bias, w):
  def loss(x, scale, bias):
    z = jax.nn.relu(jnp.einsum("bhwc,cd->bhwd", stem(form, x, scale, bias), w))
    return jnp.sum(z.astype(jnp.float32) ** 2)
  return jax.grad(loss, argnums=(0, 1, 2))(x, scale, bias)
sharding = jax.sharding.SingleDeviceSharding(bench_compile.target("v5p:2x2x1").devices[0])
f32 = jnp.float32
shapes = [((32, 112, 112, 64), bf16), ((64,), f32), ((64,), f32), ((64, 1024), bf16)]
args = [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in shapes]
out = {}
for form in ("tpu", "autodiff"):
  compiled = jax.jit(functools.partial(step, form)).lower(*args).compile()
  out[form] = {"temp": compiled.memory_analysis().temp_size_in_bytes,
               "select_and_scatter": compiled.as_text().count("select-and-scatter")}
print(json.dumps(out))
"""


def test_the_tpu_stem_keeps_x_not_its_normalised_output_for_the_backward():
  """On TPUs the stem's max-pool takes select-and-scatter, which reads the pool's input y =
  max(BN(x), 0): normalise_then_pool recomputes y from x in the backward, so the compiled
  step's temporaries are smaller than autodiff's (which keeps y from the forward to the
  backward) by at least y's size (32 x 112 x 112 x 64 bfloat16, 51.4 MB); both run
  select-and-scatter."""
  result = _run_script(_STEM_SCRIPT)
  y_bytes = 32 * 112 * 112 * 64 * 2
  assert result["autodiff"]["temp"] - result["tpu"]["temp"] >= y_bytes, result
  assert result["tpu"]["select_and_scatter"] >= 1, result
  assert result["autodiff"]["select_and_scatter"] >= 1, result
