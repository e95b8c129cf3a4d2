"""Linear classifiers on frozen features, one per label, and their top-k accuracy.

fit_fast trains them by SGD (momentum 0.9, cross-entropy) on features standardised with the
training mean and std; fit_logreg fits scikit-learn's multinomial logistic regression (L-BFGS,
C = 1) on the same standardised features, the reference the fast fit is checked against;
linear_trainer is the SGD update the paper protocol (cl_jax.evaluators.linear_probe) drives
with features computed at every step. A LinearClassifier is saved next to the probe's report
for the evaluation suites (cl_jax.evaluators.robustness).
"""

import io
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from etils import epath

from cl_jax.runtime import metrics
from cl_jax.runtime.errors import UsageError


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
  """Fraction of rows whose label is among the k largest logits, (N, C), (N,)."""
  k = min(k, logits.shape[1])
  top = np.argsort(-logits, axis=1)[:, :k]
  return float(np.mean(np.any(top == labels[:, None], axis=1)))


def linear_trainer(
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


def lr_schedule(probe: ml_collections.ConfigDict, steps_per_epoch: int) -> optax.Schedule:
  """probe.lr, x0.1 at each of probe.decay_epochs."""
  return optax.piecewise_constant_schedule(
      probe.lr, {e * steps_per_epoch: 0.1 for e in probe.decay_epochs}
  )


def _accuracy(logits: dict[str, np.ndarray], y: dict) -> dict:
  return {
      k: {"top1": topk_accuracy(v, y[k], 1), "top5": topk_accuracy(v, y[k], 5)}
      for k, v in logits.items()
  }


def steps_per_epoch(num_images: int, batch_size: int) -> int:
  """Full batches of the probe per pass over its num_images training images."""
  if num_images >= batch_size:
    return num_images // batch_size
  raise UsageError(
      f"probe.batch_size = {batch_size} exceeds the probe training set ({num_images} images); "
      f"set it to at most {num_images} (--config.probe.batch_size={num_images})"
  )


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
  steps = steps_per_epoch(len(x_train), probe.batch_size)
  params, opt_state, update = linear_trainer(
      num_classes, x_train.shape[1], lr_schedule(probe, steps), 0.9, probe.weight_decay
  )
  rng = np.random.default_rng(seed)
  for _ in tqdm.trange(
      probe.epochs, desc="probe (fast)", leave=False, disable=jax.process_index() != 0
  ):
    order = rng.permutation(len(x_train))
    for i in range(steps):
      idx = order[i * probe.batch_size : (i + 1) * probe.batch_size]
      params, opt_state = update(
          params, opt_state, x_train[idx], {k: y_train[k][idx] for k in num_classes}
      )
  return from_params(params, mean, std)


def from_params(params: dict, mean: np.ndarray, std: np.ndarray) -> LinearClassifier:
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
