"""Evaluation suites of cl_jax.evaluate: robustness, transfer and few-shot."""
