"""The pure train step: train_step(state, batch) -> (state, metrics), for every method.

One step:
  1. photometric augmentation of both host-cropped views, on the device;
  2. the method's objective (cl_jax.objectives.<method>): its target forward, loss
     and gradient, and its state updates (batch statistics, EMA target, queue);
  3. the optimizer update of the online parameters.
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

from cl_jax import objectives
from cl_jax.addons import dicr
from cl_jax.addons import from_config as addons_lib
from cl_jax.addons.from_config import AddOns
from cl_jax.data import photometric
from cl_jax.objectives.forward import Views
from cl_jax.objectives.moco import keys_per_step
from cl_jax.runtime import parallel
from cl_jax.runtime.layouts import StateLayouts, StepJit
from cl_jax.state import TrainState

__all__ = [
    "keys_per_step",
    "layer_grad_norms",
    "make_objective",
    "make_train_step",
    "jit_train_step",
    "jit_on_mesh",
]


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


def make_objective(
    config: ml_collections.ConfigDict, encoder, mesh: Mesh, addons: AddOns, steps_per_epoch: int
):
  """The objective of the config's method (objectives.method_of) with its add-ons:
  objective(state, Views) -> (loss, grads, state updates, stats)."""
  return objectives.method_of(config).build(config, encoder, mesh, addons, steps_per_epoch)


def num_views(config: ml_collections.ConfigDict) -> int:
  """Host-cropped views per image: query and key, and LooC's extra keys k_1..k_n."""
  return 2 + len(objectives.looc.key_views(config))


def view_params(
    rng: jax.Array, batch_size: int, spec: photometric.PhotometricSpec, groups: tuple[str, ...] = ()
) -> list[dict]:
  """The photometric parameters of q, k_0 and LooC's k_1..k_n (Xiao et al. 2021, Sec. 3).

  q and k_0 draw theirs independently from the first two keys of split(rng, 5); k_{i+1}
  draws its own from fold_in(rng, 100 + i) and then copies those of atomic augmentation
  groups[i] (photometric.ATOMIC_GROUPS) from q's: x_i^{k_i} = x_i^q, the others independent.

  Returns:
    [params of q, k_0, k_1, ..., k_n], each a photometric.sample_photometric dict.
  """
  r_q, r_k0 = jax.random.split(rng, 5)[:2]
  q = photometric.sample_photometric(r_q, batch_size, spec)
  keys = [photometric.sample_photometric(r_k0, batch_size, spec)]
  for i, group in enumerate(groups):
    own = photometric.sample_photometric(jax.random.fold_in(rng, 100 + i), batch_size, spec)
    keys.append(photometric.share(q, own, group))
  return [q] + keys


def augment_views(
    rng: jax.Array,
    batch: dict,
    spec: photometric.PhotometricSpec,
    groups: tuple[str, ...] = (),
    texture: bool = False,
) -> tuple[jax.Array, jax.Array, tuple, tuple]:
  """The photometric augmentation of a host batch, on the device (the step's first part).

  view1 is q, view2 k_0 and view<i + 3> LooC's k_{i+1}, each under its parameters from
  view_params; the texture images take their view's parameters (Ge et al. 2021, Sec. 2.2).

  Args:
    rng: the step's PRNG key.
    batch: the host batch (view<v> (B, S, S, 3) uint8, texture1/2 with texture).
    spec: the photometric recipe.
    groups: LooC's atomic augmentations, one per extra key view.
    texture: augment texture1 and texture2.

  Returns:
    (v1, v2, extra, textures) as in Views: float32 normalised (B, S, S, 3) views.
  """
  params = view_params(rng, batch["view1"].shape[0], spec, groups)
  views = [
      photometric.augment_with_params(batch[f"view{v + 1}"], p, spec) for v, p in enumerate(params)
  ]
  textures = ()
  if texture:
    textures = tuple(
        photometric.augment_with_params(batch[f"texture{v}"], params[v - 1], spec) for v in (1, 2)
    )
  return views[0], views[1], tuple(views[2:]), textures


