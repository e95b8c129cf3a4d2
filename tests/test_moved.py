"""Modules that moved answer with what replaced them (cl_jax.MOVED), in one line."""

import importlib

import pytest

import cl_jax


@pytest.mark.parametrize("old", sorted(cl_jax.MOVED))
def test_a_moved_module_names_its_replacement(old):
  with pytest.raises(ModuleNotFoundError) as raised:
    importlib.import_module(old)
  assert str(raised.value) == f"{old} has moved: use {cl_jax.MOVED[old]}"
  assert "\n" not in str(raised.value)


def test_a_module_that_never_existed_is_not_called_moved():
  with pytest.raises(ModuleNotFoundError, match="No module named 'cl_jax.no_such_module'"):
    importlib.import_module("cl_jax.no_such_module")
