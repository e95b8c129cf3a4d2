"""DICR's loss (2025 submission, Sec. 3.2), cl_jax.addons.dicr: the region areas, h_n from
Eq. 3 against the direct mean over the non-overlap region, the area rules of Eq. 7, Eq. 5
against a NumPy re-derivation, the edge cases of the paper (disjoint, identical and nested
crops), the per-epoch lambda warm-up of Eq. 8 (dicr_weight) and the threshold in view pixels
(epsilon_fraction), both of scalars; the presets, the config check and the resume rule."""

import dicr_reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax import config_check
from cl_jax.addons import dicr
from cl_jax.evaluators import linear_probe
from cl_jax.models.encoder import encoder_for, head_layout
from cl_jax.runtime import run_config
from configs import dicr as dicr_config
from configs import mocov2


def _batch(boxes1, boxes2, flips1=None, flips2=None):
  n = len(boxes1)
  return {
      "box1": np.asarray(boxes1, np.float32),
      "box2": np.asarray(boxes2, np.float32),
      "flip1": np.zeros(n, bool) if flips1 is None else np.asarray(flips1),
      "flip2": np.zeros(n, bool) if flips2 is None else np.asarray(flips2),
  }


def test_areas_are_the_overlaps_share_of_each_crop():
  # Rows: partial overlap, view 2 inside view 1, disjoint, identical crops.
  boxes1 = [[0, 0, 10, 10], [0, 0, 20, 20], [0, 0, 10, 10], [3, 4, 13, 24]]
  boxes2 = [[5, 5, 15, 25], [5, 5, 15, 15], [10, 0, 20, 10], [3, 4, 13, 24]]
  regions = dicr.regions_of(_batch(boxes1, boxes2, flips2=[True, False, False, True]))
  # Partial: overlap [5, 5, 10, 10] = 25 px of 100 and of 200.
  expect = [
      [0.25, 0.75, 0.125, 0.875],
      [0.25, 0.75, 1.0, 0.0],
      [0.0, 1.0, 0.0, 1.0],
      [1.0, 0.0, 1.0, 0.0],
  ]
  np.testing.assert_allclose(regions.areas, expect, atol=1e-7)
  for row, (b1, b2) in enumerate(zip(boxes1, boxes2)):
    s1, s2 = dicr_reference.overlap_share(b1, b2)
    np.testing.assert_allclose(regions.areas[row, [0, 2]], [s1, s2], atol=1e-7)
  # The partial overlap in view 2 (flipped): y 0..0.5, x 0..0.25 mirrored to 0.75..1.
  np.testing.assert_allclose(regions.o2[0], [0.0, 0.75, 0.5, 1.0], atol=1e-7)
  np.testing.assert_allclose(regions.o1[3], [0, 0, 1, 1], atol=1e-7)


