"""The benchmark command: per-device queue memory from the shards, and its printed table."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from cl_jax import bench, parallel, train
from cl_jax import train_step as step_lib
from configs import dicr, looc, mocov2_patchns

pytestmark = pytest.mark.slow  # subprocess runs or compiled train steps: minutes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "--config.data.image_size=16",
    "--config.model.width_multiplier=0.125",
    "--config.model.head_hidden_dim=16",
    "--config.model.head_out_dim=8",
    "--config.moco.queue_size=256",
    "--config.optim.batch_size=32",
]


def test_measure_reports_the_queue_shard_of_one_device():
  c = mocov2_patchns.get_config(None)
  c.data.image_size = 16
  c.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.moco.queue_size, c.optim.batch_size = 256, 32
  out = bench.measure(c, devices=4, steps=2, warmup=0)
  assert out["devices"] == 4 and out["global_batch"] == 32 and out["backend"] == "cpu"
  assert out["queue_mb_total"] == 256 * 8 * 4 / 2**20
  assert out["queue_mb_per_device"] == out["queue_mb_total"] / 4
  assert np.isfinite(out["loss"]) and out["step_ms"] > 0


def test_measure_times_the_training_step():
  """The timed function is the train step of cl_jax.train: after warmup + 1 + steps calls
  on the benchmark's synthetic batch, its loss is the one the training path reaches."""
  c = mocov2_patchns.get_config(None)
  c.data.image_size = 16
  c.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.moco.queue_size, c.optim.batch_size = 256, 32
  out = bench.measure(c, devices=1, steps=2, warmup=1)
  mesh = parallel.make_mesh(jax.devices()[:1])
  encoder, tx, schedule, make_state, _ = train.build(c, 32, mesh)
  state = make_state()
  step = step_lib.jit_train_step(
      step_lib.make_train_step(c, encoder, tx, schedule, mesh, 1),
      parallel.state_sharding(state, mesh),
      parallel.batch_sharding(mesh),
  )
  batch = bench.synthetic_batch(c, 32, np.random.default_rng(0))
  assert set(batch) == {"view1", "view2", "box1", "box2", "flip1", "flip2"}
  for _ in range(1 + 1 + 2):
    state, metrics = step(state, jax.device_put(batch, parallel.batch_sharding(mesh)))
  assert int(state.step) == 4
  np.testing.assert_allclose(out["loss"], float(metrics["loss"]), rtol=1e-6)


@pytest.mark.parametrize("name", ["dicr", "looc"])
def test_measure_runs_the_steps_that_read_boxes_or_extra_views(name):
  c = (dicr if name == "dicr" else looc).get_config(None)
  c.data.image_size = 16
  c.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.moco.queue_size, c.optim.batch_size = 256, 32
  c.dicr.warmup_epochs = 0
  out = bench.measure(c, devices=1, steps=1, warmup=0)
  assert np.isfinite(out["loss"]) and out["step_ms"] > 0


def test_cli_runs_each_device_count_in_its_own_process():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.bench",
          "--config=configs/mocov2_patchns.py",
          "--devices=1,2",
          "--steps=1",
          "--warmup=0",
          *TINY,
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["devices", "step", "ms"])
  rows = [line.split() for line in lines[header + 1 :]]
  assert [r[0] for r in rows] == ["1", "2"]
  # queue MiB per device halves with 2 devices; the total stays 256 x 8 float32.
  total = 256 * 8 * 4 / 2**20
  assert [float(r[3]) for r in rows] == [round(total, 3), round(total / 2, 3)]
  assert all(float(r[4]) == round(total, 3) for r in rows)
