"""Weighted kNN (Wu et al. 2018) against a NumPy re-derivation, on 1 and 8 simulated devices;
the monitor of a pretraining run and the standalone command."""

import json
import types

import jax
import numpy as np
import pytest

from cl_jax.evaluators import knn as knn_classifier
from cl_jax.evaluators import registry
from cl_jax.runtime import metrics, parallel
from cl_jax.runtime.errors import UsageError
from configs import mocov2
from tests import forked_commands


def _numpy_scores(queries, bank, labels, num_classes, k, t):
  """Loop form: cosine similarities, the k largest, votes exp(s / T) per class."""
  q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
  b = bank / np.linalg.norm(bank, axis=1, keepdims=True)
  out = np.zeros((len(q), num_classes))
  for i, row in enumerate(q):
    sims = b @ row
    for j in np.argsort(-sims, kind="stable")[:k]:
      out[i, labels[j]] += np.exp(sims[j] / t)
  return out


def _data(n=37, q=20, d=6, classes=4, seed=0):
  rng = np.random.default_rng(seed)
  centres = rng.normal(size=(classes, d))
  bank_labels = rng.integers(0, classes, n)
  query_labels = rng.integers(0, classes, q)
  bank = centres[bank_labels] + 0.8 * rng.normal(size=(n, d))
  queries = centres[query_labels] + 0.8 * rng.normal(size=(q, d))
  return bank.astype(np.float32), bank_labels, queries.astype(np.float32), query_labels


def test_hand_worked_vote():
  bank = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
  labels = np.array([0, 1, 1])
  mesh = parallel.make_mesh(jax.devices()[:1])
  scores = knn_classifier.sharded_knn_scores(mesh, 2, 2, 0.5)(np.array([[1.0, 0.2]]), bank, labels)
  s0, s2 = 1.0 / np.hypot(1, 0.2), 1.2 / (np.hypot(1, 0.2) * np.sqrt(2))  # the two nearest
  np.testing.assert_allclose(scores, [[np.exp(s0 / 0.5), np.exp(s2 / 0.5)]], rtol=1e-5)


@pytest.mark.parametrize("k", [1, 5, 37])
def test_scores_match_numpy(k):
  bank, bank_labels, queries, _ = _data()
  mesh = parallel.make_mesh(jax.devices()[:1])
  got = knn_classifier.sharded_knn_scores(mesh, 4, k, 0.1)(queries, bank, bank_labels)
  np.testing.assert_allclose(got, _numpy_scores(queries, bank, bank_labels, 4, k, 0.1), rtol=1e-4)


@pytest.mark.parametrize("devices", [1, 8])
def test_sharded_scores_match_numpy_with_a_padded_bank(devices):
  bank, bank_labels, queries, _ = _data()  # 37 rows: padded to 40 on 8 devices
  mesh = parallel.make_mesh(jax.devices()[:devices])
  padded, padded_labels = knn_classifier.pad_bank(bank, bank_labels, devices)
  scores = knn_classifier.sharded_knn_scores(mesh, 4, 7, 0.1)(queries, padded, padded_labels)
  np.testing.assert_allclose(
      scores, _numpy_scores(queries, bank, bank_labels, 4, 7, 0.1), rtol=1e-4
  )


@pytest.mark.slow
def test_accuracy_is_the_same_on_one_and_eight_devices():
  bank, bank_labels, queries, query_labels = _data(n=203, q=50)
  expect = np.mean(
      np.argmax(_numpy_scores(queries, bank, bank_labels, 4, 20, 0.1), axis=1) == query_labels
  )
  accuracies = [
      knn_classifier.knn_accuracy(
          parallel.make_mesh(jax.devices()[:n]),
          bank,
          {"label": bank_labels},
          queries,
          {"label": query_labels},
          {"label": 4},
          k=20,
          chunk=16,
      )["label"]
      for n in (1, 8)
  ]
  assert accuracies == [expect, expect] and expect > 0.5


def test_k_beyond_the_bank_is_refused():
  bank, bank_labels, queries, query_labels = _data(n=10)
  with pytest.raises(ValueError, match="k must be in"):
    knn_classifier.knn_accuracy(
        parallel.make_mesh(jax.devices()[:1]),
        bank,
        {"y": bank_labels},
        queries,
        {"y": query_labels},
        {"y": 4},
        k=11,
    )


@pytest.mark.slow
def test_monitor_logs_knn_per_label_and_the_command_reads_the_checkpoint(
    finished_run, finished_run_copy
):
  """The shared finished run (tests/tiny_run.py FINISHED) ran the monitor every 8 steps with
  k = 20; the standalone job runs on a copy (it writes its report into the workdir)."""
  workdir, proc = finished_run_copy, finished_run
  records = metrics.read_metrics(str(workdir))  # the probe's row merged into step 16's
  knn_steps = [r["step"] for r in records if "knn/colour" in r]
  assert knn_steps == [8, 16]
  last = records[-1]
  assert {"loss", "knn/colour", "knn/shape", "knn/texture", "knn/seconds"} <= set(last)
  assert all(0.0 <= last[f"knn/{k}"] <= 1.0 for k in ("colour", "shape", "texture"))
  assert "kNN shape" in proc.stdout
  cmd = [
      "cl_jax.evaluate",
      f"--workdir={workdir}",
      "--evaluator=knn",
      "--k=20",
  ]
  knn_proc = forked_commands.shared().run(cmd, timeout=600)
  assert knn_proc.returncode == 0, knn_proc.stderr[-3000:]
  report = json.loads((workdir / "knn_step16.json").read_text())
  # The standalone job on the final checkpoint repeats the monitor's last evaluation.
  for label in ("colour", "shape", "texture"):
    assert report["accuracy"][label] == pytest.approx(last[f"knn/{label}"])
  assert set(report["random_init"]) == {"colour", "shape", "texture"}
  too_many = forked_commands.shared().run([*cmd[:-1], "--k=5000"], timeout=600)
  assert too_many.returncode == 1 and "exceeds the memory bank" in too_many.stderr


def test_the_evaluator_refuses_a_non_positive_temperature_and_a_k_beyond_the_bank():
  """An explicit --temperature=0 is refused, not replaced by the config's default; the checks
  run before any feature is computed (the extractor here has no feature function)."""
  extractor = types.SimpleNamespace(train_src=[None] * 10, test_src=[None] * 5)
  ctx = registry.EvalContext("w", 1, mocov2.get_config(None), extractor, {}, "", {})
  with pytest.raises(UsageError, match="--temperature must be positive, got 0.0"):
    knn_classifier.run(ctx._replace(options={"temperature": 0.0}))
  with pytest.raises(UsageError, match="--k = 11 exceeds the memory bank's 10 images"):
    knn_classifier.run(ctx._replace(options={"k": 11}))
