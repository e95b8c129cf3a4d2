"""A method as the rest of the library sees it: one entry of the registry (cl_jax.objectives)."""

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Method:
  """One method's entry.

  Fields:
    name: its config.method value.
    build: build(config, encoder, mesh, addons, steps_per_epoch) -> objective(state, Views) ->
      (loss, grads, state updates, stats), the method's step with its add-ons.
    queue: the state holds a memory queue of keys (moco.queue_size rows).
    target: the state holds a target network (an EMA of the online one).
    predictor: the online network has a predictor head (model.predictor_hidden_dim > 0; 0 for
      a method without one).
    base_component: base_component(config) -> the name of its base step in the code
      fingerprint (cl_jax.analysis.fingerprint); default `name`.
  """

  name: str
  build: Callable
  queue: bool = False
  target: bool = False
  predictor: bool = False
  base_component: Callable | None = None

  def component(self, config) -> str:
    """The fingerprint's name of this method's base step for `config`."""
    return self.name if self.base_component is None else self.base_component(config)
