"""Config presets and validation: every bad value fails before training, naming its field."""

import subprocess
import sys

import pytest

from cl_jax import config_check
from cl_jax.runtime import run_config
from configs import mocov2, mocov2_patchns
from tests.conftest import ROOT


@pytest.mark.parametrize("module", [mocov2, mocov2_patchns])
@pytest.mark.parametrize("preset", [None, "imagenet100", "cifar10", "stl10"])
def test_presets_validate(module, preset):
  c = module.get_config(preset)
  if c.data.name != "trifeature":
    c.data.data_dir = "/data/tfds"
  config_check.validate(c)


def test_imagenet100_preset_carries_table1_settings():
  c = mocov2_patchns.get_config("imagenet100")
  assert (c.model.depth, c.data.image_size, c.moco.queue_size, c.moco.temperature) == (
      50,
      224,
      16384,
      0.2,
  )
  assert c.nonsemantic.enabled and c.nonsemantic.alpha == 2.0
  assert (c.nonsemantic.patch_min, c.nonsemantic.patch_max) == (16, 72)
  # Per chip 128 images at lr 0.03 per 128 (App. C.1): one chip runs the paper's recipe.
  assert (c.optim.epochs, c.optim.batch_per_chip, c.optim.batch_size, c.optim.lr) == (
      200,
      128,
      128,
      0.03,
  )
  exact = mocov2_patchns.get_config("imagenet100_b128")
  assert (exact.preset, exact.optim.lr_recipe, exact.optim.batch_per_chip) == (
      "imagenet100",
      "moco_0.03_b128",
      0,
  )
  assert (c.probe.lr, c.probe.batch_size, c.probe.epochs, tuple(c.probe.decay_epochs)) == (
      10.0,
      128,
      60,
      (30, 40, 50),
  )


def test_patchns_differs_from_mocov2_only_in_the_addon():
  a, b = mocov2.get_config(None).to_dict(), mocov2_patchns.get_config(None).to_dict()
  assert a.pop("nonsemantic") != b.pop("nonsemantic")
  assert a == b
  assert not mocov2.get_config(None).nonsemantic.enabled


def test_unknown_preset_names_the_allowed_ones():
  with pytest.raises(ValueError, match=r"unknown preset 'imagenet'.*cifar10.*imagenet100"):
    mocov2.get_config("imagenet")


def _set(c, path, value):
  *parents, leaf = path.split(".")
  node = c
  for p in parents:
    node = node[p]
  node[leaf] = value


@pytest.mark.parametrize(
    "path,value,field",
    [
        ("moco.temperature", -0.2, "moco.temperature"),
        ("moco.temperature", 0.0, "moco.temperature"),
        ("moco.queue_size", 2000, "moco.queue_size"),
        ("nonsemantic.patch_max", 40, "nonsemantic.patch_max"),
        ("nonsemantic.patch_min", 12, "nonsemantic.patch_min"),
        ("nonsemantic.alpha_mode", "both", "nonsemantic.alpha_mode"),
        ("nonsemantic.alpha", 0.0, "nonsemantic.alpha"),
        ("data.name", "imagenet21k", "data.name"),
        ("data.image_size", 8, "data.image_size"),
        ("data.trifeature_texture_angle", -1.0, "data.trifeature_texture_angle"),
        ("data.trifeature_texture_angle", 361.0, "data.trifeature_texture_angle"),
        ("model.depth", 34, "model.depth"),
        ("model.bn_mode", "ghost", "model.bn_mode"),
        ("model.bn_groups", 3, "model.bn_groups"),
        ("moco.momentum", 1.5, "moco.momentum"),
        ("optim.lr", -1.0, "optim.lr"),
        ("optim.batch_size", 0, "optim.batch_size"),
        ("aug.jitter_prob", 1.2, "aug.jitter_prob"),
        ("probe.protocol", "knn", "probe.protocol"),
        ("probe.decay_epochs", (150,), "probe.decay_epochs"),
        ("health.min_std_sqrt_d", 1.5, "health.min_std_sqrt_d"),
        ("health.min_std_sqrt_d", -0.1, "health.min_std_sqrt_d"),
        ("health.min_rank", -1.0, "health.min_rank"),
        ("health.min_rank", float("nan"), "health.min_rank"),
        ("train.stall_timeout_s", -1.0, "train.stall_timeout_s"),
        ("train.stall_timeout_s", float("inf"), "train.stall_timeout_s"),
    ],
)
def test_bad_values_name_their_field(path, value, field):
  c = mocov2_patchns.get_config(None)
  _set(c, path, value)
  with pytest.raises(config_check.ConfigError, match=field.replace(".", r"\.")):
    config_check.validate(c)


