"""The evaluation command's option parsing and its one-line errors, and the evaluators' registry:
every evaluator has the interface, options are checked against the evaluators chosen."""

import os

import pytest

from cl_jax import config_check, evaluate
from cl_jax.evaluators import MONITORS, NAMES, registry
from cl_jax.runtime.errors import UsageError
from configs import mocov2
from tests import forked_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_flag_values_become_suite_options():
  options = evaluate.options_from_flags(
      {
          "datasets": "imagenet_r, imagenet_c",
          "image_folders": "stylized_imagenet=/data/sin,imagenet_c=/data/in-c",
          "corruptions": "fog,snow",
          "severities": "1,5",
          "shots": "5,10",
          "ways": 0,
          "episodes": None,
          "baseline": False,
          "protocol": None,
          "bad_images": "skip",
      }
  )
  assert options == {
      "datasets": ("imagenet_r", "imagenet_c"),
      "image_folders": {"stylized_imagenet": "/data/sin", "imagenet_c": "/data/in-c"},
      "corruptions": ("fog", "snow"),
      "severities": (1, 5),
      "shots": (5, 10),
      "ways": 0,
      "baseline": False,
      "bad_images": "skip",
  }
  assert evaluate.options_from_flags({}) == {}
  assert evaluate.options_from_flags({"bad_images": "stop"}) == {"bad_images": "stop"}


@pytest.mark.parametrize(
    "values, message",
    [
        ({"image_folders": "stylized_imagenet"}, "name=path"),
        ({"shots": "five"}, "--shots takes integers"),
        ({"severities": "1,high"}, "--severities takes integers"),
    ],
)
def test_malformed_flags_are_refused(values, message):
  with pytest.raises(UsageError, match=message):
    evaluate.options_from_flags(values)


def test_unknown_evaluator_is_refused():
  with pytest.raises(
      UsageError, match="evaluator must be one of linear_probe, .*, fewshot, got 'speed'"
  ):
    registry.parse_names("knn,speed")
  with pytest.raises(UsageError, match="--evaluator is required"):
    registry.parse_names(" , ")


def test_every_evaluator_has_the_interface():
  for name in NAMES:
    module = registry.get(name)
    assert isinstance(module.TAG, str) and module.TAG.isidentifier(), name
    assert set(module.OPTIONS) <= set(evaluate._OPTIONS), name
    for member in ("run", "scalars", "table"):
      assert callable(getattr(module, member)), (name, member)
  for name in MONITORS:
    assert callable(registry.get(name).monitor) and callable(registry.get(name).check_monitor)


def test_an_option_no_chosen_evaluator_reads_is_refused():
  with pytest.raises(UsageError, match="--k is an option of knn, not of linear_probe, transfer"):
    registry.evaluate("/nonexistent", ("linear_probe", "transfer"), k=5)
  with pytest.raises(UsageError, match="--shots is an option of fewshot, not of knn"):
    registry.evaluate("/nonexistent", ("knn",), shots=(5,))


def test_only_monitors_run_during_pretraining():
  c = mocov2.get_config(None)
  c.eval.every, c.eval.evaluators = 10, ("knn", "linear_probe")
  with pytest.raises(UsageError, match="'linear_probe' cannot run during pretraining"):
    config_check.validate(c)


def _stderr_of(module: str, *args: str) -> str:
  """The stderr of `python -m module args` that failed with status 1 on one line."""
  proc = forked_commands.shared().run([module, *args], timeout=300)
  assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  return proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--evaluator=fewshot"], "pretraining run"),
        (["--suite=fewshot"], "--suite is now --evaluator: python -m cl_jax.evaluate"),
    ],
)
@pytest.mark.slow
def test_the_command_reports_in_one_line(tmp_path, args, message):
  stderr = _stderr_of("cl_jax.evaluate", f"--workdir={tmp_path}", *args)
  assert stderr.startswith("error:") and message in stderr


def test_a_moved_command_names_its_replacement():
  stderr = _stderr_of("cl_jax.knn", "--workdir=x")
  assert "use python -m cl_jax.evaluate --evaluator=knn" in stderr
