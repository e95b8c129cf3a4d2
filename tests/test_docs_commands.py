"""Every command that README.md and docs/ show runs as written: the module of each
`python -m cl_jax...` exists, every --flag it passes is one that the command's --help lists,
and every --config.FIELD is a field of its config file. Parsed, not run: one `--helpxml` of
each command (absl's --help as XML, with each flag's defining module and whether --help lists
it). And --help of every cl_jax command lists every flag that cl_jax defines in its process."""

import functools
import glob
import importlib.util
import os
import re
import shlex
import xml.etree.ElementTree as ET

import pytest

from cl_jax import config_defaults
from cl_jax.runtime import config_files, run_config
from tests import forked_commands
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # one fresh interpreter per command: seconds each

# Commands that need an optional extra (pyproject.toml) to start: module -> the package it needs.
# Without it, --help cannot run: the module's flags are checked where the extra is installed.
# Commands that need optional packages: {module: (the pip extra, the modules it must import)}.
OPTIONAL = {"cl_jax.bench.torch_reference": ("torch", ("torch", "torchvision"))}
DOCS = sorted(
    [os.path.join(ROOT, "README.md")]
    + glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
)
_FENCE = re.compile(r"^```(bash|sh|shell|console)\s*\n(.*?)^```", re.M | re.S)
_SEPARATORS = {"&&", "||", ";", "|", "&"}


def shell_commands(markdown: str) -> list[list[str]]:
  """The commands of the markdown's bash blocks, each as its argument list (continued lines
  joined, comments dropped, `a && b; c | d` split into a, b, c, d)."""
  commands = []
  for block in _FENCE.finditer(markdown):
    text = block.group(2).replace("\\\n", " ")
    for line in text.splitlines():
      line = line.strip()
      if line.startswith("$ "):
        line = line[2:]
      if not line or line.startswith("#"):
        continue
      lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
      lexer.whitespace_split = True
      lexer.commenters = "#"
      command = []
      for token in lexer:
        if token in _SEPARATORS:
          commands.append(command)
          command = []
        else:
          command.append(token)
      commands.append(command)
  return [c for c in commands if c]


def cl_jax_command(command: list[str]) -> tuple[str, list[str]] | None:
  """(module, its arguments) of `[VAR=value ...] [taskset -c CPUS] python[3] -m cl_jax.X args`,
  else None."""
  while command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", command[0]):
    command = command[1:]
  if command[:1] == ["taskset"] and command[1:2] == ["-c"]:
    command = command[3:]
  if len(command) >= 3 and re.fullmatch(r"(\S*/)?python3?", command[0]) and command[1] == "-m":
    if command[2].split(".")[0] == "cl_jax":
      return command[2], command[3:]
  return None


def _startable(module: str) -> bool:
  return module not in OPTIONAL or all(
      importlib.util.find_spec(name) is not None for name in OPTIONAL[module][1]
  )


def entry_modules() -> list[str]:
  """Every `python -m` command of the package: modules that run app.run as a program."""
  out = []
  for path in glob.glob(os.path.join(ROOT, "cl_jax", "**", "*.py"), recursive=True):
    with open(path) as f:
      source = f.read()
    name = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
    if name.endswith(".__main__"):
      out.append(name[: -len(".__main__")])
    elif 'if __name__ == "__main__":' in source:
      out.append(name)
  return sorted(out)


def help_flags(module: str, server: forked_commands.Server) -> dict[str, dict]:
  """{flag name: {"file": defining module, "key": listed by --help, "type": ...}} from
  `python -m module --helpxml`, started by `server`."""
  proc = server.run([module, "--helpxml"], timeout=300)
  start = proc.stdout.find("<?xml")
  assert (
      start >= 0
  ), f"{module} --helpxml printed no XML:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
  flags = {}
  for flag in ET.fromstring(proc.stdout[start:].encode()).iter("flag"):
    flags[flag.findtext("name")] = {
        "file": flag.findtext("file"),
        "key": flag.findtext("key") == "yes",
        "type": flag.findtext("type"),
    }
  return flags


@functools.cache
def all_help_flags() -> dict[str, dict[str, dict]]:
  """help_flags of every entry module that can start here, each command a process forked
  from one that has imported the libraries (tests/forked_commands.py)."""
  modules = [m for m in entry_modules() if _startable(m)]
  with forked_commands.Server(dict(os.environ, JAX_PLATFORMS="cpu")) as server:
    return {m: help_flags(m, server) for m in modules}


