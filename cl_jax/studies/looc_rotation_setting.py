"""Where can rotation be read on Trifeature? The setting for Xiao et al. 2021's Table 1 claim.

LooC's claim is about rotation information that a network keeps or loses, so it can only be
tested where a network trained without rotation augmentation reads rotation well above chance
(4 classes, 25%). On the default Trifeature images it does not: shapes are tilted by up to 45
degrees and textures point anywhere, so a quarter turn leaves an image that the data could
have shown anyway. This study measures, before the claim is tested, the rotation probe of
plain MoCo-v2 (no rotation augmentation) and of the random-init network on four data settings:
default, upright shapes (data.trifeature_max_angle 0), textures in one orientation
(data.trifeature_texture_angle 0), and both; then, since none of these four read rotation
above 30% (one seed each: 26.1, 29.6, 27.2, 28.6; random init 23.6-28.1), both at 64 px
instead of 32.
It has no expected direction: it chooses the setting in which the claim is then tested
(README, "What the papers claim").

The rule for the choice, written before the 64 px run: the claim is tested in the setting
whose trained network reads rotation best, provided that readout is at least 40% (chance
25%) and at least 10 points above its random-init network's; if no setting qualifies, the
claim is reported as not testable at this scale, with the run that would settle it.

Outcome: both at 64 px read rotation at 34.6% [33.2, 35.9] over 3 seeds (random init 28.3%
[27.5, 29.1]), below the rule's 40% and 6.3 points above random init, so no setting qualifies
and the claim is reported as not testable at this scale (README, "What the papers claim").
"""

from cl_jax.analysis.study_types import Study
from cl_jax.studies.arms import MOCOV2, variant

SETTINGS = {
    "": {},
    "_upright": {"data__trifeature_max_angle": 0.0},
    "_texture0": {"data__trifeature_texture_angle": 0.0},
    "_upright_texture0": {"data__trifeature_max_angle": 0.0, "data__trifeature_texture_angle": 0.0},
}
SETTINGS["_upright_texture0_64px"] = {**SETTINGS["_upright_texture0"], "data__image_size": 64}
ARMS = tuple(
    variant(MOCOV2, f"mocov2_rotprobe{suffix}", probe__rotation=True, **fields)
    for suffix, fields in SETTINGS.items()
)

STUDY = Study(
    name="looc_rotation_setting",
    title="Rotation readout of MoCo-v2 without rotation augmentation, by Trifeature setting",
    arms=ARMS,
    metrics=("rotation", "random_init/rotation", "colour", "shape", "texture"),
)
