"""DICR (2025 submission), Sec. 2.2 and 4.1-4.2: DICR makes SimCLR's representation distinguish
the contents of crops (higher crop NormStd) and keeps its invariance to colour operations, and
it improves the linear readout of SimCLR and symmetric MoCo."""

from cl_jax.analysis.study import Comparison, Study, arm
from cl_jax.studies.arms import MOCOV2, QUICK, SIMCLR, variant

MOCO_SYM = variant(MOCOV2, "mocov2_symmetric", moco__symmetric=True)
SIMCLR_DICR = QUICK["dicr"]  # configs/dicr.py: SimCLR + DICR
MOCO_DICR = arm("dicr_moco", "configs/dicr.py:moco")
READOUT = (
    "In most settings, DICR significantly improves the linear readout accuracy compared to the "
    "baselines."
)
CROP = (
    "DICR significantly promotes distinguishable representations of different semantic contents "
    "within an image, and achieves more generalizable performance than the baseline on both "
    "residual block 8 and residual block 7."
)
KEPT = (
    "As shown in Figure 5a, it is significantly less invariant to semantics-preserving "
    "augmentation operators (especially for flipping) than DICR and the baseline."
)
# One seed SD of the quick SimCLR's NormStd (3 seeds recorded before this claim file:
# jitter 0.0185, grayscale 0.0125), rounded up.
MARGIN_REASON = (
    "one seed SD of the quick SimCLR's NormStd at the last residual block (3 seeds recorded "
    "before this claim was fixed), rounded up: a rise within seed-to-seed noise is not a loss "
    "of invariance"
)


def _parts(method: str, dicr, base, normstd_claims: bool):
  pair = (dicr.name, base.name)
  out = [
      Comparison(
          f"{method}: probe mean",
          "mean",
          pair,
          expect="increase",
          quote=READOUT,
          where="Sec. 4.1, Table 1",
      )
  ]
  if normstd_claims:
    out += [
        Comparison(
            f"{method}: NormStd crop",
            "normstd/crop",
            pair,
            expect="increase",
            quote=CROP,
            where="Sec. 2.2, Fig. 2a",
        ),
        Comparison(
            f"{method}: NormStd jitter",
            "normstd/jitter",
            pair,
            expect="no_increase",
            quote=KEPT,
            where="Sec. 4.2, Fig. 5a",
            margin=0.019,
            margin_reason=MARGIN_REASON,
        ),
        Comparison(
            f"{method}: NormStd grayscale",
            "normstd/grayscale",
            pair,
            expect="no_increase",
            quote=KEPT,
            where="Sec. 4.2, Fig. 5a",
            margin=0.013,
            margin_reason=MARGIN_REASON,
        ),
    ]
  else:
    out += [
        Comparison(f"{method}: NormStd {aug}", f"normstd/{aug}", pair)
        for aug in ("crop", "jitter", "grayscale")
    ]
  out.append(Comparison(f"{method}: shape", "shape", pair))
  return tuple(out)


STUDY = Study(
    name="dicr_normstd",
    title="DICR: distinguishable crops, kept colour invariance, the probe (DICR 2025, Sec. 2.2, "
    "4.1, 4.2)",
    arms=(SIMCLR, SIMCLR_DICR, MOCO_SYM, MOCO_DICR),
    analyses=("normstd",),
    metrics=(
        "colour",
        "shape",
        "texture",
        "mean",
        "normstd/crop",
        "normstd/jitter",
        "normstd/grayscale",
    ),
    comparisons=_parts("SimCLR", SIMCLR_DICR, SIMCLR, True)
    + _parts("MoCo", MOCO_DICR, MOCO_SYM, False),
    paper="DICR (2025 submission)",
    where="Sec. 2.2, 4.1 and 4.2, Figs. 2a and 5a, Table 1",
    claim="\u201cEmpirical results show that DICR can significantly enhance the generalizability "
    "of existing methods in downstream tasks, and validate the crucial role of semantic content "
    "distinguishability in the generalizabile performance of contrastive learning.\u201d "
    "(Abstract)",
    paper_result="NormStd per layer and operation (STL-10, CIFAR-10, SimCLR; plotted only); "
    "CIFAR-10 probe SimCLR 89.13 -> 90.15, symmetric MoCo 90.41 -> 91.21.",
    notes="NormStd of the last residual block (python -m cl_jax.analysis.normstd --images=256 "
    "--crop_scale=0.08,1): higher is more distinguishable. The probe accuracy is the mean of the "
    "three probes (the rule of every claim). The paper shows NormStd for SimCLR only, so the "
    "NormStd comparisons of MoCo (its footnote 6: symmetric MoCo) are reported without a verdict; "
    "the readout claim covers both. The colour invariance is kept, not gained, in the paper's "
    "words (DIRR, not DICR, is \u201cless invariant\u201d than DICR and the baseline): a "
    "non-inferiority test, NormStd may not rise by more than the margin. Shape is reported "
    "without a verdict.",
)
