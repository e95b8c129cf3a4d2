"""Analyses of trained encoders (python -m cl_jax.analysis.<name>)."""
