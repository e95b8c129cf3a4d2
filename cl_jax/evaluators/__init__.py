"""Evaluators: what a run's representation is worth, each selected by name.

Every evaluator is a module of this package with the same few members:
  TAG                           the tag of its rows in the run's metrics (metrics.append_row)
  OPTIONS                       the names of the command options it reads
  run(ctx) -> dict              its report on ctx (registry.EvalContext: the checkpoint's
                                variables, the run's config, the feature Extractor, options)
  scalars(report) -> dict       the report's numbers as metrics
  table(report) -> str          the report as text
  report_name(report) -> str    (optional) its file name in the workdir; default <TAG>_step<N>
and, when it can run during pretraining (config eval.evaluators, every eval.every steps):
  check_monitor(extractor, config)        UsageError for settings it cannot run with
  monitor(extractor, variables, config)   its metrics of the current variables

All of them compute features through cl_jax.evaluators.features. The registry
(cl_jax.evaluators.registry) runs them on a checkpoint, writes their reports and metrics, and
runs the monitors of the training loop; the command is python -m cl_jax.evaluate.
"""

# name -> what it reports; the module cl_jax.evaluators.<name> implements it.
NAMES = {
    "linear_probe": "linear classifiers on frozen features (fast, logreg or paper protocol)",
    "rotation_probe": "the linear probe on the 4-way rotation task",
    "random_init": "the linear probe of the network at its random initialisation",
    "knn": "weighted kNN of the test split against the train split",
    "robustness": "the probe's classifier on ImageNet-C, -R, -Sketch, -A, Stylized-ImageNet",
    "transfer": "linear classifiers on CUB-200-2011 and Flowers-102",
    "fewshot": "N-way K-shot nearest-centroid episodes",
}
# The evaluators that can run during pretraining (they have `monitor`).
MONITORS = ("knn",)
