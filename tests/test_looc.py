"""LooC (Xiao et al. 2021): shared augmentation parameters of the key views, the loss of Eq. 2
(cl_jax.losses.looc.looc_loss) against a NumPy re-derivation on 1 and 8 devices, the heads, the
per-head queues, the extra host views, and one head equal to plain MoCo
(cl_jax.objectives.moco.pair_loss without add-ons) bit for bit."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from cl_jax import config_check, config_defaults, train
from cl_jax import train_step as step_lib
from cl_jax.addons.from_config import AddOns
from cl_jax.data import photometric, pipeline
from cl_jax.data.rotated_source import RotatedSource
from cl_jax.evaluators import registry
from cl_jax.losses import looc
from cl_jax.losses import memory_queue as queue_lib
from cl_jax.models.encoder import build_encoder
from cl_jax.objectives import moco
from cl_jax.runtime import parallel, run_config
from cl_jax.runtime.errors import UsageError
from configs import looc as looc_config
from configs import loocpp, mocov2

T = 0.2


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _embeddings(seed, b=8, h=3, k=32, d=6):
  rng = np.random.default_rng(seed)
  q = _unit(rng.normal(size=(b, h, d))).astype(np.float32)
  keys = _unit(rng.normal(size=(b, h, h, d))).astype(np.float32)
  queue = _unit(rng.normal(size=(k, h, d))).astype(np.float32)
  return q, keys, queue


def _eq2_numpy(q, k, queue, t, same_image_negatives=True):
  """Eq. 2 by its sums: head 0 contrasts k_0 with the queue; head i >= 1 puts every key of the
  same image, z_i^{k_j} for j = 0..n, in the denominator beside head i's queue (with
  same_image_negatives=False only the positive k_i, plain per-head MoCo)."""
  q, k, queue = (np.asarray(x, np.float64) for x in (q, k, queue))
  b, h, _ = q.shape
  total = 0.0
  for n in range(b):
    for i in range(h):
      e = lambda key: np.exp(q[n, i] @ key / t)
      positive = e(k[n, i, i])
      negatives = sum(e(queue[j, i]) for j in range(len(queue)))
      same = sum(e(k[n, i, j]) for j in range(h)) if i and same_image_negatives else positive
      total += -np.log(positive / (same + negatives))
  return total / (b * h)


@pytest.mark.parametrize("devices", [1, 8])
def test_looc_loss_matches_eq2_with_same_instance_negatives(devices):
  q, k, queue = _embeddings(0)
  mesh = parallel.make_mesh(jax.devices()[:devices])
  loss, stats = jax.jit(lambda q, k, z: looc.looc_loss(q, k, z, T, mesh))(q, k, queue)
  np.testing.assert_allclose(loss, _eq2_numpy(q, k, queue, T), rtol=1e-5)
  # The same-instance keys matter: without them (the queue only) the loss is clearly lower.
  assert loss > _eq2_numpy(q, k, queue, T, same_image_negatives=False) + 1e-3
  np.testing.assert_allclose(
      stats["looc/pos_head2"], np.mean(np.sum(q[:, 2] * k[:, 2, 2], -1)), 1e-5
  )
  same = np.mean([q[n, 1] @ k[n, 1, j] for n in range(8) for j in (0, 2)])
  np.testing.assert_allclose(stats["looc/same_head1"], same, rtol=1e-5)


def test_looc_loss_gradient_on_8_devices_equals_one_device():
  q, k, queue = _embeddings(1)

  def grad(devices):
    mesh = parallel.make_mesh(jax.devices()[:devices])
    return jax.jit(jax.grad(lambda q: looc.looc_loss(q, k, queue, T, mesh)[0]))(q)

  np.testing.assert_allclose(grad(8), grad(1), rtol=1e-5, atol=1e-7)


def test_one_head_is_the_moco_loss_bit_for_bit():
  q, k, queue = _embeddings(2, h=1)
  mesh = parallel.make_mesh(jax.devices()[:1])
  c = config_defaults.base_config()
  plain_loss = lambda q, k, z: moco.pair_loss(
      q, k, z, None, AddOns(), c.moco.temperature, mesh, jax.random.key(0), 0, q.shape[0]
  )[0]
  plain = jax.jit(plain_loss)(q[:, 0], k[:, 0, 0], queue[:, 0])
  one = jax.jit(lambda q, k, z: looc.looc_loss(q, k, z, c.moco.temperature, mesh)[0])(q, k, queue)
  assert np.asarray(one).tobytes() == np.asarray(plain).tobytes()


def test_looc_loss_rejects_keys_of_the_wrong_shape():
  q, k, queue = _embeddings(3)
  mesh = parallel.make_mesh(jax.devices()[:1])
  with pytest.raises(ValueError, match=r"\(B, H, H, d\)"):
    looc.looc_loss(q, k[:, :, :2], queue, T, mesh)


@pytest.mark.slow
def test_key_view_i_copies_exactly_augmentation_i_from_the_query():
  spec = photometric.PhotometricSpec(rotation_prob=0.5, texture_prob=0.5)
  groups = ("colour", "rotation", "texture")
  params = step_lib.view_params(jax.random.key(0), 256, spec, groups)
  q, others = params[0], params[1:]
  assert len(others) == 4  # k_0 .. k_3
  for name in photometric.ATOMIC_GROUPS:
    for key in photometric.ATOMIC_GROUPS[name]:
      # k_0 shares nothing with q.
      assert not np.array_equal(others[0][key], q[key]), key
  for i, group in enumerate(groups, start=1):
    for name, keys in photometric.ATOMIC_GROUPS.items():
      for key in keys:
        same = np.array_equal(others[i][key], q[key])
        assert same == (name == group), (group, name, key)
    # Augmentations without a head (blur) are drawn independently for every view.
    assert not np.array_equal(others[i]["sigma"], q["sigma"])


@pytest.mark.slow
def test_rotation_key_view_has_the_query_rotation_on_pixels():
  size, b = 16, 64
  spec = photometric.PhotometricSpec(
      jitter_prob=0.0, grayscale_prob=0.0, blur_prob=0.0, rotation_prob=0.5
  )
  image = np.random.default_rng(0).integers(0, 256, (b, size, size, 3), dtype=np.uint8)
  batch = {f"view{v}": image for v in (1, 2, 3)}
  rng = jax.random.key(3)
  v1, v2, (v3,), _ = step_lib.augment_views(rng, batch, spec, ("rotation",))
  params = step_lib.view_params(rng, b, spec, ("rotation",))
  turns_q, turns_k0 = np.asarray(params[0]["rotation"]), np.asarray(params[1]["rotation"])
  # k_1 = q on every pixel: same image, same rotation, nothing else applied.
  np.testing.assert_array_equal(v3, v1)
  # k_0 is q turned by its own rotation, which differs from q's for many images.
  assert np.mean(turns_q != turns_k0) > 0.3
  for n in range(b):
    turn = (turns_k0[n] - turns_q[n]) % 4
    np.testing.assert_array_equal(v2[n], np.rot90(np.asarray(v1[n]), turn))


@pytest.mark.slow
def test_encoder_heads_and_loocpp_conv5_features():
  c = config_defaults.base_config()
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8, bn_groups=1)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 16, 16, 3)), jnp.float32)
  plain = build_encoder(c.model)
  v_plain = plain.init(jax.random.key(0), x, train=False)
  three = build_encoder(c.model, heads=3)
  v_three = three.init(jax.random.key(0), x, train=False)
  # Extra heads leave the backbone and head 0 as they were: same names, same initial values.
  chex.assert_trees_all_equal(v_plain["params"]["backbone"], v_three["params"]["backbone"])
  chex.assert_trees_all_equal(v_plain["params"]["head"], v_three["params"]["head"])
  out = three.apply(v_three, x, train=False)
  assert out["z_heads"].shape == (2, 3, 8)
  np.testing.assert_array_equal(out["z_heads"][:, 0], out["z"])
  np.testing.assert_allclose(np.linalg.norm(out["z_heads"], axis=-1), 1.0, rtol=1e-5)
  assert out["head_features"].shape == (2, 3 * 8)
  assert not np.allclose(out["z_heads"][:, 1], out["z_heads"][:, 2])

  pp = build_encoder(c.model, heads=2, conv5_heads=True)
  v_pp = pp.init(jax.random.key(0), x, train=False)
  out = pp.apply(v_pp, x, train=False)
  assert "stage4_block1" not in v_pp["params"]["backbone"]
  assert "stage4_block1" in v_pp["params"]["head"]
  conv4, conv5 = 32 * 0.125 * 8, 64 * 0.125 * 8  # channels after conv4 and conv5 (ResNet-18)
  assert out["pooled"].shape == (2, conv4)
  assert out["head_features"].shape == (2, 2 * conv5)
  # Head i's features are head i's own conv5 stage on the shared conv4 map.
  conv5_0 = pp.apply(v_pp, out["feature_map"], False, method=lambda m, f, t: m.head(f, train=t)[0])
  np.testing.assert_allclose(out["head_features"][:, : int(conv5)], conv5_0, rtol=1e-5)


@pytest.mark.parametrize("devices", [1, 8])
def test_per_head_queues_hold_the_ring_order_keys(devices):
  k, heads, d, p = 32, 3, 4, 16
  mesh = parallel.make_mesh(jax.devices()[:devices])
  rng = np.random.default_rng(0)
  ring = rng.normal(size=(k, heads, d)).astype(np.float32)
  queue = jax.device_put(
      queue_lib.to_sharded_layout(ring, devices, p), parallel.batch_sharding(mesh)
  )
  np.testing.assert_array_equal(queue_lib.to_ring_order(np.asarray(queue), devices, p), ring)
  new = rng.normal(size=(p, heads, d)).astype(np.float32)
  out = queue_lib.enqueue(queue, jax.device_put(new, parallel.batch_sharding(mesh)), 1, mesh)
  expected = ring.copy()
  expected[p : 2 * p] = new  # step 1 writes ring rows [P, 2P)
  np.testing.assert_array_equal(queue_lib.to_ring_order(np.asarray(out), devices, p), expected)


def test_extra_views_leave_the_first_two_unchanged():
  images = np.random.default_rng(0).integers(0, 256, (12, 24, 20, 3), dtype=np.uint8)
  source = [{"image": x} for x in images]
  kw = dict(batch_size=4, image_size=16, crop_scale=(0.2, 1.0), seed=3)
  two = pipeline.pretrain_dataset(source, **kw)[0]
  four = pipeline.pretrain_dataset(source, num_views=4, **kw)[0]
  for key in ("view1", "view2", "box1", "box2", "flip1", "flip2"):
    np.testing.assert_array_equal(four[key], two[key])
  assert four["view4"].shape == (4, 16, 16, 3)
  assert not np.array_equal(four["box3"], four["box4"])


def test_rotated_source_rotates_and_labels():
  images = np.random.default_rng(0).integers(0, 256, (64, 8, 8, 3), dtype=np.uint8)
  src = RotatedSource([{"image": x, "shape": 0} for x in images], seed=0)
  assert src.num_classes == {"rotation": 4}
  labels = [int(src[i]["rotation"]) for i in range(64)]
  assert set(labels) == {0, 1, 2, 3}
  for i in range(64):
    np.testing.assert_array_equal(src[i]["image"], np.rot90(images[i], labels[i]))
    assert set(src[i]) == {"image", "rotation"}


def _looc(**fields) -> ml_collections.ConfigDict:
  c = looc_config.get_config(None)
  for block, values in fields.items():
    c[block].update(values)
  return c


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"moco": {"symmetric": True}}, "moco.symmetric"),
        ({"aug": {"rotation_prob": 0.0}}, "never applied"),
        ({"looc": {"augmentations": ("rotation", "rotation")}}, "distinct"),
        ({"looc": {"augmentations": ("flip",)}}, "distinct"),
        ({"ifm": {"enabled": True}}, "switch off ifm"),
        ({"looc": {"enabled": False}}, "probe.features"),
    ],
)
def test_config_check_rejects_what_looc_cannot_do(fields, message):
  c = loocpp.get_config(None) if "looc" in fields and "enabled" in fields["looc"] else _looc()
  for block, values in fields.items():
    c[block].update(values)
  with pytest.raises(config_check.ConfigError, match=message):
    config_check.validate(c)


def test_presets_are_valid_and_have_the_paper_settings():
  for module in (looc_config, loocpp):
    for preset in (None, "imagenet100"):
      config_check.validate(module.get_config(preset), reads_data=False)
  c = looc_config.get_config("imagenet100")
  assert c.moco.queue_size == 16384 and c.model.head_hidden_dim == 2048
  assert c.optim.epochs == 500 and tuple(c.optim.decay_epochs) == (300, 400)
  assert c.optim.schedule == "step" and c.optim.batch_size == 256


def _one_step(c, batch, devices=1):
  """(state after, metrics) of one compiled train step of config c on `devices` devices."""
  mesh = parallel.make_mesh(jax.devices()[:devices])
  encoder, tx, schedule, make_state, _ = train.build(c, 4 * c.optim.batch_size, mesh)
  state = make_state()
  fn = step_lib.jit_train_step(
      step_lib.make_train_step(c, encoder, tx, schedule, mesh, 4),
      parallel.state_sharding(state, mesh),
      parallel.batch_sharding(mesh),
  )
  return jax.device_get(fn(state, parallel.global_batch(batch, mesh)))


@pytest.mark.slow
def test_looc_without_augmentations_is_the_moco_step_bit_for_bit():
  b, s = 8, 16

  def small(c):
    c.data.image_size = s
    c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8)
    c.moco.queue_size = 32
    c.optim.update(batch_size=b, epochs=2)
    return c

  views = np.random.default_rng(0).integers(0, 256, (2, b, s, s, 3), dtype=np.uint8)
  batch = {"view1": views[0], "view2": views[1]}

  one_head = small(_looc(looc={"augmentations": ()}, aug={"rotation_prob": 0.0}))
  (after, metrics), (ref, ref_metrics) = (
      _one_step(one_head, batch),
      _one_step(small(mocov2.get_config(None)), batch),
  )
  assert metrics["loss"].tobytes() == ref_metrics["loss"].tobytes()
  chex.assert_trees_all_equal(after.params, ref.params)
  chex.assert_trees_all_equal(after.target_batch_stats, ref.target_batch_stats)
  np.testing.assert_array_equal(after.queue[:, 0], ref.queue)


@pytest.mark.slow
def test_looc_step_on_8_devices_equals_one_device():
  b, s = 8, 16
  c = _looc(looc={"augmentations": ("colour", "rotation")}, model={"bn_mode": "local"})
  c.data.image_size = s
  c.model.update(depth=10, width_multiplier=0.125, head_hidden_dim=16, head_out_dim=8, bn_groups=8)
  c.moco.queue_size = 32
  c.optim.update(batch_size=b, epochs=2)
  views = np.random.default_rng(1).integers(0, 256, (4, b, s, s, 3), dtype=np.uint8)
  batch = {f"view{v + 1}": views[v] for v in range(4)}

  def step(devices):
    after, metrics = _one_step(c, batch, devices)
    return after, metrics, queue_lib.to_ring_order(np.asarray(after.queue), devices, b)

  one, m1, q1 = step(1)
  eight, m8, q8 = step(8)
  np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
  for key in ("looc/loss_head1", "looc/same_head2"):
    np.testing.assert_allclose(m8[key], m1[key], rtol=1e-5)
  np.testing.assert_allclose(q8, q1, rtol=1e-5, atol=1e-6)
  for a, z in zip(jax.tree.leaves(one.params), jax.tree.leaves(eight.params)):
    np.testing.assert_allclose(z, a, rtol=1e-4, atol=max(1e-6, 1e-4 * np.abs(a).max()))


def test_probe_refuses_head_features_of_a_one_head_run(tmp_path):
  run_config.save_start(mocov2.get_config(None), str(tmp_path), 0)
  with pytest.raises(UsageError, match="one head"):
    registry.evaluate(str(tmp_path), ("linear_probe",), features="heads")
