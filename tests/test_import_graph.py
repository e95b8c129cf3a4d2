"""The library's import graph, read from the source: every import of a cl_jax module, at module
level or inside a function, is an edge. No circle among modules or folders, and the layers:
the pure parts (runtime, losses, models, data) below the add-ons, the add-ons below the
objectives, the objectives below the step, the step below the trainer, the trainer below the
analyses and benchmarks."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "cl_jax")


def _modules() -> dict[str, str]:
  """{dotted module name: path} of every module of the package (a package by its __init__)."""
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(folder, f)
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[name.removesuffix(".__init__")] = path
  return out


MODULES = _modules()


def _target(name: str) -> str:
  """The module an imported dotted name lives in (its longest prefix that is a module)."""
  while name not in MODULES:
    name = name.rpartition(".")[0]
  return name


def _edges() -> dict[str, set[str]]:
  """{module: the cl_jax modules it imports}; `from package import name` is an edge to the
  submodule when `name` is one, else to the package."""
  edges = {}
  for module, path in MODULES.items():
    with open(path) as f:
      tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        out |= {_target(a.name) for a in node.names if a.name.split(".")[0] == "cl_jax"}
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module.split(".")[0] == "cl_jax":
          for a in node.names:
            full = f"{node.module}.{a.name}"
            out.add(full if full in MODULES else _target(node.module))
    edges[module] = out - {module}
  return edges


EDGES = _edges()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node (Tarjan's algorithm)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def _folder(module: str) -> str:
  """A module's top-level part: cl_jax.<folder> or cl_jax.<module>."""
  return ".".join(module.split(".")[:2])


def test_the_cycle_finder_finds_a_circle_and_only_a_circle():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
  assert _cycles(graph) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_imports():
  """An import inside a function is an edge (the fingerprint imports the trainer lazily)."""
  assert "cl_jax.train" in EDGES["cl_jax.analysis.fingerprint"]
  assert "cl_jax.objectives" in EDGES["cl_jax.config_check"]


def test_no_module_imports_itself_back():
  assert _cycles(EDGES) == []


def test_no_two_folders_import_each_other():
  folders = {}
  for module, targets in EDGES.items():
    folders.setdefault(_folder(module), set()).update(
        _folder(t) for t in targets if _folder(t) != _folder(module)
    )
  assert _cycles(folders) == []


# What each part may import besides itself: the lower layers.
BELOW = {
    "cl_jax.runtime": set(),
    "cl_jax.losses": {"cl_jax.runtime"},
    "cl_jax.models": {"cl_jax.runtime"},
    "cl_jax.addons": {"cl_jax.runtime", "cl_jax.losses", "cl_jax.models"},
    "cl_jax.objectives": {
        "cl_jax.runtime",
        "cl_jax.losses",
        "cl_jax.models",
        "cl_jax.addons",
        "cl_jax.state",
    },
    "cl_jax.state": {"cl_jax.losses"},
}


@pytest.mark.parametrize("part", sorted(BELOW))
def test_each_layer_imports_only_the_layers_below_it(part):
  allowed = BELOW[part] | {part}
  wrong = sorted(
      f"{module} -> {target}"
      for module, targets in EDGES.items()
      if _folder(module) == part
      for target in targets
      if _folder(target) not in allowed
  )
  assert wrong == []


def test_the_trainer_sits_above_its_step_and_below_the_analyses():
  assert "cl_jax.train_step" in EDGES["cl_jax.train"]
  below_train = [m for m in MODULES if m != "cl_jax.train" and "cl_jax.train" in _reaches(m)]
  lower = ("cl_jax.train_step", "cl_jax.objectives", "cl_jax.addons", "cl_jax.data")
  assert [m for m in below_train if m.startswith(lower)] == []
  # The analyses and the benchmarks import the trainer; the analyses, not the benchmarks.
  assert not any(_folder(t) == "cl_jax.bench" for m in MODULES if m.startswith("cl_jax.analysis")
                 for t in EDGES[m])  # fmt: skip


def _reaches(module: str) -> set[str]:
  """Every module `module` imports, directly or through others."""
  seen, todo = set(), [module]
  while todo:
    for target in EDGES[todo.pop()]:
      if target not in seen:
        seen.add(target)
        todo.append(target)
  return seen


def test_the_study_types_and_the_method_and_addon_entries_are_leaves():
  """They import nothing of the library but modules that themselves import none of it (the
  study types: the intervals' directions)."""
  for leaf in ("cl_jax.analysis.study_types", "cl_jax.objectives.method", "cl_jax.addons.addon"):
    assert all(EDGES[m] == set() for m in EDGES[leaf]), leaf


def test_health_and_the_photometric_spec_sit_below_the_objectives():
  assert not any(t.startswith("cl_jax.analysis") for t in _reaches("cl_jax.objectives"))
  assert "cl_jax.train_step" not in _reaches("cl_jax.data.photometric")


def test_at_most_twelve_top_level_modules():
  top = [
      m
      for m in MODULES
      if m.count(".") == 1 and not os.path.isdir(os.path.join(ROOT, *m.split(".")))
  ]
  assert len(top) <= 12, sorted(top)


def test_the_config_check_reads_option_lists_from_the_modules_that_implement_them():
  """No tuple of option names is written out in config_check: each comes from its module
  (forward.BN_MODES, optim.OPTIMIZERS, linear_probe.PROTOCOLS, the add-ons' own, ...)."""
  with open(MODULES["cl_jax.config_check"]) as f:
    tree = ast.parse(f.read())
  written = [
      target.id
      for node in tree.body
      if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)
      and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)
      for target in node.targets
  ]  # fmt: skip
  assert written == []
