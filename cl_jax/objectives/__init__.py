"""The methods' train-step objectives, one module each, and their registry.

METHODS maps each config.method value to its Method entry (cl_jax.objectives.method), which
the train step (which objective to build), the trainer (which state to hold), the config
defaults and check (its block, its rules, the add-ons it composes) and the code fingerprint
(its base component) read; a method is added by its module's METHOD and one line here. LooC
(Xiao et al. 2021), configured as MoCo with looc.enabled, is a method of its own: `method_of`
gives its entry for such a config, and ENTRIES holds every entry, LooC's included.
"""

from cl_jax.objectives import barlow_twins, byol, looc, moco, simclr, simsiam
from cl_jax.objectives.method import Method

METHODS: dict[str, Method] = {
    m.name: m
    for m in (moco.METHOD, simclr.METHOD, byol.METHOD, simsiam.METHOD, barlow_twins.METHOD)
}
ENTRIES: tuple[Method, ...] = (*METHODS.values(), looc.METHOD)


def method_of(config) -> Method:
  """The entry whose objective trains `config`: LooC's for MoCo with looc.enabled, else
  config.method's."""
  if config.method not in METHODS:
    raise ValueError(f"method must be one of {', '.join(METHODS)}; got {config.method!r}")
  if config.method == "moco" and config.looc.enabled:
    return looc.METHOD
  return METHODS[config.method]