def test_texture_angle_accepts_its_range_and_stored_configs_without_it_resume():
  c = mocov2_patchns.get_config(None)
  assert c.data.trifeature_texture_angle == 360.0
  for angle in (0.0, 90.0, 360.0):
    c.data.trifeature_texture_angle = angle
    config_check.validate(c)
  stored, new = mocov2_patchns.get_config(None), mocov2_patchns.get_config(None)
  del stored.data["trifeature_texture_angle"]  # a config stored before the field existed
  assert run_config.check_resume(stored, new, step=8, workdir="w", allow_change=False) == []
  new.data.trifeature_texture_angle = 0.0
  with pytest.raises(
      run_config.ConfigChangeError, match=r"data.trifeature_texture_angle: '<absent>' -> 0.0"
  ):
    run_config.check_resume(stored, new, step=8, workdir="w", allow_change=False)


def test_a_stored_config_without_a_decoder_resumes_with_pils_and_refuses_the_fast_one():
  stored, new = mocov2_patchns.get_config(None), mocov2_patchns.get_config(None)
  del stored.data["decoder"]  # a config stored before the field existed
  assert run_config.check_resume(stored, new, step=8, workdir="w", allow_change=False) == []
  new.data.decoder = "fast"  # other views: a run of its own
  with pytest.raises(run_config.ConfigChangeError, match=r"data.decoder: '<absent>' -> 'fast'"):
    run_config.check_resume(stored, new, step=8, workdir="w", allow_change=True)


def test_zero_health_thresholds_switch_the_warnings_off():
  c = mocov2_patchns.get_config(None)
  c.health.min_std_sqrt_d, c.health.min_rank = 0.0, 0.0
  config_check.validate(c)


@pytest.mark.parametrize(
    "mode,groups,batch,devices,message",
    [
        ("sync", 4, 128, 1, "set model.bn_groups = 1"),
        ("local", 1, 128, 1, "at least 2 groups"),
        ("shuffle", 1, 128, 1, "at least 2 groups"),
        ("shuffle_stats", 1, 128, 1, "at least 2 groups"),
        ("shuffle", 6, 96, 4, "multiple or a divisor of the number of devices"),
        ("local", 8, 96, 3, "multiple or a divisor of the number of devices"),
    ],
)
def test_batch_norm_groups_must_match_mode_and_devices(mode, groups, batch, devices, message):
  c = mocov2_patchns.get_config(None)
  c.model.bn_mode, c.model.bn_groups, c.optim.batch_size = mode, groups, batch
  c.moco.queue_size = 4 * batch
  with pytest.raises(config_check.ConfigError, match=r"model\.bn_groups.*" + message):
    config_check.validate(c, num_devices=devices)


@pytest.mark.parametrize(
    "mode,groups,devices",
    [
        ("sync", 1, 8),
        ("local", 8, 8),
        ("shuffle", 4, 8),
        ("shuffle", 16, 8),
        ("shuffle_stats", 4, 8),
        ("local", 2, 1),
    ],
)
def test_batch_norm_groups_that_map_onto_devices_are_accepted(mode, groups, devices):
  c = mocov2_patchns.get_config(None)
  c.model.bn_mode, c.model.bn_groups = mode, groups
  config_check.validate(c, num_devices=devices)


def test_symmetric_queue_must_hold_both_views_keys():
  c = mocov2.get_config(None)
  c.moco.symmetric, c.moco.queue_size, c.optim.batch_size = True, 384, 128
  with pytest.raises(config_check.ConfigError, match=r"moco\.queue_size.*256"):
    config_check.validate(c)


def test_lr_recipe_fixes_lr_and_batch():
  c = mocov2.get_config("imagenet100_b128")
  c.data.data_dir = "/data/tfds"
  c.optim.lr = 0.8
  with pytest.raises(config_check.ConfigError, match=r"optim\.lr_recipe.*custom"):
    config_check.validate(c)


def test_tfds_dataset_needs_data_dir():
  c = mocov2.get_config("cifar10")
  with pytest.raises(config_check.ConfigError, match=r"data\.data_dir"):
    config_check.validate(c)