def test_h_n_from_eq3_is_the_mean_over_the_non_overlap_region():
  """With f linear in position, bilinear RoIAlign over an interior region is its exact mean,
  so Eq. 3 must give the plain mean of the cells outside the (cell-aligned) region."""
  rng = np.random.default_rng(0)
  size, channels = 8, 5
  coeff = rng.normal(size=(3, channels))
  yy, xx = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
  f = coeff[0] + yy[..., None] * coeff[1] + xx[..., None] * coeff[2]  # (8, 8, C)
  region = np.array([0.25, 0.25, 0.75, 0.5])  # cells y 2..5, x 2..3
  share = 0.5 * 0.25
  inside = np.zeros((size, size), bool)
  inside[2:6, 2:4] = True
  h_o, h_n = dicr.region_representations(
      jnp.asarray(f[None], jnp.float32),
      jnp.asarray(f.mean((0, 1))[None], jnp.float32),
      jnp.asarray(region[None], jnp.float32),
      jnp.asarray([share], jnp.float32),
      epsilon=0.01,
  )
  np.testing.assert_allclose(h_o[0], f[inside].mean(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(h_n[0], f[~inside].mean(0), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_region_representations_match_numpy_on_a_random_map():
  rng = np.random.default_rng(1)
  f = rng.normal(size=(3, 4, 4, 6)).astype(np.float32)
  regions = np.array([[0.1, 0.2, 0.7, 0.9], [0, 0, 1, 1], [0.3, 0.3, 0.4, 0.35]], np.float32)
  shares = np.array([0.42, 1.0, 0.005], np.float32)
  eps = 0.01
  h_o, h_n = dicr.region_representations(
      jnp.asarray(f), jnp.asarray(f.mean((1, 2))), jnp.asarray(regions), jnp.asarray(shares), eps
  )
  for b in range(3):
    ref_o, ref_n = dicr_reference.regions(f[b], regions[b], shares[b], eps)
    np.testing.assert_allclose(h_o[b], ref_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h_n[b], ref_n, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "areas, expect",
    [
        ((0.5, 0.3), "cos"),  # both regions present
        ((0.001, 0.002), 1.0),  # both null: same direction (footnote 4)
        ((0.001, 0.3), 0.0),  # one null: orthogonal
        ((0.3, 0.0), 0.0),
        ((0.01, 0.01), "cos"),  # at epsilon counts as present (S >= epsilon)
    ],
)
def test_eq7_area_rules(areas, expect):
  hx, hy = jnp.array([[1.0, 2.0, 0.0]]), jnp.array([[2.0, 0.5, 1.0]])
  s = dicr.similarity(hx, hy, jnp.array([areas[0]]), jnp.array([areas[1]]), 0.01)
  if expect == "cos":
    expect = 3.0 / (np.sqrt(5.0) * np.sqrt(5.25))
  np.testing.assert_allclose(s, [expect], rtol=1e-6)


def test_eq7_replaced_similarities_pass_no_gradient_even_from_zero_vectors():
  zero = jnp.zeros((1, 3))

  def total(hx, hy):
    return jnp.sum(dicr.similarity(hx, hy, jnp.array([0.0]), jnp.array([0.5]), 0.01))

  gx, gy = jax.grad(total, argnums=(0, 1))(zero, jnp.ones((1, 3)))
  assert np.all(np.asarray(gx) == 0) and np.all(np.asarray(gy) == 0)


@pytest.mark.parametrize("constant_positive", [None, 0.7])
@pytest.mark.parametrize("tau", [0.05, 0.5])
@pytest.mark.slow
def test_loss_matches_numpy(constant_positive, tau):
  rng = np.random.default_rng(2)
  h = rng.normal(size=(6, 4, 5)).astype(np.float32)
  areas = rng.uniform(0.0, 1.0, size=(6, 4)).astype(np.float32)
  areas[1, [1, 3]] = 0.0  # identical crops
  areas[2, [0, 2]] = 0.0  # disjoint crops
  areas[3, 3] = 0.001  # view 2 inside view 1
  eps = 0.01
  loss, stats = dicr.dicr_loss(jnp.asarray(h), jnp.asarray(areas), eps, tau, constant_positive)
  expect = dicr_reference.loss(h, areas, eps, tau, constant_positive)
  np.testing.assert_allclose(loss, expect, rtol=1e-5)
  np.testing.assert_allclose(stats["dicr/loss"], expect, rtol=1e-5)
  np.testing.assert_allclose(stats["dicr/null_regions"], (areas < eps).sum() / 6, rtol=1e-6)


def _whole_view_features(rng, batch):
  """Feature maps of 4 x 4 cells and their means, as an encoder's outputs."""
  f = rng.normal(size=(batch, 4, 4, 8)).astype(np.float32)
  return {"feature_map": jnp.asarray(f), "pooled": jnp.asarray(f.mean((1, 2)))}


def _loss_and_grads(boxes1, boxes2, tau=0.1):
  rng = np.random.default_rng(3)
  out1, out2 = _whole_view_features(rng, len(boxes1)), _whole_view_features(rng, len(boxes1))
  regions = dicr.regions_of(_batch(boxes1, boxes2))

  def loss_fn(f1, f2):
    o1 = {"feature_map": f1, "pooled": f1.mean((1, 2))}
    o2 = {"feature_map": f2, "pooled": f2.mean((1, 2))}
    h = dicr.stacked_regions(o1, o2, regions, 0.01)
    return dicr.dicr_loss(h, regions.areas, 0.01, tau)

  (loss, stats), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
      out1["feature_map"], out2["feature_map"]
  )
  return out1, out2, loss, stats, grads


@pytest.mark.slow
def test_disjoint_views_repel_their_whole_representations():
  out1, out2, loss, stats, grads = _loss_and_grads([[0, 0, 10, 10]], [[10, 0, 20, 10]], tau=1.0)
  # sim(o1, o2) = 1, the {o, n} pairs 0, and {n1, n2} = cos(h1, h2) of the whole views.
  h1, h2 = np.asarray(out1["pooled"][0]), np.asarray(out2["pooled"][0])
  c = h1 @ h2 / (np.linalg.norm(h1) * np.linalg.norm(h2))
  logits = np.array([1.0, 0.0, 0.0, 0.0, c, 0.0])
  expect = -(logits[0] - np.log(np.sum(np.exp(logits))))
  np.testing.assert_allclose(loss, expect, rtol=1e-5)
  np.testing.assert_allclose(stats["dicr/pos_sim"], 1.0)
  # A small step down the gradient lowers cos(h1, h2).
  f1 = out1["feature_map"] - 1e-2 * grads[0]
  f2 = out2["feature_map"] - 1e-2 * grads[1]
  g1, g2 = np.asarray(f1.mean((1, 2))[0]), np.asarray(f2.mean((1, 2))[0])
  assert g1 @ g2 / (np.linalg.norm(g1) * np.linalg.norm(g2)) < c


@pytest.mark.slow
def test_identical_views_attract_their_whole_representations():
  out1, out2, loss, stats, _ = _loss_and_grads([[2, 2, 12, 12]], [[2, 2, 12, 12]], tau=0.1)
  # o_i is the whole view (RoIAlign at the map's resolution: the plain mean), n1, n2 null:
  # sim(n1, n2) = 1 and the {o, n} pairs 0.
  h1, h2 = np.asarray(out1["pooled"][0]), np.asarray(out2["pooled"][0])
  c = h1 @ h2 / (np.linalg.norm(h1) * np.linalg.norm(h2))
  np.testing.assert_allclose(stats["dicr/pos_sim"], c, rtol=1e-5)
  logits = np.array([c, 0.0, 0.0, 0.0, 1.0, 0.0]) / 0.1
  np.testing.assert_allclose(loss, -0.1 * (logits[0] - np.log(np.exp(logits).sum())), rtol=1e-5)


@pytest.mark.slow
def test_a_nested_view_repels_the_outer_views_rest_from_both_overlaps():
  """v2 inside v1: attract (o1, o2), repel {o2, n1} and {o1, n1}; n2 is null."""
  _, _, _, _, grads = _loss_and_grads([[0, 0, 16, 16]], [[4, 4, 12, 12]], tau=0.1)
  regions = dicr.regions_of(_batch([[0, 0, 16, 16]], [[4, 4, 12, 12]]))
  np.testing.assert_allclose(regions.areas[0], [0.25, 0.75, 1.0, 0.0])
  # Both maps receive gradient: view 2 through o2 = v2, view 1 through o1 and n1.
  assert np.abs(np.asarray(grads[0])).sum() > 0 and np.abs(np.asarray(grads[1])).sum() > 0


def test_lambda_rises_once_per_epoch_to_its_final_value():
  steps = jnp.array([0, 9, 10, 25, 39, 40, 100])
  weights = [float(dicr.dicr_weight(s, 10, weight=8.0, warmup_epochs=4)) for s in steps]
  np.testing.assert_allclose(weights, [0.0, 0.0, 2.0, 4.0, 6.0, 8.0, 8.0])
  assert float(dicr.dicr_weight(jnp.array(0), 10, weight=8.0, warmup_epochs=0)) == 8.0


def test_epsilon_is_given_in_view_pixels():
  assert dicr.epsilon_fraction(9.0, 64) == 9.0 / 4096


# The config check and the resume rule.


@pytest.mark.parametrize("method", ["simclr", "moco", "simsiam", "byol"])
@pytest.mark.parametrize("dataset", ["", ",cifar10", ",cifar100", ",stl10", ",tiny_imagenet"])
def test_presets_validate(method, dataset):
  c = dicr_config.get_config(method + dataset)
  if dataset:
    c.data.data_dir = "/data/tfds"
  config_check.validate(c)
  assert c.dicr.enabled and c.dicr.warmup_epochs == c.optim.epochs - 1


def test_paper_presets_carry_sec41_settings():
  cifar = dicr_config.get_config("simclr,cifar100")
  assert (cifar.optim.lr, cifar.optim.batch_size, cifar.optim.epochs) == (0.5, 512, 500)
  assert (cifar.optim.optimizer, cifar.optim.weight_decay, cifar.optim.momentum) == (
      "sgd",
      1e-4,
      0.9,
  )
  assert (cifar.model.depth, cifar.model.stem, cifar.dicr.epsilon_area) == (18, "cifar", 4.0)
  assert (cifar.dicr.weight, cifar.dicr.temperature) == (40.0, 0.05)
  stl = dicr_config.get_config("moco,stl10")
  assert (stl.optim.lr, stl.optim.batch_size, stl.optim.epochs) == (0.25, 256, 250)
  assert stl.moco.symmetric and (stl.dicr.weight, stl.dicr.temperature) == (10.0, 0.02)
  assert stl.dicr.epsilon_area == 9.0
  siam = dicr_config.get_config("simsiam")
  assert (siam.dicr.weight, siam.dicr.temperature, siam.data.name) == (2.0, 0.005, "trifeature")


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"moco.symmetric": False}, "moco.symmetric"),
        ({"looc.enabled": True}, "dicr.enabled"),
        ({"dicr.variant": "roi"}, "dicr.variant"),
        ({"dicr.weight": 0.0}, "dicr.weight"),
        ({"dicr.temperature": -1.0}, "dicr.temperature"),
        ({"dicr.warmup_epochs": 17}, "dicr.warmup_epochs"),
        ({"dicr.epsilon_area": 2000.0}, "dicr.epsilon_area"),
        ({"dicr.variant": "dirr", "dicr.dirr_similarity": 1.5}, "dicr.dirr_similarity"),
        ({"dicr.variant": "icr", "dicr.icr_layers": 0}, "dicr.icr_layers"),
    ],
)
def test_bad_dicr_settings_name_their_field(fields, field):
  c = dicr_config.get_config("moco")
  for path, value in fields.items():
    block, name = path.split(".")
    c[block][name] = value
  with pytest.raises(config_check.ConfigError, match=field.replace(".", r"\.")):
    config_check.validate(c)


