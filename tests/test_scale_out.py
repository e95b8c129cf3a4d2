"""One device against eight: the train step, the sharded queue and the batch-norm modes.

The 8 devices are simulated CPU devices (tests/conftest.py). The references are
the same computation on one device, and per-device forwards of each device's rows.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax import train
from cl_jax import train_step as step_lib
from cl_jax.losses import memory_queue as queue_lib
from cl_jax.objectives import forward
from cl_jax.runtime import parallel
from cl_jax.runtime.errors import UsageError
from configs import mocov2_patchns

pytestmark = pytest.mark.slow  # subprocess runs or compiled train steps: minutes

B, S, K = 16, 16, 64


def _config(bn_mode: str, groups: int):
  c = mocov2_patchns.get_config(None)
  c.data.image_size = S
  # The paper's head (no BN): a head BN over this test's groups of 2 rows amplifies
  # float32 summation-order noise past the tolerance; head BN across devices is
  # checked with the SimCLR and BYOL steps.
  c.model.update(
      depth=10,
      width_multiplier=0.125,
      head_hidden_dim=16,
      head_out_dim=8,
      bn_mode=bn_mode,
      bn_groups=groups,
      head_bn=False,
  )
  c.moco.update(queue_size=K, momentum=0.9)
  c.nonsemantic.update(enabled=True, num_ns=2, patch_min=2, patch_max=6)
  c.optim.update(batch_size=B, epochs=1)
  return c


@pytest.fixture(scope="module")
def host_batch():
  rng = np.random.default_rng(0)
  return {v: rng.integers(0, 256, (B, S, S, 3), dtype=np.uint8) for v in ("view1", "view2")}


def _one_step(config, host_batch, devices: int):
  mesh = parallel.make_mesh(jax.devices()[:devices])
  encoder, tx, schedule, make_state, _ = train.build(config, 4 * B, mesh)
  state = make_state()
  before = jax.device_get(state)
  train_step = step_lib.make_train_step(config, encoder, tx, schedule, mesh, 4)
  step = step_lib.jit_train_step(
      train_step, parallel.state_sharding(state, mesh), parallel.batch_sharding(mesh)
  )
  after, metrics = step(state, jax.device_put(host_batch, parallel.batch_sharding(mesh)))
  return before, after, jax.device_get(metrics)


def _close(a, b, rtol=1e-5, atol=1e-7):
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol),
      a,
      b,
  )


@pytest.mark.parametrize(
    "bn_mode,groups", [("sync", 1), ("local", 8), ("shuffle", 8), ("shuffle_stats", 4)]
)
def test_eight_devices_take_the_one_device_step(bn_mode, groups, host_batch):
  # MoCo-v2 + patch NS negatives on the same global batch: same loss, statistics, updated
  # parameters (online and EMA), batch-norm statistics and queue (compared slot by slot).
  config = _config(bn_mode, groups)
  before1, one, m1 = _one_step(config, host_batch, 1)
  before8, eight, m8 = _one_step(config, host_batch, 8)
  p = step_lib.keys_per_step(config)
  # The same initial state, the queue in each run's layout.
  _close(before1.params, before8.params, rtol=0, atol=0)
  np.testing.assert_allclose(
      queue_lib.to_ring_order(before8.queue, 8, p), before1.queue, rtol=1e-6, atol=1e-7
  )
  assert set(m1) == set(m8)
  assert {n for n in m1 if not n.startswith("grad_norm/")} == {
      "loss",
      "lr",
      "pos_mean",
      "neg_mean",
      "neg_var",
      "ns_mean",
      "health/std",
      "health/std_sqrt_d",
      "health/rank",
      "health/align",
      "health/uniform",
  }
  # One gradient norm per layer, a module holding parameters, counted by hand: ResNet-10's
  # stem conv and BN, 2 convs and 2 BNs in each of 4 blocks, 3 projection convs and BNs (24),
  # and the head's 2 dense layers (no head BN).
  assert sum(n.startswith("grad_norm/") for n in m1) == 24 + 2
  for name in m1:
    np.testing.assert_allclose(m8[name], m1[name], rtol=1e-5, atol=1e-7, err_msg=name)
  # With shuffle-BN each device encodes its share of the permuted keys, so the keys' sums run
  # in another order than on one device: the updated parameters agree to float32 rounding.
  _close(eight.params, one.params, atol=1e-6)
  _close(eight.target_params, one.target_params, atol=1e-6)
  _close(eight.batch_stats, one.batch_stats)
  _close(eight.target_batch_stats, one.target_batch_stats)
  # The momentum buffer is the gradient itself, a sum over the batch: summed in another
  # order its near-zero entries differ by float32 rounding, so each array is compared
  # relative to its largest entry.
  jax.tree.map(
      lambda x, y: np.testing.assert_array_less(
          np.abs(np.asarray(x) - y), 1e-5 * np.abs(y).max() + 1e-12
      ),
      eight.opt_state,
      one.opt_state,
  )
  np.testing.assert_allclose(
      queue_lib.to_ring_order(eight.queue, 8, p), one.queue, rtol=1e-5, atol=1e-6
  )
  # The step's keys went into slots [0, P) of the ring; the parameters moved.
  assert not np.allclose(one.queue[:p], before1.queue[:p])
  np.testing.assert_array_equal(one.queue[p:], before1.queue[p:])
  assert not all(
      np.allclose(a, b)
      for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(before1.params))
  )
  # Each device holds K/8 rows of the queue.
  shards = eight.queue.addressable_shards
  assert len(shards) == 8
  assert all(s.data.shape == (K // 8, config.model.head_out_dim) for s in shards)
  assert all(s.data.nbytes == eight.queue.nbytes // 8 for s in shards)


def _encoder_and_variables(groups, dtype="float32"):
  config = _config("local", groups)
  config.model.dtype = dtype
  mesh = parallel.make_mesh(jax.devices()[:1])
  built = train.build(config, 4 * B, mesh)
  encoder, make_state = built.encoder, built.make_state
  state = jax.device_get(make_state())
  return encoder, {"params": state.params, "batch_stats": state.batch_stats}


def _forward(encoder, variables, x):
  out, mutated = encoder.apply(variables, x, train=True, mutable=["batch_stats"])
  return out["z"], mutated["batch_stats"]


def test_local_bn_statistics_are_per_device(host_batch):
  # bn_mode=local with 8 groups on 8 devices: device i's outputs equal a forward of
  # device i's rows alone, and the running statistics are the mean of the 8 per-device
  # updates. The normalisation needs no cross-device traffic (one all-reduce, for the
  # running statistics, against about one per batch-norm layer under sync).
  x = jnp.asarray(host_batch["view1"], jnp.float32) / 255.0
  encoder8, variables = _encoder_and_variables(8)
  encoder1 = _encoder_and_variables(1)[0]
  mesh = parallel.make_mesh()
  xs = jax.device_put(x, parallel.batch_sharding(mesh))
  fwd8 = jax.jit(lambda v, x: _forward(encoder8, v, x))
  fwd1 = jax.jit(lambda v, x: _forward(encoder1, v, x))
  z, stats = fwd8(variables, xs)
  refs = [fwd1(variables, x[i * B // 8 : (i + 1) * B // 8]) for i in range(8)]
  for shard in z.addressable_shards:
    i = shard.index[0].start // (B // 8)
    np.testing.assert_allclose(shard.data, refs[i][0], rtol=1e-5, atol=1e-6)
  mean_stats = jax.tree.map(lambda *s: np.mean(s, axis=0), *[r[1] for r in refs])
  _close(stats, mean_stats, rtol=1e-5, atol=1e-6)

  def all_reduces(fn):
    return len(re.findall(r" all-reduce(-start)?\(", fn.lower(variables, xs).compile().as_text()))

  # Under sync, one all-reduce of both sums per layer; XLA combines the 3 projection
  # shortcuts' with their blocks' first BN, which reads the same input.
  layers = len(jax.tree.leaves(variables["batch_stats"])) // 2
  assert all_reduces(fwd8) <= 1 < layers - 3 <= all_reduces(fwd1)


@pytest.mark.parametrize("mode", ["shuffle", "shuffle_stats"])
@pytest.mark.parametrize("groups", [8, 4])
def test_shuffle_bn_normalises_keys_with_a_random_group(groups, mode, host_batch):
  # Shuffle-BN across 8 devices: the key batch is permuted over the whole global batch,
  # each group of B/G permuted rows is normalised on its own, and the keys are put back
  # in order ("shuffle"), or each BN takes its statistics over the rows of those groups
  # where they lie ("shuffle_stats"). Reference: the same permutation, then G separate
  # one-group forwards on one device.
  x = jnp.asarray(host_batch["view2"], jnp.float32) / 255.0
  encoder, variables = _encoder_and_variables(groups)
  encoder1 = _encoder_and_variables(1)[0]
  mesh = parallel.make_mesh()
  rng = jax.random.key(3)
  keys, stats = jax.jit(
      lambda v, x: forward.encode_keys(encoder, v["params"], v["batch_stats"], x, rng, mode)
  )(variables, jax.device_put(x, parallel.batch_sharding(mesh)))
  perm = np.asarray(jax.random.permutation(rng, B))
  shuffled = x[perm]
  size = B // groups
  fwd1 = jax.jit(lambda v, x: _forward(encoder1, v, x))
  refs = [fwd1(variables, shuffled[g * size : (g + 1) * size]) for g in range(groups)]
  want = np.empty((B, keys.shape[1]), np.float32)
  want[perm] = np.concatenate([r[0] for r in refs])
  np.testing.assert_allclose(keys, want, rtol=1e-5, atol=1e-6)
  _close(
      stats,
      jax.tree.map(lambda *s: np.mean(s, axis=0), *[r[1] for r in refs]),
      rtol=1e-5,
      atol=1e-6,
  )
  # Not the unshuffled statistics: some key differs from its unshuffled value.
  plain = np.concatenate([fwd1(variables, x[g * size : (g + 1) * size])[0] for g in range(groups)])
  assert np.abs(np.asarray(keys) - plain).max() > 1e-3


def test_shuffle_stats_moves_no_image_and_reduces_group_statistics(host_batch):
  # The same key forward on 8 devices with "shuffle_stats": the compiled program has no
  # gather, all-to-all or permute across devices, only all-reduces whose arrays hold at most
  # G x 2C values (a group's sums per channel; C at most the head's or the last stage's
  # width), at least one per batch-norm layer; "shuffle" gathers the images.
  groups = 4
  x = jnp.asarray(host_batch["view2"], jnp.float32) / 255.0
  encoder, variables = _encoder_and_variables(groups)
  mesh = parallel.make_mesh()
  xs = jax.device_put(x, parallel.batch_sharding(mesh))
  layers = len(jax.tree.leaves(variables["batch_stats"])) // 2
  widest = max(a.shape[0] for a in jax.tree.leaves(variables["batch_stats"]))

  def compiled(mode):
    fn = jax.jit(
        lambda v, x: forward.encode_keys(
            encoder, v["params"], v["batch_stats"], x, jax.random.key(3), mode, mesh=mesh
        )
    )
    return fn.lower(variables, xs).compile().as_text()

  text = compiled("shuffle_stats")
  moves = r"= \S+ (all-gather|all-to-all|collective-permute)(-start)?\("
  assert not re.search(moves, text)
  # Each all-reduce's result: one array, or a tuple of those XLA combined.
  results = re.findall(r"= (.+?) all-reduce(?:-start)?\(", text)
  arrays = [dims for r in results for dims in re.findall(r"\[([\d,]*)\]", r)]
  assert len(arrays) >= layers
  for dims in arrays:
    assert np.prod([int(d) for d in dims.split(",") if d]) <= groups * 2 * widest, dims
  assert re.search(moves, compiled("shuffle"))


def test_shuffle_stats_takes_the_shuffle_step(host_batch):
  # One MoCo-v2 + patch NS step on one device in each mode, same state, batch and PRNG
  # keys: the same loss, statistics and updated state, to float32 rounding.
  _, one, m1 = _one_step(_config("shuffle", 4), host_batch, 1)
  _, other, m2 = _one_step(_config("shuffle_stats", 4), host_batch, 1)
  for name in m1:
    np.testing.assert_allclose(m2[name], m1[name], rtol=1e-5, atol=1e-7, err_msg=name)
  _close(other.params, one.params, atol=1e-6)
  _close(other.target_batch_stats, one.target_batch_stats)
  np.testing.assert_allclose(other.queue, one.queue, rtol=1e-5, atol=1e-6)


def test_shuffle_bn_permutes_images_in_the_compute_dtype(host_batch):
  # A bfloat16 encoder's shuffled key forward on 8 devices: the random gather of the images,
  # which becomes a collective across devices, reads bfloat16 images, not float32 ones
  # (twice the bytes). Checked in the lowered program: XLA's CPU backend widens bfloat16
  # gathers and collectives to float32 itself, accelerators keep them.
  x = jnp.asarray(host_batch["view2"], jnp.float32) / 255.0
  encoder, variables = _encoder_and_variables(8, dtype="bfloat16")
  mesh = parallel.make_mesh()
  fn = jax.jit(
      lambda v, x: forward.encode_keys(
          encoder, v["params"], v["batch_stats"], x, jax.random.key(3), "shuffle", mesh=mesh
      )
  )
  text = fn.lower(variables, jax.device_put(x, parallel.batch_sharding(mesh))).as_text()
  images = re.findall(rf'"stablehlo.gather"\(.*-> tensor<{B}x{S}x{S}x3x(\w+)>', text)
  assert images == ["bf16"], images


def test_a_run_resumed_on_fewer_devices_keeps_every_key_in_its_slot():
  # A queue written by 8 devices, re-laid out for 2: the ring order (slot by slot) is
  # unchanged and each of the 2 devices now holds K/2 rows.
  config = _config("shuffle", 8)
  p = step_lib.keys_per_step(config)
  mesh8, mesh2 = parallel.make_mesh(), parallel.make_mesh(jax.devices()[:2])
  state = train.build(config, 4 * B, mesh8).make_state()
  keys = jnp.arange(p * 4, dtype=jnp.float32).reshape(4, p)[:, :, None] * jnp.ones(8)
  for t in range(3):  # three steps of distinct keys over the random initial queue
    state = state.replace(
        queue=jax.jit(queue_lib.enqueue, static_argnums=3)(
            state.queue, jax.device_put(keys[t], parallel.batch_sharding(mesh8)), t, mesh8
        )
    )
  # Restoring into the 2-device template puts the rows, still in the 8-shard layout, on 2.
  restored = state.replace(queue=jax.device_put(state.queue, parallel.batch_sharding(mesh2)))
  moved = queue_lib.relayout(restored, {"queue_shards": 8, "keys_per_step": p}, mesh2, p)
  np.testing.assert_array_equal(
      queue_lib.to_ring_order(moved.queue, 2, p), queue_lib.to_ring_order(state.queue, 8, p)
  )
  assert [s.data.shape[0] for s in moved.queue.addressable_shards] == [K // 2, K // 2]
  with pytest.raises(UsageError, match="keys per step"):
    queue_lib.relayout(restored, {"queue_shards": 8, "keys_per_step": 2 * p}, mesh2, p)
