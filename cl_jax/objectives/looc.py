"""The LooC step (Xiao et al. 2021, Sec. 3-4) on MoCo v2.

1. EMA update of the key encoder, as MoCo's;
2. the key encoder embeds every key view k_0..k_n in every head (no gradient,
   shuffle-BN per view when model.bn_mode is "shuffle" or "shuffle_stats"): z_i^{k_j} for all i, j;
3. loss and gradient of the query encoder, cl_jax.losses.looc.looc_loss (Eq. 2),
   from one forward pass of the query view through the backbone and all heads;
4. head i's queue receives z_i^{k_i}, the key that is head i's positive (k_0 for
   head 0); the H queues share one (K, H, d) array and advance together.
"""

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from cl_jax.addons.from_config import AddOns
from cl_jax.losses import looc
from cl_jax.objectives import forward, moco
from cl_jax.objectives.forward import Views, encode
from cl_jax.objectives.health import embedding_health
from cl_jax.objectives.method import Method
from cl_jax.runtime.config_fields import boolean, fail, get
from cl_jax.state import TrainState

# Atomic augmentations that may have a head and key view of their own (Sec. 4), and the
# photometric switches that apply each.
AUGMENTATIONS = {
    "colour": ("aug.jitter_prob", "aug.grayscale_prob"),
    "rotation": ("aug.rotation_prob",),
    "texture": ("aug.texture_prob",),
}


def key_views(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The atomic augmentations with their own head and key view (none without LooC)."""
  return tuple(config.looc.augmentations) if config.looc.enabled else ()


def head_embeddings(out: dict) -> jax.Array:
  """(B, H, d) unit embeddings of every head from an encoder output (one head: z)."""
  return out["z_heads"] if "z_heads" in out else out["z"][:, None]


def make_objective(
    config: ml_collections.ConfigDict, encoder, mesh: Mesh, addons: AddOns, steps_per_epoch: int
):
  """objective(state, views) -> (loss, grads, state updates, stats) of one LooC step.

  The views are x.v1 (query) and the keys x.v2 (k_0) followed by x.extra
  (k_1..k_n). stats: looc_loss's, and cl_jax.objectives.health.embedding_health of head 0's
  queries and k_0 keys.
  """
  del addons, steps_per_epoch  # LooC composes no add-on

  shuffle = forward.shuffle_mode(config)

  def objective(state: TrainState, x: Views):
    target_params = forward.momentum_target(state, config.moco.momentum)
    keys, target_bs = forward.target_keys(
        encoder,
        target_params,
        state.target_batch_stats,
        [x.v2, *x.extra],
        x.r_key,
        shuffle,
        mesh,
        output=head_embeddings,
    )
    keys = jnp.stack(keys, axis=2)  # (B, H, V, d): keys[b, i, j] = z_i^{k_j}

    def loss_fn(params):
      params, ks = forward.keys_first(params, keys)
      out, bs = encode(encoder, params, state.batch_stats, x.v1)
      q = head_embeddings(out)
      loss, stats = looc.looc_loss(
          q, ks, state.queue, config.moco.temperature, mesh, config.train.score_queries
      )
      return loss, (bs, {**stats, **embedding_health(q[:, 0], ks[:, 0, 0])})

    loss, batch_stats, stats, grads = forward.value_and_grad(loss_fn, state.params)
    heads = keys.shape[1]
    own = keys[:, jnp.arange(heads), jnp.arange(heads)]  # (B, H, d): z_i^{k_i}
    return loss, grads, moco.updates(state, batch_stats, target_params, target_bs, own, mesh), stats

  return objective


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.enabled = False
  # Atomic augmentations with their own head and key view: colour, rotation, texture. Each must
  # be switched on in the aug block (colour: jitter or grayscale; aug.rotation_prob;
  # aug.texture_prob).
  block.augmentations = ("rotation",)
  block.conv5_heads = False  # LooC++: a conv5 stage in each head
  return block


def check(c) -> None:
  """LooC is MoCo with looc.enabled."""
  method = get(c, "method")
  if boolean(c, "looc.enabled") and method != "moco":
    fail(
        "looc.enabled", True, f"LooC is built on MoCo's key encoder and queue; method is {method!r}"
    )


def rules(c) -> None:
  """One query view against its key views, each with its augmentation applied by the aug
  block; and MoCo's queue."""
  if get(c, "moco.symmetric"):
    fail("moco.symmetric", True, "LooC contrasts one query view with its key views; set False")
  augs = get(c, "looc.augmentations")
  if (
      not isinstance(augs, (tuple, list))
      or len(set(augs)) != len(augs)
      or not set(augs) <= set(AUGMENTATIONS)
  ):
    fail(
        "looc.augmentations",
        augs,
        f"must be distinct names out of {', '.join(AUGMENTATIONS)} (may be empty: one head)",
    )
  for aug in augs:
    if not any(get(c, p) > 0 for p in AUGMENTATIONS[aug]):
      fail(
          "looc.augmentations",
          augs,
          f"{aug!r} has a head but is never applied: set {' or '.join(AUGMENTATIONS[aug])} > 0",
      )
  boolean(c, "looc.conv5_heads")
  moco.check_queue(c)


def describe(c) -> str:
  augs = ", ".join(c.looc.augmentations) or "none"
  plus = "LooC++: conv5 heads, " if c.looc.conv5_heads else ""
  return f"leave-one-out heads ({plus}{1 + len(c.looc.augmentations)} heads: {augs})"


# Configured as MoCo with looc.enabled (cl_jax.objectives.method_of); its fingerprint is MoCo's
# base step with the "+looc" component.
METHOD = Method(
    "looc",
    make_objective,
    queue=True,
    target=True,
    shuffle_bn=True,
    negatives="queue",
    block="looc",
    defaults=defaults,
    check=check,
    rules=rules,
    describe=describe,
    config_file="configs/looc.py",
    base_component=moco.METHOD.base_component,
)
