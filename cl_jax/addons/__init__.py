"""The research add-ons as transforms of a method's contrast (cl_jax.losses.contrast):

  nonsemantic                  extra negatives (Ge et al. 2021)
  feature_transform(_contrast) transformed positives and negatives (Zhu et al. 2021)
  ifm                          similarities shifted by the adversary (Robinson et al. 2021)
  dicr (+ dicr_regions)        a regulariser on the feature maps (2025 submission)
LooC's extra heads and views are its own objective (cl_jax.objectives.looc). Each add-on
is a record of plain scalars; from_config is the one place that builds them from a config,
and cl_jax.config_check the one place that decides which combinations the maths allows."""
