"""Command-line plumbing shared by the entry points: flag parsing and one-line errors.

`parse_flags` is the flags parser of `absl.app.run`: it resolves a relative
`--config=configs/NAME.py` against the installed repository when the current
directory has no such file (so the commands work from any directory), and turns
every flag error (a missing config file, an unknown config field, a value of the
wrong type) into one line on stderr, with a "did you mean" hint for misspelt
fields. `report` turns the exceptions of bad input, and write faults, into one line
each.
"""

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable

from absl import flags
from ml_collections import config_flags

from cl_jax.runtime import config_files, run_config, write_faults
from cl_jax.runtime.errors import UsageError

flags.disclaim_key_flags()  # --config defined here belongs to the command that calls for it

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config_arg(argv: list[str]) -> tuple[int, str] | None:
  """(index in argv, value) of the --config flag's value, or None."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return i, arg[len("--config=") :]
    if arg == "--config" and i + 1 < len(argv):
      return i + 1, argv[i + 1]
  return None


def resolve_config_path(value: str) -> str:
  """`value` (PATH[:preset]) with PATH made absolute: relative to the current directory
  if the file is there, else to the repository root; UsageError if neither has it."""
  path, colon, preset = value.partition(":")
  candidates = (
      [path]
      if os.path.isabs(path)
      else list(dict.fromkeys([os.path.abspath(path), os.path.join(REPO_ROOT, path)]))
  )
  for candidate in candidates:
    if os.path.isfile(candidate):
      return os.path.abspath(candidate) + colon + preset
  where = " or ".join(os.path.abspath(c) for c in candidates)
  raise UsageError(
      f"config file {path} not found (looked for {where}); configs are "
      f"Python files such as configs/mocov2_patchns.py"
  )


def _load_config(value: str):
  """The ConfigDict of --config=PATH[:preset] (the file's get_config)."""
  path, _, preset = value.partition(":")
  module = config_files.load_config_file(path)
  return module.get_config(preset) if preset else module.get_config()


def _unknown_field(argv: list[str], config_value: str) -> str | None:
  """A one-line error for the first --config.FIELD override that the config lacks."""
  try:
    config = _load_config(config_value)
  except Exception:  # the config file itself fails: absl's message says how
    return None
  fields = run_config.flatten(config)
  for arg in argv:
    if arg.startswith("--config."):
      field = arg[len("--config.") :].partition("=")[0]
      if field not in fields and not any(k.startswith(field + ".") for k in fields):
        return f"unknown config field {field} (in {arg})" f"{run_config.suggest(field, config)}"
  return None


def _one_line(message: str) -> str:
  """The informative line of an absl flag error (its last non-empty line when the
  message carries a traceback)."""
  lines = [line.strip() for line in str(message).splitlines() if line.strip()]
  if any(line.startswith("Traceback") for line in lines):
    return f"{lines[0].rstrip(':')} {lines[-1]}"
  return " ".join(lines)


HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def parse_flags(argv: list[str]) -> list[str]:
  """absl flags parser: parse `argv`, or print one error line and exit with status 2; --help
  prints the flags and exits with status 0 (absl's own exits with 1)."""
  argv = list(argv)
  found = _config_arg(argv)
  try:
    if found is not None:
      i, value = found
      resolved = resolve_config_path(value)
      argv[i] = f"--config={resolved}" if argv[i].startswith("--config=") else resolved
    return flags.FLAGS(argv)
  except UsageError as e:
    sys.exit(f"error: {e}")
  except SystemExit as e:
    if e.code == 1 and any(a.split("=")[0] in HELP_FLAGS for a in argv[1:]):
      sys.exit(0)
    raise
  except Exception as e:  # absl and ml_collections raise several types for bad flags
    if found is not None:
      broken = _broken_config_file(_config_arg(argv)[1])
      if broken is not None:
        sys.exit(f"error: {broken}")
    hint = _unknown_field(argv, _config_arg(argv)[1]) if found is not None else None
    if hint is None and not isinstance(e, flags.Error):
      raise
    sys.exit(f"error: {hint or _one_line(e)}")


def _broken_config_file(value: str) -> str | None:
  """A one-line error if the config file of --config=PATH[:preset] itself fails to load (a
  syntax error, a failing import, an unknown preset, an exception in get_config), with the
  file's line; None if it loads."""
  path = value.partition(":")[0]
  try:
    _load_config(value)
  except SyntaxError as e:
    return f"config file {path} has a syntax error at line {e.lineno}: {e.msg}"
  except Exception as e:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    where = f" at line {frames[-1].lineno}" if frames else ""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"config file {path} fails to load{where}: {type(e).__name__}: {first}"
  return None


def define_config_flag() -> flags.FlagHolder:
  """Defines --config of every command: a config file with an optional preset
  (configs/NAME.py[:preset]), locked, so that an override names an existing field."""
  return config_flags.DEFINE_config_file(
      "config",
      None,
      "Config file, optionally with a preset: configs/NAME.py[:preset].",
      lock_config=True,
  )


def list_in_help(module_name: str) -> None:
  """Makes --help of the running program list the flags that `module_name` defines. absl's
  --help lists the main module's flags only, so a command whose flags live in the module it
  runs (python -m cl_jax.bench runs cl_jax.bench.step) would list none."""
  for flag in flags.FLAGS.get_flags_for_module(module_name):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def start_reader(argv: list[str], workdir: str | None, purpose: str) -> None:
  """The start of a command that reads a run (probe, kNN, evaluate, export, NormStd): no
  positional arguments, --workdir given (absl's one-line usage error otherwise, naming
  `purpose`), and absl's log at WARNING unless --verbosity was given (orbax logs every
  restore at INFO)."""
  from absl import app, logging

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; give the run as --workdir=W")
  if not workdir:
    raise app.UsageError(f"--workdir is required: the run directory to {purpose}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def require(names: tuple[str, ...], command: str) -> None:
  """UsageError naming the first of the flags `names` left empty (command: its module, for
  --help)."""
  for name in names:
    if not getattr(flags.FLAGS, name):
      raise UsageError(f"--{name} is required (python -m {command} --help)")


@contextlib.contextmanager
def report(*expected: type[BaseException]):
  """Turn UsageError, a write fault (no space, read-only, no permission:
  cl_jax.runtime.write_faults) and the `expected` exception types into one error line and exit 1."""
  try:
    with write_faults.guard("an output file", "its folder"):
      yield
  except (UsageError, *expected) as e:
    sys.exit(f"error: {e}")


def run_measurement(define_flags: Callable[[], None], measure: Callable, text: Callable) -> None:
  """Run a benchmark command (the flags defined here, when it runs, so that importing its module
  defines none): --config (required), the flags define_flags() adds and --json; its result,
  measure(flags.FLAGS) -> a JSON-able dict, printed as one JSON object with --json, else as
  text(result); a UsageError or write fault is one error line (report)."""
  from absl import app

  def main(argv):
    del argv
    with report():
      result = measure(flags.FLAGS)
    print(json.dumps(result) if flags.FLAGS.json else text(result))

  define_config_flag()
  define_flags()
  flags.DEFINE_bool("json", False, "Print one JSON object instead of the text.")
  flags.mark_flag_as_required("config")
  app.run(main, flags_parser=parse_flags)
