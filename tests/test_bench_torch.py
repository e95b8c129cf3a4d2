"""The PyTorch reference of the MoCo-v2 step (cl_jax.bench.torch_reference) against the JAX
step, and the benchmark's --compare=torch."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")  # the reference's ResNet

import jax  # noqa: E402
import numpy as np  # noqa: E402

from cl_jax import train  # noqa: E402
from cl_jax import train_step as step_lib  # noqa: E402
from cl_jax.bench import torch_reference as bench_torch  # noqa: E402
from cl_jax.data import photometric  # noqa: E402
from cl_jax.models import torchvision_export as export_torchvision  # noqa: E402
from cl_jax.runtime import parallel  # noqa: E402
from configs import mocov2  # noqa: E402
from tests import tiny_run  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

B, S, K = 16, 16, 64


def _config(symmetric: bool, augment: bool = False):
  """A tiny float32 MoCo-v2 with shuffle-BN over 4 groups; photometric augmentation off (every
  probability 0: the JAX step's views are then the normalised uint8 views), or at MoCo-v2's
  probabilities with solarisation too."""
  c = mocov2.get_config(None)
  c.data.image_size = S
  c.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8, dtype="float32")
  c.model.update(bn_mode="shuffle", bn_groups=4)
  c.moco.update(queue_size=K, momentum=0.9, symmetric=symmetric)
  if augment:
    c.aug.update(solarize_prob=0.2)
  else:
    c.aug.update(jitter_prob=0.0, grayscale_prob=0.0, blur_prob=0.0, solarize_prob=0.0)
  c.optim.batch_size = B
  return c


def _torch_names(params: dict, batch_stats: dict, depth: int) -> dict[str, np.ndarray]:
  """Our encoder's variables under the torch model's names: the backbone through
  cl_jax.models.torchvision_export, the head (hidden1, bn1, out) as fc.0, fc.1 and fc.3."""
  out = export_torchvision.torchvision_state_dict(
      params["backbone"], batch_stats["backbone"], depth
  )
  head, head_stats = params["head"], batch_stats["head"]
  for torch_name, dense in (("fc.0", "hidden1"), ("fc.3", "out")):
    out[f"{torch_name}.weight"] = np.asarray(head[dense]["kernel"]).T
    out[f"{torch_name}.bias"] = np.asarray(head[dense]["bias"])
  out.update(export_torchvision.bn_entries("fc.1", head["bn1"], head_stats["bn1"]))
  return out


def _load(module: torch.nn.Module, arrays: dict[str, np.ndarray]) -> None:
  module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})


def _key_perms(raw_rng: np.ndarray, pairs: int) -> list[torch.Tensor]:
  """The shuffle-BN permutations of the JAX step 0 (cl_jax.train_step, objectives.forward)."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(raw_rng), 0)
  r_key = jax.random.split(rng, 5)[2]
  return [
      torch.from_numpy(np.array(jax.random.permutation(jax.random.fold_in(r_key, i), B), np.int64))
      for i in range(pairs)
  ]


def _assert_close(torch_state: dict, expected: dict[str, np.ndarray], **tol) -> None:
  for name, value in expected.items():
    if not name.endswith("num_batches_tracked"):
      np.testing.assert_allclose(torch_state[name].numpy(), value, err_msg=name, **tol)


@pytest.mark.slow  # compiles the JAX step
@pytest.mark.parametrize("symmetric,augment", [(False, False), (True, False), (False, True)])
def test_one_step_matches_the_jax_step(symmetric, augment):
  """Same weights, queue, views and shuffle permutations (and, with augmentation on, the JAX
  step's photometric parameters, applied by the torch step itself): the loss, the SGD-updated
  query encoder, the EMA key encoder, both encoders' BN running statistics and the queue
  agree."""
  c = _config(symmetric, augment)
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(c, 4 * B, mesh)
  before = jax.device_get(make_state())
  views = {
      v: np.random.default_rng(i).integers(0, 256, (B, S, S, 3), dtype=np.uint8)
      for i, v in enumerate(("view1", "view2"))
  }
  step = jax.jit(step_lib.make_train_step(c, encoder, tx, schedule, mesh, 4))
  after, metrics = jax.device_get(step(before, views))

  torch.manual_seed(0)
  model = bench_torch.build(c, torch.device("cpu"))
  _load(model.encoder_q, _torch_names(before.params, before.batch_stats, 18))
  _load(model.encoder_k, _torch_names(before.target_params, before.target_batch_stats, 18))
  model.queue.copy_(torch.from_numpy(np.array(before.queue)))
  torch_step = bench_torch.make_step(model, c, compile=False)
  pairs = 2 if symmetric else 1
  params = None
  if augment:  # the JAX step 0's draws (cl_jax.train_step.view_params)
    rng = jax.random.fold_in(jax.random.wrap_key_data(before.rng), 0)
    drawn = jax.device_get(step_lib.view_params(rng, B, photometric.config_spec(c)))
    params = [{k: torch.from_numpy(np.array(v)) for k, v in p.items()} for p in drawn]
    assert all(p["jitter"].any() and p["grayscale"].any() for p in params)
  loss = torch_step(
      *(torch.from_numpy(views[v]) for v in ("view1", "view2")),
      _key_perms(before.rng, pairs),
      params,
  )

  np.testing.assert_allclose(float(loss), float(metrics["loss"]), rtol=1e-4)
  online = _torch_names(after.params, after.batch_stats, 18)
  _assert_close(model.encoder_q.state_dict(), online, rtol=1e-4, atol=1e-5)
  target = _torch_names(after.target_params, after.target_batch_stats, 18)
  _assert_close(model.encoder_k.state_dict(), target, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(model.queue.numpy(), np.array(after.queue), rtol=1e-4, atol=1e-5)
  assert model.pointer == pairs * B


def test_group_batch_norm_normalises_each_group_with_its_own_statistics():
  x = torch.cat([torch.randn(4, 3, 5, 5), 10 + 3 * torch.randn(4, 3, 5, 5)])
  mean, var = torch.zeros(3), torch.ones(3)
  y = bench_torch.group_batch_norm(x, torch.ones(3), torch.zeros(3), mean, var, 2, 0.1, 1e-5)
  for group in (y[:4], y[4:]):
    torch.testing.assert_close(group.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        group.var(dim=(0, 2, 3), correction=0), torch.ones(3), atol=1e-3, rtol=0
    )
  stats = [torch.var_mean(g, dim=(0, 2, 3), correction=0) for g in (x[:4], x[4:])]
  torch.testing.assert_close(mean, 0.1 * (stats[0][1] + stats[1][1]) / 2)
  torch.testing.assert_close(var, 0.9 + 0.1 * (stats[0][0] + stats[1][0]) / 2)


def test_add_ons_are_refused():
  c = _config(False)
  c.nonsemantic.enabled = True
  with pytest.raises(ValueError, match="--config.nonsemantic.enabled=False"):
    bench_torch.build(c, torch.device("cpu"))


def test_measure_torch_times_eager_steps_on_the_cpu():
  c = _config(False)
  out = bench_torch.measure_torch(c, steps=2, warmup=1, compile=False)
  assert out["mode"] == "eager" and out["device"] == "cpu" and out["dtype"] == "float32"
  assert out["global_batch"] == B and out["step_ms"] > 0 and out["img_per_s"] > 0
  assert out["compile_s"] > 0 and np.isfinite(out["loss"])


@pytest.mark.slow  # a JAX compilation and torch.compile in subprocesses: minutes
def test_compare_cli_prints_jax_and_torch_rows_and_ratios():
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.bench.step",
          "--devices=1",
          "--compare=torch",
          "--steps=1",
          "--warmup=0",
          # The patch negatives on: the comparison switches them off in both steps.
          *(f for f in tiny_run.BENCH_FLAGS if f != "--config.nonsemantic.enabled=False"),
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert any("switched off in both: nonsemantic" in line for line in lines)
  header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["step", "dtype"])
  jax_row, eager, compiled = lines[header + 1 : header + 4]
  assert jax_row.startswith("jax (jit, 1 device)")
  assert eager.startswith("torch eager") and float(eager.split()[-1]) > 0
  # torch.compile may fail where no C compiler is found; the row then says so.
  assert compiled.startswith("torch compiled")
  ratios = next(line for line in lines if line.startswith("JAX img/s / torch img/s: eager "))
  assert "compiled" in ratios
