"""What the add-on modules share: the record of plain scalars built from a config block."""

import dataclasses


def record(cls, block, **derived):
  """An add-on record (a dataclass) whose fields are the config block's fields of the same
  names, except those given in `derived` (fields the config states in other units)."""
  names = [f.name for f in dataclasses.fields(cls) if f.name not in derived]
  return cls(**{name: block[name] for name in names}, **derived)
