"""The benchmark command: per-device queue memory from the shards, and its printed table."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from cl_jax import train
from cl_jax import train_step as step_lib
from cl_jax.bench import flops
from cl_jax.bench import step as bench
from cl_jax.runtime import parallel
from configs import dicr, looc, mocov2, mocov2_patchns
from tests import tiny_run

pytestmark = pytest.mark.slow  # subprocess runs or compiled train steps: minutes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_measure_times_the_training_step():
  """The timed function is the lean train step of cl_jax.train (the one it runs between
  logging steps): after warmup + 1 + steps calls on the benchmark's synthetic batch, its loss
  is the one the training path reaches (the same program: read from the compilation cache)."""
  c = mocov2_patchns.get_config(None)
  c.data.image_size = 16
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.moco.queue_size, c.optim.batch_size = 256, 32
  out = bench.measure(c, devices=1, steps=2, warmup=1)
  assert out["devices"] == 1 and out["global_batch"] == 32 and out["backend"] == "cpu"
  # One device holds the whole queue (256 x 8 float32); the CLI test below splits it over 2.
  assert out["queue_mb_per_device"] == out["queue_mb_total"] == 256 * 8 * 4 / 2**20
  assert out["step_ms"] > 0
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(c, 32, mesh)
  state = make_state()
  step = step_lib.jit_train_step(
      step_lib.make_train_step(c, encoder, tx, schedule, mesh, 1, statistics=False),
      parallel.state_sharding(state, mesh),
      parallel.batch_sharding(mesh),
  )
  batch = train.synthetic_batch(c, 32, np.random.default_rng(0))
  assert set(batch) == {"view1", "view2", "box1", "box2", "flip1", "flip2"}
  for _ in range(1 + 1 + 2):
    state, metrics = step(state, jax.device_put(batch, parallel.batch_sharding(mesh)))
  assert int(state.step) == 4
  np.testing.assert_allclose(out["loss"], float(metrics["loss"]), rtol=1e-6)


@pytest.mark.parametrize("name", ["dicr", "looc"])
def test_measure_runs_the_steps_that_read_boxes_or_extra_views(name):
  c = (dicr if name == "dicr" else looc).get_config(None)
  c.data.image_size = 16
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.moco.queue_size, c.optim.batch_size = 256, 32
  c.dicr.warmup_epochs = 0
  out = bench.measure(c, devices=1, steps=1, warmup=0)
  assert np.isfinite(out["loss"]) and out["step_ms"] > 0


def test_cli_runs_each_device_count_in_its_own_process():
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.bench.step",
          "--devices=1,2",
          "--steps=1",
          "--warmup=0",
          *tiny_run.BENCH_FLAGS,
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["devices", "step", "ms"])
  rows = [line.split() for line in lines[header + 1 :]]
  assert [r[0] for r in rows] == ["1", "2"]
  # queue MiB per device halves with 2 devices (the queue is 256 x 8 float32).
  total = 256 * 8 * 4 / 2**20
  assert [float(r[7]) for r in rows] == [round(total, 3), round(total / 2, 3)]
  # FLOPs per image do not depend on how the batch is split; a CPU has no known peak.
  gflop = [float(r[3]) for r in rows]
  assert gflop[0] > 0 and abs(gflop[1] - gflop[0]) <= 0.05 * gflop[0]
  assert [r[5] for r in rows] == ["n/a", "n/a"]


def test_torch_comparison_switches_off_the_addons_the_reference_lacks():
  config = mocov2_patchns.get_config(None)
  reference, addons = bench.torch_comparable(config)
  assert addons == ["nonsemantic"] and not reference.nonsemantic.enabled
  assert config.nonsemantic.enabled  # the config itself is left as it was
  assert bench.torch_comparable(mocov2.get_config(None))[1] == []


def test_children_keep_the_xla_flags_but_the_device_count():
  flags = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=1"
  assert bench._without_device_count(flags) == "--xla_backend_optimization_level=1"
  assert bench._without_device_count("") == ""


def _valid_taps(size: int, kernel: int, stride: int) -> tuple[int, int]:
  """(output side, kernel taps on real pixels summed over the output positions) of a k x k
  convolution with padding k // 2 along one axis of `size` pixels, counted on a mask: the
  input's pixels as ones between k // 2 zeros of padding, each window's sum its taps."""
  mask = np.pad(np.ones(size), kernel // 2)
  windows = [mask[start : start + kernel] for start in range(0, len(mask) - kernel + 1, stride)]
  return len(windows), int(sum(w.sum() for w in windows))


def _resnet18_cifar_convs(size: int, width: int) -> list[tuple[int, int, int, int, int]]:
  """(C_in, C_out, k, stride, input side) of every convolution of a CIFAR-stem ResNet-18
  (He et al. 2016, Table 1 with a 3x3/1 stem and no max-pool), written out independently."""
  convs = [(3, width, 3, 1, size)]
  c_in, side = width, size
  for stage, planes in enumerate([width, 2 * width, 4 * width, 8 * width]):
    for block in range(2):
      stride = 2 if stage > 0 and block == 0 else 1
      out_side = _valid_taps(side, 3, stride)[0]
      convs += [(c_in, planes, 3, stride, side), (planes, planes, 3, 1, out_side)]
      if stride != 1 or c_in != planes:
        convs.append((c_in, planes, 1, stride, side))
      c_in, side = planes, out_side
  return convs


def test_peak_table_names_the_accelerators():
  from cl_jax.bench import device_peaks

  assert device_peaks.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
  assert device_peaks.peak_tflops("NVIDIA H100 PCIe") == 756.0
  assert device_peaks.peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
  assert device_peaks.peak_tflops("TPU v5 lite") == 197.0
  assert device_peaks.peak_tflops("TPU v4") == 275.0
  assert device_peaks.peak_tflops("cpu") is None


def _tiny_resnet18_config(dtype: str, size: int = 8):
  c = mocov2_patchns.get_config(None)
  c.nonsemantic.enabled = False
  c.data.image_size = size
  c.model.update(
      depth=18, stem="cifar", width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8,
      dtype=dtype,
  )  # fmt: skip
  return c


@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("bfloat16", 2)])
def test_online_residuals_match_a_hand_count(dtype, itemsize):
  """CIFAR ResNet-18 at width 8, 8 px: per image, the backward keeps each BN's input (a
  convolution's output) and each ReLU's output (which the next convolution reads, or the
  residual block's batch norm for its ReLU's mask), in the compute dtype, and nothing else of
  full size; bfloat16 adds the image's bfloat16 copy."""
  from cl_jax.bench import memory

  convs = _resnet18_cifar_convs(8, 8)
  conv_out = sum(c_out * _valid_taps(side, k, s)[0] ** 2 for _, c_out, k, s, side in convs)
  # ReLUs: the stem's, then two per block (after BN1, after the residual sum), at the width
  # and side of the block's output.
  block_out = [(planes, 8 // 2**stage) for stage, planes in enumerate([8, 16, 32, 64])]
  relu_out = 8 * 8**2 + sum(2 * 2 * planes * side**2 for planes, side in block_out)
  head_hidden = 16  # the head's hidden ReLU, float32
  out = memory.online_residuals(_tiny_resnet18_config(dtype), 4)
  ops = out["by_op"]
  assert ops[f"conv_general_dilated {dtype}"] == conv_out * itemsize
  # The ReLU outputs are batch norms' outputs (cl_jax.models.batchnorm applies the ReLU): cast
  # to the compute dtype (a reshape in float32, a convert in bfloat16), a block's behind the
  # optimization barrier that ends it; the head's hidden ReLU is float32 (custom_vjp_call).
  activations = ("reshape", "convert_element_type", "optimization_barrier")
  saved = sum(ops.get(f"{op} {dtype}", 0) for op in activations)
  image = 8 * 8 * 3 * 2 if dtype == "bfloat16" else 0  # the image's bfloat16 copy
  assert saved == relu_out * itemsize + image
  assert ops[f"custom_vjp_call {'float32'}"] == head_hidden * 4
  # The rest: the pooled features and the head's normalisation, (B, <= 128) each.
  rest = (
      out["per_image_bytes"]
      - sum(
          v for k, v in ops.items() if k.split()[0] in ("conv_general_dilated", "custom_vjp_call")
      )
      - saved
  )
  assert 0 < rest <= 128 * 4
  assert sum(out["by_dtype"].values()) == out["per_image_bytes"]
  assert "float32" not in out["by_dtype"] or dtype == "float32" or out["by_dtype"]["float32"] < 1e3


def test_largest_batch_fits_a_line_through_two_peaks():
  from cl_jax.bench import memory

  fit = memory.largest_batch({64: 10 * 2**30 + 64 * 2**28, 128: 10 * 2**30 + 128 * 2**28},
                             80 * 2**30, 8)  # fmt: skip
  # fixed 10 GiB + 0.25 GiB per image: 280 images fit in 80 GiB.
  assert fit["fixed_bytes"] == 10 * 2**30 and fit["per_image_bytes"] == 2**28
  assert fit["batch"] == 280
  # 12.5 bytes per image: 88 images fit in 1100 bytes, 80 in multiples of 16.
  assert memory.largest_batch({8: 100, 16: 200}, 1100, 16)["batch"] == 80


def test_step_flops_and_the_efficiency_ratio_match_a_hand_count():
  """MoCo-v2 (asymmetric) step on a CIFAR ResNet-18, 32 px, batch 8, float32: the query
  encoder's forward and backward (3 forward costs, less the stem's input gradient, which
  nothing needs) and the key encoder's forward (1) give 4 forward costs less one stem; the
  heads, logits, BN and augmentation add about 1.5%. The supervised step is one forward and
  backward of the same backbone (3 forward costs less the stem's input gradient). Times are
  measured and positive; their ratio is not asserted (timings are not tests)."""
  from cl_jax.bench import efficiency

  c = mocov2_patchns.get_config(None)
  c.nonsemantic.enabled = False
  c.data.image_size = 32
  c.model.update(depth=18, stem="cifar", width_multiplier=1.0, dtype="float32")
  c.moco.update(queue_size=512, symmetric=False)
  c.optim.batch_size = 8
  out = efficiency.measure(c, rounds=1, steps=1)
  forward = [
      2 * c_in * c_out * _valid_taps(side, k, s)[1] ** 2
      for c_in, c_out, k, s, side in _resnet18_cifar_convs(32, 64)
  ]
  supervised, moco = 3 * sum(forward) - forward[0], 4 * sum(forward) - forward[0]
  assert moco <= 1e9 * out["gflop_per_image"] <= 1.03 * moco
  # cl_jax.bench.flops's count adds the head and the queue's logits to the convolutions.
  analytic = flops.step_flops_per_image(c)["per_image"]
  assert 0.99 * analytic <= 1e9 * out["gflop_per_image"] <= 1.03 * analytic
  assert supervised <= 1e9 * out["supervised_gflop_per_image"] <= 1.02 * supervised
  assert 0.99 * moco / supervised <= out["flop_ratio"] <= 1.03 * moco / supervised
  assert out["step_ms"] > 0 and out["supervised_ms"] > 0 and out["time_ratio"] > 0
