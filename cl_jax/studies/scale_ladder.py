"""The rungs of a scale ladder: claims' comparisons again in a larger setting, so that a reader
can see whether a verdict reached at the quick scale moves with training and size.

Each rung is a claim of its own with the quick claim's paper, sentences, directions, margins and
Holm correction, over other arms:
- at 4x the quick recipe's epochs: Ge et al.'s sweep over alpha 0, 1 and 2 (MoCo-v2, 64 epochs
  instead of 16) and DICR on SimCLR (32 epochs instead of 8); only the epochs change (and DICR's
  lambda warm-up, which ends in the last epoch as in the quick recipe); on a processor or, faster,
  a GPU (records of one device kind per rung);
- at the paper's own scale (a GPU): Robinson et al.'s Fig. 6 and Fig. 3 on Trifeature at 128 px
  with a full-width ResNet-18 for 200 epochs (configs/simclr.py:trifeature128).
"""

import dataclasses
from collections.abc import Mapping, Sequence

from cl_jax.analysis.study_types import Arm, Comparison, Study
from cl_jax.studies import dicr_normstd, ge_alpha, robinson_difficulty, robinson_ifm
from cl_jax.studies.arms import SIMCLR, variant

FACTOR = 4
PAPER_PRESET = "trifeature128"
QUICK_EPOCHS = {"mocov2": 16, "simclr": 8}  # optim.epochs of the quick configs (README)


def longer(base: Arm, epochs: int) -> Arm:
  """`base` trained for `epochs`; dicr.warmup_epochs (by default one less than the epochs, so
  that DICR's lambda reaches its final value in the last epoch) is named with it, since it
  follows the epochs in every config."""
  return variant(
      base, f"{base.name}_e{epochs}", optim__epochs=epochs, dicr__warmup_epochs=epochs - 1
  )


def on_preset(base: Arm, preset: str) -> Arm:
  """`base` (same overrides) on its config file's `preset` instead of the quick setting."""
  return Arm(f"{base.name}_{preset}", f"{base.config.split(':')[0]}:{preset}", base.overrides)


