"""The linear-probe evaluator: linear classifiers on frozen features of a pretraining checkpoint.

One linear classifier per label (shape, texture and colour on Trifeature; the class on TFDS
sets), trained on the frozen features of the online (query) encoder (cl_jax.evaluators.features),
reported as top-1 / top-5 accuracy on the test split. Protocols:
  fast    features of the evaluation views computed once, standardised with the training mean
          and variance; SGD on the cached features (cl_jax.evaluators.linear_classifier).
  logreg  the same standardised cached features, fitted by scikit-learn's multinomial logistic
          regression (L-BFGS, L2 penalty C = 1): the standard reference the fast probe is
          checked against.
  paper   the protocol of the papers (e.g. Ge et al. 2021, App. C.1): random resized crop +
          flip training views through the frozen backbone at every step, SGD momentum 0.9,
          lr 10, batch 128, 60 epochs, lr x0.1 at 30/40/50.
Beside every trained number the report gives the same probe on the same architecture at its
random initialisation (step 0 of the run's seed), computed once per configuration and cached
(`random_init_accuracy`; option baseline). With option validation the fast and logreg probes fit
four fifths of the training split and report the held-out fifth, for tuning a recipe without
looking at the test split. With probe.rotation the report also holds the label "rotation"
(cl_jax.evaluators.rotation_probe).

python -m cl_jax.evaluate --workdir=W --evaluator=linear_probe [--protocol=P] [--validation]
    [--baseline=false] [--features=backbone|heads] [--rotation]

The report is <workdir>/probe_step<N>_<protocol>[_heads][_val].json, with the trained classifier
(LinearClassifier, for the robustness evaluator) in the same name's _classifier.npz, and its
accuracies join the run's metrics.jsonl and TensorBoard at step N as
probe[_heads][_val]/<protocol>/<label>/top1|top5.
"""

import hashlib
import json
import os

import jax
import ml_collections
import numpy as np
import tqdm
from etils import epath

from cl_jax.data import pipeline
from cl_jax.evaluators import features
from cl_jax.evaluators.features import Extractor
from cl_jax.evaluators.linear_classifier import (
    LinearClassifier,
    fit_fast,
    fit_logreg,
    from_params,
    linear_trainer,
    lr_schedule,
    steps_per_epoch,
)
from cl_jax.models.encoder import head_layout
from cl_jax.runtime.errors import UsageError

# probe.protocol values (the module docstring says what each fits).
PROTOCOLS = ("fast", "logreg", "paper")

TAG = "probe"
OPTIONS = ("protocol", "baseline", "validation")
# Bumped whenever the probe's procedure changes, so stale baselines are never read.
BASELINE_CACHE_VERSION = 1


def validation_split(x: np.ndarray, y: dict) -> tuple:
  """(x_fit, y_fit, x_val, y_val): the last 4/5 of the probe's training rows to fit, the
  first 1/5 held out, so that recipes can be tuned without looking at the test split."""
  n = len(x) // 5
  if n == 0:
    raise UsageError(f"a validation split needs at least 5 probe training images, got {len(x)}")
  return x[n:], {k: v[n:] for k, v in y.items()}, x[:n], {k: v[:n] for k, v in y.items()}


def probe_variables(
    ctx: Extractor, variables: dict, protocol: str, validation: bool = False
) -> tuple[dict, LinearClassifier]:
  """(accuracy, classifier): accuracy (label -> {top1, top5}) of the `protocol` probe on the
  encoder `variables`, on the test split, or with `validation` on the held-out fifth of the
  training split (validation_split; fast and logreg protocols), and the trained classifier.
  With probe.rotation also the label "rotation": the same probe trained and tested on the
  images rotated by a random multiple of 90 degrees (Xiao et al. 2021, Table 1)."""
  accuracy, classifier = probe_labels(ctx, variables, protocol, validation)
  if ctx.config.probe.get("rotation", False):
    rotated, rotation = probe_labels(features.rotated(ctx), variables, protocol, validation)
    accuracy.update(rotated)
    classifier = LinearClassifier(
        classifier.mean,
        classifier.std,
        {**classifier.weights, **rotation.weights},
        {**classifier.biases, **rotation.biases},
    )
  return accuracy, classifier


