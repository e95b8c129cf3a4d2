"""The arms the studies share: the quick Trifeature configs and their one-variable variants.

An arm's name says what it is, and one name is one config everywhere: studies that use the
same arm share its runs and records (cl_jax.analysis.study). Every variant differs from its
quick config only in the fields it names.
"""

import os

from cl_jax import objectives
from cl_jax.analysis.study_types import Arm, arm

# The quick default of each config file (configs/<name>.py, README "The quick recipe"): those
# named here in this order, then every other method's (its entry's config_file,
# cl_jax.objectives.ENTRIES).
_LISTED = ("mocov1", "mocov2", "mocov2_patchns", "mocov2_patchns_ft_ifm", "looc", "dicr", "simclr")
_LISTED += ("byol", "simsiam")
_METHODS = [os.path.splitext(os.path.basename(m.config_file))[0] for m in objectives.ENTRIES]
QUICK_CONFIGS = _LISTED + tuple(name for name in _METHODS if name not in _LISTED)
QUICK = {name: arm(name, f"configs/{name}.py") for name in QUICK_CONFIGS}
MOCOV2, MOCOV2_NS, SIMCLR = QUICK["mocov2"], QUICK["mocov2_patchns"], QUICK["simclr"]


def variant(base: Arm, name: str, **fields) -> Arm:
  """`base` with more overrides, given as block__field=value (block.field)."""
  overrides = dict(base.overrides)
  overrides.update({k.replace("__", "."): v for k, v in fields.items()})
  return arm(name, base.config, overrides)


def mocov2_ns(alpha: float) -> Arm:
  """MoCo-v2 + patch negatives at weight alpha (alpha 2 is configs/mocov2_patchns.py)."""
  if alpha == 2.0:
    return MOCOV2_NS
  return variant(MOCOV2_NS, f"mocov2_patchns_a{alpha:g}", nonsemantic__alpha=float(alpha))


def simclr(temperature: float = 0.5, ifm_epsilon: float | None = None, hcl_beta=None) -> Arm:
  """SimCLR at `temperature`, with IFM at ifm_epsilon or hard negatives at hcl_beta (the
  quick SimCLR is temperature 0.5 without either)."""
  name, fields = "simclr", {}
  if temperature != 0.5:
    name += f"_t{temperature:g}"
    fields["simclr__temperature"] = float(temperature)
  if ifm_epsilon is not None:
    name += "_ifm" if ifm_epsilon == 0.1 else f"_ifm_e{ifm_epsilon:g}"
    fields.update(ifm__enabled=True, ifm__epsilon=float(ifm_epsilon))
  if hcl_beta is not None:
    name += f"_hcl_b{hcl_beta:g}"
    fields.update(hcl__enabled=True, hcl__beta=float(hcl_beta))
  return variant(SIMCLR, name, **fields) if fields else SIMCLR
