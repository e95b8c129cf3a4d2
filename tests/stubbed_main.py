"""`python -m tests.stubbed_main INDEX FLAGS`: `python -m cl_jax.main FLAGS` as process INDEX of
a multi-host run whose pretraining returns at step 8 of 16, with JAX's distributed start-up and
the training stubbed out: what main does around them is what a test reads. The start-up prints
its arguments; a probe is an error."""

import sys

import jax
from absl import app

from cl_jax import evaluate, main, train
from cl_jax.runtime import distributed_startup


def _no_probe(*args, **kwargs):
  raise AssertionError("the probe ran after a --stop_at_step chunk")


if __name__ == "__main__":
  index = int(sys.argv.pop(1))
  distributed_startup.initialize_distributed = lambda *a, **k: print(f"start-up {a}")
  train.pretrain = lambda *a, **k: (8, 16)
  jax.process_index = lambda: index
  evaluate.print_reports = _no_probe
  app.run(main.main)
