"""Robinson et al. 2021, Sec. 4 and Fig. 6: implicit feature modification raises the feature
the baseline represents worst without lowering the others, for SimCLR and MoCo-v2."""

from cl_jax.analysis.study import Comparison, Study
from cl_jax.studies.arms import MOCOV2, SIMCLR, simclr, variant

EPSILONS = (0.05, 0.1, 0.2)
PAPER_EPSILON = 0.1
# The feature each baseline represents worst, fixed before any run of this study from the
# recipe check's three seeds (README "The quick recipe"): texture, 31-34% for SimCLR and MoCo-v2
# against 46-52% shape and 98-99% colour.
WORST = "texture"
OTHERS = ("colour", "shape")


def _mocov2_ifm(eps: float):
  name = "mocov2_ifm" if eps == PAPER_EPSILON else f"mocov2_ifm_e{eps:g}"
  return variant(MOCOV2, name, ifm__enabled=True, ifm__epsilon=float(eps))


SIMCLR_IFM = tuple(simclr(0.5, ifm_epsilon=e) for e in EPSILONS)
MOCOV2_IFM = tuple(_mocov2_ifm(e) for e in EPSILONS)


def _parts(method: str, base, arms):
  out = []
  for eps, a in zip(EPSILONS, arms):
    decisive = eps == PAPER_EPSILON
    pair = (a.name, base.name)
    out.append(
        Comparison(
            f"{method} eps {eps:g}: {WORST}", WORST, pair, expect="increase" if decisive else None
        )
    )
    for m in OTHERS:
      out.append(
          Comparison(
              f"{method} eps {eps:g}: {m}", m, pair, expect="no_decrease" if decisive else None
          )
      )
  return tuple(out)


STUDY = Study(
    name="robinson_ifm",
    title="Implicit feature modification and the worst-represented feature (Robinson et al. "
    "2021, Sec. 4, Fig. 6)",
    arms=(SIMCLR, *SIMCLR_IFM, MOCOV2, *MOCOV2_IFM),
    metrics=("colour", "shape", "texture", "mean"),
    comparisons=_parts("SimCLR", SIMCLR, SIMCLR_IFM) + _parts("MoCo-v2", MOCOV2, MOCOV2_IFM),
    paper="Robinson et al. 2021",
    where="Sec. 4.1-4.2, Fig. 6, Table 1",
    claim="IFM raises the feature the baseline represents worst without lowering the others.",
    paper_result="Trifeature (SimCLR, eps 0.1): IFM raises colour, shape and texture together "
    "at every T (plotted only); ImageNet-100 MoCo-v2 80.4 -> 81.1 / 80.9 / 80.7 at eps 0.05 / "
    "0.1 / 0.2.",
    notes="Differences are paired by seed against the method's quick baseline. The verdict "
    "rests on the paper's eps 0.1 (its Trifeature setting): texture must rise, colour and shape "
    "must not fall (no_decrease: opposite only when the interval lies wholly below 0); eps "
    "0.05 and 0.2 are reported without a verdict.",
)
