"""cl_jax: contrastive self-supervised learning in JAX/Flax.

Commands and modules that moved keep answering: `python -m cl_jax.<old name>` (or an import of
it) stops with one line naming what replaced it (MOVED), instead of Python's bare "No module
named ...".

Importing cl_jax chooses XLA's CPU convolution path from the processor where no XLA_FLAGS are
set (cl_jax.runtime.xla_cpu); XLA_CPU_CHOICE is the line saying so, or None.
"""

import importlib.abc
import sys

# Old module -> the command or import that replaced it.
MOVED = {
    "cl_jax.knn": "python -m cl_jax.evaluate --evaluator=knn",
    "cl_jax.bench_augment": "python -m cl_jax.bench.augment",
    "cl_jax.bench_torch": "python -m cl_jax.bench.torch_reference",
    "configs.default": "from cl_jax import config_defaults",
    "cl_jax.bench_report": "python -m cl_jax.bench.report",
    "cl_jax.memory_queue": "from cl_jax.losses import memory_queue",
}


class _MovedCommands(importlib.abc.MetaPathFinder):
  """Finds the MOVED modules only to refuse them with the new command (runpy prints the
  ModuleNotFoundError's message on one line)."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname in MOVED:
      raise ModuleNotFoundError(f"{fullname} has moved: use {MOVED[fullname]}", name=fullname)
    return None


sys.meta_path.append(_MovedCommands())

from cl_jax.runtime import xla_cpu as _xla_cpu  # noqa: E402  (before any JAX backend exists)

XLA_CPU_CHOICE = _xla_cpu.apply()
