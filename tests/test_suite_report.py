"""The test-suite profile's summary (tests/suite_report.py) on hand-written records."""

import json

from tests import suite_report


def _proc(argv, test, wall=2.0, **counts):
  return {"argv": argv, "test": test, "wall_s": wall, **counts}


def test_commands_are_named_by_module_or_script():
  assert suite_report.command_of(["/r/cl_jax/main.py", "--workdir=w"]) == "cl_jax.main"
  assert suite_report.command_of(["/r/cl_jax/viz/__main__.py", "w"]) == "cl_jax.viz.__main__"
  assert suite_report.command_of(["-c"]) == "-c"
  assert suite_report.command_of(["/r/launch/x.py"]) == "x.py"


def test_each_test_gets_the_first_kind_that_applies():
  main = "/r/cl_jax/main.py"
  assert suite_report.kind_of({}, [_proc([main, "--num_processes=2"], "t")]) == (
      "multi-process run"
  )
  assert suite_report.kind_of({}, [_proc([main], "t"), _proc(["-c"], "t")]) == (
      "subprocess: cl_jax.main"
  )
  assert suite_report.kind_of({"requests": 3}, [_proc(["-c"], "t")]) == (
      "subprocess: other command"
  )
  assert suite_report.kind_of({"requests": 3}, []) == "in-process JAX"
  assert suite_report.kind_of({"requests": 0}, []) == "Python only"


def test_rows_sum_the_tests_and_their_subprocesses(tmp_path):
  tests = [
      {"test": "a.py::x", "setup": 1.0, "call": 2.0, "teardown": 0.5, "requests": 4, "hits": 1,
       "writes": 3, "compile_s": 1.5, "trace_s": 0.25, "lower_s": 0.25},
      {"test": "a.py::y", "setup": 0.0, "call": 1.0, "teardown": 0.0, "requests": 0, "hits": 0,
       "writes": 0, "compile_s": 0.0, "trace_s": 0.0, "lower_s": 0.0},
      {"test": "b.py::z", "setup": 0.0, "call": 10.0, "teardown": 0.0, "requests": 0, "hits": 0,
       "writes": 0, "compile_s": 0.0, "trace_s": 0.0, "lower_s": 0.0},
  ]  # fmt: skip
  (tmp_path / "proc").mkdir()
  with open(tmp_path / "tests.jsonl", "w") as f:
    f.writelines(json.dumps(t) + "\n" for t in tests)
  procs = [
      _proc(["/r/cl_jax/main.py"], "b.py::z", 8.0, requests=10, hits=7, writes=3, compile_s=4.0),
      _proc(["/r/cl_jax/probe.py"], "b.py::z", 1.0, requests=2, hits=2, writes=0, compile_s=0.5),
  ]
  for i, p in enumerate(procs):
    (tmp_path / "proc" / f"{i}.json").write_text(json.dumps(p))
  loaded, by_test = suite_report.load(str(tmp_path))
  rows = suite_report.summarise(loaded, by_test, lambda t, p: t["test"].split("::")[0])
  assert [r["name"] for r in rows] == ["b.py", "a.py"]  # biggest first
  b, a = rows
  assert a["tests"] == 2 and a["seconds"] == 4.5 and a["setup"] == 1.0 and a["compile"] == 2.0
  assert a["in-process requests"] == 4 and a["in-process hits"] == 1 and a["subprocesses"] == 0
  assert b["subprocesses"] == 2 and b["subprocess compile"] == 4.5
  assert b["subprocess requests"] == 12 and b["subprocess hits"] == 9
  text = suite_report.report(str(tmp_path))
  assert "| cl_jax.main | 1 | 8 | 4 | 10 | 7 | 3 |" in text
  assert "| **total** | 3 | 14 | 1 | 2 | 2 | 4 | 4 | 1 | 12 | 9 |" in text