def _config_fields(value: str) -> set[str] | None:
  """The dotted fields of --config=PATH[:preset] (a path relative to the repository root), or
  None when the value is not a literal path (a shell variable)."""
  if "$" in value:
    return None
  path, _, preset = value.partition(":")
  module = config_files.load_config_file(os.path.join(ROOT, path))
  return set(run_config.flatten(module.get_config(preset) if preset else module.get_config()))


def command_errors(module: str, args: list[str], flags: dict[str, dict] | None) -> list[str]:
  """What is wrong with `python -m module args`: an unknown module (flags None), a flag that
  --help does not list, a --config.FIELD its config lacks."""
  if flags is None:
    return [f"no command {module}"]
  errors = []
  config = next((a.partition("=")[2] for a in args if a.startswith("--config=")), None)
  fields = (
      _config_fields(config) if config else set(run_config.flatten(config_defaults.base_config()))
  )
  for arg in args:
    if not arg.startswith("--") or arg == "--":
      continue
    name = arg[2:].partition("=")[0]
    if name.startswith("config."):
      field = name[len("config.") :]
      if (
          fields is not None
          and field not in fields
          and not any(f.startswith(field + ".") for f in fields)
      ):
        errors.append(f"{arg}: {config or 'the base config'} has no field {field}")
      continue
    listed = {n for n, f in flags.items() if f["key"] or f["file"].startswith("absl.app")}
    bool_flag = name.startswith("no") and flags.get(name[2:], {}).get("type") == "bool"
    if name not in listed and not (bool_flag and name[2:] in listed):
      errors.append(f"{arg}: not a flag of {module} (its --help lists {sorted(listed)})")
  return errors


def documented_commands() -> list[tuple[str, str, list[str]]]:
  """(file, module, arguments) of every `python -m cl_jax...` command in README and docs."""
  out = []
  for path in DOCS:
    with open(path) as f:
      for command in shell_commands(f.read()):
        found = cl_jax_command(command)
        if found:
          out.append((os.path.relpath(path, ROOT), *found))
  return out


def test_the_parser_finds_continued_chained_and_prefixed_commands():
  markdown = (
      "text\n```bash\n# a comment\n"
      "JAX_PLATFORMS=cpu python -m cl_jax.main --config=configs/mocov2.py \\\n"
      "    --config.seed=1 --workdir=runs/a  # trailing comment\n"
      "python3 -m cl_jax.probe --workdir=runs/a && python -m cl_jax.viz --workdir=runs/a\n"
      "taskset -c 1 python -m cl_jax.study --study=ge_alpha --arms=mocov2 &\n"
      "pip install -e .\n```\nnot a command: python -m cl_jax.nothing\n"
  )
  found = [cl_jax_command(c) for c in shell_commands(markdown)]
  assert found == [
      ("cl_jax.main", ["--config=configs/mocov2.py", "--config.seed=1", "--workdir=runs/a"]),
      ("cl_jax.probe", ["--workdir=runs/a"]),
      ("cl_jax.viz", ["--workdir=runs/a"]),
      ("cl_jax.study", ["--study=ge_alpha", "--arms=mocov2"]),
      None,
  ]


def test_a_misspelt_flag_or_field_is_found():
  flags = all_help_flags()["cl_jax.main"]
  assert (
      command_errors("cl_jax.main", ["--config=configs/mocov2.py", "--workdir=runs/a"], flags) == []
  )
  errors = command_errors(
      "cl_jax.main",
      ["--config=configs/mocov2.py", "--work_dir=runs/a", "--config.optim.batchsize=8"],
      flags,
  )
  assert len(errors) == 2
  assert errors[0].startswith("--work_dir=runs/a: not a flag of cl_jax.main")
  assert errors[1].startswith("--config.optim.batchsize=8: configs/mocov2.py has no field")
  assert command_errors("cl_jax.mian", [], None) == ["no command cl_jax.mian"]


def test_every_documented_command_exists_as_written():
  commands = documented_commands()
  assert len(commands) >= 20, commands  # README and docs show the main commands
  helps = all_help_flags()
  errors = [
      f"{path}: python -m {module} ...: {error}"
      for path, module, args in commands
      if _startable(module)
      for error in command_errors(module, args, helps.get(module))
  ]
  assert not errors, "\n".join(errors)


@pytest.mark.parametrize("module", entry_modules())
def test_help_lists_the_commands_own_flags(module):
  if not _startable(module):
    pytest.skip(f"needs {OPTIONAL[module][0]} (pip install -e .[{OPTIONAL[module][0]}])")
  flags = all_help_flags()[module]
  unlisted = sorted(
      name
      for name, flag in flags.items()
      if (flag["file"].startswith("cl_jax") or flag["file"].endswith(".py")) and not flag["key"]
  )
  assert not unlisted, f"python -m {module} --help does not list {unlisted}"
