"""Quieting the libraries' absl warnings where cl_jax reports the condition itself."""

import contextlib
import logging as std_logging

from absl import logging


@contextlib.contextmanager
def quiet():
  """absl logging at ERROR level inside (e.g. orbax's notes on read-only managers and on
  unreadable checkpoints, TFDS's on unprepared datasets, which cl_jax reports itself)."""
  level = logging.get_verbosity()
  logging.set_verbosity(min(level, logging.ERROR))  # absl: lower is quieter
  try:
    yield
  finally:
    logging.set_verbosity(level)


def drop(phrase: str) -> None:
  """Drop, from now on, the absl log records whose message contains `phrase` (a library's
  note on a condition that cl_jax reports itself in its own words)."""

  def keep(record) -> bool:
    return phrase not in record.getMessage()

  std_logging.getLogger("absl").addFilter(keep)
