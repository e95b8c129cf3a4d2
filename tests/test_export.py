"""Backbone export (cl_jax.export, cl_jax.models.torchvision_export): torchvision's names and shapes
written out from its architecture, the kernel layout, a tiny run exported in both formats,
equality with torchvision's ResNet (where torch is installed) and one-line errors."""

import json
import os

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import safetensors.numpy

from cl_jax import export
from cl_jax.data import photometric
from cl_jax.models.batchnorm import GroupBatchNorm
from cl_jax.models.encoder import encoder_for
from cl_jax.models.resnet import ResNet
from cl_jax.models.torchvision_export import conv_weight, torchvision_state_dict
from cl_jax.runtime import run_config
from cl_jax.runtime.errors import UsageError
from configs import loocpp, mocov2_patchns
from tests import forked_commands

# torchvision's ResNet (torchvision/models/resnet.py), written out: blocks per stage, convs
# per block (BasicBlock: 3x3, 3x3; Bottleneck: 1x1, 3x3, 1x1 x4) and the blocks that have a
# downsample (1x1 conv + BN) shortcut: where the stride or the channel count changes.
_BLOCKS = {18: (2, 2, 2, 2), 50: (3, 4, 6, 3)}
_DOWNSAMPLED = {
    18: {"layer2.0", "layer3.0", "layer4.0"},
    50: {"layer1.0", "layer2.0", "layer3.0", "layer4.0"},
}


def _bn_shapes(prefix: str, channels: int) -> dict:
  return {
      **{f"{prefix}.{k}": (channels,) for k in ("weight", "bias", "running_mean", "running_var")},
      f"{prefix}.num_batches_tracked": (),
  }


def _torchvision_shapes(depth: int, width: int, stem_kernel: int) -> dict[str, tuple]:
  """Every entry of torchvision's resnet{depth} state dict but fc.*, with its shape, for base
  width `width` (64 in torchvision) and a stem conv of side `stem_kernel`."""
  shapes = {"conv1.weight": (width, 3, stem_kernel, stem_kernel), **_bn_shapes("bn1", width)}
  channels = width
  for stage, blocks in enumerate(_BLOCKS[depth], start=1):
    planes = width * 2 ** (stage - 1)
    out = planes if depth == 18 else 4 * planes
    for index in range(blocks):
      name = f"layer{stage}.{index}"
      if depth == 18:
        convs = [(planes, channels, 3), (planes, planes, 3)]
      else:
        convs = [(planes, channels, 1), (planes, planes, 3), (out, planes, 1)]
      for k, (o, i, side) in enumerate(convs, start=1):
        shapes[f"{name}.conv{k}.weight"] = (o, i, side, side)
        shapes.update(_bn_shapes(f"{name}.bn{k}", o))
      if name in _DOWNSAMPLED[depth]:
        shapes[f"{name}.downsample.0.weight"] = (out, channels, 1, 1)
        shapes.update(_bn_shapes(f"{name}.downsample.1", out))
      channels = out
  return shapes


def _random_tree(params: dict, stats: dict, rng) -> tuple[dict, dict]:
  """Random (params, batch_stats) for a module's abstract ones: Kaiming-normal conv kernels
  (fan_out, as the model's init) and BN scales, biases and running statistics away from
  their defaults, float32."""
  if "kernel" in params:
    shape = params["kernel"].shape  # (kh, kw, in, out)
    std = np.sqrt(2 / (shape[0] * shape[1] * shape[3]))
    return {"kernel": (std * rng.normal(size=shape)).astype(np.float32)}, {}
  if "scale" in params:
    draw = lambda low, high: rng.uniform(low, high, params["scale"].shape).astype(np.float32)
    return (
        {"scale": draw(0.5, 1.5), "bias": draw(-0.3, 0.3)},
        {"mean": draw(-0.3, 0.3), "var": draw(0.5, 2.0)},
    )
  new_params, new_stats = {}, {}
  for name in params:
    new_params[name], child_stats = _random_tree(params[name], stats.get(name, {}), rng)
    if child_stats:
      new_stats[name] = child_stats
  return new_params, new_stats


def _random_variables(module: ResNet, size: int, seed: int = 0) -> dict:
  """{"params", "batch_stats"} of `module` for (B, size, size, 3) images, drawn at random."""
  init = lambda key, x: module.init(key, x, train=False)
  shapes = jax.eval_shape(init, jax.random.key(0), jnp.zeros((1, size, size, 3)))
  rng = np.random.default_rng(seed)
  params, stats = _random_tree(shapes["params"], shapes["batch_stats"], rng)
  return {"params": params, "batch_stats": stats}


