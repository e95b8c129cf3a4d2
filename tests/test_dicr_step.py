"""DICR in the train step: switched off, every base method takes the step it took before DICR
existed (bit for bit); switched on, SimCLR's loss is NT-Xent + lambda L_DICR re-derived in NumPy
from a reference forward; lambda starts at 0; 1 and 8 devices take the same step."""

import os

import dicr_reference
import jax
import numpy as np
import pytest

from cl_jax import config_check, train
from cl_jax import train_step as step_lib
from cl_jax.data import photometric
from cl_jax.runtime import parallel
from configs import byol, mocov2, simclr, simsiam

pytestmark = pytest.mark.slow  # compiled train steps: minutes

B, S = 8, 16
BASE = {
    "simclr": (simclr, {}),
    "moco": (mocov2, {"moco": {"symmetric": True}}),
    "simsiam": (simsiam, {}),
    "byol": (byol, {}),
}
# One step of each base method recorded before DICR was added (at the config and batch below):
# the loss and the float64 sum of each parameter array after the step. Bit for bit on the
# machine that recorded it; XLA's CPU kernels differ by processor (README "Reproducibility"),
# so elsewhere they agree to float32 rounding only: measured on an AVX2 machine against the
# recording, 1.5e-7 on SimSiam's loss (-0.0028) and 2.2e-5 on a parameter sum. Since the
# contrastive methods share one InfoNCE (cl_jax.losses.contrast), SimCLR's step agrees with the
# recording to float32 rounding on the recording machine too: its positive logit now enters
# the log-sum-exp and the loss through two divisions by T, as MoCo's always did (measured
# 9.5e-7 at most over the parameters and metrics of two steps on a 2-core AMD EPYC).
RTOL, LOSS_ATOL, SUM_ATOL = 1e-5, 1e-6, 1e-4
FIXTURE = os.path.join(os.path.dirname(__file__), "data", "base_steps_v1.npz")


