"""The losses: pure array functions with scalar hyperparameters, readable and testable
without the config system. `contrast` holds the InfoNCE contrast that MoCo, SimCLR and LooC
share; the add-ons (cl_jax.addons) transform it, the objectives (cl_jax.objectives) compose
the two."""
