"""Transfer suite: linear classifiers on frozen features of fine-grained datasets.

python -m cl_jax.evaluate --workdir=W --evaluator=transfer [--datasets=cub200,flowers102]
    [--protocol=logreg|fast] [--baseline=true] [--data_dir=D]

Xiao et al. 2021 (Sec. 4, Table 2) report top-1 / top-5 of a linear classifier on the frozen
backbone of CUB-200-2011 (train 5,994 / test 5,794 images). Here one classifier per dataset
(cl_jax.evaluators.fine_grained: CUB-200-2011 fitted on train, Flowers-102 on train+validation,
both tested on test) is fitted to the cached, standardised features of the evaluation views:
  logreg  (default) scikit-learn's multinomial logistic regression, L-BFGS, C = 1
          (linear_classifier.fit_logreg): a convex problem, so no learning rate to tune per dataset;
  fast    SGD with the run's config.probe settings (linear_classifier.fit_fast).
The paper's own schedules (App. C: SGD lr 30 for 200 epochs on CUB, Adam for Flowers) train on
augmented views and are not offered. With `baseline` the same evaluation on the network at
random initialisation (step 0 of the run's seed) stands beside every number.
"""

from cl_jax.evaluators import fine_grained, linear_classifier
from cl_jax.runtime.errors import UsageError

TAG = "eval_transfer"
OPTIONS = ("protocol", "datasets", "baseline")

DEFAULT_DATASETS = ("cub200", "flowers102")
PROTOCOLS = ("logreg", "fast")


def _protocol(options: dict) -> str:
  protocol = options.get("protocol") or "logreg"
  if protocol == "paper":
    raise UsageError(
        "--protocol=paper (augmented training views through the backbone at every step) is "
        "the linear probe's (python -m cl_jax.evaluate --evaluator=linear_probe); the transfer "
        "suite fits cached features: use --protocol=logreg or --protocol=fast"
    )
  if protocol not in PROTOCOLS:
    raise UsageError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
  return protocol


def accuracy(ctx, variables: dict, dataset: fine_grained.Opened, protocol: str) -> dict:
  """{"top1", "top5"} test accuracy (fractions) of the `protocol` classifier fitted to the
  training features of `dataset` under the encoder `variables`."""
  f = fine_grained.split_features(ctx, variables, dataset)
  classes = {"label": dataset.num_classes}
  if protocol == "fast":
    classifier = linear_classifier.fit_fast(
        f.x_train, {"label": f.y_train}, classes, ctx.config.probe, ctx.config.seed
    )
  else:
    classifier = linear_classifier.fit_logreg(f.x_train, {"label": f.y_train}, classes)
  return classifier.accuracy(f.x_test, {"label": f.y_test})["label"]


def run(ctx) -> dict:
  """The report body: protocol, features, and per dataset its TFDS splits, sizes, classes,
  "accuracy" {"top1", "top5"} and (with the baseline option) "random_init" alike."""
  names = fine_grained.dataset_names(ctx.options, DEFAULT_DATASETS)
  protocol = _protocol(ctx.options)
  baseline = fine_grained.baseline_option(ctx.options)
  datasets = [fine_grained.open_dataset(name, ctx.data_dir) for name in names]
  networks = {"accuracy": ctx.variables}
  if baseline:
    networks["random_init"] = ctx.extractor.init_variables()
  report = {}
  for dataset in datasets:
    report[dataset.name] = {
        "tfds": dataset.spec.tfds_name,
        "train_split": dataset.spec.train_split,
        "test_split": dataset.spec.test_split,
        "num_train": len(dataset.train),
        "num_test": len(dataset.test),
        "num_classes": dataset.num_classes,
        **{key: accuracy(ctx, v, dataset, protocol) for key, v in networks.items()},
    }
  return {
      "protocol": protocol,
      "features": ctx.config.probe.get("features", "backbone"),
      "datasets": report,
  }


def scalars(report: dict) -> dict[str, float]:
  """transfer/<dataset>/top1|top5 and transfer/<dataset>/random_init/top1|top5."""
  return fine_grained.dataset_scalars(report, "transfer", lambda k, v, infix: [(infix + k, v)])


def table(report: dict) -> str:
  """Top-1 / top-5 per dataset with the sizes, and the random-init numbers if present."""
  entries = report["datasets"]
  base = all("random_init" in e for e in entries.values())
  lines = [
      f"transfer: {report['protocol']} linear classifier on frozen {report['features']} "
      f"features of {report['workdir']} at step {report['step']}",
      f"  {'dataset':<11} {'train':>6} {'test':>6} {'top-1':>7}"
      + (f" {'random init':>11} {'gain':>6}" if base else "")
      + f" {'top-5':>7}"
      + (f" {'random init':>11}" if base else ""),
  ]
  for name, e in entries.items():
    top1, top5 = 100 * e["accuracy"]["top1"], 100 * e["accuracy"]["top5"]
    line = f"  {name:<11} {e['num_train']:>6} {e['num_test']:>6} {top1:6.2f}%"
    if base:
      init1, init5 = 100 * e["random_init"]["top1"], 100 * e["random_init"]["top5"]
      line += f" {init1:10.2f}% {top1 - init1:+6.1f} {top5:6.2f}% {init5:10.2f}%"
    else:
      line += f" {top5:6.2f}%"
    lines.append(line)
  return "\n".join(lines)
