"""python -m cl_jax.bench: the train-step benchmark (cl_jax.bench.step)."""

from cl_jax.bench import step

step.run()
