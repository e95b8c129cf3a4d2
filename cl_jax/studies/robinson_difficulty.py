"""Robinson et al. 2021, Sec. 2.3 and Fig. 3: the difficulty of instance discrimination trades
colour against shape and texture on Trifeature."""

import math

from cl_jax.analysis.study import Comparison, Study
from cl_jax.studies.arms import simclr

TEMPERATURES = (0.05, 0.2, 0.5)
BETAS = (0.5, 1.0, 2.0)  # hard-negative concentration at T 0.5, tau+ 0.1
T_ARMS = tuple(simclr(t) for t in TEMPERATURES)
B_ARMS = tuple(simclr(0.5, hcl_beta=b) for b in BETAS)
LOG10_T = tuple(math.log10(t) for t in TEMPERATURES)


def _sweeps():
  t_names, b_names = tuple(a.name for a in T_ARMS), tuple(a.name for a in B_ARMS)
  out = []
  # Easier discrimination: larger T, smaller beta.
  for metric, easier in (("colour", "increase"), ("shape", "decrease"), ("texture", "decrease")):
    harder = "decrease" if easier == "increase" else "increase"
    out.append(Comparison(f"{metric} vs log10 T", metric, t_names, LOG10_T, easier))
    out.append(Comparison(f"{metric} vs beta", metric, b_names, BETAS, harder))
  return tuple(out)


STUDY = Study(
    name="robinson_difficulty",
    title="Instance-discrimination difficulty and feature suppression (Robinson et al. 2021, "
    "Fig. 3)",
    arms=(*T_ARMS, *B_ARMS),
    metrics=("colour", "shape", "texture", "mean"),
    comparisons=_sweeps(),
    paper="Robinson et al. 2021",
    where="Sec. 2.3, Fig. 3",
    claim="easier instance discrimination (larger temperature, smaller hard-negative beta) "
    "favours colour and harms shape and texture; harder discrimination reverses it.",
    paper_result="SimCLR, ResNet-18 on 128 px Trifeature: colour accuracy rises and shape and "
    "texture fall as T grows or beta shrinks (plotted only).",
    notes="Slopes per decade of T and per unit of beta. Hard negatives (Robinson et al. ICLR "
    "2021) at T 0.5 with tau+ 0.1. The temperature arms are those of the suppression study.",
)