@pytest.mark.slow
def test_cli_rejects_bad_value_before_training(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.main",
          "--config=configs/mocov2_patchns.py",
          f"--workdir={workdir}",
          "--config.moco.temperature=-1.0",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode != 0
  assert "moco.temperature" in proc.stderr
  assert not (workdir / "checkpoints").exists()


@pytest.mark.parametrize("name", ["mocov1", "simclr", "byol", "simsiam"])
@pytest.mark.parametrize("preset", [None, "imagenet100", "cifar10"])
def test_method_configs_validate(name, preset):
  import importlib

  c = importlib.import_module(f"configs.{name}").get_config(preset)
  if c.data.name != "trifeature":
    c.data.data_dir = "/data/tfds"
  config_check.validate(c)


def test_method_presets_carry_the_papers_settings():
  from configs import byol, mocov1, simsiam

  v1 = mocov1.get_config(None)
  assert (v1.model.head_layers, v1.moco.temperature, v1.aug.blur_prob) == (1, 0.07, 0.0)
  b = byol.get_config("imagenet100")
  assert (b.optim.optimizer, b.optim.lr, b.optim.batch_size, b.optim.weight_decay) == (
      "lars",
      4.8,
      1024,
      1e-6,
  )
  assert b.byol.base_momentum == 0.996 and b.model.predictor_hidden_dim == 4096
  s = simsiam.get_config("imagenet100")
  assert (s.model.head_layers, s.model.head_out_bn, s.model.predictor_hidden_dim) == (3, True, 512)
  with pytest.raises(ValueError, match="presets imagenet100 and cifar10"):
    byol.get_config("stl10")


# (config, preset) -> (base lr of the paper or None for a fixed lr, lr at the preset's batch).
PAPER_LRS = {
    ("simclr", "imagenet100"): (0.3, 0.6),  # Chen et al. 2020, Sec. B.1: 0.3 x BatchSize/256
    ("simclr", "cifar10"): (0.3, 0.6),
    ("simsiam", "imagenet100"): (0.05, 0.1),  # Chen & He 2021, Sec. 4: base lr 0.05
    ("simsiam", "cifar10"): (0.03, 0.06),  # Chen & He 2021, App. D: base lr 0.03
    ("byol", "imagenet100"): (None, 4.8),  # Ge et al. 2021, App. C.1: lr 4.8 at batch 1024
}


@pytest.mark.parametrize("name, preset", list(PAPER_LRS))
def test_learning_rates_follow_the_papers_batch_rule(name, preset):
  import importlib

  from absl import flags
  from ml_collections import config_flags

  base, lr = PAPER_LRS[(name, preset)]
  c = importlib.import_module(f"configs.{name}").get_config(preset)
  assert c.optim.lr == pytest.approx(lr)
  assert c.optim.get("base_lr") == base
  # A command-line batch override scales the lr (or, for a fixed recipe, leaves it).
  argv = ["prog", f"--config={ROOT}/configs/{name}.py:{preset}", "--config.optim.batch_size=1024"]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
      "config", None, "", flag_values=fv, lock_config=True, sys_argv=argv
  )
  fv(argv)
  want = lr if base is None else base * 1024 / 256
  assert fv.config.optim.lr == pytest.approx(want)
  fv.config.data.data_dir = "/data/tfds"
  config_check.validate(fv.config)


def test_a_scaled_lr_set_by_hand_is_rejected():
  from configs import simclr

  c = simclr.get_config("imagenet100")
  c.data.data_dir = "/data/tfds"
  c.optim.lr = 1.0
  with pytest.raises(config_check.ConfigError, match="set optim.base_lr instead"):
    config_check.validate(c)


@pytest.mark.parametrize(
    "method, overrides, field",
    [
        ("byol", {"model.predictor_hidden_dim": 0}, "model.predictor_hidden_dim"),
        ("simclr", {"model.predictor_hidden_dim": 8}, "model.predictor_hidden_dim"),
        ("simsiam", {"ifm.enabled": True}, "ifm.enabled"),
        ("simsiam", {"nonsemantic.enabled": True}, "nonsemantic.enabled"),
        ("byol", {"ft.enabled": True}, "ft.negative"),  # default negative: interpolate
        ("simclr", {"ft.enabled": True, "ft.negative": "hard"}, "ft.negative"),
        ("byol", {"hcl.enabled": True}, "hcl.enabled"),
        ("simclr", {"hcl.enabled": True, "hcl.tau_plus": 1.0}, "hcl.tau_plus"),
        ("simclr", {"hcl.enabled": True, "ifm.enabled": True}, "hcl.enabled"),
        ("simclr", {"model.bn_mode": "shuffle", "model.bn_groups": 4}, "model.bn_mode"),
        ("byol", {"model.bn_mode": "shuffle_stats", "model.bn_groups": 4}, "model.bn_mode"),
        ("simclr", {"optim.optimizer": "adam"}, "optim.optimizer"),
    ],
)
def test_method_specific_fields_are_checked(method, overrides, field):
  import importlib

  c = importlib.import_module(f"configs.{method}").get_config(None)
  for path, value in overrides.items():
    block, name = path.split(".")
    c[block][name] = value
  with pytest.raises(config_check.ConfigError, match=field.replace(".", r"\.")):
    config_check.validate(c)
