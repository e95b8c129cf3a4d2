"""Linear probe on frozen features of a pretraining checkpoint (cl_jax.probe runs it).

One linear classifier per label (shape, texture and colour on Trifeature; the
class on TFDS sets), trained on the frozen, globally pooled backbone features
of the online (query) encoder, reported as top-1 / top-5 accuracy on the test
split. Protocols:
  fast    features of the evaluation views computed once, standardised with the
          training mean and variance; SGD on the cached features.
  logreg  the same standardised cached features, fitted by scikit-learn's
          multinomial logistic regression (L-BFGS, L2 penalty C = 1): the
          standard reference the fast probe is checked against.
  paper   the protocol of the papers (e.g. Ge et al. 2021, App. C.1): random
          resized crop + flip training views through the frozen backbone at
          every step, SGD momentum 0.9, lr 10, batch 128, 60 epochs, lr x0.1 at
          30/40/50.
Beside every trained number the report gives the same probe on the same
architecture at its random initialisation (step 0 of the run's seed), computed
once per configuration and cached (`random_init_accuracy`). With `validation`
the fast and logreg probes fit four fifths of the training split and report the
held-out fifth, for tuning a recipe without looking at the test split.
The report is written next to the checkpoints, <workdir>/probe_step<N>_<protocol>[_val].json,
with the trained classifier (LinearClassifier, for the evaluation suites of cl_jax.evaluate)
in probe_step<N>_<protocol>[_val]_classifier.npz, and its accuracies join the run's
metrics.jsonl and TensorBoard at step N (metrics.append_row).
"""

import functools
import hashlib
import io
import json
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from etils import epath

from cl_jax import checkpoint, config_check, metrics, parallel, run_config, write_faults
from cl_jax.data import photometric, pipeline, sources
from cl_jax.data.rotated_source import RotatedSource
from cl_jax.errors import UsageError
from cl_jax.models.encoder import encoder_for, head_layout
from cl_jax.state import init_variables

# Bumped whenever the probe's procedure changes, so stale baselines are never read.
BASELINE_CACHE_VERSION = 1


FEATURE_OUTPUTS = {"backbone": "pooled", "heads": "head_features"}


def _features_fn(encoder, mean, std, which: str = "backbone"):
  """jit: uint8 images (b, S, S, 3) -> (b, D) float32 features (eval-mode BN): the pooled
  backbone features, or (which="heads") the heads' features concatenated (LooC++,
  cl_jax.models.encoder.Encoder's head_features)."""
  spec = photometric.PhotometricSpec(mean=mean, std=std)
  output = FEATURE_OUTPUTS[which]

  @jax.jit
  def features(variables, images):
    x = photometric.normalize(photometric.to_float(images), spec)
    return encoder.apply(variables, x, train=False)[output]

  return features


def sharded_features(features, variables, images: np.ndarray, mesh) -> jax.Array:
  """features(variables, images) for uint8 images (b, S, S, 3), data-parallel: the batch is
  padded with black images to a multiple of the mesh's devices, split over them, and the
  padding's rows dropped; (b, D) on the devices."""
  rows = len(images)
  pad = -rows % mesh.size
  images = np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)])
  return features(variables, jax.device_put(images, parallel.batch_sharding(mesh)))[:rows]


def extract(features, variables, dataset, label_names, desc: str | None, mesh=None):
  """Features and labels of every batch of `dataset` (numpy, in order), under a progress bar
  named `desc` (None: no bar). With `mesh`, each batch is computed data-parallel
  (sharded_features)."""
  feats, labels = [], {k: [] for k in label_names}
  bar = desc is None or jax.process_index() != 0
  for batch in tqdm.tqdm(dataset, desc=desc, leave=False, disable=bar):
    if mesh is not None:
      feats.append(np.asarray(sharded_features(features, variables, batch["image"], mesh)))
    else:
      feats.append(np.asarray(features(variables, batch["image"])))
    for k in label_names:
      labels[k].append(batch[k])
  return np.concatenate(feats), {k: np.concatenate(v) for k, v in labels.items()}


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
  """Fraction of rows whose label is among the k largest logits, (N, C), (N,)."""
  k = min(k, logits.shape[1])
  top = np.argsort(-logits, axis=1)[:, :k]
  return float(np.mean(np.any(top == labels[:, None], axis=1)))