def _images(size: int, count: int = 2, seed: int = 1) -> np.ndarray:
  """`count` random RGB images (count, size, size, 3) normalised as the probe feeds them."""
  pixels = np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), np.uint8)
  spec = photometric.PhotometricSpec()
  return np.asarray(photometric.normalize(photometric.to_float(jnp.asarray(pixels)), spec))


# Names, shapes and layout.


@pytest.mark.parametrize(
    "depth,stem", [(18, "imagenet"), (18, "cifar"), (50, "imagenet")], ids=["r18", "r18c", "r50"]
)
def test_names_and_shapes_are_torchvisions(depth, stem):
  module = ResNet(depth=depth, stem=stem, width_multiplier=0.125)
  variables = _random_variables(module, 32)
  tensors = torchvision_state_dict(variables["params"], variables["batch_stats"], depth)
  expected = _torchvision_shapes(depth, 8, 7 if stem == "imagenet" else 3)
  assert {k: v.shape for k, v in tensors.items()} == expected
  assert {k[: -len(".downsample.0.weight")] for k in tensors if "downsample.0" in k} == (
      _DOWNSAMPLED[depth]
  )
  for name, value in tensors.items():
    want = np.int64 if name.endswith("num_batches_tracked") else np.float32
    assert value.dtype == want, name
  bn = variables["params"]["stage2_block1"]["bn2"]
  np.testing.assert_array_equal(tensors["layer2.0.bn2.weight"], bn["scale"])
  stats = variables["batch_stats"]["stage4_block1"]["proj_bn"]
  np.testing.assert_array_equal(tensors["layer4.0.downsample.1.running_var"], stats["var"])


def test_conv_kernel_goes_from_hwio_to_oihw():
  kernel = np.arange(12).reshape(2, 3, 1, 2)  # (kh, kw, in, out): k[h, w, 0, o] = 6h + 2w + o
  expected = [[[[0, 2, 4], [6, 8, 10]]], [[[1, 3, 5], [7, 9, 11]]]]  # (out, in, kh, kw)
  np.testing.assert_array_equal(conv_weight(kernel), expected)
  assert conv_weight(kernel).dtype == np.float32


def test_exported_kernel_convolves_nchw_images_as_flax_does_nhwc():
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(3, 3, 2, 4)).astype(np.float32)
  x = rng.normal(size=(1, 5, 6, 2)).astype(np.float32)
  conv = nn.Conv(4, (3, 3), strides=2, padding=((1, 1), (1, 1)), use_bias=False)
  ours = conv.apply({"params": {"kernel": kernel}}, x)
  torch_style = jax.lax.conv_general_dilated(  # torch's Conv2d(2, 4, 3, 2, 1): NCHW, OIHW
      x.transpose(0, 3, 1, 2), conv_weight(kernel), (2, 2), ((1, 1), (1, 1))
  )
  np.testing.assert_allclose(torch_style, np.transpose(ours, (0, 3, 1, 2)), rtol=1e-5, atol=1e-5)


def test_bn_epsilon_is_torchvisions():
  assert GroupBatchNorm().epsilon == 1e-5  # torch.nn.BatchNorm2d's default eps


def test_a_backbone_without_conv5_is_refused():
  module = ResNet(depth=18, width_multiplier=0.125, stages=3)
  variables = _random_variables(module, 32)
  with pytest.raises(ValueError, match=r"missing modules \['stage4_block1', 'stage4_block2'\]"):
    torchvision_state_dict(variables["params"], variables["batch_stats"], 18)


# The shared finished tiny run (tests/tiny_run.py FINISHED, checkpoints at steps 12 and 16)
# exported in both formats, each test on its own copy (the export goes into the workdir).


def _restored(workdir: str, step: int | None = None):
  """(encoder, step, variables) of the run's checkpoint `step` (default: the latest)."""
  config = run_config.read(workdir)
  encoder = encoder_for(config)
  step, variables = export.restore_online(config, encoder, workdir, step)
  return encoder, step, variables


