"""Evaluation suites of a pretrained run's checkpoint, beyond the linear probe.

python -m cl_jax.evaluate --workdir=W --suite=robustness|transfer|fewshot [--step=N]
    [--data_dir=D] [--datasets=a,b] [--protocol=P] [--image_folders=name=path,...]
    [--bad_images=stop|skip] [--corruptions=c,...] [--severities=1,...] [--shots=5,10]
    [--ways=0] [--episodes=10] [--baseline=true]

  robustness  the run's linear-probe classifier (python -m cl_jax.probe first) on shifted test
              sets: ImageNet-C (mCE normalised by AlexNet, Hendrycks & Dietterich 2019),
              ImageNet-R, -Sketch, -A and Stylized-ImageNet, restricted to the classes the model
              was trained on (Ge et al. 2021, Sec. 4; cl_jax.suites.robustness).
  transfer    linear classifiers on frozen features of CUB-200-2011 and Flowers-102 (Xiao et
              al. 2021, Sec. 4; cl_jax.suites.transfer).
  fewshot     N-way K-shot nearest-centroid episodes on frozen features, mean and 95% interval
              over episodes (Xiao et al. 2021, Sec. 4; cl_jax.suites.fewshot).

Datasets are read from a prepared TFDS data_dir (default: the run config's data.data_dir) or,
for those TFDS lacks, from an image folder; nothing is downloaded, and a missing dataset stops
with the command that prepares it. An unreadable image in a folder stops the command with a line
naming it (--bad_images=stop, default), or is left out with a warning and listed in the report
(--bad_images=skip, at the cost of one extra decode of every image at start). The report is
written to W/eval_<suite>_step<N>.json, its numbers join the run's metrics.jsonl and TensorBoard
at step N (metrics.append_row), and the table is printed.
"""

import json
import os
from typing import NamedTuple

import jax
import ml_collections
from etils import epath

from cl_jax import checkpoint, linear_probe, metrics, run_config, write_faults
from cl_jax.errors import UsageError

SUITES = ("robustness", "transfer", "fewshot")


class EvalContext(NamedTuple):
  """What a suite needs about the run it evaluates.

  Attributes:
    workdir: the run directory.
    step: the checkpoint's step.
    config: the run's config.
    probe: the run's linear-probe context (linear_probe.setup): the feature function, the mesh
      the features are computed on, the initial variables (random-init baseline).
    variables: the checkpoint's encoder variables {"params", "batch_stats"}.
    data_dir: the TFDS data directory the suite's datasets are read from.
    options: the command's suite options (datasets, protocol, image_folders, bad_images,
      shots, ways, episodes, baseline), see `run`.
  """

  workdir: str
  step: int
  config: ml_collections.ConfigDict
  probe: object
  variables: dict
  data_dir: str
  options: dict


def _suite(name: str):
  """The module of suite `name`: run(ctx) -> report dict, scalars(report), table(report)."""
  if name == "robustness":
    from cl_jax.suites import robustness as module
  elif name == "transfer":
    from cl_jax.suites import transfer as module
  elif name == "fewshot":
    from cl_jax.suites import fewshot as module
  else:
    raise UsageError(f"--suite must be one of {', '.join(SUITES)}, got {name!r}")
  return module


def run(workdir: str, suite: str, step: int | None = None, data_dir: str | None = None, **options):
  """Run `suite` on checkpoint `step` (default: the latest) of the run in `workdir`.

  Args:
    workdir: a pretraining run directory.
    suite: one of SUITES.
    step: checkpoint step; None for the latest.
    data_dir: TFDS data directory; None for the run config's data.data_dir.
    **options: suite options passed on in EvalContext.options.
  Returns:
    The report (also written to workdir/eval_<suite>_step<N>.json, whose path it holds under
    "path" on process 0).
  """
  module = _suite(suite)
  config = run_config.read(workdir)
  data_dir = data_dir or config.data.get("data_dir", "")
  write_faults.check_writable(workdir, f"the {suite} report")
  probe = linear_probe.setup(config)
  step, variables = checkpoint.restore_encoder(workdir, probe.init_variables, step)
  where = workdir if "://" in workdir else os.path.abspath(workdir)
  ctx = EvalContext(where, step, config, probe, variables, data_dir, options)
  report = {"workdir": where, "step": step, "suite": suite, **module.run(ctx)}
  if jax.process_index() == 0:
    path = epath.Path(workdir) / f"eval_{suite}_step{step}.json"
    metrics.write_atomically(path, json.dumps(report, indent=2))
    metrics.append_row(workdir, step, module.scalars(report), f"eval_{suite}")
    report["path"] = str(path)
  return report


