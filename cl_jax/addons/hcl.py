"""Hard-negative sampling (Robinson, Chuang, Sra & Jegelka, ICLR 2021) as an add-on: the `hcl`
config block, whose estimator replaces InfoNCE's negative term
(cl_jax.losses.hard_negatives.hcl_loss)."""

import dataclasses

import ml_collections

from cl_jax.addons.addon import record
from cl_jax.runtime.config_fields import fail, get, number

# Its entry's members (cl_jax.addons).
BLOCK = "hcl"
TITLE = "hard-negative sampling"
NEEDS = "it reweights the in-batch negatives of an InfoNCE loss"
EXCLUDES = ("nonsemantic", "ifm", "ft")


@dataclasses.dataclass(frozen=True)
class HardNegativeSampling:
  """Hard-negative sampling of a run: beta, the hardness concentration; tau_plus, the class
  prior of the debiasing correction."""

  beta: float
  tau_plus: float


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.enabled = False
  block.beta = 1.0  # hardness concentration: weights exp(beta * s / T)
  block.tau_plus = 0.1  # class prior of the debiasing correction (0: none)
  return block


def check(c, method, reads_data: bool) -> None:
  del method, reads_data
  number(c, "hcl.beta", 0.0, None)
  number(c, "hcl.tau_plus", 0.0, 1.0)
  if get(c, "hcl.tau_plus") >= 1.0:
    fail("hcl.tau_plus", get(c, "hcl.tau_plus"), "the class prior must be < 1")


def describe(c) -> str:
  return f"hard-negative sampling (beta {c.hcl.beta}, tau+ {c.hcl.tau_plus})"


def build(c, steps_per_epoch: int):
  return record(HardNegativeSampling, c.hcl)
