"""Ge et al. 2021, Sec. 4.1 and Fig. 6a-b: the weight alpha of the patch negatives trades
texture for shape."""

from cl_jax.analysis.study import Comparison, Study
from cl_jax.studies.arms import MOCOV2, mocov2_ns

ALPHAS = (0.0, 1.0, 2.0, 3.0, 5.0)  # 0: plain MoCo-v2, no negatives (the paper's baseline)
ARMS = (MOCOV2, *(mocov2_ns(a) for a in ALPHAS[1:]))
NAMES = tuple(a.name for a in ARMS)

STUDY = Study(
    name="ge_alpha",
    title="Patch negatives: shape against texture as alpha rises (Ge et al. 2021, Fig. 6a-b)",
    arms=ARMS,
    metrics=("colour", "shape", "texture", "mean"),
    comparisons=(
        Comparison("shape vs alpha", "shape", NAMES, ALPHAS, "increase"),
        Comparison("texture vs alpha", "texture", NAMES, ALPHAS, "decrease"),
        Comparison("colour vs alpha", "colour", NAMES, ALPHAS),
    ),
    paper="Ge et al. 2021",
    where="Sec. 4.1, Fig. 6a-b",
    claim="a larger weight alpha of the patch negatives raises shape and lowers texture "
    "accuracy (on cue-conflict images, MoCo-v2 on ImageNet-100).",
    paper_result="shape accuracy rises and texture accuracy falls monotonically for alpha "
    "0 -> 5 (plotted only); ImageNet-100 top-1 77.88 (alpha 0), 79.35 (2), 75.58 (3).",
    notes="Slopes in points per unit of alpha, one least-squares slope per seed over the five "
    "arms. Colour is reported without an expectation: the patch negatives keep the image's "
    "colours, the paper does not say what happens to them.",
)
