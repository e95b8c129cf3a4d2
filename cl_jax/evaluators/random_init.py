"""The random-init evaluator: the linear probe (cl_jax.evaluators.linear_probe) of the run's
network at its random initialisation (step 0 of the run's seed), the baseline every trained
number is read against. Computed once per configuration and cached
($CL_JAX_CACHE/random_init, linear_probe.random_init_accuracy).

python -m cl_jax.evaluate --workdir=W --evaluator=random_init [--protocol=P] [--validation]

The report is <workdir>/random_init_<protocol>[_val].json; its accuracies join the run's
metrics (at the evaluated step) as random_init[_heads][_val]/<protocol>/<label>/top1|top5.
"""

from cl_jax.evaluators import linear_probe

TAG = "random_init"
OPTIONS = ("protocol", "validation")


def run(ctx) -> dict:
  """The evaluator on ctx (cl_jax.evaluators.registry.EvalContext); options: protocol (default
  the config's probe.protocol), validation."""
  protocol, validation = linear_probe.protocol_option(ctx)
  accuracy = linear_probe.random_init_accuracy(ctx.extractor, protocol, validation)
  return linear_probe.describe(ctx, protocol, validation, accuracy)


def report_name(report: dict) -> str:
  """random_init_<protocol>[_heads][_val]: one report per setting, whatever the step."""
  validation = report["split"] == "validation"
  return linear_probe.file_stem("random_init", report["protocol"], report["features"], validation)


def scalars(report: dict) -> dict[str, float]:
  """random_init[_heads][_val]/<protocol>/<label>/top1|top5."""
  return linear_probe.scalars(report, "random_init")


def table(report: dict) -> str:
  """The linear probe's table, titled for the random initialisation."""
  return linear_probe.table(report, title="linear probe at random initialisation")