@pytest.mark.slow
def test_torchvision_export_of_a_run(finished_run_copy):
  workdir = str(finished_run_copy)
  result = export.export(workdir, "torchvision")
  path = os.path.join(workdir, "export", "backbone_step16.safetensors")
  assert result["path"] == path and result["step"] == 16
  encoder, _, variables = _restored(workdir)
  params, stats = variables["params"]["backbone"], variables["batch_stats"]["backbone"]
  loaded = safetensors.numpy.load_file(path)
  assert result["tensors"] == len(loaded) == len(_torchvision_shapes(18, 8, 3))
  assert result["parameters"] == sum(x.size for x in jax.tree.leaves(params))
  np.testing.assert_array_equal(
      loaded["conv1.weight"], np.transpose(params["stem_conv"]["kernel"], (3, 2, 0, 1))
  )
  np.testing.assert_array_equal(
      loaded["layer4.1.bn2.running_var"], stats["stage4_block2"]["bn2"]["var"]
  )
  for name, value in torchvision_state_dict(params, stats, 18).items():
    np.testing.assert_array_equal(loaded[name], value, err_msg=name)
  with safetensors.safe_open(path, "np") as f:
    metadata = f.metadata()
  assert {k: metadata[k] for k in ("format", "arch", "stem", "width_multiplier", "step")} == {
      "format": "torchvision",
      "arch": "resnet18",
      "stem": "cifar",
      "width_multiplier": "0.125",
      "step": "16",
  }
  assert json.loads(metadata["mean"]) == [0.485, 0.456, 0.406]
  assert json.loads(metadata["std"]) == [0.229, 0.224, 0.225]
  assert metadata["workdir"] == os.path.abspath(workdir)
  assert os.listdir(os.path.dirname(path)) == ["backbone_step16.safetensors"]


@pytest.mark.slow
def test_flax_export_of_a_run_gives_the_encoders_features(finished_run, tmp_path):
  """Step 12, not the latest, written outside the workdir (so the shared run is read only)."""
  out = str(tmp_path / "backbone.msgpack")
  result = export.export(finished_run.workdir, "flax", step=12, out=out)
  assert result["path"] == out
  encoder, _, variables = _restored(finished_run.workdir, 12)
  with open(out, "rb") as f:
    restored = flax.serialization.msgpack_restore(f.read())
  backbone = {k: variables[k]["backbone"] for k in ("params", "batch_stats")}
  jax.tree.map(np.testing.assert_array_equal, restored, backbone)
  assert result["tensors"] == len(jax.tree.leaves(restored))
  with open(f"{out}.json") as f:
    sidecar = json.load(f)
  assert sidecar["format"] == "flax" and sidecar["step"] == 12 and sidecar["stages"] == 4
  module = ResNet(
      depth=sidecar["depth"],
      stem=sidecar["stem"],
      width_multiplier=sidecar["width_multiplier"],
      stages=sidecar["stages"],
  )
  images = _images(16)
  pooled = module.apply(restored, images, train=False)["pooled"]
  assert pooled.shape == (2, sidecar["feature_dim"])
  np.testing.assert_allclose(
      pooled, encoder.apply(variables, images, train=False)["pooled"], rtol=1e-6, atol=1e-6
  )


@pytest.mark.slow
def test_the_command_prints_what_it_wrote(finished_run_copy):
  workdir = str(finished_run_copy)
  proc = forked_commands.shared().run(
      ["cl_jax.export", f"--workdir={workdir}", "--format=flax"], timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  path = os.path.join(workdir, "export", "backbone_step16.msgpack")
  assert f"wrote {path} (flax, step 16): 100 tensors, 175,752 parameters" in proc.stdout


# Equality with torchvision.


@pytest.mark.parametrize(
    "depth,stem,size",
    [(18, "imagenet", 64), (18, "cifar", 32), (50, "imagenet", 64)],
    ids=["resnet18", "resnet18-cifar", "resnet50"],
)
def test_torchvision_computes_our_features(depth, stem, size):
  torch = pytest.importorskip("torch")
  torchvision = pytest.importorskip("torchvision")
  safetensors_torch = pytest.importorskip("safetensors.torch")
  module = ResNet(depth=depth, stem=stem)
  variables = _random_variables(module, size)
  tensors = torchvision_state_dict(variables["params"], variables["batch_stats"], depth)
  model = getattr(torchvision.models, f"resnet{depth}")()
  if stem == "cifar":
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
  assert model.bn1.eps == GroupBatchNorm().epsilon
  state = safetensors_torch.load(safetensors.numpy.save(tensors))  # through the file format
  missing, unexpected = model.load_state_dict(state, strict=False)
  assert sorted(missing) == ["fc.bias", "fc.weight"] and unexpected == []
  model.fc = torch.nn.Identity()
  model.eval()
  images = _images(size)
  with torch.no_grad():
    theirs = model(torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).numpy()
  ours = np.asarray(module.apply(variables, images, train=False)["pooled"])
  assert ours.shape == theirs.shape == (2, module.feature_dim)
  scale = np.abs(ours).max()
  assert scale > 0.1  # non-trivial features
  np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4 * scale)


