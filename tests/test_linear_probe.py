"""The linear probe's pieces: the fast SGD probe against scikit-learn's logistic
regression on the same features, and the cached random-initialisation baseline."""

import json

import numpy as np
import pytest

from cl_jax.evaluators import features, linear_classifier, linear_probe
from cl_jax.runtime.errors import UsageError
from configs import mocov2, simclr


def _gaussian_classes(rng, n, centres, noise):
  """(n, D) features of classes drawn uniformly, each around its centre, and their labels."""
  labels = rng.integers(0, len(centres), n)
  return centres[labels] + noise * rng.standard_normal((n, centres.shape[1])), labels


def _two_label_data(seed=0, dim=24):
  """Features carrying two independent labels (an easy one with 4 classes, a hard one with
  10), in separate dimensions, on an arbitrary scale and offset (the probes standardise)."""
  rng = np.random.default_rng(seed)
  easy_c = 3.0 * rng.standard_normal((4, dim // 2))
  hard_c = 0.6 * rng.standard_normal((10, dim - dim // 2))
  out = []
  for n in (3000, 1000):
    xe, ye = _gaussian_classes(rng, n, easy_c, 1.0)
    xh, yh = _gaussian_classes(rng, n, hard_c, 1.0)
    out.append((5.0 + 40.0 * np.concatenate([xe, xh], axis=1), {"easy": ye, "hard": yh}))
  return out, {"easy": 4, "hard": 10}


def test_fast_probe_agrees_with_logistic_regression():
  (train, test), classes = _two_label_data()
  probe = mocov2.get_config().probe
  fast = linear_classifier.fit_fast(*train, classes, probe, seed=0).accuracy(*test)
  logreg = linear_classifier.fit_logreg(*train, classes).accuracy(*test)
  for k in classes:
    assert abs(fast[k]["top1"] - logreg[k]["top1"]) < 0.03, (k, fast[k], logreg[k])
    assert fast[k]["top1"] <= fast[k]["top5"] <= 1.0
  # Both are well above chance on the easy label and above it on the hard one.
  assert logreg["easy"]["top1"] > 0.9 and logreg["hard"]["top1"] > 0.2


def test_logreg_probe_matches_nearest_centroid_on_separable_data():
  """On well separated isotropic classes the optimal linear rule is nearest centroid."""
  rng = np.random.default_rng(1)
  centres = 4.0 * rng.standard_normal((5, 8))
  x_tr, y_tr = _gaussian_classes(rng, 2000, centres, 1.0)
  x_te, y_te = _gaussian_classes(rng, 1000, centres, 1.0)
  nearest = np.argmin(((x_te[:, None] - centres[None]) ** 2).sum(-1), axis=1)
  acc = linear_classifier.fit_logreg(x_tr, {"c": y_tr}, {"c": 5}).accuracy(x_te, {"c": y_te})
  assert abs(acc["c"]["top1"] - np.mean(nearest == y_te)) < 0.02


def test_topk_accuracy_hand_checked():
  logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.5], [0.2, 0.3, 0.1]])
  labels = np.array([1, 2, 2])
  assert linear_classifier.topk_accuracy(logits, labels, 1) == pytest.approx(1 / 3)
  assert linear_classifier.topk_accuracy(logits, labels, 2) == pytest.approx(2 / 3)
  assert linear_classifier.topk_accuracy(logits, labels, 5) == 1.0


def test_baseline_key_follows_the_network_data_and_probe_only():
  c = mocov2.get_config()
  key = linear_probe.baseline_key(c, "fast")
  same = mocov2.get_config()
  same.moco.temperature = 0.05  # training settings do not change a random network
  same.optim.lr = 1.0
  same.nonsemantic.enabled = True
  same.data.workers = 4
  assert linear_probe.baseline_key(same, "fast") == key
  for change in (
      lambda x: x.update(seed=1),
      lambda x: x.model.update(width_multiplier=0.5),
      lambda x: x.data.update(image_size=48),
      lambda x: x.probe.update(epochs=7),
  ):
    other = mocov2.get_config()
    change(other)
    assert linear_probe.baseline_key(other, "fast") != key
  assert linear_probe.baseline_key(c, "paper") != key
  assert linear_probe.baseline_key(simclr.get_config(), "fast") != key  # head with BN


_VARIABLES = {"params": {"w": np.zeros(1)}, "batch_stats": {}}


def test_random_init_baseline_is_computed_once_per_config(tmp_path, monkeypatch):
  monkeypatch.setenv("CL_JAX_CACHE", str(tmp_path))
  calls = []

  def fake_probe(ctx, variables, protocol, validation=False):
    calls.append((ctx.config.seed, protocol))
    return {"colour": {"top1": 0.1 * len(calls), "top5": 0.5}}, None

  monkeypatch.setattr(linear_probe, "probe_variables", fake_probe)

  def ctx(seed):
    c = mocov2.get_config()
    c.seed = seed
    return features.Extractor(c, None, None, lambda: _VARIABLES, None, None)

  first = linear_probe.random_init_accuracy(ctx(0), "fast")
  again = linear_probe.random_init_accuracy(ctx(0), "fast")
  assert calls == [(0, "fast")] and again == first
  files = list((tmp_path / "random_init").glob("*.json"))
  assert len(files) == 1 and json.loads(files[0].read_text())["accuracy"] == first
  other = linear_probe.random_init_accuracy(ctx(1), "fast")
  assert calls == [(0, "fast"), (1, "fast")] and other != first


def test_validation_split_holds_out_the_first_fifth():
  x = np.arange(20, dtype=np.float32).reshape(10, 2)
  y = {"a": np.arange(10)}
  x_fit, y_fit, x_val, y_val = linear_probe.validation_split(x, y)
  np.testing.assert_array_equal(y_val["a"], [0, 1])
  np.testing.assert_array_equal(y_fit["a"], np.arange(2, 10))
  np.testing.assert_array_equal(np.concatenate([x_val, x_fit]), x)
  with pytest.raises(UsageError, match="at least 5"):
    linear_probe.validation_split(x[:4], {"a": y["a"][:4]})
  c = mocov2.get_config()
  assert linear_probe.baseline_key(c, "fast", True) != linear_probe.baseline_key(c, "fast")


def test_logreg_classifier_covers_binary_labels_and_absent_classes():
  """Two present classes of four: sklearn's single decision function becomes two logits whose
  difference it is; the absent classes get -inf and are never predicted."""
  rng = np.random.default_rng(2)
  x = rng.standard_normal((400, 3))
  y = np.where(x[:, 0] + 0.5 * x[:, 1] > 0, 3, 1)
  clf = linear_classifier.fit_logreg(x, {"c": y}, {"c": 4})
  from sklearn.linear_model import LogisticRegression

  z = (x - x.mean(0)) / (x.std(0) + 1e-6)
  ref = LogisticRegression(max_iter=1000).fit(z, y)
  logits = clf.logits(x)["c"]
  assert np.all(np.isneginf(logits[:, [0, 2]]))
  np.testing.assert_allclose(logits[:, 3] - logits[:, 1], ref.decision_function(z), rtol=1e-6)
  np.testing.assert_array_equal(np.argmax(logits, 1), ref.predict(z))


def test_classifier_save_load_round_trip(tmp_path):
  rng = np.random.default_rng(3)
  clf = linear_classifier.LinearClassifier(
      rng.standard_normal(4),
      rng.random(4) + 0.5,
      {"shape": rng.standard_normal((4, 3)), "rotation": rng.standard_normal((4, 4))},
      {"shape": np.array([0.0, -np.inf, 1.0]), "rotation": rng.standard_normal(4)},
  )
  clf.save(tmp_path / "c.npz")
  back = linear_classifier.LinearClassifier.load(tmp_path / "c.npz")
  x = rng.standard_normal((5, 4))
  for k, v in clf.logits(x).items():
    np.testing.assert_array_equal(back.logits(x)[k], v)
  np.testing.assert_allclose(
      clf.logits(x)["shape"][:, 2], ((x - clf.mean) / clf.std) @ clf.weights["shape"][:, 2] + 1.0
  )
  assert not list(tmp_path.glob("*.tmp"))
