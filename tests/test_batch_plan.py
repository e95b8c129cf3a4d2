"""Per-chip batches and the linear lr rule (cl_jax.batch_plan): the presets' reference points,
the paper's exact recipe by name, the refusals, the trainer's resolved config, and the launch
scripts' --dry-run line."""

import json
import os
import subprocess
import sys

import pytest

from cl_jax import batch_plan, config_check
from cl_jax.runtime.errors import UsageError
from configs import mocov2_patchns, simclr
from tests import tiny_run

LAUNCH = os.path.join(tiny_run.ROOT, "launch")


@pytest.mark.parametrize("chips, batch, lr", [(1, 128, 0.03), (8, 1024, 0.24), (16, 2048, 0.48)])
def test_the_imagenet100_preset_scales_from_the_papers_reference_point(chips, batch, lr):
  """Ge et al. 2021, App. C.1: lr 0.03 at batch 128; 128 images per chip, the lr linear in the
  global batch (Goyal et al. 2017)."""
  p = batch_plan.plan(mocov2_patchns.get_config("imagenet100"), chips)
  assert (p["per_chip"], p["global_batch"]) == (128, batch)
  assert p["lr"] == pytest.approx(lr)
  resolved = batch_plan.resolve(mocov2_patchns.get_config("imagenet100"), chips)
  resolved.data.data_dir = "/data/tfds"
  config_check.validate(resolved, num_devices=chips)


@pytest.mark.parametrize("chips, warmup", [(1, 0), (8, 0), (16, 5), (64, 5)])
def test_a_global_batch_above_1024_warms_up_for_5_epochs(chips, warmup):
  """Goyal et al. 2017, Sec. 2.2: the linear rule at large batches with a gradual warm-up."""
  config = mocov2_patchns.get_config("imagenet100")
  assert batch_plan.plan(config, chips)["warmup_epochs"] == warmup
  assert config.optim.warmup_epochs == 0  # the config is left as it was
  longer = mocov2_patchns.get_config("imagenet100")
  longer.optim.warmup_epochs = 10  # a longer warm-up is kept
  assert batch_plan.resolve(longer, chips).optim.warmup_epochs == 10
  off = mocov2_patchns.get_config("imagenet100")
  off.optim.large_batch_warmup_epochs = 0
  assert batch_plan.resolve(off, chips).optim.warmup_epochs == 0
  short = mocov2_patchns.get_config("imagenet100")
  short.optim.epochs = 3  # at most epochs - 1
  assert batch_plan.resolve(short, chips).optim.warmup_epochs == min(warmup, 2)
  if warmup:
    assert "warm-up 5 epochs" in batch_plan.line(batch_plan.plan(config, chips))


@pytest.mark.parametrize("chips", [1, 8, 16, 64])
def test_the_resnet50_presets_shuffle_bn_by_statistics_beyond_one_host_of_8(chips):
  """MoCo's shuffle-BN: "shuffle" up to 8 chips, "shuffle_stats" (no key image gathered on every
  chip) beyond; the config keeps its own mode where the field is "" or bn_mode is not a shuffle
  mode, and an override of the field is obeyed."""
  want = "shuffle" if chips <= 8 else "shuffle_stats"
  config = mocov2_patchns.get_config("imagenet100")
  assert batch_plan.plan(config, chips)["bn_mode"] == want
  assert config.model.bn_mode == "shuffle"  # resolve copies; the config is left as it was
  config.model.shuffle_bn_above_8_chips = "shuffle"
  assert batch_plan.resolve(config, chips).model.bn_mode == "shuffle"
  assert batch_plan.resolve(mocov2_patchns.get_config(None), chips).model.bn_mode == "shuffle"
  # SimCLR inherits the preset's model block but takes statistics over the whole batch.
  assert batch_plan.resolve(simclr.get_config("imagenet100"), chips).model.bn_mode == "sync"


def test_a_shuffle_bn_mode_for_pods_outside_the_shuffle_modes_is_refused():
  c = mocov2_patchns.get_config(None)
  c.model.shuffle_bn_above_8_chips = "local"
  with pytest.raises(config_check.ConfigError, match="model.shuffle_bn_above_8_chips"):
    config_check.validate(c, num_devices=1)


def test_a_global_batch_set_on_a_per_chip_preset_is_refused():
  c = mocov2_patchns.get_config("imagenet100")
  c.optim.batch_size = 1024
  with pytest.raises(UsageError, match="optim.batch_size=1024: this config's batch follows"):
    batch_plan.resolve(c, 8)


def test_the_paper_recipe_by_name_keeps_its_batch_on_any_chips():
  p = batch_plan.plan(mocov2_patchns.get_config("imagenet100_b128"), 8)
  assert (p["per_chip"], p["global_batch"], p["lr"]) == (16, 128, 0.03)


