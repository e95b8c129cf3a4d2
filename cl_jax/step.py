"""The pure MoCo train step: train_step(state, batch) -> (state, metrics).

One step (He et al. 2020, Alg. 1, with the add-ons of the config):
  1. photometric augmentation of both host-cropped views, on the device;
  2. EMA update of the key encoder, theta_k <- m theta_k + (1 - m) theta_q;
  3. keys of the other view (and of the NS images) from the key encoder,
     without gradient, under shuffle-BN when model.bn_mode = "shuffle";
  4. loss and gradient of the query encoder, SGD update;
  5. the step's keys replace the oldest keys of the queue.
All randomness comes from fold_in(state.rng, state.step), so a resumed run
repeats the same step exactly.

The step is written for the global batch and jitted over the device mesh: the
batch and the queue's rows are sharded over the `data` axis, the rest of the
state is replicated, and XLA inserts the gradient all-reduce. Per-device code
(the contrast against each device's queue shard, the enqueue) runs under
jax.shard_map. Random numbers are drawn for the global batch with the
sharding-independent threefry PRNG, so 1 device and N devices compute the same
step.
"""
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh

from cl_jax import queue as queue_lib
from cl_jax.addons import nonsemantic
from cl_jax.data import photometric
from cl_jax.methods import moco
from cl_jax.state import TrainState


def photometric_spec(aug: ml_collections.ConfigDict) -> photometric.PhotometricSpec:
  """The PhotometricSpec of the `aug` config block."""
  return photometric.PhotometricSpec(
      jitter_prob=aug.jitter_prob, brightness=aug.brightness, contrast=aug.contrast,
      saturation=aug.saturation, hue=aug.hue, grayscale_prob=aug.grayscale_prob,
      blur_prob=aug.blur_prob, blur_sigma=tuple(aug.blur_sigma),
      solarize_prob=aug.solarize_prob)


def encode_keys(encoder, params, batch_stats, images: jax.Array, rng: jax.Array,
                shuffle: bool):
  """Key-encoder features of `images`, in train-mode batch norm.

  With shuffle=True the batch is permuted before the encoder and un-permuted
  after it (shuffle-BN, He et al. 2020 Sec. 3.3): with grouped batch norm,
  key i is normalised with the statistics of a random group of other images,
  not with those of the group that holds query i.

  Args:
    images: (N, S, S, 3) normalised views.
  Returns:
    ((N, d) unit keys, updated batch_stats).
  """
  if shuffle:
    perm = jax.random.permutation(rng, images.shape[0])
    images = images[perm]
  out, mutated = encoder.apply({"params": params, "batch_stats": batch_stats}, images,
                               train=True, mutable=["batch_stats"])
  z = out["z"]
  if shuffle:
    z = jnp.zeros_like(z).at[perm].set(z)
  return jax.lax.stop_gradient(z), mutated["batch_stats"]


def keys_per_step(config: ml_collections.ConfigDict) -> int:
  """P, the keys enqueued per step: the global batch, twice when symmetric."""
  return config.optim.batch_size * (2 if config.moco.symmetric else 1)


def layer_grad_norms(grads) -> dict[str, jax.Array]:
  """Per-layer gradient L2 norms, {"grad_norm/<module path>": ||g||_2} (Zhu et al. 2021,
  App. A: the gradient-norm landscape). A layer is a module that holds parameters
  directly (a conv with its kernel, a batch norm with scale and bias); its norm is
  taken over all of them together. Keys come in the parameter tree's sorted order;
  cl_jax.viz.landscape puts them back in network order."""
  sums: dict[str, jax.Array] = {}
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    layer = "/".join(str(getattr(p, "key", p)) for p in path[:-1])
    sums[layer] = sums.get(layer, 0.0) + jnp.sum(jnp.square(g.astype(jnp.float32)))
  return {f"grad_norm/{layer}": jnp.sqrt(total) for layer, total in sums.items()}