def _config(name, depth=10, **blocks):
  """The method's config on the test's batch: ResNet-10 x0.125 unless `depth` says (the
  recorded steps are ResNet-18's)."""
  module, base = BASE[name]
  c = module.get_config(None)
  c.data.image_size = S
  c.model.update(depth=depth, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  if c.model.predictor_hidden_dim:
    c.model.predictor_hidden_dim = 16
  c.optim.update(batch_size=B, epochs=2)
  for block, fields in {**base, **blocks}.items():
    c[block].update(fields)
  return c


def _batch():
  """Random views with crop boxes in a 32 px source image and random flips."""
  rng = np.random.default_rng(0)
  out = {v: rng.integers(0, 256, (B, S, S, 3), dtype=np.uint8) for v in ("view1", "view2")}
  for v in (1, 2):
    y0, x0 = rng.uniform(0, 20, B), rng.uniform(0, 20, B)
    size_y, size_x = rng.uniform(8, 12, B), rng.uniform(8, 12, B)
    out[f"box{v}"] = np.stack([y0, x0, y0 + size_y, x0 + size_x], 1).astype(np.float32)
    out[f"flip{v}"] = rng.random(B) < 0.5
  return out


def _step(config, devices=1, at_steps=(0,)):
  """One step of `config` compiled once and taken from the initial state with its step counter
  set to each of `at_steps` (4 steps per epoch): the encoder, the initial state, and the state
  after and the metrics of the first of them, then the metrics of the others."""
  mesh = parallel.make_mesh(jax.devices()[:devices])
  encoder, tx, schedule, make_state, _ = train.build(config, 4 * B, mesh)
  before = jax.device_get(make_state())
  fn = step_lib.jit_train_step(
      step_lib.make_train_step(config, encoder, tx, schedule, mesh, 4),
      parallel.state_sharding(before, mesh),
      parallel.batch_sharding(mesh),
  )
  batch = parallel.global_batch(_batch(), mesh)
  taken = [fn(make_state().replace(step=np.int32(t)), batch) for t in at_steps]
  after, metrics = jax.device_get(taken[0])
  return encoder, before, after, metrics, *[jax.device_get(m) for _, m in taken[1:]]


@pytest.mark.parametrize("name", list(BASE))
def test_switched_off_each_base_method_takes_its_recorded_step(name):
  reference = np.load(FIXTURE)
  _, _, after, metrics = _step(_config(name, depth=18))
  np.testing.assert_allclose(metrics["loss"], reference[f"{name}_loss"], RTOL, LOSS_ATOL)
  sums = [np.sum(np.asarray(x, np.float64)) for x in jax.tree.leaves(after.params)]
  np.testing.assert_allclose(sums, reference[f"{name}_params"], RTOL, SUM_ATOL)
  assert not any(k.startswith("dicr/") for k in metrics)


def test_simclr_step_adds_lambda_times_the_numpy_dicr_loss():
  weight, tau, t = 3.0, 0.2, 0.5
  config = _config(
      "simclr", dicr={"enabled": True, "warmup_epochs": 0, "weight": weight, "temperature": tau}
  )
  encoder, before, _, metrics = _step(config)
  rng = jax.random.fold_in(jax.random.wrap_key_data(before.rng), 0)
  r_aug1, r_aug2 = jax.random.split(rng, 5)[:2]
  spec = photometric.config_spec(config)
  batch = _batch()
  augment = jax.jit(photometric.augment_batch, static_argnums=2)
  forward = jax.jit(
      lambda x: encoder.apply(
          {"params": before.params, "batch_stats": before.batch_stats},
          x,
          train=True,
          mutable=["batch_stats"],
      )[0]
  )
  outs = []
  for r, v in ((r_aug1, "view1"), (r_aug2, "view2")):
    out = forward(augment(r, batch[v], spec)[0])
    outs.append({k: np.asarray(out[k], np.float64) for k in ("z", "feature_map")})
  u = np.concatenate([o["z"] for o in outs])
  nt_xent = []
  for i in range(2 * B):  # Chen et al. 2020, Eq. 1
    partner = (i + B) % (2 * B)
    denominator = sum(np.exp(u[i] @ u[k] / t) for k in range(2 * B) if k != i)
    nt_xent.append(-np.log(np.exp(u[i] @ u[partner] / t) / denominator))
  eps = config.dicr.epsilon_area / S**2
  h, areas = [], []
  for b in range(B):
    box1, box2 = batch["box1"][b].astype(np.float64), batch["box2"][b].astype(np.float64)
    s1, s2 = dicr_reference.overlap_share(box1, box2)
    zero = np.zeros(4)
    o1 = dicr_reference.overlap_in_view(box1, batch["flip1"][b], box2)
    o2 = dicr_reference.overlap_in_view(box2, batch["flip2"][b], box1)
    h_o1, h_n1 = dicr_reference.regions(
        outs[0]["feature_map"][b], zero if o1 is None else o1, s1, eps
    )
    h_o2, h_n2 = dicr_reference.regions(
        outs[1]["feature_map"][b], zero if o2 is None else o2, s2, eps
    )
    h.append([h_o1, h_n1, h_o2, h_n2])
    areas.append([s1, 1 - s1, s2, 1 - s2])
  l_dicr = dicr_reference.loss(np.array(h), np.array(areas), eps, tau)
  np.testing.assert_allclose(metrics["dicr/loss"], l_dicr, rtol=1e-4)
  np.testing.assert_allclose(metrics["loss"], np.mean(nt_xent) + weight * l_dicr, rtol=1e-5)
  assert metrics["dicr/weight"] == weight


@pytest.mark.parametrize(
    "name, blocks",
    [
        ("moco", {"dicr": {"enabled": True, "warmup_epochs": 0}}),
        (
            "simclr",
            {"dicr": {"enabled": True, "warmup_epochs": 0, "variant": "icr", "icr_layers": 2}},
        ),
    ],
)
def test_one_and_eight_devices_take_the_same_step(name, blocks):
  model = (
      {"bn_mode": "local", "bn_groups": 4}
      if name == "simclr"
      else {"bn_mode": "sync", "bn_groups": 1}
  )
  config = _config(name, model=model, **blocks)
  _, _, one, m1 = _step(config, devices=1)
  _, _, eight, m8 = _step(config, devices=8)
  for key in ("loss", "dicr/loss", "dicr/pos_sim", "dicr/neg_sim"):
    np.testing.assert_allclose(m8[key], m1[key], rtol=1e-5, err_msg=key)
  for (path, a), b in zip(
      jax.tree_util.tree_leaves_with_path(one.params), jax.tree.leaves(eight.params)
  ):
    name = jax.tree_util.keystr(path)
    if "hidden" in name and name.endswith("['bias']"):
      # A dense bias that feeds batch norm gets gradient 0 (the norm removes any shift); its
      # update is summation rounding, whose pattern depends on the device split. Both stay 0.
      assert np.abs(a).max() < 1e-5 and np.abs(b).max() < 1e-5, name
      continue
    np.testing.assert_allclose(
        b, a, rtol=1e-4, atol=max(1e-6, 1e-4 * np.abs(a).max()), err_msg=name
    )


@pytest.mark.parametrize(
    "name, addons",
    [
        (
            "simclr",
            {
                "nonsemantic": {"enabled": True, "patch_min": 2, "patch_max": 6},
                "ifm": {"enabled": True},
            },
        ),
        ("moco", {"ft": {"enabled": True}}),
        ("byol", {"nonsemantic": {"enabled": True, "patch_min": 2, "patch_max": 6, "alpha": 0.3}}),
        ("simsiam", {}),
    ],
)
def test_dicr_adds_its_term_on_top_of_the_other_addons_from_its_warmup_on(name, addons):
  """lambda is 0 in the first epoch (warmup_epochs=1): the step is the one without DICR, whose
  loss it still reports; from epoch 1 (step 4) the loss is the step's without DICR plus
  lambda L_DICR."""
  dicr_on = {"dicr": {"enabled": True, "warmup_epochs": 1, "weight": 0.5}}
  config = _config(name, **addons, **dicr_on)
  config_check.validate(config)
  *_, without, without_later = _step(_config(name, **addons), at_steps=(0, 4))
  _, _, after, warm, later = _step(config, at_steps=(0, 4))
  assert warm["dicr/weight"] == 0.0 and warm["dicr/loss"] > 0.0
  np.testing.assert_allclose(warm["loss"], without["loss"], rtol=1e-6, atol=1e-7)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(after.params))
  assert later["dicr/weight"] == 0.5 and later["dicr/loss"] > 0
  np.testing.assert_allclose(
      later["loss"], without_later["loss"] + 0.5 * later["dicr/loss"], rtol=1e-5
  )