def test_a_base_lr_config_scales_by_its_papers_rule_per_256():
  """SimCLR (Chen et al. 2020, Sec. B.1): lr 0.3 x B / 256, at 64 images on each of 8 chips."""
  c = simclr.get_config("imagenet100")
  c.optim.batch_per_chip = 64
  resolved = batch_plan.resolve(c, 8)
  assert resolved.optim.batch_size == 512 and resolved.optim.lr == pytest.approx(0.3 * 512 / 256)
  resolved.data.data_dir = "/data/tfds"
  config_check.validate(resolved, num_devices=8)


def test_a_named_recipe_with_a_per_chip_batch_is_refused():
  c = mocov2_patchns.get_config("imagenet100_b128")
  c.optim.batch_per_chip = 64
  with pytest.raises(UsageError, match="fixes the batch.*set optim.batch_per_chip=0"):
    batch_plan.resolve(c, 8)
  c.data.data_dir = "/data/tfds"
  with pytest.raises(config_check.ConfigError, match="optim.batch_per_chip"):
    config_check.validate(c)
  with pytest.raises(UsageError, match="does not split over 3 chips"):
    batch_plan.plan(mocov2_patchns.get_config("imagenet100_b128"), 3)


@pytest.mark.slow
def test_the_trainer_stores_the_resolved_batch_and_lr(tmp_path):
  """A tiny run with 8 images per chip on 2 devices trains at batch 16 and at the lr scaled
  from the config's (lr, batch 32)."""
  flags = tiny_run.FLAGS + [
      "--config.optim.epochs=1",
      "--config.optim.batch_per_chip=8",
      "--config.probe.after_pretrain=False",
      "--config.eval.every=0",
      "--stop_at_step=1",
  ]
  proc = subprocess.run(
      tiny_run.command(tmp_path / "run", flags),
      cwd=tiny_run.ROOT,
      env=tiny_run.env(devices=2),
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  stored = json.loads((tmp_path / "run" / "config.json").read_text())
  reference = mocov2_patchns.get_config(None).optim.lr
  assert stored["optim"]["batch_size"] == 16
  assert stored["optim"]["lr"] == pytest.approx(reference * 16 / 32)


def _with_python_path() -> str:
  return os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


@pytest.mark.slow
def test_the_launch_scripts_dry_run_prints_the_plan():
  env = {**os.environ, "PATH": _with_python_path()}
  config = "configs/mocov2_patchns.py:imagenet100"
  tpu = subprocess.run(
      [os.path.join(LAUNCH, "tpu_vm.sh"), "run", "--dry-run", "--name", "t", "--zone", "z",
       "--accelerator-type", "v4-32", f"--config={config}", "--workdir", "gs://b/r"],
      capture_output=True, text=True, env=env, timeout=120, check=True,
  )  # fmt: skip
  assert (
      "batch plan: 16 chips: per-chip batch 128, global batch 2048, lr 0.48, warm-up 5 epochs"
      in tpu.stderr
  )
  slurm = subprocess.run(
      [os.path.join(LAUNCH, "slurm_gpu.sh"), "--dry-run", "--nodes", "2", "--gpus-per-node",
       "8", "--partition", "p", "--time", "60", f"--config={config}", "--workdir", "/tmp/r",
       "--venv", "/nonexistent", "--", "--config.optim.batch_per_chip=64"],
      capture_output=True, text=True, env=env, timeout=120, check=True,
  )  # fmt: skip
  assert "batch plan: 16 chips: per-chip batch 64, global batch 1024, lr 0.24" in slurm.stderr
  # --batch-per-chip passes the per-chip batch to cl_jax.main; v5litepod-16 is 16 chips.
  tpu = subprocess.run(
      [os.path.join(LAUNCH, "tpu_vm.sh"), "run", "--dry-run", "--name", "t", "--zone", "z",
       "--accelerator-type", "v5litepod-16", f"--config={config}", "--workdir", "gs://b/r",
       "--batch-per-chip", "32"],
      capture_output=True, text=True, env=env, timeout=120, check=True,
  )  # fmt: skip
  assert "batch plan: 16 chips: per-chip batch 32, global batch 512, lr 0.12" in tpu.stderr
  assert "--config.optim.batch_per_chip=32" in tpu.stdout
  both = subprocess.run(
      [os.path.join(LAUNCH, "tpu_vm.sh"), "run", "--dry-run", "--name", "t", "--zone", "z",
       "--accelerator-type", "v4-8", f"--config={config}", "--workdir", "gs://b/r",
       "--batch-per-chip", "32", "--", "--config.optim.batch_per_chip=64"],
      capture_output=True, text=True, env=env, timeout=120, check=False,
  )  # fmt: skip
  assert both.returncode != 0 and "give one" in both.stderr
