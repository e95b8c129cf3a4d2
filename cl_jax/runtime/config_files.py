"""Config files (the repository's `configs/NAME.py`), loaded by their path, not imported as a
package: `load_config_file` reads one, and a config built on another (DICR on its base
methods) reads its sibling with `sibling_config`."""

import importlib.util
import os
import types


def load_config_file(path: str, module_name: str = "cl_jax_config_file") -> types.ModuleType:
  """The Python config file at `path`, executed as a module named `module_name`."""
  spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def sibling_config(config_file: str, name: str) -> types.ModuleType:
  """The config file NAME.py in the folder of `config_file` (a config's __file__)."""
  path = os.path.join(os.path.dirname(os.path.abspath(config_file)), f"{name}.py")
  return load_config_file(path, f"cl_jax_config_{name}")