def probe_labels(ctx: Extractor, variables: dict, protocol: str, validation: bool) -> tuple:
  """probe_variables for the labels of ctx's sources only."""
  num_classes = dict(ctx.train_src.num_classes)
  if validation:
    if protocol == "paper":
      raise UsageError("the validation split is for the fast and logreg protocols")
    x_train, y_train, x_test, y_test = validation_split(
        *features.eval_features(ctx, variables, ctx.train_src, "train features")
    )
  else:
    x_test, y_test = features.eval_features(ctx, variables, ctx.test_src, "test features")
  if protocol == "paper":
    classifier = _fit_paper(ctx, variables, num_classes, x_test.shape[1])
  else:
    if not validation:
      x_train, y_train = features.eval_features(ctx, variables, ctx.train_src, "train features")
    if protocol == "fast":
      classifier = fit_fast(x_train, y_train, num_classes, ctx.config.probe, ctx.config.seed)
    else:
      classifier = fit_logreg(x_train, y_train, num_classes)
  return classifier.accuracy(x_test, y_test), classifier


def _fit_paper(ctx: Extractor, variables: dict, num_classes: dict, dim: int) -> LinearClassifier:
  """The paper protocol's classifiers (module docstring) on features of dimension `dim`,
  computed from fresh training views at every step."""
  d, p = ctx.config.data, ctx.config.probe
  steps = steps_per_epoch(len(ctx.train_src), p.batch_size)
  params, opt_state, update = linear_trainer(
      num_classes, dim, lr_schedule(p, steps), 0.9, p.weight_decay
  )
  train_ds = pipeline.probe_dataset(
      ctx.train_src,
      tuple(num_classes),
      image_size=d.image_size,
      eval_crop_fraction=d.eval_crop_fraction,
      batch_size=p.batch_size,
      train_views=True,
      seed=ctx.config.seed,
      epochs=p.epochs,
  )
  for batch in tqdm.tqdm(
      train_ds,
      total=p.epochs * steps,
      desc="probe (paper)",
      leave=False,
      disable=jax.process_index() != 0,
  ):
    x = features.sharded_features(ctx.features, variables, batch["image"], ctx.mesh)
    params, opt_state = update(params, opt_state, x, {k: batch[k] for k in num_classes})
  return from_params(params, np.zeros(dim, np.float32), np.ones(dim, np.float32))


def baseline_key(config: ml_collections.ConfigDict, protocol: str, validation: bool = False) -> str:
  """Hash of everything the random-init probe depends on: the model, the seed, the
  data and the probe settings (not the method, its add-ons or the optimizer)."""
  data = {k: v for k, v in config.data.to_dict().items() if k not in ("workers", "cache_dir")}
  fields = {
      "version": BASELINE_CACHE_VERSION,
      "protocol": protocol,
      "seed": config.seed,
      "validation": validation,
      "model": config.model.to_dict(),
      # ICR's region head takes no part in the probed features.
      "heads": {k: v for k, v in head_layout(config).items() if k != "region_head_layers"},
      "data": data,
      "probe": {k: v for k, v in config.probe.to_dict().items() if k != "after_pretrain"},
  }
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _baseline_dir() -> epath.Path:
  root = os.environ.get("CL_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cl_jax")
  return epath.Path(root) / "random_init"


def random_init_accuracy(ctx: Extractor, protocol: str, validation: bool = False) -> dict:
  """The probe's accuracy on the run's network at initialisation (step 0, same seed).

  Cached in $CL_JAX_CACHE/random_init/<baseline_key>.json (default
  ~/.cache/cl_jax), so it is computed once per configuration.
  """
  path = _baseline_dir() / f"{baseline_key(ctx.config, protocol, validation)}.json"
  if path.exists():
    return json.loads(path.read_text())["accuracy"]
  accuracy, _ = probe_variables(ctx, ctx.init_variables(), protocol, validation)
  if jax.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{path.name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"protocol": protocol, "accuracy": accuracy}, indent=2))
    tmp.replace(path)
  return accuracy


def protocol_option(ctx) -> tuple[str, bool]:
  """(protocol, validation) of an EvalContext's options, the protocol defaulting to the
  config's probe.protocol."""
  protocol = ctx.options.get("protocol") or ctx.config.probe.protocol
  if protocol not in PROTOCOLS:
    raise UsageError(f"probe protocol must be one of {PROTOCOLS}, got {protocol!r}")
  return protocol, bool(ctx.options.get("validation", False))


