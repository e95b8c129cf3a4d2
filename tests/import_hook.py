"""Runs a function on a module right after its first import, so that a test subprocess that
never imports the module (jax, most often) does not pay for it."""

import importlib.abc
import importlib.util
import sys


def after_import(name: str, callback) -> None:
  """callback(module) once the module `name` is imported: now, if it already is."""
  if name in sys.modules:
    callback(sys.modules[name])
  else:
    sys.meta_path.insert(0, _AfterImport(name, callback))


class _AfterImport(importlib.abc.MetaPathFinder):
  """Finds `name` with the other finders, then runs callback on the executed module; removes
  itself at that first import."""

  def __init__(self, name, callback):
    self.name = name
    self.callback = callback

  def find_spec(self, name, path, target=None):
    if name != self.name:
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    exec_module = spec.loader.exec_module

    def exec_and_call(module):
      exec_module(module)
      self.callback(module)

    spec.loader.exec_module = exec_and_call
    return spec
