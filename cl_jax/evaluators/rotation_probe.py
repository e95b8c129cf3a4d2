"""The rotation-probe evaluator: the linear probe (cl_jax.evaluators.linear_probe) on the 4-way
rotation task (Xiao et al. 2021, Table 1): every probe image rotated by a random multiple of 90
degrees and labelled by it (cl_jax.data.rotated_source), a linear classifier of the frozen
features trained and tested on them. It tells whether the features keep the information an
augmentation (rotation) would make them invariant to.

python -m cl_jax.evaluate --workdir=W --evaluator=rotation_probe [--protocol=P] [--validation]
    [--baseline=false]

The same numbers join a linear_probe report as its label "rotation" when probe.rotation is set.
The report is <workdir>/probe_step<N>_<protocol>[_heads][_val]_rotation.json; its accuracies join
the run's metrics as the linear probe's probe[...]/<protocol>/rotation/top1|top5.
"""

from cl_jax.evaluators import features, linear_probe

TAG = "probe"
OPTIONS = ("protocol", "baseline", "validation")


def run(ctx) -> dict:
  """The evaluator on ctx (cl_jax.evaluators.registry.EvalContext); options as the linear
  probe's. The baseline (the same probe at random initialisation) is computed, not cached."""
  protocol, validation = linear_probe.protocol_option(ctx)
  task = features.rotated(ctx.extractor)
  accuracy, _ = linear_probe.probe_labels(task, ctx.variables, protocol, validation)
  report = linear_probe.describe(ctx, protocol, validation, accuracy)
  if ctx.options.get("baseline", True):
    init = ctx.extractor.init_variables()
    report["random_init"], _ = linear_probe.probe_labels(task, init, protocol, validation)
  return report


def report_name(report: dict) -> str:
  """The linear probe's name of the same settings, with _rotation."""
  return linear_probe.report_name(report) + "_rotation"


def scalars(report: dict) -> dict[str, float]:
  """As the linear probe's: probe[_heads][_val]/<protocol>/rotation/top1|top5."""
  return linear_probe.scalars(report)


def table(report: dict) -> str:
  """The linear probe's table, titled rotation probe."""
  return linear_probe.table(report, title="rotation probe")
