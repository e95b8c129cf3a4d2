"""cl_jax.viz: legend labels, landscape epoch means and histogram tallies against NumPy,
and `python -m cl_jax.viz` on a tiny real run plus a hand-written one."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from cl_jax import config_defaults
from cl_jax.models.encoder import build_encoder
from cl_jax.viz import curves, histograms, landscape
from tests import tiny_run
from tests.conftest import ROOT

# Layers of the tiny run's encoder (tests/tiny_run.py), in the sorted order a logged metrics
# dict has them.
LAYERS = ("backbone/stage1_block1/conv1", "backbone/stem_bn", "backbone/stem_conv", "head/out")
NETWORK_ORDER = (
    "backbone/stem_conv",
    "backbone/stem_bn",
    "backbone/stage1_block1/conv1",
    "head/out",
)


def test_run_labels_name_the_fields_that_differ():
  base = {
      "seed": 0,
      "data": {"crop_scale": (0.2, 1.0), "name": "trifeature"},
      "moco": {"momentum": 0.99, "queue_size": 128},
  }
  configs = [{**base, "moco": {"momentum": m, "queue_size": 128}} for m in (0.9, 0.99, 0.999)]
  assert curves.run_labels(["a", "b", "c"], configs) == [
      "a (moco.momentum=0.9)",
      "b (moco.momentum=0.99)",
      "c (moco.momentum=0.999)",
  ]
  assert curves.run_labels(["a", "b"], [base, dict(base)]) == ["a", "b"]

  other = {**base, "seed": 1, "moco": {"momentum": 0.99, "queue_size": 128, "symmetric": True}}
  assert curves.differing_fields([base, other]) == ["moco.symmetric", "seed"]
  assert curves.run_labels(["x", "y"], [base, other]) == [
      "x (moco.symmetric unset, seed=0)",
      "y (moco.symmetric=True, seed=1)",
  ]
  with pytest.raises(ValueError, match="one config per run"):
    curves.run_labels(["x"], [base, other])


def test_landscape_epoch_means_match_numpy():
  rng = np.random.default_rng(0)
  spe, steps = 4, np.arange(1, 18)  # epochs 0..4; epoch 4 holds step 17 only
  values = rng.lognormal(size=(len(steps), len(LAYERS)))
  values[steps == 6, :] = np.nan  # a logged step without gradient norms
  values[(steps >= 9) & (steps <= 12), :] = np.nan  # epoch 2 logged none
  values[steps == 3, 3] = np.nan  # one layer missing at one step
  records = []
  for s, row in zip(steps, values):
    r = {"step": int(s), "loss": 1.0}
    r.update({f"grad_norm/{l}": float(v) for l, v in zip(LAYERS, row) if np.isfinite(v)})
    records.append(r)

  got = landscape.epoch_means(records, spe)
  epoch = (steps - 1) // spe
  want = np.full((len(LAYERS), 5), np.nan)
  for e in range(5):
    block = values[epoch == e]
    for l in range(len(LAYERS)):
      col = block[:, l][np.isfinite(block[:, l])]
      if col.size:
        want[l, e] = col.mean()
  assert got.layers == LAYERS
  np.testing.assert_array_equal(got.epochs, np.arange(5))
  np.testing.assert_array_equal(np.isnan(got.norms), np.isnan(want))
  np.testing.assert_allclose(got.norms, want, rtol=1e-12)
  assert np.isnan(got.norms[:, 2]).all()
  # Epoch 0, layer 3: steps 1, 2 and 4 only (step 3 lacks it).
  np.testing.assert_allclose(got.norms[3, 0], values[[0, 1, 3], 3].mean())

  reordered = landscape.epoch_means(records, spe, ("", "backbone", *NETWORK_ORDER))
  assert reordered.layers == NETWORK_ORDER
  rows = [LAYERS.index(l) for l in NETWORK_ORDER]
  np.testing.assert_allclose(reordered.norms, want[rows], rtol=1e-12)

  with pytest.raises(ValueError, match="no per-layer gradient norms"):
    landscape.epoch_means([{"step": 1, "loss": 1.0}], spe)
  with pytest.raises(ValueError, match="not modules of the run's encoder"):
    landscape.epoch_means(records, spe, NETWORK_ORDER[:3])


def test_network_order_follows_the_forward_pass():
  model = config_defaults.base_config().model
  model.update(width_multiplier=0.125, head_hidden_dim=32, head_out_dim=16)
  order = landscape.network_order(model, 16)
  position = [
      order.index(l)
      for l in (
          "backbone/stem_conv",
          "backbone/stem_bn",
          "backbone/stage1_block1/conv1",
          "backbone/stage1_block1/bn1",
          "backbone/stage1_block1/conv2",
          "backbone/stage2_block1/proj_conv",
          "backbone/stage4_block2/bn2",
          "head/hidden1",
          "head/out",
      )
  ]
  assert position == sorted(position)
  # Every module holding parameters (a gradient-norm layer) is in the order.
  encoder = build_encoder(model)
  params = jax.eval_shape(
      lambda: encoder.init(jax.random.key(0), jnp.zeros((4, 16, 16, 3)), train=False)
  )["params"]
  layers = {
      "/".join(p.key for p in path[:-1]) for path, _ in jax.tree_util.tree_leaves_with_path(params)
  }
  assert layers <= set(order) and len(layers) == 42, len(layers)


def test_tallies_accumulate_to_the_numpy_density():
  rng = np.random.default_rng(1)
  edges = np.linspace(-1.0, 1.0, 41)
  chunks = [np.tanh(rng.normal(size=n)) for n in (50, 7, 300)]
  chunks.append(np.array([1.0 + 1e-7, -1.0 - 1e-7]))  # round-off beyond the unit interval
  t = None
  for c in chunks:
    t = histograms.tally(t, c, edges)
  every = np.concatenate(chunks)
  want, _ = np.histogram(np.clip(every, -1.0, 1.0), edges, density=True)
  np.testing.assert_allclose(histograms.density(t, edges), want, rtol=1e-12)
  assert t.n == every.size and t.counts[0] >= 1 and t.counts[-1] >= 1
  np.testing.assert_allclose(t.total / t.n, every.mean(), rtol=1e-12)


def test_pair_similarities_match_numpy():
  rng = np.random.default_rng(2)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q, k = unit(rng.normal(size=(3, 5))), unit(rng.normal(size=(3, 5)))
  queue, t = unit(rng.normal(size=(4, 5))), unit(rng.normal(size=(3, 2, 5)))
  got = histograms.pair_similarities(
      q.astype(np.float32), k.astype(np.float32), queue.astype(np.float32), t.astype(np.float32)
  )
  np.testing.assert_allclose(got["positive"], [q[i] @ k[i] for i in range(3)], atol=1e-6)
  np.testing.assert_allclose(
      got["negative"], [q[i] @ queue[j] for i in range(3) for j in range(4)], atol=1e-6
  )
  np.testing.assert_allclose(
      got["non-semantic"], [q[i] @ t[i, m] for i in range(3) for m in range(2)], atol=1e-6
  )


def _assert_png(path: str) -> None:
  with Image.open(path) as image:
    assert image.format == "PNG"
    pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
  assert pixels.shape[1] > 200 and pixels.shape[0] > 200, pixels.shape
  assert pixels.var() > 0, f"{path} is blank"


def _write_run(workdir, config: dict, momentum: float, grad_norms: bool, seed: int) -> None:
  """A hand-written run: config.json with moco.momentum changed, 16 logged steps."""
  config = json.loads(json.dumps(config))
  config["moco"]["momentum"] = momentum
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(config))
  rng = np.random.default_rng(seed)
  with open(workdir / "metrics.jsonl", "w") as f:
    for step in range(1, 17):
      record = {
          "step": step,
          "loss": 5.0,
          "lr": 0.06,
          "pos_mean": rng.uniform(0.4, 0.9),
          "neg_mean": rng.normal(0.0, 0.1),
          "neg_var": rng.uniform(0.01, 0.1),
      }
      if grad_norms:
        record.update({f"grad_norm/{l}": rng.lognormal() for l in LAYERS})
      f.write(json.dumps(record) + "\n")


@pytest.mark.slow
def test_cli_renders_every_plot(finished_run, tmp_path):
  """The shared finished tiny run (tests/tiny_run.py FINISHED, 16 steps), copied under the
  momentum sweep's name, beside two runs written by hand."""
  real, out = tmp_path / "m099", tmp_path / "plots"
  shutil.copytree(finished_run.workdir, real)
  # Two more runs of the momentum sweep, written by hand, without checkpoints: one with
  # per-layer gradient norms, one from before they were logged.
  config = json.loads((real / "config.json").read_text())
  _write_run(tmp_path / "m090", config, 0.9, grad_norms=True, seed=3)
  _write_run(tmp_path / "m0999", config, 0.999, grad_norms=False, seed=4)
  real_logs_norms = "grad_norm/" in (real / "metrics.jsonl").read_text()

  viz = subprocess.run(
      [
          sys.executable,
          "-m",
          "cl_jax.viz",
          str(real),
          str(tmp_path / "m090"),
          str(tmp_path / "m0999"),
          f"--out={out}",
          "--batches=2",
      ],
      cwd=ROOT,
      env=tiny_run.env(),
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert viz.returncode == 0, viz.stderr[-3000:]
  want = {
      out / "score_stats.png",
      out / "grad_landscape_m090.png",
      out / "sim_hist_m099_step16.png",
  }
  if real_logs_norms:
    want.add(out / "grad_landscape_m099.png")
  printed = {line for line in viz.stdout.splitlines() if line.endswith(".png")}
  assert printed == {str(p) for p in want}, viz.stdout
  assert sorted(os.listdir(out)) == sorted(p.name for p in want)
  assert f"{tmp_path / 'm0999'} logged no per-layer gradient norms" in viz.stdout
  assert f"{tmp_path / 'm090'} holds no checkpoint" in viz.stdout
  for path in want:
    _assert_png(str(path))
