"""cl_jax.bench.compile: its HLO readers on a hand-written module, target names, and the
compiled step of the tiny test config on 8 CPU devices: it communicates only what data
parallelism needs."""

import os

import jax
import pytest

from cl_jax.bench import chips
from cl_jax.bench import compile as bench_compile
from cl_jax.runtime.errors import UsageError
from configs import mocov2_patchns, simclr

# A hand-written HLO module: two gradient all-reduces and a concatenated unnamed one (as the GPU
# compiler emits), unnamed small combined ones, a cuDNN convolution, an asynchronous all-gather
# of bf16 key images in the shuffle_bn scope, an all-to-all nobody asked for, a bf16 and an f32
# convolution, float32 dots at full, high and default precision, a float64 constant and a
# host callback.
with open(os.path.join(os.path.dirname(__file__), "data", "train_step_collectives.hlo")) as f:
  HLO = f.read()


def test_the_readers_find_each_collective_its_bytes_purpose_and_the_census():
  insts = bench_compile.instructions(HLO)
  # 64 parameters: the unnamed all-reduce of 70 elements is the GPU compiler's concatenated
  # gradient reduction (gradients, batch-norm statistics and the loss in one array). Global
  # batch 32: the loss's scalar all-reduce is expected, the all-reduce of 32 images is not.
  found = {
      (c["kind"], c["dtype"], c["purpose"]): c for c in bench_compile.collectives(insts, 64, 32)
  }
  assert set(found) == {
      ("all-reduce", "f32", "gradient reduction"),
      ("all-reduce", "bf16", "gradient reduction"),
      ("all-reduce", "f32", "reduction of a loss or metric"),
      ("all-reduce", "s32", "reduction of a loss or metric"),
      ("all-reduce", "f32", bench_compile.COMBINED_SMALL),
      ("all-reduce", "f32", "unexpected"),
      ("all-gather", "bf16", "shuffled key batch"),
      ("all-to-all", "f32", "unexpected"),
  }
  assert found["all-reduce", "f32", "unexpected"]["bytes"] == 32 * 8 * 8 * 3 * 4
  # Two reductions of 24 values, combined by XLA into one all-reduce of 48 (more than the
  # batch): each array holds at most one value per image, so it is a metric's.
  assert found["all-reduce", "s32", "reduction of a loss or metric"]["bytes"] == 2 * 24 * 4
  # Float reductions of at most one value per image that XLA combined and left unnamed (the
  # synchronised batch norm's statistics and sums, losses).
  assert found["all-reduce", "f32", bench_compile.COMBINED_SMALL]["bytes"] == (16 + 32) * 4
  # The GPU compiler gives every shard_map psum (cl_jax.models.conv's float32 weight-gradient
  # sums) the same channel_id: different operations, each counted.
  grads = found["all-reduce", "f32", "gradient reduction"]
  assert (grads["count"], grads["bytes"]) == (5, (2 * 64 + 70 + 2 * 3 * 3 * 3 * 16) * 4)
  # Above its combining threshold the GPU compiler splits the concatenated gradients into
  # several unnamed arrays, each smaller than the parameters but larger than the batch.
  split = found["all-reduce", "bf16", "gradient reduction"]
  assert (split["count"], split["bytes"]) == (2, 2 * 40 * 2)
  gather = found["all-gather", "bf16", "shuffled key batch"]
  # The start op's tuple holds its operand and its result: only the gathered result counts.
  # Its copy in a TPU collective fusion (the same channel_id) is the same transfer, counted once.
  assert (gather["count"], gather["bytes"]) == (1, 32 * 8 * 8 * 3 * 2)
  assert gather["replica_groups"] == "{{0,1,2,3,4,5,6,7}}"
  assert found["all-to-all", "f32", "unexpected"]["ops"] == ["jit(train_step)/mystery"]
  census = bench_compile.census(insts)
  # The cuDNN call counts as a convolution, its operands' dtypes read from their definitions.
  assert census["products"] == {
      "convolution bf16xbf16": 2,
      "convolution f32xf32": 1,
      "dot f32xf32": 3,
  }
  # float32 products without operand_precision {highest,highest} or {high,high}: the head's dot
  # and the unnamed convolution, not the queue contrast's full-precision dot or the
  # augmentation's high-precision one.
  assert census["default_precision_f32"] == {"jit(train_step)/head/dot_general": 1, "?": 1}
  assert census["float64"] == 1
  assert census["host"] == ["custom-call"]


