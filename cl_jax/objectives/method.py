"""A method as the rest of the library sees it: one entry of the registry (cl_jax.objectives)."""

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Method:
  """One method's entry.

  Fields:
    name: its config.method value (a variant's own name: "looc").
    build: build(config, encoder, mesh, addons, steps_per_epoch) -> objective(state, Views) ->
      (loss, grads, state updates, stats), the method's step with its add-ons (its module's
      make_objective; steps_per_epoch places epoch-based schedules on the step axis).
    queue: the state holds a memory queue of keys (moco.queue_size rows).
    target: the state holds a target network (an EMA of the online one).
    predictor: the online network has a predictor head (model.predictor_hidden_dim > 0; 0 for
      a method without one).
    shuffle_bn: its key encoder takes model.bn_mode "shuffle" or "shuffle_stats".
    negatives: what its contrast's negatives are, "queue" (a memory queue of keys), "batch"
      (the other images of the batch) or None (no negatives), which the add-ons that
      transform negatives read (cl_jax.addons).
    addons: the add-ons (cl_jax.addons.ADDONS' blocks) its objective composes with its loss;
      the config check refuses the others.
    block: its config block (config[block]), or None for a method without settings of its own.
    defaults: defaults(config) -> its block's fields, written into every config by
      cl_jax.config_defaults.base_config (config: the fields made so far).
    check: check(config) -> None: the fields of its block, in every config (each bad field a
      ConfigError, cl_jax.runtime.config_fields).
    rules: rules(config) -> None: what a run of this method needs of the other fields.
    describe: describe(config) -> the start-up summary's note on the method's settings, or
      None for none.
    config_file: its quick config (configs/NAME.py), the base of its fingerprint's canonical
      configs (cl_jax.analysis.fingerprint).
    base_component: base_component(config) -> the name of its base step in the code
      fingerprint; default `name`.
  """

  name: str
  build: Callable
  queue: bool = False
  target: bool = False
  predictor: bool = False
  shuffle_bn: bool = False
  negatives: str | None = None
  addons: tuple[str, ...] = ()
  block: str | None = None
  defaults: Callable | None = None
  check: Callable | None = None
  rules: Callable | None = None
  describe: Callable | None = None
  config_file: str = ""
  base_component: Callable | None = None

  def component(self, config) -> str:
    """The fingerprint's name of this method's base step for `config`."""
    return self.name if self.base_component is None else self.base_component(config)
