"""Zhu et al. 2021, Tables 3-4 and Fig. 7: positive extrapolation helps and interpolation hurts,
negative interpolation helps; with FT the positive scores fall and the negative scores rise."""

from cl_jax.analysis.study import Comparison, Study
from cl_jax.studies.arms import MOCOV2, variant

_FT = {"ft__enabled": True}
POS_EX = variant(MOCOV2, "mocov2_ft_posex", **_FT, ft__negative="none")
POS_IN = variant(
    MOCOV2, "mocov2_ft_posin", **_FT, ft__negative="none", ft__positive_interpolation=True
)
NEG_IN = variant(MOCOV2, "mocov2_ft_negin", **_FT, ft__positive_extrapolation=False)
BASE = MOCOV2.name

STUDY = Study(
    name="zhu_ft",
    title="Feature transformation: extrapolated and interpolated positives, interpolated "
    "negatives (Zhu et al. 2021, Tables 3-4, Fig. 7)",
    arms=(MOCOV2, POS_EX, POS_IN, NEG_IN),
    metrics=("colour", "shape", "texture", "mean", "pos_mean", "neg_mean", "neg_var"),
    comparisons=(
        Comparison("positive extrapolation - none", "mean", (POS_EX.name, BASE), expect="increase"),
        Comparison("positive interpolation - none", "mean", (POS_IN.name, BASE), expect="decrease"),
        Comparison("negative interpolation - none", "mean", (NEG_IN.name, BASE), expect="increase"),
        Comparison(
            "positive score: extrapolation - none",
            "pos_mean",
            (POS_EX.name, BASE),
            expect="decrease",
        ),
        Comparison(
            "negative score: interpolation - none",
            "neg_mean",
            (NEG_IN.name, BASE),
            expect="increase",
        ),
    ),
    paper="Zhu et al. 2021",
    where="Sec. 4.1-4.3, Tables 3-4, Fig. 7",
    claim="extrapolating the positives (harder positives) helps and interpolating them hurts; "
    "interpolating the negatives helps; with the transformation the positive scores fall and "
    "the negative scores rise.",
    paper_result="ImageNet-100 MoCo top-1 71.1; positives interpolated / extrapolated 67.4 / "
    "72.8 (a_ex 2); negatives interpolated 74.6 (a_in 1.6).",
    notes="The accuracy is the mean of the three probes (the paper reports one accuracy). "
    "Score statistics (pos_mean, neg_mean) are the ones the runs log, on the transformed "
    "features, averaged over the last epoch: extrapolation lowers the positive score by "
    "construction (Eq. 4), while interpolation leaves the mean negative score unchanged in "
    "expectation, so a rise there is the network's doing. a_ex 2, a_in 1.6, one scalar "
    "coefficient per step (the defaults).",
)
