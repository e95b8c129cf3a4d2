"""The studies of cl_jax.study: the papers' claims, one file each, the search for the setting
of LooC's claim, and the two grids.

A claim file states the paper, the figure or table, the claim in one sentence, the arms, the
metric and the expected direction; cl_jax.analysis.study runs it and gives the verdict. The
scale ladder repeats two claims at 4x the quick recipe's epochs.
"""

from cl_jax.studies import (
    dicr_normstd,
    ge_alpha,
    ge_nojitter,
    ge_queue,
    looc_rotation_setting,
    recipe,
    robinson_difficulty,
    robinson_ifm,
    scale_ladder,
    suppression,
    zhu_ft,
)

CLAIMS = tuple(
    m.STUDY
    for m in (
        ge_alpha,
        ge_nojitter,
        ge_queue,
        robinson_difficulty,
        robinson_ifm,
        zhu_ft,
        dicr_normstd,
    )
) + (
    scale_ladder.GE,
    scale_ladder.DICR,
    scale_ladder.ROBINSON_IFM,
    scale_ladder.ROBINSON_DIFFICULTY,
)
STUDIES = {
    s.name: s for s in (*CLAIMS, looc_rotation_setting.STUDY, suppression.STUDY, recipe.STUDY)
}