def describe(ctx, protocol: str, validation: bool, accuracy: dict) -> dict:
  """The fields of a probe report on ctx (an EvalContext) beside its accuracies."""
  size = ctx.config.data.image_size
  shape = jax.ShapeDtypeStruct((1, size, size, 3), "uint8")
  return {
      "protocol": protocol,
      "dataset": ctx.config.data.name,
      "features": ctx.config.probe.get("features", "backbone"),
      "feature_dim": int(jax.eval_shape(ctx.extractor.features, ctx.variables, shape).shape[1]),
      "num_train": len(ctx.extractor.train_src),
      "num_test": len(ctx.extractor.test_src),
      "split": "validation" if validation else "test",
      "accuracy": accuracy,
  }


def check_data(ctx: Extractor, protocol: str, validation: bool = False) -> None:
  """UsageError for a probe its data cannot run, before any feature is computed (and, for the
  probe that ends a pretraining run, before its first step): the SGD batch of the fast and paper
  protocols against the images it is fitted on (the training split, or its four fifths with
  `validation`)."""
  if protocol in ("fast", "paper"):
    images = len(ctx.train_src)
    steps_per_epoch(images - images // 5 if validation else images, ctx.config.probe.batch_size)


def run(ctx) -> dict:
  """The evaluator on ctx (cl_jax.evaluators.registry.EvalContext); options: protocol (default
  the config's probe.protocol), validation (default false), baseline (default true). The trained
  classifier is saved beside the report."""
  protocol, validation = protocol_option(ctx)
  check_data(ctx.extractor, protocol, validation)
  accuracy, classifier = probe_variables(ctx.extractor, ctx.variables, protocol, validation)
  report = describe(ctx, protocol, validation, accuracy)
  if ctx.options.get("baseline", True):
    report["random_init"] = random_init_accuracy(ctx.extractor, protocol, validation)
  if jax.process_index() == 0:
    stem = file_stem(f"probe_step{ctx.step}", protocol, report["features"], validation)
    classifier.save(epath.Path(ctx.workdir) / f"{stem}_classifier.npz")
  return report


def file_stem(head: str, protocol: str, features_: str = "backbone", validation=False) -> str:
  """<head>_<protocol>[_heads][_val]; with head probe_step<N>, the name of a probe's report
  (.json) and of its classifier (_classifier.npz, LinearClassifier.save) in the workdir."""
  heads = "_heads" if features_ == "heads" else ""
  return f"{head}_{protocol}{heads}{'_val' if validation else ''}"


def report_name(report: dict) -> str:
  """The report's file name in the workdir (file_stem)."""
  validation = report["split"] == "validation"
  head = f"probe_step{report['step']}"
  return file_stem(head, report["protocol"], report["features"], validation)


def scalars(report: dict, name: str = "probe") -> dict[str, float]:
  """The report's accuracies as metrics: <name>[_heads][_val]/<protocol>/<label>/top1|top5."""
  heads, validation = report["features"] == "heads", report["split"] == "validation"
  prefix = name + ("_heads" if heads else "") + ("_val" if validation else "")
  return {
      f"{prefix}/{report['protocol']}/{label}/{k}": v
      for label, acc in report["accuracy"].items()
      for k, v in acc.items()
  }


def _split_text(report: dict) -> str:
  if report.get("split") == "validation":
    return (
        f"validation (the held-out fifth of the {report['num_train']} training images; "
        "the probe fits the rest)"
    )
  return f"test ({report['num_test']} images)"


def table(report: dict, title: str = "linear probe") -> str:
  """Accuracy table of a probe report, with the random-init baseline if present."""
  base = report.get("random_init")
  lines = [
      f"{title} ({report['protocol']}) of {report['workdir']} at step {report['step']} "
      f"on {report['dataset']} {_split_text(report)}:"
  ]
  if base is None:
    lines.append(f"  {'label':<10} {'top-1':>7} {'top-5':>7}")
  else:
    lines.append(f"  {'label':<10} {'top-1':>7} {'random init':>11} {'gain':>6} {'top-5':>7}")
  for k, acc in report["accuracy"].items():
    top1, top5 = 100 * acc["top1"], 100 * acc["top5"]
    if base is None:
      lines.append(f"  {k:<10} {top1:6.2f}% {top5:6.2f}%")
    else:
      init = 100 * base[k]["top1"]
      lines.append(f"  {k:<10} {top1:6.2f}% {init:10.2f}% {top1 - init:+6.1f} {top5:6.2f}%")
  return "\n".join(lines)
