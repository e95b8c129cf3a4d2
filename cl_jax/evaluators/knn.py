"""The weighted-kNN evaluator: k-nearest-neighbour classification of frozen features (Wu et al.
2018, Sec. 3.4; the kNN monitor of solo-learn and the MoCo CIFAR demo), with the memory bank
sharded over the device mesh. The probe dataset's train split in its evaluation view is the
memory bank, the test split is classified, one accuracy per label. It runs on a checkpoint
(python -m cl_jax.evaluate --evaluator=knn [--k=K] [--temperature=T] [--baseline=false];
defaults eval.knn_k and eval.knn_temperature of the run's config) and as the monitor of
pretraining (eval.evaluators, every eval.every steps).

A query q (unit) scores class c by its k most similar bank features b_i (unit, cosine
similarity s_i = q . b_i):

  score_c(q) = sum_{i in top-k(q)} exp(s_i / T) [y_i = c]

and is predicted as argmax_c score_c. Each device holds a slice of the bank, finds its local
top-k, and the candidates of all devices are gathered for the global top-k, so one device and
many devices pick the same neighbours.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cl_jax.evaluators import features
from cl_jax.models.heads import l2_normalize
from cl_jax.runtime.errors import UsageError
from cl_jax.runtime.parallel import DATA_AXIS

TAG = "knn"
OPTIONS = ("k", "temperature", "baseline")


def _similarities(queries: jax.Array, bank: jax.Array, labels: jax.Array) -> jax.Array:
  """(Q, N) cosine similarities, -inf for the bank's padding rows (label -1)."""
  sims = l2_normalize(queries.astype(jnp.float32)) @ l2_normalize(bank.astype(jnp.float32)).T
  return jnp.where(labels[None, :] >= 0, sims, -jnp.inf)


def _vote(sims: jax.Array, labels: jax.Array, num_classes: int, temperature: float) -> jax.Array:
  """sum_i exp(s_i / T) one_hot(y_i): (Q, k) similarities and labels -> (Q, C)."""
  weights = jnp.where(labels >= 0, jnp.exp(sims / temperature), 0.0)
  return jnp.einsum("qk,qkc->qc", weights, jax.nn.one_hot(labels, num_classes))


@functools.cache
def sharded_knn_scores(mesh: Mesh, num_classes: int, k: int, temperature: float):
  """Class scores of weighted kNN with the bank's rows split over the mesh's `data` axis.

  Returns a jitted scores(queries (Q, D) replicated, bank (N, D), bank_labels (N,)) ->
  (Q, num_classes) float32. Features are normalised inside; labels are ints in
  [0, num_classes), -1 for padding rows, N a multiple of the device count (pad_bank) and
  k <= N. Each device's top-k is gathered and the global top-k of the candidates votes.
  """

  def local(queries, bank, labels):
    top, index = jax.lax.top_k(_similarities(queries, bank, labels), min(k, bank.shape[0]))
    top = jax.lax.all_gather(top, DATA_AXIS, axis=1, tiled=True)  # (Q, devices * k)
    cand = jax.lax.all_gather(labels[index], DATA_AXIS, axis=1, tiled=True)
    best, pick = jax.lax.top_k(top, k)
    return _vote(best, jnp.take_along_axis(cand, pick, axis=1), num_classes, temperature)

  return jax.jit(
      jax.shard_map(
          local,
          mesh=mesh,
          in_specs=(P(), P(DATA_AXIS), P(DATA_AXIS)),
          out_specs=P(),
          check_vma=False,
      )
  )


def pad_bank(bank: np.ndarray, labels: np.ndarray, multiple: int) -> tuple[np.ndarray, np.ndarray]:
  """Pad the bank with zero rows labelled -1 to a multiple of `multiple` rows."""
  extra = -len(bank) % multiple
  return (
      np.concatenate([bank, np.zeros((extra, bank.shape[1]), bank.dtype)]),
      np.concatenate([labels, -np.ones(extra, labels.dtype)]),
  )