def _linear_trainer(
    num_classes: dict[str, int], dim: int, schedule, momentum: float, weight_decay: float
):
  """(params, update) for independent linear classifiers, one per label."""
  params = {k: {"w": jnp.zeros((dim, c)), "b": jnp.zeros((c,))} for k, c in num_classes.items()}
  tx = optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(schedule, momentum=momentum))

  def loss_fn(p, x, y):
    total = 0.0
    for k in p:
      logits = x @ p[k]["w"] + p[k]["b"]
      total = total + optax.softmax_cross_entropy_with_integer_labels(logits, y[k]).mean()
    return total

  @jax.jit
  def update(p, opt_state, x, y):
    grads = jax.grad(loss_fn)(p, x, y)
    updates, opt_state = tx.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state

  return params, tx.init(params), update


def _lr_schedule(probe: ml_collections.ConfigDict, steps_per_epoch: int) -> optax.Schedule:
  """probe.lr, x0.1 at each of probe.decay_epochs."""
  return optax.piecewise_constant_schedule(
      probe.lr, {e * steps_per_epoch: 0.1 for e in probe.decay_epochs}
  )


def _accuracy(logits: dict[str, np.ndarray], y: dict) -> dict:
  return {
      k: {"top1": topk_accuracy(v, y[k], 1), "top5": topk_accuracy(v, y[k], 5)}
      for k, v in logits.items()
  }


def _steps_per_epoch(num_images: int, batch_size: int) -> int:
  if num_images < batch_size:
    raise UsageError(
        f"probe.batch_size = {batch_size} exceeds the probe training set " f"({num_images} images)"
    )
  return num_images // batch_size


class LinearClassifier(NamedTuple):
  """A trained probe: one linear classifier per label on standardised features,
  logits_k(x) = ((x - mean) / std) @ weights[k] + biases[k], for x (N, D), mean and std (D,),
  weights[k] (D, C_k), biases[k] (C_k,) (-inf for a class absent from the training labels).
  Saved next to the probe's report (save / load) for the evaluation suites."""

  mean: np.ndarray
  std: np.ndarray
  weights: dict
  biases: dict

  def logits(self, x: np.ndarray) -> dict[str, np.ndarray]:
    """label -> (N, C_k) logits of features x (N, D)."""
    z = (x - self.mean) / self.std
    return {k: z @ self.weights[k] + self.biases[k] for k in self.weights}

  def accuracy(self, x: np.ndarray, y: dict) -> dict:
    """label -> {"top1", "top5"} accuracy (fractions) on features x (N, D), labels y[k] (N,)."""
    return _accuracy(self.logits(x), y)

  def save(self, path: epath.Path) -> None:
    """Write the classifier to `path` (.npz); a crash leaves the old file or the new one."""
    arrays = {"mean": self.mean, "std": self.std}
    arrays.update({f"w/{k}": np.asarray(w) for k, w in self.weights.items()})
    arrays.update({f"b/{k}": np.asarray(b) for k, b in self.biases.items()})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    metrics.write_atomically(path, buffer.getvalue())

  @classmethod
  def load(cls, path: epath.Path) -> "LinearClassifier":
    """The classifier saved at `path`."""
    with np.load(io.BytesIO(epath.Path(path).read_bytes())) as f:
      labels = [k[2:] for k in f.files if k.startswith("w/")]
      return cls(
          f["mean"], f["std"], {k: f[f"w/{k}"] for k in labels}, {k: f[f"b/{k}"] for k in labels}
      )