def test_a_run_stored_without_the_dicr_block_resumes_with_dicr_off():
  stored = mocov2.get_config()
  del stored["dicr"]
  assert (
      run_config.check_resume(stored, mocov2.get_config(), step=8, workdir="w", allow_change=False)
      == []
  )
  with pytest.raises(run_config.ConfigChangeError, match="dicr.enabled: '<absent>' -> True"):
    run_config.check_resume(
        stored, dicr_config.get_config("moco"), step=8, workdir="w", allow_change=False
    )


def test_the_fields_of_a_switched_off_addon_may_change():
  """optim.epochs moves dicr.warmup_epochs with it; with DICR off that changes nothing."""
  stored = mocov2.get_config()
  longer = mocov2.get_config()
  longer.optim.epochs = 40
  assert run_config.check_resume(stored, longer, step=8, workdir="w", allow_change=True) == [
      "optim.epochs: 16 -> 40"
  ]
  on, longer_on = dicr_config.get_config("moco"), dicr_config.get_config("moco")
  longer_on.optim.epochs = 40
  with pytest.raises(run_config.ConfigChangeError, match="dicr.warmup_epochs: 15 -> 39"):
    run_config.check_resume(on, longer_on, step=8, workdir="w", allow_change=True)


@pytest.mark.slow
def test_icr_adds_a_region_head_that_the_probe_cache_ignores():
  c = dicr_config.get_config("simclr")
  c.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  c.dicr.update(variant="icr", icr_layers=2)
  assert head_layout(c)["region_head_layers"] == 2
  encoder = encoder_for(c)
  variables = encoder.init(jax.random.key(0), jnp.zeros((4, 16, 16, 3)), train=True)
  assert set(variables["params"]["region_head"]) == {"hidden1", "bn1", "out"}
  h = jnp.ones((12, 64))
  z, _ = encoder.apply(variables, h, train=True, method="project_regions", mutable=["batch_stats"])
  assert z.shape == (12, 8)
  plain = dicr_config.get_config("simclr")
  plain.model.update(width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
  assert linear_probe.baseline_key(c, "fast") == linear_probe.baseline_key(plain, "fast")
