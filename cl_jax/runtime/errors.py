"""The exception for bad input: what the command-line entry points report as one line.

Everything a user can get wrong (a config value, a flag, a path, a dataset that
is not prepared, a workdir that holds another run) raises `UsageError` or a
subclass with a message that names what is wrong and how to fix it. The entry
points catch only this class (and a diverged run), so an internal error keeps
its traceback.
"""


class UsageError(Exception):
  """Bad input: the message names the offending value and the way out."""