def rung(
    quick: Study,
    arms: Mapping[str, Arm],
    labels: Sequence[str],
    extra=(),
    primary: Sequence[str] | None = None,
    notes: str = "",
    suffix: str = f"x{FACTOR}",
    scale: str = f"{FACTOR}x the quick recipe's epochs",
    **fields: str,
) -> Study:
  """Claim `quick` in a larger setting (`scale`, in words; the rung is named
  <quick>_<suffix>): its comparisons `labels` (quote, direction, margin
  kept) between the rung's arms ({quick arm name: rung arm}), then the comparisons `extra`
  (already over the rung's arms); `primary`, when given, the labels that test the rung's
  headline (the others secondary; by default each keeps the quick claim's part); `fields`
  (title, where, claim, paper_result) replace the quick claim's where the rung tests only part
  of it."""
  by_label = {c.label: c for c in quick.comparisons}
  unknown = [label for label in labels if label not in by_label]
  if unknown:
    raise ValueError(f"claim {quick.name} has no comparisons {unknown}")

  def names(old: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(arms[n].name for n in old)

  described = ("title", "where", "claim", "paper_result")
  if set(fields) - set(described):
    raise ValueError(
        f"a rung replaces only {described}, not {sorted(set(fields) - set(described))}"
    )
  fields = {k: fields.get(k, getattr(quick, k)) for k in described}
  return dataclasses.replace(
      quick,
      name=f"{quick.name}_{suffix}",
      title=f"{fields['title']}, at {scale}",
      where=f"{fields['where']}, at {scale}",
      claim=fields["claim"],
      paper_result=fields["paper_result"],
      arms=tuple(arms.values()),
      comparisons=tuple(
          dataclasses.replace(
              c,
              arms=names(c.arms),
              minus=names(c.minus),
              primary=c.primary if primary is None else c.label in primary,
          )
          for c in (by_label[label] for label in labels)
      )
      + tuple(extra),
      notes=f"One rung of the scale ladder: the comparisons of the claim {quick.name} between "
      f"these arms, with its quotes, directions and margins (fixed for the quick recipe, before "
      f"any run of either) and Holm's correction over the decisive ones, at {scale}. {notes}",
  )


GE_ALPHAS = ge_alpha.ALPHAS[:3]  # 0, 1, 2: the sweep before colour collapses (alpha 3, 5)
GE_ARMS = {
    a.name: longer(a, FACTOR * QUICK_EPOCHS["mocov2"]) for a in ge_alpha.ARMS[: len(GE_ALPHAS)]
}


def _over_alpha_0_to_2(label: str) -> Comparison:
  """The quick claim's slope `label` (quote, direction, part) over the rung's alphas 0-2."""
  c = next(c for c in ge_alpha.STUDY.comparisons if c.label == label)
  names = tuple(GE_ARMS[n].name for n in c.arms[: len(GE_ALPHAS)])
  return dataclasses.replace(c, label=f"{label} 0-2", arms=names, x=GE_ALPHAS)


GE = rung(
    ge_alpha.STUDY,
    GE_ARMS,
    ("accuracy: alpha 2 - alpha 0",),
    title="Patch negatives: shape against texture as alpha rises from 0 to 2 (Ge et al. 2021, "
    "Fig. 6a-b)",
    extra=(
        _over_alpha_0_to_2("shape vs alpha"),
        _over_alpha_0_to_2("texture vs alpha"),
        *(
            Comparison(f"{m} vs alpha 0-2", m, tuple(a.name for a in GE_ARMS.values()), GE_ALPHAS)
            for m in ("colour", "mean")
        ),
    ),
    notes="The sweep's first three alphas (0, 1, 2), before colour collapses at 3 and 5 in the "
    "quick runs: the headline's shape and texture slopes over them (primary) and the accuracy at "
    "alpha 2 against 0 (secondary), as in the quick claim; colour's and the accuracy's slopes "
    "without a verdict. 15 runs of 4x the quick MoCo-v2 recipe, on a GPU (launch/gpu_study.sh "
    "ge_alpha_x4 OUT) or on processors (a seed's three arms on one processor).",
)

DICR_ARMS = {
    a.name: longer(a, FACTOR * QUICK_EPOCHS["simclr"]) for a in (SIMCLR, dicr_normstd.SIMCLR_DICR)
}
DICR = rung(
    dicr_normstd.STUDY,
    DICR_ARMS,
    tuple(
        f"SimCLR: {part}"
        for part in ("probe mean", "NormStd crop", *(f"NormStd {a}" for a in dicr_normstd.MARGINS))
    )
    + ("SimCLR: shape",),
    notes="SimCLR only (the MoCo arms of the quick claim are not repeated). The kept margins are "
    "the quick recipe's seed SDs; the longer recipe's are not known before its runs.",
)

PAPER_SCALE = "the paper's scale (Trifeature 128 px, ResNet-18, 200 epochs, on a GPU)"
PAPER_NOTES = (
    "The paper's own Trifeature setting (configs/simclr.py:trifeature128): 128 px, a full-width "
    "ResNet-18 with the ImageNet stem, 200 epochs. The paper and its authors' public code give "
    "no batch, optimiser or training-set size: the training split is the public ports' (2,400 "
    "images, 3 renders of each of the 800 training combinations) and the optimiser SimCLR's "
    "CIFAR-10 recipe (LARS, batch 512, lr 0.6, weight decay 1e-6, 10 warm-up epochs). Runs on "
    "one GPU kind (records name their device; a comparison across device kinds is refused)."
)


def _paper_rung(quick: Study) -> Study:
  arms = {a.name: on_preset(a, PAPER_PRESET) for a in quick.arms}
  return rung(
      quick,
      arms,
      tuple(c.label for c in quick.comparisons),
      notes=PAPER_NOTES,
      suffix="paper",
      scale=PAPER_SCALE,
  )


ROBINSON_IFM = _paper_rung(robinson_ifm.STUDY)  # Fig. 6: the ladder's first rung on a GPU
ROBINSON_DIFFICULTY = _paper_rung(robinson_difficulty.STUDY)  # Fig. 3