def test_the_export_says_how_to_load_a_backbone_that_is_not_a_stock_torchvision_resnet():
  from cl_jax.models import torchvision_export

  stock = torchvision_export.loading_line(50, "imagenet", 1)
  assert stock.startswith("load it into torchvision.models.resnet50()")
  quick = torchvision_export.loading_line(18, "cifar", 0.25)
  assert quick == (
      "not a stock torchvision ResNet-18 (cifar stem, width x0.25): load it into "
      "cl_jax.models.torchvision_export.torch_resnet(18, stem='cifar', width_multiplier=0.25), "
      "torchvision's ResNet built at this layout"
  )
  about = {"depth": 18, "stem": "cifar", "width_multiplier": 0.25, "stages": 4}
  assert export.safetensors_metadata(about)["load"] == quick


@pytest.mark.parametrize(
    "depth,stem,width", [(18, "cifar", 0.25), (50, "imagenet", 0.5)], ids=["quick", "r50-half"]
)
def test_the_named_builder_loads_the_export_strictly_and_computes_our_features(depth, stem, width):
  torch = pytest.importorskip("torch")
  pytest.importorskip("torchvision")
  safetensors_torch = pytest.importorskip("safetensors.torch")
  from cl_jax.models import torchvision_export

  module = ResNet(depth=depth, stem=stem, width_multiplier=width)
  size = 32
  variables = _random_variables(module, size)
  tensors = torchvision_state_dict(variables["params"], variables["batch_stats"], depth)
  model = torchvision_export.torch_resnet(depth, stem=stem, width_multiplier=width)
  state = safetensors_torch.load(safetensors.numpy.save(tensors))
  model.load_state_dict(state, strict=True)  # every tensor, no fc
  model.eval()
  images = _images(size)
  with torch.no_grad():
    theirs = model(torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).numpy()
  ours = np.asarray(module.apply(variables, images, train=False)["pooled"])
  assert ours.shape == theirs.shape == (2, module.feature_dim)
  scale = np.abs(ours).max()
  np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4 * scale)


# Bad input.


def test_unknown_format_is_refused(tmp_path):
  with pytest.raises(UsageError, match="--format must be one of torchvision, flax, got 'onnx'"):
    export.export(str(tmp_path), "onnx")


def test_a_run_without_a_checkpoint_is_refused(tmp_path):
  run_config.save_start(mocov2_patchns.get_config(), str(tmp_path), 0)
  with pytest.raises(UsageError, match=f"no checkpoint in {tmp_path}/checkpoints: pretrain"):
    export.export(str(tmp_path), "torchvision")


def test_loocpp_is_refused_for_torchvision_only(tmp_path):
  run_config.save_start(loocpp.get_config(), str(tmp_path), 0)
  with pytest.raises(UsageError, match="stops after conv4 .* use --format=flax"):
    export.export(str(tmp_path), "torchvision")
  with pytest.raises(UsageError, match="no checkpoint"):  # the flax export goes on
    export.export(str(tmp_path), "flax")


def test_resnet10_is_refused_for_torchvision_only(tmp_path):
  config = mocov2_patchns.get_config()
  config.model.depth = 10
  run_config.save_start(config, str(tmp_path), 0)
  with pytest.raises(
      UsageError, match="is a ResNet-10, which torchvision does not build .* use --format=flax"
  ):
    export.export(str(tmp_path), "torchvision")
  with pytest.raises(UsageError, match="no checkpoint"):  # the flax export goes on
    export.export(str(tmp_path), "flax")


@pytest.mark.slow
def test_the_command_reports_bad_input_in_one_line(tmp_path):
  proc = forked_commands.shared().run(
      ["cl_jax.export", f"--workdir={tmp_path}", "--format=onnx"], timeout=600
  )
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      "error: --format must be one of torchvision, flax, got 'onnx': torchvision writes a "
      "safetensors state dict for torchvision's ResNet, flax a msgpack of the Flax variables"
  ]