@pytest.mark.parametrize(
    "name, message",
    [
        ("v5e", "give FAMILY:SHAPE"),
        ("v7x:2x2", "give FAMILY:SHAPE"),
        ("v5e:2by2", "give FAMILY:SHAPE"),
        ("h100:0", "give h100:N"),
        ("h100:12", "whole hosts of 8"),
        ("v4:2x2", "3-D"),
    ],
)
def test_a_bad_target_is_refused_in_one_line(name, message):
  with pytest.raises(UsageError, match=message):
    bench_compile.target(name)


@pytest.mark.slow  # one compile of the tiny step on 8 devices
def test_the_tiny_step_on_eight_cpu_devices_communicates_what_data_parallelism_needs():
  from cl_jax.runtime import config_files
  from tests.conftest import ROOT

  # The tiny run's config (tests/tiny_run.py FLAGS) at a global batch of 32 on 8 devices.
  config = config_files.load_config_file(f"{ROOT}/configs/mocov2_patchns.py").get_config()
  config.data.image_size = 16
  config.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=32, head_out_dim=16)
  config.moco.queue_size = 128
  config.nonsemantic.update(patch_min=2, patch_max=6)
  cpu = chips.Chip("CPU", float("inf"), 1e12, 1e11, "")
  target = bench_compile.Target("cpu:8", cpu, tuple(jax.devices()[:8]), 1)
  result = bench_compile.analyse(bench_compile.for_target(config, 8, 4), target)
  assert result["global_batch"] == 32 and result["batch_per_chip"] == 4
  purposes = {c["purpose"] for c in result["collectives"]}
  # An "unexpected" collective here was the patch negatives' gather, all-reducing every view.
  assert "unexpected" not in purposes, result["collectives"]
  assert "gradient reduction" in purposes
  assert not result["census"]["float64"] and not result["census"]["host"]
  # The donated state is reused for the new state: every state byte is aliased.
  assert result["memory"]["alias"] >= result["state_bytes"]
  # The CPU's compiler, left to choose the state's layouts, keeps them row-major.
  layouts = result["state_layouts"]
  assert layouts["arrays"] > 100 and layouts["not_row_major"] == 0, layouts
  # The evaluation forward: the probe's batch of 256 split over the 8 devices, nothing
  # communicated (replicated variables, each device's images its own).
  ev = result["eval"]
  assert (ev["global_batch"], ev["batch_per_chip"]) == (256, 32)
  assert ev["collectives"] == [] and not ev["census"]["host"], ev
  assert ev["memory"]["peak"] > 0 and ev["fits"]


def test_a_batch_per_chip_keeps_the_configs_lr_rule():
  """Presets whose lr follows the batch (SimCLR: base_lr x batch / 256) and presets with a
  fixed lr recipe both take another batch per chip."""
  simclr_config = simclr.get_config("imagenet100")
  got = bench_compile.for_target(simclr_config, 8, 128)  # twice the preset's 64 per chip
  assert got.optim.batch_size == 1024
  assert got.optim.lr == pytest.approx(simclr_config.optim.base_lr * 1024 / 256)
  moco = bench_compile.for_target(mocov2_patchns.get_config("imagenet100"), 8, 64)
  assert moco.optim.batch_size == 512 and moco.optim.lr_recipe == "custom"


def test_max_batch_refits_when_the_linear_fit_overshoots(monkeypatch):
  """Memory that grows faster than linearly (1 GiB + 10 MiB x b + 1 KiB x b^2 here): the line
  through 64 and 128 images overshoots 80 GiB; the refits through the largest batch that fits
  and the one that did not end on a batch that fits, within 5% of the true largest."""
  import types

  gib = 2**30

  def peak(b):
    return gib + 10 * 2**20 * b + 1024 * b * b

  monkeypatch.setattr(bench_compile, "for_target", lambda config, chips, b: b)
  monkeypatch.setattr(
      bench_compile,
      "analyse",
      lambda b, tgt, with_eval=True: {"memory": {"peak": peak(b)}, "fits": peak(b) <= 80 * gib},
  )
  tgt = types.SimpleNamespace(devices=[0], chip=types.SimpleNamespace(hbm_bytes=80 * gib))
  config = types.SimpleNamespace(model=types.SimpleNamespace(bn_groups=1))
  out = bench_compile.max_batch(config, tgt, 64)
  true_largest = max(b for b in range(1, 20000) if peak(b) <= 80 * gib)
  assert out["fit"]["refits"] >= 1 and out["checked"]["fits"]
  assert 0.95 * true_largest <= out["fit"]["config_batch"] <= true_largest


