"""The evaluation command's option parsing and its one-line errors."""

import os
import subprocess
import sys

import pytest

from cl_jax import evaluate
from cl_jax.errors import UsageError

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


def test_unknown_suite_is_refused():
  with pytest.raises(UsageError, match="--suite must be one of robustness, transfer, fewshot"):
    evaluate.run("/nonexistent", "speed")


def test_the_command_reports_a_missing_run_in_one_line(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "cl_jax.evaluate", f"--workdir={tmp_path}", "--suite=fewshot"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
      env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert proc.returncode == 1
  assert proc.stderr.strip().startswith("error:") and len(proc.stderr.strip().splitlines()) == 1
  assert "pretraining run" in proc.stderr