def table(report: dict) -> str:
  """The report of `run` as aligned text."""
  return _suite(report["suite"]).table(report)


def _pairs(text: str) -> dict[str, str]:
  """{name: path} of --image_folders=name=path,name=path."""
  out = {}
  for item in filter(None, text.split(",")):
    name, eq, path = item.partition("=")
    if not eq or not name or not path:
      raise UsageError(f"--image_folders takes name=path[,name=path...], got {item!r}")
    out[name.strip()] = path.strip()
  return out


def options_from_flags(values: dict) -> dict:
  """Suite options from the command's flag values (None: the suite's default)."""
  options = {}
  if values.get("datasets"):
    options["datasets"] = tuple(d.strip() for d in values["datasets"].split(",") if d.strip())
  if values.get("image_folders"):
    options["image_folders"] = _pairs(values["image_folders"])
  if values.get("corruptions"):
    options["corruptions"] = tuple(c.strip() for c in values["corruptions"].split(","))
  for name in ("shots", "severities"):
    if values.get(name):
      try:
        options[name] = tuple(int(s) for s in values[name].split(","))
      except ValueError:
        raise UsageError(f"--{name} takes integers such as 1,2, got {values[name]!r}") from None
  for name in ("protocol", "ways", "episodes", "baseline", "bad_images"):
    if values.get(name) is not None:
      options[name] = values[name]
  return options


def main(argv):
  """The command line (module docstring)."""
  from absl import app, flags

  from cl_jax import cli

  f = flags.FLAGS
  cli.start_reader(argv, f.workdir, "evaluate")
  if not f.suite:
    raise app.UsageError(f"--suite is required: one of {', '.join(SUITES)}")

  with cli.report():
    names = (
        "datasets",
        "image_folders",
        "corruptions",
        "severities",
        "shots",
        "protocol",
        "ways",
        "episodes",
        "baseline",
        "bad_images",
    )
    options = options_from_flags({name: f[name].value for name in names})
    report = run(f.workdir, f.suite, f.step, f.data_dir, **options)
    print(table(report))
    if "path" in report:
      print(f"report written to {report['path']}")


def _define_flags():
  """The command's flags (defined only when it runs as a program)."""
  from absl import flags

  flags.DEFINE_string("workdir", None, "Run directory with a checkpoint.")
  flags.DEFINE_enum("suite", None, list(SUITES), "The evaluation suite.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).", lower_bound=1)
  flags.DEFINE_string("data_dir", None, "TFDS data_dir (default: the run's data.data_dir).")
  flags.DEFINE_string("datasets", None, "Comma-separated datasets of the suite (default: all).")
  flags.DEFINE_string(
      "image_folders", None, "name=path,...: datasets read from image folders instead of TFDS."
  )
  flags.DEFINE_enum(
      "bad_images",
      "stop",
      ["stop", "skip"],
      "robustness, image folders: what an unreadable image (truncated, empty) does. stop: the "
      "command stops with a line naming the file. skip: every image is decoded once at start "
      "and the unreadable ones are left out, each named in a warning and listed in the report.",
  )
  flags.DEFINE_string("protocol", None, "Probe protocol (robustness: whose classifier; transfer).")
  flags.DEFINE_string("corruptions", None, "robustness: ImageNet-C corruptions (default all 15).")
  flags.DEFINE_string("severities", None, "robustness: ImageNet-C severities (default 1,2,3,4,5).")
  flags.DEFINE_string("shots", None, "fewshot: comma-separated K of the K-shot episodes.")
  flags.DEFINE_integer("ways", None, "fewshot: N classes per episode (0: all).", lower_bound=0)
  flags.DEFINE_integer("episodes", None, "fewshot: episodes per K.", lower_bound=1)
  flags.DEFINE_bool("baseline", None, "Also evaluate the network at random initialisation.")


if __name__ == "__main__":
  from absl import app

  from cl_jax import cli

  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
