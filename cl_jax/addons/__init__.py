"""The research add-ons as transforms of a method's contrast (cl_jax.losses.contrast):

  hcl                          hard-negative sampling (Robinson, Chuang, Sra & Jegelka 2021)
  nonsemantic                  extra negatives (Ge et al. 2021)
  feature_transform(_contrast) transformed positives and negatives (Zhu et al. 2021)
  ifm                          similarities shifted by the adversary (Robinson et al. 2021)
  dicr (+ dicr_regions)        a regulariser on the feature maps (2025 submission)

Every add-on is a module of this package with the same few members:
  BLOCK                                its config block; config[BLOCK].enabled switches it on
  TITLE                                what it is, in words
  NEEDS                                what a method must have for it (the refusal's reason)
  EXCLUDES                             (optional) add-ons it does not combine with
  VARIANT                              (optional) a field of its block whose value names a
                                       code-fingerprint component of its own
                                       ("nonsemantic_patch", cl_jax.analysis.fingerprint)
  defaults(config) -> ConfigDict       its block (enabled False), written into every config by
                                       cl_jax.config_defaults.base_config (config: the fields
                                       made so far)
  check(config, method, reads_data)    its fields once enabled, with the method's entry
                                       (cl_jax.objectives.method.Method); each bad field a
                                       ConfigError; reads_data=False skips data locations
  describe(config) -> str              its one-line summary (the run's start-up summary)
  build(config, steps_per_epoch)       its record of plain scalars, which the objectives read
ADDONS lists them once. A method's entry (Method.addons) names the add-ons its objective
composes with; from_config builds the records of a config, and its AddOns compose them around
a method's loss. LooC's extra heads and views are a method of its own (cl_jax.objectives.looc).
"""

from cl_jax.addons import dicr, feature_transform_contrast, hcl, ifm, nonsemantic
from cl_jax.runtime.config_fields import boolean, fail

ADDONS = {m.BLOCK: m for m in (hcl, nonsemantic, feature_transform_contrast, ifm, dicr)}


def enabled(config) -> list:
  """The add-ons `config` switches on, in ADDONS' order."""
  return [a for a in ADDONS.values() if config[a.BLOCK].enabled]


def component(addon, config) -> str:
  """The name of `addon`'s code-fingerprint component in `config`."""
  variant = getattr(addon, "VARIANT", "")
  return f"{addon.BLOCK}_{config[addon.BLOCK][variant]}" if variant else addon.BLOCK


def check(c, method, methods, reads_data: bool) -> None:
  """Each add-on's `enabled`, then for each one switched on: the method combines with it
  (method.addons; methods: every entry, to name those that do), it combines with the others,
  and its own fields (its check)."""
  on = [a for a in ADDONS.values() if boolean(c, f"{a.BLOCK}.enabled")]
  for addon in on:
    if addon.BLOCK not in method.addons:
      those = ", ".join(m.name for m in methods if addon.BLOCK in m.addons)
      fail(
          f"{addon.BLOCK}.enabled",
          True,
          f"method {method.name!r} does not combine with {addon.TITLE} ({addon.NEEDS}): "
          f"switch off {addon.BLOCK}.enabled, or use a method that does ({those})",
      )
    others = [f"{o.BLOCK}.enabled" for o in on if o.BLOCK in getattr(addon, "EXCLUDES", ())]
    if others:
      fail(
          f"{addon.BLOCK}.enabled",
          True,
          f"{addon.TITLE} does not combine with the others on; switch off {' and '.join(others)}",
      )
    addon.check(c, method, reads_data)


def describe(config) -> list[str]:
  """The add-ons `config` switches on, each with its main settings."""
  return [a.describe(config) for a in enabled(config)]