def _standardiser(x_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(mean, std + 1e-6) of training features (N, D) over N."""
  return x_train.mean(0), x_train.std(0) + 1e-6


def fit_fast(
    x_train: np.ndarray,
    y_train: dict,
    num_classes: dict[str, int],
    probe: ml_collections.ConfigDict,
    seed: int,
) -> LinearClassifier:
  """SGD linear classifiers on cached features standardised with the training statistics.

  Args:
    x_train: (N, D) features; y_train: label name -> (N,) int labels.
    num_classes: label name -> classes.
    probe: the `probe` config block (batch_size, epochs, lr, weight_decay,
      decay_epochs); SGD momentum 0.9, cross-entropy, one classifier per label.
  """
  mean, std = _standardiser(x_train)
  x_train = (x_train - mean) / std
  steps_per_epoch = _steps_per_epoch(len(x_train), probe.batch_size)
  params, opt_state, update = _linear_trainer(
      num_classes, x_train.shape[1], _lr_schedule(probe, steps_per_epoch), 0.9, probe.weight_decay
  )
  rng = np.random.default_rng(seed)
  for _ in tqdm.trange(
      probe.epochs, desc="probe (fast)", leave=False, disable=jax.process_index() != 0
  ):
    order = rng.permutation(len(x_train))
    for i in range(steps_per_epoch):
      idx = order[i * probe.batch_size : (i + 1) * probe.batch_size]
      params, opt_state = update(
          params, opt_state, x_train[idx], {k: y_train[k][idx] for k in num_classes}
      )
  return _from_params(params, mean, std)


def _from_params(params: dict, mean: np.ndarray, std: np.ndarray) -> LinearClassifier:
  """The LinearClassifier of trained {label: {w, b}} parameters."""
  weights = {k: np.asarray(q["w"]) for k, q in params.items()}
  return LinearClassifier(mean, std, weights, {k: np.asarray(q["b"]) for k, q in params.items()})


def fit_logreg(
    x_train: np.ndarray, y_train: dict, num_classes: dict[str, int], max_iter: int = 1000
) -> LinearClassifier:
  """scikit-learn's multinomial logistic regression (L-BFGS, C = 1) on standardised features.

  The arguments are those of fit_fast; the optimum of this convex problem does not depend on
  a learning rate or schedule. Classes absent from y_train get the logit -inf.
  """
  from sklearn.linear_model import LogisticRegression

  mean, std = _standardiser(x_train)
  z = (x_train - mean) / std
  weights, biases = {}, {}
  for k, c in num_classes.items():
    model = LogisticRegression(max_iter=max_iter).fit(z, y_train[k])
    coef, intercept = model.coef_.T, model.intercept_
    if len(model.classes_) == 2:  # one decision function: score of classes_[1] against [0]
      coef = np.concatenate([np.zeros_like(coef), coef], axis=1)
      intercept = np.concatenate([np.zeros_like(intercept), intercept])
    weights[k] = np.zeros((z.shape[1], c))
    biases[k] = np.full((c,), -np.inf)
    weights[k][:, model.classes_], biases[k][model.classes_] = coef, intercept
  return LinearClassifier(mean, std, weights, biases)


class _Probe(NamedTuple):
  """What probing any variables of a run needs: its data, the encoder's variables at
  initialisation (a () -> {"params", "batch_stats"} function, replicated over the mesh;
  jax.eval_shape of it is the template of a checkpoint's variables), the feature
  function and the device mesh the features are computed on."""

  config: ml_collections.ConfigDict
  train_src: object
  test_src: object
  init_variables: object
  features: object
  mesh: object


def setup(config: ml_collections.ConfigDict, devices=None) -> _Probe:
  """The probe's data, initial variables and feature function for a run config; features are
  computed data-parallel over `devices` (default: all)."""
  mesh = parallel.make_mesh(devices)
  train_src = sources.open_source(config.data, "probe_train")
  test_src = sources.open_source(config.data, "test")
  encoder = encoder_for(config)
  init = jax.jit(
      functools.partial(init_variables, config.seed, encoder, config.data.image_size),
      out_shardings=parallel.replicated(mesh),
  )
  spec = photometric.PhotometricSpec()
  which = config.probe.get("features", "backbone")
  return _Probe(
      config, train_src, test_src, init, _features_fn(encoder, spec.mean, spec.std, which), mesh
  )


def _rotated(ctx: _Probe) -> _Probe:
  """The probe of the 4-way rotation task (cl_jax.data.rotated_source) on the same data."""
  seed = ctx.config.seed
  return ctx._replace(
      train_src=RotatedSource(ctx.train_src, seed), test_src=RotatedSource(ctx.test_src, seed + 1)
  )


def validation_split(x: np.ndarray, y: dict) -> tuple:
  """(x_fit, y_fit, x_val, y_val): the last 4/5 of the probe's training rows to fit, the
  first 1/5 held out, so that recipes can be tuned without looking at the test split."""
  n = len(x) // 5
  if n == 0:
    raise UsageError(f"a validation split needs at least 5 probe training images, got {len(x)}")
  return x[n:], {k: v[n:] for k, v in y.items()}, x[:n], {k: v[:n] for k, v in y.items()}


def probe_variables(
    ctx: _Probe, variables: dict, protocol: str, validation: bool = False
) -> tuple[dict, LinearClassifier]:
  """(accuracy, classifier): accuracy (label -> {top1, top5}) of the `protocol` probe on the
  encoder `variables`, on the test split, or with `validation` on the held-out fifth of the
  training split (validation_split; fast and logreg protocols), and the trained classifier.
  With probe.rotation also the label "rotation": the same probe trained and tested on the
  images rotated by a random multiple of 90 degrees (Xiao et al. 2021, Table 1)."""
  accuracy, classifier = _probe_labels(ctx, variables, protocol, validation)
  if ctx.config.probe.get("rotation", False):
    rotated, rotation = _probe_labels(_rotated(ctx), variables, protocol, validation)
    accuracy.update(rotated)
    classifier = LinearClassifier(
        classifier.mean,
        classifier.std,
        {**classifier.weights, **rotation.weights},
        {**classifier.biases, **rotation.biases},
    )
  return accuracy, classifier


def eval_features(ctx: _Probe, variables: dict, src, desc: str | None, labels=None):
  """(features (N, D), {label: (N,)}) of every image of `src` in its evaluation view (resize
  and centre crop), in order, computed data-parallel; `labels`: the label names to collect
  (default: those of ctx's probe data)."""
  d = ctx.config.data
  labels = tuple(ctx.train_src.num_classes) if labels is None else tuple(labels)
  dataset = pipeline.probe_dataset(
      src,
      labels,
      image_size=d.image_size,
      eval_crop_fraction=d.eval_crop_fraction,
      batch_size=ctx.config.probe.batch_size,
      train_views=False,
  )
  return extract(ctx.features, variables, dataset, labels, desc, ctx.mesh)


def _probe_labels(ctx: _Probe, variables: dict, protocol: str, validation: bool) -> tuple:
  """probe_variables for the labels of ctx's sources."""
  labels = tuple(ctx.train_src.num_classes)
  num_classes = dict(ctx.train_src.num_classes)
  d, p = ctx.config.data, ctx.config.probe

  if validation:
    if protocol == "paper":
      raise UsageError("the validation split is for the fast and logreg protocols")
    x_train, y_train, x_test, y_test = validation_split(
        *eval_features(ctx, variables, ctx.train_src, "train features")
    )
  else:
    x_test, y_test = eval_features(ctx, variables, ctx.test_src, "test features")
  if protocol in ("fast", "logreg"):
    if not validation:
      x_train, y_train = eval_features(ctx, variables, ctx.train_src, "train features")
    if protocol == "fast":
      classifier = fit_fast(x_train, y_train, num_classes, p, ctx.config.seed)
    else:
      classifier = fit_logreg(x_train, y_train, num_classes)
    return classifier.accuracy(x_test, y_test), classifier
  steps_per_epoch = _steps_per_epoch(len(ctx.train_src), p.batch_size)
  params, opt_state, update = _linear_trainer(
      num_classes, x_test.shape[1], _lr_schedule(p, steps_per_epoch), 0.9, p.weight_decay
  )
  train_ds = pipeline.probe_dataset(
      ctx.train_src,
      labels,
      image_size=d.image_size,
      eval_crop_fraction=d.eval_crop_fraction,
      batch_size=p.batch_size,
      train_views=True,
      seed=ctx.config.seed,
      epochs=p.epochs,
  )
  for batch in tqdm.tqdm(
      train_ds,
      total=p.epochs * steps_per_epoch,
      desc="probe (paper)",
      leave=False,
      disable=jax.process_index() != 0,
  ):
    x = sharded_features(ctx.features, variables, batch["image"], ctx.mesh)
    params, opt_state = update(params, opt_state, x, {k: batch[k] for k in labels})
  dim = x_test.shape[1]
  classifier = _from_params(params, np.zeros(dim, np.float32), np.ones(dim, np.float32))
  return classifier.accuracy(x_test, y_test), classifier


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


def random_init_accuracy(ctx: _Probe, protocol: str, validation: bool = False) -> dict:
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


def run(
    workdir: str,
    step: int | None = None,
    protocol: str | None = None,
    baseline: bool = True,
    validation: bool = False,
    features: str | None = None,
    rotation: bool | None = None,
) -> dict:
  """Probe the checkpoint of `step` (default: latest) of the run in `workdir`, and
  (with `baseline`) the same network at random initialisation; with `validation`
  on the held-out fifth of the training split instead of the test split.
  features / rotation override the run config's probe.features / probe.rotation."""
  config = run_config.read(workdir)
  if features is not None:
    layout = head_layout(config)
    if features == "heads" and layout["heads"] == 1 and not layout["conv5_heads"]:
      raise UsageError(
          f"--features=heads needs a LooC run with extra or conv5 heads; {workdir} has one head"
      )
    config.probe.features = features
  if rotation is not None:
    config.probe.rotation = rotation
  protocol = protocol or config.probe.protocol
  if protocol not in config_check.PROBE_PROTOCOLS:
    raise UsageError(
        f"probe protocol must be one of {config_check.PROBE_PROTOCOLS}, " f"got {protocol!r}"
    )
  write_faults.check_writable(workdir, "the probe report")
  ctx = setup(config)
  step, variables = checkpoint.restore_encoder(workdir, ctx.init_variables, step)
  size = config.data.image_size
  accuracy, classifier = probe_variables(ctx, variables, protocol, validation)
  where = workdir if "://" in workdir else os.path.abspath(workdir)
  report = {
      "workdir": where,
      "step": step,
      "protocol": protocol,
      "dataset": config.data.name,
      "features": config.probe.get("features", "backbone"),
      "feature_dim": int(
          jax.eval_shape(
              ctx.features, variables, jax.ShapeDtypeStruct((1, size, size, 3), "uint8")
          ).shape[1]
      ),
      "num_train": len(ctx.train_src),
      "num_test": len(ctx.test_src),
      "split": "validation" if validation else "test",
      "accuracy": accuracy,
  }
  if baseline:
    report["random_init"] = random_init_accuracy(ctx, protocol, validation)
  if jax.process_index() == 0:
    name = report_name(step, protocol, report["features"], validation)
    path = epath.Path(workdir) / f"{name}.json"
    classifier.save(epath.Path(workdir) / f"{name}_classifier.npz")
    metrics.write_atomically(path, json.dumps(report, indent=2))
    metrics.append_row(workdir, step, scalars(report), "probe")
    report["path"] = str(path)
  return report


def report_name(step: int, protocol: str, features: str = "backbone", validation=False) -> str:
  """probe_step<N>_<protocol>[_heads][_val]: the name of a probe's report (.json) and of its
  classifier (_classifier.npz, LinearClassifier.save) in the workdir."""
  heads = "_heads" if features == "heads" else ""
  return f"probe_step{step}_{protocol}{heads}{'_val' if validation else ''}"


def scalars(report: dict) -> dict[str, float]:
  """The report's accuracies as metrics: probe[_heads][_val]/<protocol>/<label>/top1|top5."""
  heads, validation = report["features"] == "heads", report["split"] == "validation"
  prefix = "probe" + ("_heads" if heads else "") + ("_val" if validation else "")
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


def print_report(report: dict) -> None:
  """Accuracy table of a probe report on stdout, with the random-init baseline if present."""
  if jax.process_index() != 0:
    return
  base = report.get("random_init")
  print(
      f"\nlinear probe ({report['protocol']}) of {report['workdir']} at step {report['step']} "
      f"on {report['dataset']} {_split_text(report)}:"
  )
  if base is None:
    print(f"  {'label':<10} {'top-1':>7} {'top-5':>7}")
  else:
    print(f"  {'label':<10} {'top-1':>7} {'random init':>11} {'gain':>6} {'top-5':>7}")
  for k, acc in report["accuracy"].items():
    top1, top5 = 100 * acc["top1"], 100 * acc["top5"]
    if base is None:
      print(f"  {k:<10} {top1:6.2f}% {top5:6.2f}%")
    else:
      init = 100 * base[k]["top1"]
      print(f"  {k:<10} {top1:6.2f}% {init:10.2f}% {top1 - init:+6.1f} {top5:6.2f}%")
  if "path" in report:
    print(f"report written to {report['path']}")
