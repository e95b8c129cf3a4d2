"""Weighted-kNN evaluation of a run's checkpoint (Wu et al. 2018; cl_jax.knn_classifier): the
probe dataset's train split in its evaluation view is the memory bank, the test split is
classified, one accuracy per label; with --baseline also the same network at random
initialisation.

python -m cl_jax.knn --workdir=W [--step=N] [--k=200] [--temperature=0.1] [--baseline=true]

Writes W/knn_step<N>.json and prints the table.
"""

from absl import app, flags

from cl_jax import cli
from cl_jax.knn_eval import run, table

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory with a checkpoint.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).", lower_bound=1)
_K = flags.DEFINE_integer("k", 200, "Neighbours.", lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.1, "Temperature T of the votes exp(s / T).")
_BASELINE = flags.DEFINE_bool("baseline", True, "Also evaluate the network at random init.")


def main(argv):
  cli.start_reader(argv, _WORKDIR.value, "evaluate")
  with cli.report():
    report = run(_WORKDIR.value, _STEP.value, _K.value, _TEMPERATURE.value, _BASELINE.value)
    print(table(report))
    if "path" in report:
      print(f"report written to {report['path']}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
