"""The MoCo step (He et al. 2020, Alg. 1; Chen et al. 2020 for v2), with its add-ons.

1. EMA update of the key encoder, theta_k <- m theta_k + (1 - m) theta_q;
2. keys of the other view (and of the NS images) from the key encoder,
   without gradient, under shuffle-BN when model.bn_mode is "shuffle" or "shuffle_stats";
3. loss and gradient of the query encoder: pair_loss composes MoCo's contrast
   (cl_jax.losses.moco) with the add-ons (cl_jax.addons);
4. the step's keys replace the oldest keys of the queue.
"""

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax.addons.from_config import AddOns
from cl_jax.losses import memory_queue as queue_lib
from cl_jax.losses import moco
from cl_jax.objectives import forward
from cl_jax.objectives.forward import Views, encode
from cl_jax.objectives.health import embedding_health
from cl_jax.objectives.method import Method
from cl_jax.runtime.config_fields import boolean, fail, get, integer, number
from cl_jax.state import TrainState


def keys_per_step(config: ml_collections.ConfigDict) -> int:
  """P, the keys enqueued per step: the global batch, twice when symmetric."""
  return config.optim.batch_size * (2 if config.moco.symmetric else 1)


def pair_loss(
    q: jax.Array,
    k: jax.Array,
    queue: jax.Array,
    t: jax.Array | None,
    addons: AddOns,
    temperature: float,
    mesh: Mesh,
    rng: jax.Array,
    step: jax.Array,
    num_keys: int,
    score_queries: int = 0,
) -> tuple[jax.Array, dict]:
  """The loss of one (query view, key view) pair with the run's add-ons, and its statistics.

  1. feature transformation: q, k and the negative sets transformed (Zhu et al. 2021,
     Sec. 4; FeatureTransform.on_queue);
  2. MoCo's contrast of the queries against the queue (losses.moco.moco_contrast);
  3. non-semantic negatives: each query's NS keys appended (Ge et al. 2021, Eq. 1);
  4. the contrast's loss, InfoNCE or with IFM (Robinson et al. 2021, Eq. 2)
     (AddOns.contrast_loss).

  Args:
    q: (B, d) unit queries with gradient; k: (B, d) unit keys without.
    queue: (K, d) unit queued keys, rows sharded over the mesh's `data` axis.
    t: (B, M, d) unit NS keys without gradient, or None without NS negatives.
    addons: the run's add-ons.
    temperature: T.
    mesh: the device mesh.
    rng: PRNG key of the feature transformation's coefficients.
    step: () the step (the transformation's start).
    num_keys: P of the queue layout (keys_per_step).
    score_queries: statistics over the first n queries (0: all).

  Returns:
    (loss, stats): contrast_stats on the transformed features (pos_mean, neg_mean, neg_var
    over all the negatives, 2K of them for the union; ns_mean with NS).
  """
  k = jax.lax.stop_gradient(k)
  negatives, active = [(queue, None)], True
  if addons.ft is not None:
    active = addons.ft.active(step)
    q, k, negatives = addons.ft.on_queue(q, k, queue, rng, active, mesh, num_keys)
  c = moco.moco_contrast(q, k, negatives, temperature, mesh, active)
  return addons.contrast_step(c, q, t, temperature, score_queries or q.shape[0])


def updates(
    state: TrainState, batch_stats, target_params, target_batch_stats, new_keys: jax.Array, mesh
) -> dict:
  """The state updates of a step with a momentum encoder and a queue: batch_stats, the EMA
  target and the queue with new_keys (P, ...) in place of its oldest keys."""
  return dict(
      forward.momentum_updates(batch_stats, target_params, target_batch_stats),
      queue=queue_lib.enqueue(state.queue, new_keys, state.step, mesh),
  )