def test_max_batch_steps_below_a_peak_that_grows_in_steps(monkeypatch):
  """A TPU compiler pads the batch (to a multiple of 16 here), so the peak grows in steps: the
  SimSiam step on v5p:2x2x1 (0.35 GB + 69.1 MB per image) peaks the same from 1,361 to 1,376
  images, 40 MB over the chip. The line through 128 and 256 images points at 1,375, which does
  not fit, and each later line's batch lies less than one batch below the last that failed,
  in the same step: the search goes at least 1% below it (2% after a second miss) and ends
  within 2% of the true largest (1,360), not at 256."""
  import types

  def peak(b):
    return 354_277_720 + 69_119_776 * (-(-b // 16) * 16)

  hbm = peak(1376) - 40_000_000
  compiled = []

  def analyse(b, tgt, with_eval=True):
    compiled.append(b)
    return {"memory": {"peak": peak(b)}, "fits": peak(b) <= hbm}

  monkeypatch.setattr(bench_compile, "for_target", lambda config, chips, b: b)
  monkeypatch.setattr(bench_compile, "analyse", analyse)
  tgt = types.SimpleNamespace(devices=[0], chip=types.SimpleNamespace(hbm_bytes=hbm))
  config = types.SimpleNamespace(model=types.SimpleNamespace(bn_groups=1))
  out = bench_compile.max_batch(config, tgt, 128)
  true_largest = max(b for b in range(1, 5000) if peak(b) <= hbm)
  assert true_largest == 1360 and compiled[:3] == [128, 256, 1375]
  assert len(compiled) == len(set(compiled)) and len(compiled) <= 2 + bench_compile.REFITS + 1
  assert (
      out["checked"]["fits"] and 0.98 * true_largest <= out["fit"]["config_batch"] <= true_largest
  )


def test_max_batch_compiles_each_batch_once(monkeypatch):
  """Linear memory (1 GiB + 55 MiB x b) on a 16 GiB chip fits 256 images with a queue that
  takes multiples of 128 per chip: the fit rounds down to 2 x 128, which was compiled already
  and is not compiled again."""
  import types

  gib = 2**30

  def peak(b):
    return gib + 55 * 2**20 * b

  compiled = []

  def for_target(config, chips, b):
    if b % 128:
      raise bench_compile.UsageError(f"batch {b} is not a multiple of 128")
    return b

  def analyse(b, tgt, with_eval=True):
    compiled.append(b)
    return {"memory": {"peak": peak(b)}, "fits": peak(b) <= 16 * gib}

  monkeypatch.setattr(bench_compile, "for_target", for_target)
  monkeypatch.setattr(bench_compile, "analyse", analyse)
  tgt = types.SimpleNamespace(devices=[0], chip=types.SimpleNamespace(hbm_bytes=16 * gib))
  config = types.SimpleNamespace(model=types.SimpleNamespace(bn_groups=1))
  out = bench_compile.max_batch(config, tgt, 128)
  assert out["fit"]["batch"] == 279 and out["fit"]["config_batch"] == 256
  assert compiled == [128, 256] and out["checked"]["fits"]


def test_max_batch_doubles_where_the_peak_does_not_grow(monkeypatch):
  """A TPU compiler may lay out a larger batch in less memory (the quick default on v6e:2x2:
  153 MB at 32 per chip, 129 MB at 64): no line through those two peaks, so the batch doubles
  to 128, the line through 64 and 128 points far above the chip,
  and the largest batch the queue accepts (512 here) is compiled and reported."""
  import types

  def peak(b):
    return {32: 153_322_080, 64: 129_284_640}.get(b, 100_000_000 + 2**20 * b)

  compiled = []

  def for_target(config, chips, b):
    if b > 512:
      raise bench_compile.UsageError(f"the queue takes at most 512 images per chip, not {b}")
    return b

  def analyse(b, tgt, with_eval=True):
    compiled.append(b)
    return {"memory": {"peak": peak(b)}, "fits": peak(b) <= 31 * 2**30}

  monkeypatch.setattr(bench_compile, "for_target", for_target)
  monkeypatch.setattr(bench_compile, "analyse", analyse)
  tgt = types.SimpleNamespace(devices=[0], chip=types.SimpleNamespace(hbm_bytes=31 * 2**30))
  config = types.SimpleNamespace(model=types.SimpleNamespace(bn_groups=1))
  out = bench_compile.max_batch(config, tgt, 32)
  assert compiled == [32, 64, 128, 512]
  assert out["fit"]["config_batch"] == 512 and out["checked"]["fits"]
  per_image = (peak(128) - peak(64)) / 64  # the line through the two largest that fit first
  assert out["fit"]["per_image_bytes"] == pytest.approx(per_image)
  assert out["fit"]["batch"] == int((31 * 2**30 - (peak(64) - 64 * per_image)) // per_image)


def test_max_batch_searches_below_a_batch_the_tpu_compiler_refuses(monkeypatch):
  """A TPU compiler refuses every program over 16 GiB (no peak to fit a line through): the
  config's 128 images per chip are refused, 64 fit, and halving the gap finds a batch within
  one step of the true largest (1 GiB + 150 MiB x b: 102) in REFITS + 1 more compiles, none
  compiled twice."""
  import types

  gib = 2**30

  def peak(b):
    return gib + 150 * 2**20 * b

  compiled = []

  def analyse(b, tgt, with_eval=True):
    compiled.append(b)
    if peak(b) > 16 * gib:
      return {"memory": None, "fits": False, "out_of_memory": "Ran out of memory on HBM"}
    return {"memory": {"peak": peak(b)}, "fits": True}

  monkeypatch.setattr(bench_compile, "for_target", lambda config, chips, b: b)
  monkeypatch.setattr(bench_compile, "analyse", analyse)
  tgt = types.SimpleNamespace(devices=[0], chip=types.SimpleNamespace(hbm_bytes=16 * gib))
  config = types.SimpleNamespace(model=types.SimpleNamespace(bn_groups=1))
  out = bench_compile.max_batch(config, tgt, 128)
  true_largest = max(b for b in range(1, 1000) if peak(b) <= 16 * gib)
  assert true_largest == 102 and out["first"]["out_of_memory"]
  assert compiled[:2] == [128, 64] and len(compiled) == len(set(compiled))
  assert len(compiled) <= 2 + bench_compile.REFITS + 1
  assert out["checked"]["fits"] and true_largest - 2 <= out["fit"]["config_batch"] <= true_largest
  # Nothing fits: no batch, no line.
  monkeypatch.setattr(
      bench_compile,
      "analyse",
      lambda b, tgt, with_eval=True: {
          "memory": None,
          "fits": False,
          "out_of_memory": "Ran out of memory on HBM",
      },
  )
  out = bench_compile.max_batch(config, tgt, 4)
  assert out["checked"] is None and out["fit"] is None


def test_a_refused_batch_reports_in_one_line_why():
  refused = {"target": "v5e:2x2", "chips": 4, "chip": "TPU v5e", "hosts": 1, "global_batch": 2048}
  refused.update(batch_per_chip=512, compile_s=61.2, memory=None, eval=None)
  refused["out_of_memory"] = "Ran out of memory on HBM"
  assert bench_compile.report(refused).splitlines() == [
      "v5e:2x2: 4 x TPU v5e on 1 host(s), global batch 2048 (512 per chip), refused after 61.2 s",
      "  DOES NOT FIT: the compiler ran out of HBM (Ran out of memory on HBM)",
  ]


@pytest.mark.slow  # one compile of the tiny step on 8 devices
def test_barlow_twins_all_reduces_its_cross_correlation_as_a_loss_over_the_global_batch():
  """Its (d, d) correlation sums over the global batch, d x d > the batch: the one collective
  beyond gradients and batch norm, named by its scope rather than "unexpected"."""
  from cl_jax.runtime import config_files
  from tests.conftest import ROOT

  config = config_files.load_config_file(f"{ROOT}/configs/barlow_twins.py").get_config()
  config.data.image_size = 16
  config.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=32, head_out_dim=16)
  cpu = chips.Chip("CPU", float("inf"), 1e12, 1e11, "")
  target = bench_compile.Target("cpu:8", cpu, tuple(jax.devices()[:8]), 1)
  result = bench_compile.analyse(bench_compile.for_target(config, 8, 4), target)
  purposes = {c["purpose"] for c in result["collectives"]}
  assert "unexpected" not in purposes, result["collectives"]
  assert "loss over the global batch" in purposes, result["collectives"]


def test_a_loss_over_the_global_batch_is_named_by_its_scope():
  big = [8192 * 8192]
  args = ("all-reduce", big, True, 10**6, 512)
  assert bench_compile.classify("jit(f)/jvp(global_batch_loss)/dot_general", *args) == (
      "loss over the global batch"
  )
  assert bench_compile.classify("jit(f)/jvp()/dot_general", *args) == "unexpected"