def knn_accuracy(
    mesh: Mesh,
    bank: np.ndarray,
    bank_labels: dict[str, np.ndarray],
    queries: np.ndarray,
    query_labels: dict[str, np.ndarray],
    num_classes: dict[str, int],
    k: int = 200,
    temperature: float = 0.1,
    chunk: int = 1024,
) -> dict[str, float]:
  """Top-1 weighted-kNN accuracy of every label, the bank sharded over `mesh`.

  Args:
    bank: (N, D) features of the memory bank (the probe's train split).
    bank_labels, query_labels: {label name: (N,) / (Q,) ints}.
    queries: (Q, D) features of the evaluated split.
    num_classes: {label name: classes}.
    k: neighbours (at most N); temperature: T.
    chunk: queries scored per call.

  Returns:
    {label name: accuracy in [0, 1]}.
  """
  if not 1 <= k <= len(bank):
    raise ValueError(f"k must be in [1, {len(bank)}] (the bank's size), got {k}")
  devices = mesh.shape[DATA_AXIS]
  rows = NamedSharding(mesh, P(DATA_AXIS))
  out = {}
  for name, labels in bank_labels.items():
    padded, padded_labels = pad_bank(np.asarray(bank, np.float32), np.asarray(labels), devices)
    on_mesh = jax.device_put(padded, rows), jax.device_put(padded_labels.astype(np.int32), rows)
    scores = sharded_knn_scores(mesh, num_classes[name], k, temperature)
    predicted = np.concatenate(
        [
            np.argmax(np.asarray(scores(jnp.asarray(queries[s : s + chunk]), *on_mesh)), axis=1)
            for s in range(0, len(queries), chunk)
        ]
    )
    out[name] = float(np.mean(predicted == np.asarray(query_labels[name])))
  return out


def evaluate(
    ctx: features.Extractor, variables: dict, k: int, temperature: float, quiet: bool = False
) -> dict[str, float]:
  """{label: top-1 kNN accuracy} of encoder `variables` on ctx's test split, with ctx's train
  split as the memory bank, sharded over ctx's mesh; `quiet`: no progress bars."""
  bank, bank_labels = features.eval_features(
      ctx, variables, ctx.train_src, None if quiet else "kNN bank"
  )
  queries, query_labels = features.eval_features(
      ctx, variables, ctx.test_src, None if quiet else "kNN test"
  )
  return knn_accuracy(
      ctx.mesh,
      bank,
      bank_labels,
      queries,
      query_labels,
      dict(ctx.train_src.num_classes),
      k=k,
      temperature=temperature,
  )


def _check(ctx: features.Extractor, k: int, temperature: float, k_name: str, t_name: str) -> None:
  """UsageError unless 1 <= k <= the bank's size and temperature > 0; k_name and t_name name
  the settings in the message (the command's flags or the config's fields)."""
  if temperature <= 0:
    raise UsageError(f"{t_name} must be positive, got {temperature}")
  if k > len(ctx.train_src):
    raise UsageError(
        f"{k_name} = {k} exceeds the memory bank's {len(ctx.train_src)} images "
        "(the probe's train split)"
    )


def run(ctx) -> dict:
  """The evaluator on ctx (cl_jax.evaluators.registry.EvalContext); options: k, temperature
  (default: the config's eval.knn_k, eval.knn_temperature), baseline (default true: also the
  network at random initialisation)."""
  k = ctx.options.get("k", ctx.config.eval.knn_k)
  temperature = ctx.options.get("temperature", ctx.config.eval.knn_temperature)
  _check(ctx.extractor, k, temperature, "--k", "--temperature")
  report = {
      "k": k,
      "temperature": temperature,
      "bank": len(ctx.extractor.train_src),
      "num_test": len(ctx.extractor.test_src),
      "accuracy": evaluate(ctx.extractor, ctx.variables, k, temperature),
  }
  if ctx.options.get("baseline", True):
    init = ctx.extractor.init_variables()
    report["random_init"] = evaluate(ctx.extractor, init, k, temperature)
  return report


def report_name(report: dict) -> str:
  """knn_step<N>: the report's file name in the workdir (.json)."""
  return f"knn_step{report['step']}"


def scalars(report: dict) -> dict[str, float]:
  """The accuracies as knn/<label>: the monitor's names, so a rerun on a monitored step
  replaces the monitor's numbers when read."""
  return {f"knn/{label}": acc for label, acc in report["accuracy"].items()}


def check_monitor(ctx: features.Extractor, config) -> None:
  """UsageError, before pretraining starts, for settings the monitor cannot run with."""
  _check(ctx, config.eval.knn_k, config.eval.knn_temperature, "eval.knn_k", "eval.knn_temperature")


def monitor(ctx: features.Extractor, variables: dict, config) -> dict[str, float]:
  """knn/<label> of encoder `variables` during pretraining (no progress bars)."""
  accuracy = evaluate(ctx, variables, config.eval.knn_k, config.eval.knn_temperature, quiet=True)
  return scalars({"accuracy": accuracy})


def table(report: dict) -> str:
  """The report as aligned text, random init beside the checkpoint when present."""
  lines = [
      f"weighted kNN (k {report['k']}, T {report['temperature']}) of {report['workdir']} at "
      f"step {report['step']}: bank {report['bank']} images, {report['num_test']} test images",
      f"  {'label':10s} {'top-1':>8s}"
      + (f" {'random init':>12s}" if "random_init" in report else ""),
  ]
  for label, acc in report["accuracy"].items():
    row = f"  {label:10s} {100 * acc:7.2f}%"
    if "random_init" in report:
      row += f" {100 * report['random_init'][label]:11.2f}%"
    lines.append(row)
  return "\n".join(lines)