def make_train_step(
    config: ml_collections.ConfigDict,
    encoder,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    mesh: Mesh,
    steps_per_epoch: int,
    statistics: bool = True,
):
  """Build the jit-able train_step(state, batch) for `config` on `mesh`.

  steps_per_epoch places epoch-based switches (ft.start_epoch) and schedules
  (BYOL's target momentum) on the step axis.

  batch: view1, view2 (B, S, S, 3) uint8 host-cropped views; with LooC also
  view3..view<n+2>, the keys k_1..k_n, whose photometric parameters copy those of
  atomic augmentation i (looc.augmentations[i - 1]) from view1's (Xiao et al.
  2021, Sec. 3; the other parameters are drawn independently); with texture NS
  negatives texture1, texture2, each augmented with its view's parameters (Ge et
  al. 2021, Sec. 2.2); see augment_views. With DICR, box1, box2 (B, 4) and flip1,
  flip2 (B,) place the views' overlap (cl_jax.addons.dicr.regions_of). Other entries
  of the host batch are ignored. metrics: loss, lr, the method's statistics (score
  statistics of the contrastive methods, cl_jax.losses.contrast.contrast_stats;
  pos_mean and BYOL's tau for the others), the
  embeddings' health signals (cl_jax.objectives.health.embedding_health, health/*) and the
  per-layer gradient norms of layer_grad_norms, float32 scalars. With statistics=False the
  metrics are loss and lr alone and XLA drops the computations of the others (the step the
  training loop runs between logging steps; the state it returns is the same). The
  augmentation and the optimizer update run under the named scopes "augment" and "optimizer",
  which profiles show (cl_jax.bench.profile).
  """
  spec = photometric.config_spec(config)
  addons = addons_lib.from_config(config, steps_per_epoch)
  objective = make_objective(config, encoder, mesh, addons, steps_per_epoch)
  groups = objectives.looc.key_views(config)
  texture = addons.nonsemantic is not None and addons.nonsemantic.kind == "texture"

  def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    _, _, r_key, r_ns, r_ft = jax.random.split(rng, 5)
    with jax.named_scope("augment"):
      v1, v2, extra, textures = augment_views(rng, batch, spec, groups, texture)
    regions = dicr.regions_of(batch) if addons.dicr is not None else None
    views = Views(v1, v2, r_key, r_ns, r_ft, extra, textures, regions)
    loss, grads, updates, stats = objective(state, views)
    with jax.named_scope("optimizer"):
      param_updates, opt_state = tx.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, param_updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, **updates)
    metrics = {"loss": loss, "lr": jnp.asarray(schedule(state.step), jnp.float32)}
    if statistics:
      metrics.update(stats, **layer_grad_norms(grads))
    return new_state, metrics

  return train_step


def jit_train_step(
    train_step, state_sharding, batch_sharding, layouts: StateLayouts | None = None
) -> StepJit:
  """train_step(state, batch) jitted over the mesh with the state donated (its buffers are
  reused for the new state) and kept in the device-local layouts its compiler chooses,
  shared with the other steps of `layouts` (cl_jax.runtime.layouts). Call it as the jitted
  function; it compiles on its first call.

  state_sharding: cl_jax.runtime.parallel.state_sharding of the state; batch_sharding:
  the batch's rows over `data`. Metrics come back replicated.
  """
  return StepJit(train_step, state_sharding, (batch_sharding,), None, layouts)


def jit_on_mesh(
    train_step, state: TrainState, mesh: Mesh, layouts: StateLayouts | None = None
) -> StepJit:
  """`train_step` (of make_train_step) jitted by jit_train_step for `state` (its sharding:
  the queue's rows over `mesh`, the rest replicated) and a batch split over `mesh`."""
  return jit_train_step(
      train_step, parallel.state_sharding(state, mesh), parallel.batch_sharding(mesh), layouts
  )
