"""Linear probe on frozen features of a pretraining checkpoint (cl_jax.probe runs it).

One linear classifier per label (shape, texture and colour on Trifeature; the
class on TFDS sets), trained on the frozen, globally pooled backbone features
of the online (query) encoder, reported as top-1 / top-5 accuracy on the test
split. Protocols:
  fast   features of the evaluation views computed once, standardised with the
         training mean and variance; SGD on the cached features.
  paper  the protocol of the papers (REFERENCE.md): random resized crop + flip
         training views through the frozen backbone at every step, SGD
         momentum 0.9, lr 10, batch 128, 60 epochs, lr x0.1 at 30/40/50.
The report is written next to the checkpoints: <workdir>/probe_step<N>_<protocol>.json.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from etils import epath

from cl_jax import checkpoint, config_check, parallel, train
from cl_jax.data import photometric, pipeline, sources


def _features_fn(encoder, mean, std):
  """jit: uint8 images (b, S, S, 3) -> (b, D) float32 pooled features (eval-mode BN)."""
  spec = photometric.PhotometricSpec(mean=mean, std=std)

  @jax.jit
  def features(variables, images):
    x = photometric.normalize(photometric.to_float(images), spec)
    return encoder.apply(variables, x, train=False)["pooled"]
  return features


def extract(features, variables, dataset, label_names, desc: str):
  """Features and labels of every batch of `dataset` (numpy, in order)."""
  feats, labels = [], {k: [] for k in label_names}
  for batch in tqdm.tqdm(dataset, desc=desc, leave=False, disable=jax.process_index() != 0):
    feats.append(np.asarray(features(variables, batch["image"])))
    for k in label_names:
      labels[k].append(batch[k])
  return np.concatenate(feats), {k: np.concatenate(v) for k, v in labels.items()}


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
  """Fraction of rows whose label is among the k largest logits, (N, C), (N,)."""
  k = min(k, logits.shape[1])
  top = np.argsort(-logits, axis=1)[:, :k]
  return float(np.mean(np.any(top == labels[:, None], axis=1)))


def _linear_trainer(num_classes: dict[str, int], dim: int, schedule, momentum: float,
                    weight_decay: float):
  """(params, update) for independent linear classifiers, one per label."""
  params = {k: {"w": jnp.zeros((dim, c)), "b": jnp.zeros((c,))} for k, c in num_classes.items()}
  tx = optax.chain(optax.add_decayed_weights(weight_decay),
                   optax.sgd(schedule, momentum=momentum))

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


def _evaluate(params, x: np.ndarray, y: dict) -> dict:
  out = {}
  for k, p in params.items():
    logits = x @ np.asarray(p["w"]) + np.asarray(p["b"])
    out[k] = {"top1": topk_accuracy(logits, y[k], 1), "top5": topk_accuracy(logits, y[k], 5)}
  return out


def run(workdir: str, step: int | None = None, protocol: str | None = None) -> dict:
  """Probe the checkpoint of `step` (default: latest) of the run in `workdir`."""
  config = train.read_config(workdir)
  protocol = protocol or config.probe.protocol
  if protocol not in config_check.PROBE_PROTOCOLS:
    raise ValueError(f"probe protocol must be one of {config_check.PROBE_PROTOCOLS}, "
                     f"got {protocol!r}")
  mesh = parallel.make_mesh()
  train_src = sources.open_source(config.data, "probe_train")
  test_src = sources.open_source(config.data, "test")
  pre_len = len(sources.open_source(config.data, "pretrain"))
  encoder, _, _, make_state, _ = train.build(config, pre_len, mesh)
  manager = checkpoint.make_manager(workdir, read_only=True)
  restored = checkpoint.restore(manager, jax.eval_shape(make_state), step)
  if restored is None:
    raise FileNotFoundError(f"no checkpoint in {workdir}/checkpoints: pretrain first")
  state = restored[0]
  variables = {"params": state.params, "batch_stats": state.batch_stats}
  spec = photometric.PhotometricSpec()
  features = _features_fn(encoder, spec.mean, spec.std)
  labels = tuple(train_src.num_classes)
  num_classes = dict(train_src.num_classes)
  d, p = config.data, config.probe

  def eval_ds(src):
    return pipeline.probe_dataset(src, labels, image_size=d.image_size,
                                  eval_crop_fraction=d.eval_crop_fraction,
                                  batch_size=p.batch_size, train_views=False)

  x_test, y_test = extract(features, variables, eval_ds(test_src), labels, "test features")
  steps_per_epoch = len(train_src) // p.batch_size
  if steps_per_epoch == 0:
    raise ValueError(f"probe.batch_size = {p.batch_size} exceeds the probe training set "
                     f"({len(train_src)} images)")
  schedule = optax.piecewise_constant_schedule(
      p.lr, {e * steps_per_epoch: 0.1 for e in p.decay_epochs})
  dim = x_test.shape[1]
  params, opt_state, update = _linear_trainer(num_classes, dim, schedule, 0.9,
                                              p.weight_decay)
  bar = tqdm.tqdm(total=p.epochs * steps_per_epoch, desc=f"probe ({protocol})", leave=False,
                  disable=jax.process_index() != 0)
  if protocol == "fast":
    x_train, y_train = extract(features, variables, eval_ds(train_src), labels, "train features")
    mu, sigma = x_train.mean(0), x_train.std(0) + 1e-6
    x_train, x_test = (x_train - mu) / sigma, (x_test - mu) / sigma
    rng = np.random.default_rng(config.seed)
    for _ in range(p.epochs):
      order = rng.permutation(len(x_train))
      for i in range(steps_per_epoch):
        idx = order[i * p.batch_size:(i + 1) * p.batch_size]
        params, opt_state = update(params, opt_state, x_train[idx],
                                   {k: y_train[k][idx] for k in labels})
        bar.update(1)
  else:
    train_ds = pipeline.probe_dataset(train_src, labels, image_size=d.image_size,
                                      eval_crop_fraction=d.eval_crop_fraction,
                                      batch_size=p.batch_size, train_views=True,
                                      seed=config.seed, epochs=p.epochs)
    for batch in train_ds:
      x = features(variables, batch["image"])
      params, opt_state = update(params, opt_state, x, {k: batch[k] for k in labels})
      bar.update(1)
  bar.close()
  where = workdir if "://" in workdir else os.path.abspath(workdir)
  report = {"workdir": where, "step": int(state.step), "protocol": protocol,
            "dataset": config.data.name, "feature_dim": int(dim),
            "num_train": len(train_src), "num_test": len(test_src),
            "accuracy": _evaluate(params, x_test, y_test)}
  if jax.process_index() == 0:
    path = epath.Path(workdir) / f"probe_step{report['step']}_{protocol}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(path)
    report["path"] = str(path)
  return report


def print_report(report: dict) -> None:
  """Accuracy table of a probe report on stdout."""
  if jax.process_index() != 0:
    return
  print(f"\nlinear probe ({report['protocol']}) of {report['workdir']} at step {report['step']} "
        f"on {report['dataset']} test ({report['num_test']} images):")
  print(f"  {'label':<10} {'top-1':>7} {'top-5':>7}")
  for k, acc in report["accuracy"].items():
    print(f"  {k:<10} {100 * acc['top1']:6.2f}% {100 * acc['top5']:6.2f}%")
  if "path" in report:
    print(f"report written to {report['path']}")