def make_train_step(config: ml_collections.ConfigDict, encoder,
                    tx: optax.GradientTransformation, schedule: optax.Schedule, mesh: Mesh,
                    steps_per_epoch: int):
  """Build the jit-able train_step(state, batch) for `config` on `mesh`.

  steps_per_epoch places epoch-based switches (ft.start_epoch) on the step axis.

  batch: view1, view2 (B, S, S, 3) uint8 host-cropped views (other entries of
  the host batch are ignored). metrics: loss, lr, the score statistics of
  cl_jax.methods.moco.moco_loss and the per-layer gradient norms of
  layer_grad_norms, float32 scalars.
  """
  spec = photometric_spec(config.aug)
  ns = config.nonsemantic
  shuffle = config.model.bn_mode == "shuffle"
  m = config.moco.momentum
  ft_start = config.ft.start_epoch * steps_per_epoch
  num_keys = keys_per_step(config)

  def ns_keys(target_params, target_bs, views, rng):
    r_patch, r_shuffle = jax.random.split(rng)
    images = nonsemantic.patch_negatives(r_patch, views, ns.num_ns, ns.patch_min, ns.patch_max)
    flat = images.reshape((-1,) + views.shape[1:])
    t, _ = encode_keys(encoder, target_params, target_bs, flat, r_shuffle, shuffle)
    return t.reshape(views.shape[0], ns.num_ns, -1)

  def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    r_aug1, r_aug2, r_key, r_ns, r_ft = jax.random.split(rng, 5)
    v1, _ = photometric.augment_batch(r_aug1, batch["view1"], spec)
    v2, _ = photometric.augment_batch(r_aug2, batch["view2"], spec)
    pairs = [(v1, v2), (v2, v1)] if config.moco.symmetric else [(v1, v2)]

    target_params = optax.incremental_update(state.params, state.target_params, 1.0 - m)
    target_bs = state.target_batch_stats
    keys, ns_feats = [], []
    for i, (vq, vk) in enumerate(pairs):
      k, target_bs = encode_keys(encoder, target_params, target_bs, vk,
                                 jax.random.fold_in(r_key, i), shuffle)
      keys.append(k)
      ns_feats.append(ns_keys(target_params, target_bs, vq, jax.random.fold_in(r_ns, i))
                      if ns.enabled else None)

    def loss_fn(params):
      bs = state.batch_stats
      losses, stats = [], []
      for (vq, _), k, t in zip(pairs, keys, ns_feats):
        out, mutated = encoder.apply({"params": params, "batch_stats": bs}, vq, train=True,
                                     mutable=["batch_stats"])
        bs = mutated["batch_stats"]
        loss, st = moco.moco_loss(
            out["z"], k, state.queue, t, config.moco, ns, config.ifm, mesh,
            config.train.score_queries, ft_cfg=config.ft,
            ft_rng=jax.random.fold_in(r_ft, len(losses)), ft_active=state.step >= ft_start,
            keys_per_step=num_keys)
        losses.append(loss)
        stats.append(st)
      mean = lambda xs: sum(xs) / len(xs)
      return mean(losses), (bs, jax.tree.map(lambda *xs: mean(xs), *stats))

    (loss, (batch_stats, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # The keys of one example stay adjacent, (B, V, d) -> (B * V, d), so the
    # rows a device holds stay on that device.
    new_queue = queue_lib.enqueue(state.queue, jnp.stack(keys, axis=1).reshape(-1, k.shape[-1]),
                                  state.step, mesh)

    new_state = state.replace(
        step=state.step + 1, params=params, batch_stats=batch_stats,
        target_params=target_params, target_batch_stats=target_bs, opt_state=opt_state,
        queue=new_queue)
    metrics = {"loss": loss, "lr": jnp.asarray(schedule(state.step), jnp.float32), **stats,
               **layer_grad_norms(grads)}
    return new_state, metrics

  return train_step


def jit_train_step(train_step, state_sharding, batch_sharding):
  """jit over the mesh with the state donated: its buffers are reused for the new state.

  state_sharding: cl_jax.parallel.state_sharding of the state; batch_sharding:
  the batch's rows over `data`. Metrics come back replicated.
  """
  return jax.jit(train_step, in_shardings=(state_sharding, batch_sharding),
                 out_shardings=(state_sharding, None), donate_argnums=(0,))
