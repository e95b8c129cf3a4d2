"""Typed reads of config fields, each failing with one line naming the field and the allowed values.

A field is named by its dotted path in an `ml_collections.ConfigDict` ("optim.lr"); every reader
returns the value once it is of the right type and in range, and otherwise raises `ConfigError`.
"""

import math

import ml_collections

from cl_jax.runtime.errors import UsageError


class ConfigError(UsageError, ValueError):
  """A config field holds a value outside its allowed range."""


def fail(field: str, value, allowed: str):
  """Raise ConfigError for `field` holding `value`, which is not `allowed`."""
  raise ConfigError(f"config field {field} = {value!r} is invalid: {allowed}")


def get(c, path: str):
  """The value at dotted `path` of config `c`, of any type; ConfigError if it is missing."""
  node = c
  for part in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise ConfigError(f"config field {path} is missing")
    node = node[part]
  return node


def integer(c, path, lo=None, hi=None):
  """An int (not a bool) in [lo, hi]; a bound of None is open."""
  v = get(c, path)
  if isinstance(v, bool) or not isinstance(v, int):
    fail(path, v, "must be an integer")
  if (lo is not None and v < lo) or (hi is not None and v > hi):
    fail(path, v, f"must be an integer in [{lo}, {hi if hi is not None else 'inf'}]")
  return v


def number(c, path, lo=None, hi=None, lo_open=False):
  """A finite int or float in [lo, hi] ((lo, hi] with lo_open), returned as a float."""
  v = get(c, path)
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    fail(path, v, "must be a finite number")
  below = v <= lo if lo_open else v < lo if lo is not None else False
  if below or (hi is not None and v > hi):
    left = "(" if lo_open else "["
    fail(path, v, f"must be in {left}{lo}, {hi if hi is not None else 'inf'}]")
  return float(v)


def choice(c, path, allowed):
  """One of the values in `allowed`."""
  v = get(c, path)
  if v not in allowed:
    fail(path, v, f"must be one of {', '.join(map(str, allowed))}")
  return v


def boolean(c, path):
  """True or False (not 0 or 1)."""
  v = get(c, path)
  if not isinstance(v, bool):
    fail(path, v, "must be True or False")
  return v


def interval(c, path, lo, hi):
  """A pair of numbers (a, b) with lo <= a <= b <= hi, returned as a tuple."""
  v = get(c, path)
  if (
      not isinstance(v, (tuple, list))
      or len(v) != 2
      or not all(isinstance(x, (int, float)) for x in v)
      or not lo <= v[0] <= v[1] <= hi
  ):
    fail(path, v, f"must be a pair (a, b) with {lo} <= a <= b <= {hi}")
  return tuple(v)
