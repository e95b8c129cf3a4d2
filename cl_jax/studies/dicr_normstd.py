"""DICR (2025 submission), Sec. 2.2, 3 and 4.1-4.2: DICR makes SimCLR's representation distinguish
the contents of crops (higher crop NormStd) and keeps its invariance to the semantics-preserving
operations (colour jitter, grayscale, flip), and it improves the linear readout of SimCLR and
symmetric MoCo."""

from cl_jax.analysis.study_types import Comparison, Study, arm
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
    "To maximize the identity term, the embeddings of o_1, o_2 should remain invariant under "
    "these semantic-preserving augmentations, thereby encouraging the representations h_{o_1}, "
    "h_{o_2} to capture identical semantic contents. [Sec. 3, Eq. 4] [...] However, it performs "
    "consistently worse than DICR. We attribute this to DIRR's inability to model the identity of "
    "semantically identical contents with different styles. As shown in Figure 5a, it is "
    "significantly less invariant to semantics-preserving augmentation operators (especially for "
    "flipping) than DICR and the baseline. [Sec. 4.2]"
)
# One seed SD of the quick SimCLR's NormStd at the last residual block over the 3 seeds recorded
# before this claim file (jitter 0.0185, grayscale 0.0125, flip 0.0073), rounded up.
MARGINS = {"jitter": 0.019, "grayscale": 0.013, "flip": 0.008}
MARGIN_REASON = (
    "one seed SD of the quick SimCLR's NormStd at the last residual block, rounded up: a rise "
    "within seed-to-seed noise is not a loss of invariance. The SD is that of 3 seeds recorded "
    "by older code before this claim file was written, when the same seeds of the DICR arm had "
    "been recorded too; those records are not used in the verdict"
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
    out.append(
        Comparison(
            f"{method}: NormStd crop",
            "normstd/crop",
            pair,
            expect="increase",
            quote=CROP,
            where="Sec. 2.2, Fig. 2a",
        )
    )
    out += [
        Comparison(
            f"{method}: NormStd {aug}",
            f"normstd/{aug}",
            pair,
            expect="no_increase",
            quote=KEPT,
            where="Sec. 3 and 4.2, Fig. 5a",
            margin=margin,
            margin_reason=MARGIN_REASON,
            primary=False,
        )
        for aug, margin in MARGINS.items()
    ]
  else:
    out += [
        Comparison(f"{method}: NormStd {aug}", f"normstd/{aug}", pair) for aug in ("crop", *MARGINS)
    ]
  out.append(Comparison(f"{method}: shape", "shape", pair))
  return tuple(out)


STUDY = Study(
    name="dicr_normstd",
    title="DICR: distinguishable crops, kept invariance to semantics-preserving operations, the "
    "probe (DICR 2025, Sec. 2.2, 3, 4.1, 4.2)",
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
        "normstd/flip",
    ),
    comparisons=_parts("SimCLR", SIMCLR_DICR, SIMCLR, True)
    + _parts("MoCo", MOCO_DICR, MOCO_SYM, False),
    paper="DICR (2025 submission)",
    where="Sec. 2.2, 3, 4.1 and 4.2, Figs. 2a and 5a, Table 1",
    claim="\u201cEmpirical results show that DICR can significantly enhance the generalizability "
    "of existing methods in downstream tasks, and validate the crucial role of semantic content "
    "distinguishability in the generalizabile performance of contrastive learning.\u201d "
    "(Abstract)",
    paper_setting="ResNet-18 with a 3x3 stride-1 stem and no max-pool, CIFAR-10/100 at 32 px "
    "(500 epochs, batch 512) and STL-10, Tiny ImageNet (250 epochs, batch 256); SimCLR and MoCo",
    paper_result="NormStd per layer and operation (STL-10, CIFAR-10, SimCLR; plotted only); "
    "CIFAR-10 probe SimCLR 89.13 -> 90.15, symmetric MoCo 90.41 -> 91.21.",
    notes="NormStd of the last residual block (python -m cl_jax.analysis.normstd --images=256 "
    "--crop_scale=0.08,1): higher is more distinguishable. The crop quote's second half (block 7 "
    "as well as block 8) is not tested: only the last block is measured. The probe accuracy is "
    "the mean of the three probes (the rule of every claim). The paper shows NormStd for SimCLR "
    "only, so the NormStd comparisons of MoCo (its footnote 6: symmetric MoCo) are reported "
    "without a verdict; the readout claim covers both. The paper does not compare DICR's "
    "invariance with the baseline's in one sentence: its identity term is built to keep the "
    "semantics-preserving operations invariant (Sec. 3), and Fig. 5a is read as DIRR, not DICR, "
    "being \u201cless invariant\u201d than DICR and the baseline (Sec. 4.2), so DICR keeps the "
    "invariance: a non-inferiority test per operation of Fig. 5a that the quick recipe applies "
    "(colour jitter, grayscale, flip), NormStd may not rise by more than the margin. Shape is "
    "reported without a verdict.",
)
