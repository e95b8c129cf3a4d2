"""Evaluate a pretraining run's checkpoint: the one command for every evaluator.

python -m cl_jax.evaluate --workdir=W --evaluator=NAME[,NAME...] [--step=N] [--data_dir=D]
    [options of the evaluators]

  linear_probe    linear classifiers on frozen features: --protocol=fast|logreg|paper,
                  --validation (the held-out fifth of the train split), --baseline=false
  rotation_probe  the linear probe on the 4-way rotation task (same options)
  random_init     the linear probe of the network at its random initialisation (cached)
  knn             weighted kNN (Wu et al. 2018): --k, --temperature, --baseline=false
  robustness      the run's linear-probe classifier (run linear_probe first) on ImageNet-C
                  (mCE normalised by AlexNet), -R, -Sketch, -A and Stylized-ImageNet, restricted
                  to the classes the model was trained on (Ge et al. 2021, Sec. 4):
                  --datasets, --corruptions, --severities, --image_folders, --bad_images
  transfer        linear classifiers on CUB-200-2011 and Flowers-102 (Xiao et al. 2021, Sec. 4):
                  --datasets, --protocol, --baseline
  fewshot         N-way K-shot nearest-centroid episodes (Xiao et al. 2021, Sec. 4): --shots,
                  --ways, --episodes, --datasets, --baseline
--features=backbone|heads and --rotation override the run config's probe.features and
probe.rotation for all of them. Each evaluator is a module of cl_jax.evaluators (the interface
is in its package docstring); the checkpoint is restored once and the evaluators run in the
order given.

Datasets beyond the run's own are read from a prepared TFDS data_dir (default: the run config's
data.data_dir) or, for those TFDS lacks, from an image folder; nothing is downloaded, and a
missing dataset stops with the command that prepares it. An unreadable image in a folder stops
the command with a line naming it (--bad_images=stop, default), or is left out with a warning
and listed in the report (--bad_images=skip, at the cost of one extra decode of every image at
start). Each report is written to the workdir (its name is printed), its numbers join the
run's metrics.jsonl and TensorBoard at step N (metrics.append_row), and its table is printed.
"""

import jax

from cl_jax.evaluators import NAMES, features, linear_probe, registry
from cl_jax.runtime.errors import UsageError


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
  """Evaluator options from the command's flag values (None: the evaluator's default)."""
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
  for name in _PLAIN:
    if values.get(name) is not None:
      options[name] = values[name]
  return options


# Options passed on as the flags parse them.
_PLAIN = (
    "protocol",
    "validation",
    "features",
    "rotation",
    "k",
    "temperature",
    "ways",
    "episodes",
    "baseline",
    "bad_images",
)
_OPTIONS = ("datasets", "image_folders", "corruptions", "severities", "shots") + _PLAIN


def print_reports(reports: list[dict]) -> None:
  """Each report's table and where it was written, on process 0."""
  if jax.process_index() != 0:
    return
  for report in reports:
    print("\n" + registry.table(report))
    if "path" in report:
      print(f"report written to {report['path']}")


def main(argv):
  """The command line (module docstring)."""
  from absl import flags

  from cl_jax.runtime import cli

  f = flags.FLAGS
  if f.suite:
    with cli.report():
      raise UsageError(
          f"--suite is now --evaluator: python -m cl_jax.evaluate --workdir={f.workdir} "
          f"--evaluator={f.suite}"
      )
  cli.start_reader(argv, f.workdir, "evaluate")
  with cli.report():
    names = registry.parse_names(f.evaluator or "")
    options = options_from_flags({name: f[name].value for name in _OPTIONS})
    print_reports(registry.evaluate(f.workdir, names, f.step, f.data_dir, **options))


def _define_flags():
  """The command's flags (defined only when it runs as a program)."""
  from absl import flags

  flags.DEFINE_string("workdir", None, "Run directory with a checkpoint.")
  flags.DEFINE_string("evaluator", None, f"Comma-separated evaluators: {', '.join(NAMES)}.")
  flags.DEFINE_string("suite", None, "Replaced by --evaluator.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).", lower_bound=1)
  flags.DEFINE_string("data_dir", None, "TFDS data_dir (default: the run's data.data_dir).")
  flags.DEFINE_enum(
      "protocol",
      None,
      list(linear_probe.PROTOCOLS),
      "Probe protocol (default: the " "run config's probe.protocol; transfer: logreg).",
  )
  flags.DEFINE_bool(
      "validation",
      None,
      "Probes: report the held-out fifth of the training split instead of "
      "the test split (fast, logreg).",
  )
  flags.DEFINE_enum(
      "features",
      None,
      list(features.FEATURE_OUTPUTS),
      "Features to evaluate (default: " "the run config's probe.features).",
  )
  flags.DEFINE_bool(
      "rotation",
      None,
      "linear_probe: also probe 4-way rotation (default: the run config's " "probe.rotation).",
  )
  flags.DEFINE_bool("baseline", None, "Also evaluate the network at random initialisation.")
  flags.DEFINE_integer("k", None, "knn: neighbours (default: eval.knn_k).", lower_bound=1)
  flags.DEFINE_float("temperature", None, "knn: T of the votes exp(s / T) (eval.knn_temperature).")
  flags.DEFINE_string("datasets", None, "Comma-separated datasets of a suite (default: all).")
  flags.DEFINE_string(
      "image_folders", None, "name=path,...: datasets read from image folders instead of TFDS."
  )
  flags.DEFINE_enum(
      "bad_images",
      None,
      ["stop", "skip"],
      "robustness, image folders: what an unreadable image (truncated, empty) does. stop "
      "(default): the command stops with a line naming the file. skip: every image is decoded "
      "once at start and the unreadable ones are left out, each named in a warning and listed "
      "in the report.",
  )
  flags.DEFINE_string("corruptions", None, "robustness: ImageNet-C corruptions (default all 15).")
  flags.DEFINE_string("severities", None, "robustness: ImageNet-C severities (default 1,2,3,4,5).")
  flags.DEFINE_string("shots", None, "fewshot: comma-separated K of the K-shot episodes.")
  flags.DEFINE_integer("ways", None, "fewshot: N classes per episode (0: all).", lower_bound=0)
  flags.DEFINE_integer("episodes", None, "fewshot: episodes per K.", lower_bound=1)


if __name__ == "__main__":
  from absl import app

  from cl_jax.runtime import cli

  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
