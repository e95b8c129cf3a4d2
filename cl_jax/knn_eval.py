"""Weighted-kNN evaluation of encoder variables on a run's probe data (Wu et al. 2018;
cl_jax.knn_classifier): the probe dataset's train split in its evaluation view is the memory
bank, the test split is classified, one accuracy per label. Used by the kNN monitor of
pretraining (eval.knn_every) and by `python -m cl_jax.knn`."""

import json
import os

import jax
from etils import epath

from cl_jax import (
    checkpoint,
    knn_classifier,
    linear_probe,
    metrics,
    parallel,
    run_config,
    write_faults,
)
from cl_jax.errors import UsageError


def evaluate(
    ctx, variables: dict, k: int, temperature: float, quiet: bool = False
) -> dict[str, float]:
  """{label: top-1 kNN accuracy} of encoder `variables` on ctx's test split, with ctx's train
  split (cl_jax.linear_probe.setup) as the memory bank, sharded over ctx's mesh; `quiet`: no
  progress bars."""
  bank, bank_labels = linear_probe.eval_features(
      ctx, variables, ctx.train_src, None if quiet else "kNN bank"
  )
  queries, query_labels = linear_probe.eval_features(
      ctx, variables, ctx.test_src, None if quiet else "kNN test"
  )
  return knn_classifier.knn_accuracy(
      ctx.mesh,
      bank,
      bank_labels,
      queries,
      query_labels,
      dict(ctx.train_src.num_classes),
      k=k,
      temperature=temperature,
  )


def on_local_devices(variables: dict, ctx) -> dict:
  """The replicated encoder `variables` of a (possibly multi-process) run, copied onto ctx's
  mesh of this process's devices (linear_probe.setup(config, jax.local_devices()))."""
  replicated = parallel.replicated(ctx.mesh)
  return jax.tree.map(lambda x: jax.device_put(x.addressable_data(0), replicated), variables)


def run(workdir: str, step=None, k: int = 200, temperature: float = 0.1, baseline=True) -> dict:
  """kNN accuracy of checkpoint `step` (default: the latest) of the run in `workdir`; the
  report is written to workdir/knn_step<N>.json and returned, and its accuracies join the
  run's metrics and TensorBoard at step N as knn/<label> (metrics.append_row; the kNN
  monitor's names, so a rerun on a monitored step replaces the monitor's numbers when read)."""
  if temperature <= 0:
    raise UsageError(f"--temperature must be positive, got {temperature}")
  config = run_config.read(workdir)
  write_faults.check_writable(workdir, "the kNN report")
  ctx = linear_probe.setup(config)
  if k > len(ctx.train_src):
    raise UsageError(f"--k={k} exceeds the memory bank's {len(ctx.train_src)} images")
  step, variables = checkpoint.restore_encoder(workdir, ctx.init_variables, step)
  report = {
      "workdir": workdir if "://" in workdir else os.path.abspath(workdir),
      "step": step,
      "k": k,
      "temperature": temperature,
      "bank": len(ctx.train_src),
      "num_test": len(ctx.test_src),
      "accuracy": evaluate(ctx, variables, k, temperature),
  }
  if baseline:
    report["random_init"] = evaluate(ctx, ctx.init_variables(), k, temperature)
  if jax.process_index() == 0:
    path = epath.Path(workdir) / f"knn_step{step}.json"
    metrics.write_atomically(path, json.dumps(report, indent=2))
    scalars = {f"knn/{label}": acc for label, acc in report["accuracy"].items()}
    metrics.append_row(workdir, step, scalars, "knn")
    report["path"] = str(path)
  return report


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