def make_objective(
    config: ml_collections.ConfigDict, encoder, mesh: Mesh, addons: AddOns, steps_per_epoch: int
):
  """objective(state, views) -> (loss, grads, state updates, stats) of one MoCo step.

  The updates are the new batch_stats, target_params, target_batch_stats and
  queue; stats are pair_loss's (the mean over the pairs when symmetric) and
  cl_jax.objectives.health.embedding_health of the first pair's queries and keys,
  before any feature transformation. With DICR (symmetric MoCo only) the loss
  adds lambda L_DICR of the two views' online outputs.
  """
  del steps_per_epoch

  shuffle = forward.shuffle_mode(config)
  temperature, num_keys = config.moco.temperature, keys_per_step(config)
  ns = addons.nonsemantic

  def objective(state: TrainState, x: Views):
    pairs = [(x.v1, x.v2), (x.v2, x.v1)] if config.moco.symmetric else [(x.v1, x.v2)]
    target_params = forward.momentum_target(state, config.moco.momentum)
    keys, target_bs = forward.target_keys(
        encoder,
        target_params,
        state.target_batch_stats,
        [vk for _, vk in pairs],
        x.r_key,
        shuffle,
        mesh,
    )
    ns_keys = forward.ns_keys(
        encoder, target_params, target_bs, [vq for vq, _ in pairs], x, ns, shuffle, mesh
    )

    def loss_fn(params):
      params, (ks, ts) = forward.keys_first(params, (keys, ns_keys))
      bs, losses, stats, outs = state.batch_stats, [], [], []
      for i, ((vq, _), k, t) in enumerate(zip(pairs, ks, ts)):
        out, bs = encode(encoder, params, bs, vq)
        outs.append(out)
        loss, st = pair_loss(
            out["z"],
            k,
            state.queue,
            t,
            addons,
            temperature,
            mesh,
            jax.random.fold_in(x.r_ft, i),
            state.step,
            num_keys,
            config.train.score_queries,
        )
        losses.append(loss)
        stats.append(st)
      mean = lambda xs: sum(xs) / len(xs)
      loss, stats = mean(losses), jax.tree.map(lambda *xs: mean(xs), *stats)
      stats = {**stats, **embedding_health(outs[0]["z"], ks[0])}
      return forward.regularised(
          addons.dicr, loss, stats, bs, encoder, params, state.step, outs[:2], x.regions
      )

    loss, batch_stats, stats, grads = forward.value_and_grad(loss_fn, state.params)
    # The keys of one example stay adjacent, (B, V, d) -> (B * V, d), so the
    # rows a device holds stay on that device.
    new_keys = jnp.stack(keys, axis=1).reshape(-1, keys[0].shape[-1])
    return loss, grads, updates(state, batch_stats, target_params, target_bs, new_keys, mesh), stats

  return objective


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.queue_size = 2048
  block.temperature = 0.2
  block.momentum = 0.99
  block.symmetric = False
  return block


def check(c) -> None:
  integer(c, "moco.queue_size", 1)
  number(c, "moco.temperature", 0.0, None, lo_open=True)
  number(c, "moco.momentum", 0.0, 1.0)
  boolean(c, "moco.symmetric")


def check_queue(c) -> None:
  """The queue holds whole steps of keys (cl_jax.losses.memory_queue's layout), and two steps
  of them for transformed negatives, which pair keys of different steps."""
  queue, batch = get(c, "moco.queue_size"), get(c, "optim.batch_size")
  per_step = batch * (2 if get(c, "moco.symmetric") else 1)
  if queue % per_step:
    fail(
        "moco.queue_size",
        queue,
        f"must be divisible by the keys enqueued per step ({per_step} = global batch"
        f"{' x 2 views (symmetric)' if per_step > batch else ''})",
    )
  if queue < per_step:
    fail("moco.queue_size", queue, f"must be at least the keys per step ({per_step})")
  if get(c, "ft.enabled") and get(c, "ft.negative") in ("interpolate", "extrapolate"):
    if queue < 2 * per_step:
      fail(
          "moco.queue_size",
          queue,
          f"negative transforms pair keys of different steps: the "
          f"queue must hold at least 2 steps of keys ({2 * per_step})",
      )


def rules(c) -> None:
  """The queue (check_queue); DICR takes both views through the query encoder."""
  check_queue(c)
  if get(c, "dicr.enabled") and not get(c, "moco.symmetric"):
    fail(
        "moco.symmetric",
        False,
        "DICR needs both views through the query encoder, as in the paper's symmetric MoCo "
        "(its footnote 6); set moco.symmetric = True",
    )


METHOD = Method(
    "moco",
    make_objective,
    queue=True,
    target=True,
    shuffle_bn=True,
    negatives="queue",
    addons=("nonsemantic", "ft", "ifm", "dicr"),
    block="moco",
    defaults=defaults,
    check=check,
    rules=rules,
    config_file="configs/mocov2.py",
    base_component=lambda config: "moco_symmetric" if config.moco.symmetric else "moco",
)
