"""The transfer and few-shot suites (cl_jax.evaluators.transfer / fewshot): the prototype classifier
and the 95% interval against hand-worked numbers and a NumPy re-derivation, episode sampling,
the options' errors, and both suites end to end on mocked CUB-200-2011 and Flowers-102 records
with known labels (tfds.testing.mock_data; the TFDS metadata is written as `tfds build` does).
"""

import json

import jax
import numpy as np
import pytest

from cl_jax.data import tfds_source
from cl_jax.evaluators import features, fewshot, fine_grained, linear_classifier, registry, transfer
from cl_jax.runtime.errors import UsageError
from configs import simclr

tfds = pytest.importorskip("tensorflow_datasets")
from tests.test_tfds_source import encoded, write_prepared_dataset  # noqa: E402

# Known labels of the mocked records: split -> labels, in record order.
FLOWERS_CLASSES = (3, 17, 50, 101)
CUB_CLASSES = (0, 7, 199)


def _labels(classes, per_class, seed):
  return np.random.default_rng(seed).permutation(np.repeat(classes, per_class)).tolist()


MOCK_LABELS = {
    "oxford_flowers102": {
        "train": _labels(FLOWERS_CLASSES, 2, 0),
        "validation": _labels(FLOWERS_CLASSES, 2, 1),
        "test": _labels(FLOWERS_CLASSES, 3, 2),
    },
    "caltech_birds2011": {"train": _labels(CUB_CLASSES, 5, 3), "test": _labels(CUB_CLASSES, 3, 4)},
}


def _image(label, i, split):
  """A (H, W, 3) uint8 image of varying size: strong noise around a colour set by the label,
  so that classifiers on it are neither at chance nor perfect."""
  rng = np.random.default_rng([label, i, len(split)])
  colour = 128 + 10 * np.array([label % 3, label % 5, label % 7])
  noise = rng.integers(-110, 110, size=(36 + i % 5, 40, 3))
  return np.clip(colour + noise, 0, 255).astype(np.uint8)


class FakeRecords:
  """Stand-in TFDS data source: record i of `split` is {"image", "label"}; a split "a+b" reads
  the records of a, then those of b."""

  def __init__(self, tfds_name, split):
    self.records = [
        {"image": _image(label, i, part), "label": np.int64(label)}
        for part in split.split("+")
        for i, label in enumerate(MOCK_LABELS[tfds_name][part])
    ]

  def __len__(self):
    return len(self.records)

  def __getitem__(self, i):
    return self.records[i]


@pytest.fixture(name="data_dir")
def fixture_data_dir(tmp_path):
  """A data_dir holding the metadata of both datasets, their records mocked (FakeRecords)."""
  for name, splits in MOCK_LABELS.items():
    write_prepared_dataset(tmp_path, name, {s: len(v) for s, v in splits.items()})

  def as_data_source(builder, split, decoders=None, deserialize_method=None):
    del decoders, deserialize_method
    return FakeRecords(builder.name, split)

  with tfds.testing.mock_data(data_dir=str(tmp_path), as_data_source_fn=as_data_source):
    yield str(tmp_path)


@pytest.fixture(name="probe", scope="module")
def fixture_probe():
  """The probe context of a tiny SimCLR config on one device."""
  config = simclr.get_config()
  config.data.update(image_size=32, trifeature_train=16, trifeature_test=16)
  config.model.width_multiplier = 0.125
  config.probe.update(batch_size=8, epochs=3, decay_epochs=(2,))
  return features.setup(config, jax.devices()[:1])


def _context(probe, data_dir, **options):
  """EvalContext whose checkpoint variables differ from the random init (arrays x 0.5 + 0.01)."""
  init = probe.init_variables()
  variables = jax.tree.map(lambda a: 0.5 * a + 0.01, init)
  return registry.EvalContext("w", 7, probe.config, probe, variables, data_dir, options)


def _report(module, ctx):
  """The report as cl_jax.evaluators.registry.evaluate assembles it."""
  return {"workdir": ctx.workdir, "step": ctx.step, **module.run(ctx)}


def _numpy_prototypes(support, support_labels, queries):
  """Cosine nearest-centroid labels, re-derived with explicit loops."""
  classes = sorted(set(support_labels.tolist()))
  protos = []
  for c in classes:
    rows = [s / np.linalg.norm(s) for s, l in zip(support, support_labels) if l == c]
    p = np.mean(rows, axis=0)
    protos.append(p / np.linalg.norm(p))
  out = []
  for q in queries:
    scores = [np.dot(q / np.linalg.norm(q), p) for p in protos]
    out.append(classes[int(np.argmax(scores))])
  return np.array(out)


def test_prototypes_match_a_numpy_rederivation():
  rng = np.random.default_rng(0)
  support = rng.standard_normal((5 * 4, 16)) * rng.uniform(0.1, 10, (20, 1))
  labels = np.repeat([9, 2, 4, 7, 0], 4)
  queries = rng.standard_normal((50, 16))
  predicted = fewshot.prototype_predictions(support, labels, queries)
  np.testing.assert_array_equal(predicted, _numpy_prototypes(support, labels, queries))
  assert set(predicted.tolist()) <= set(labels.tolist()) and len(set(predicted.tolist())) > 1


def test_prototypes_hand_worked_two_way_one_shot():
  # Supports: class 5 at (2, 0) -> prototype (1, 0); class 8 at (0, 3) -> (0, 1). The query
  # (3, 1) has cosines 3/sqrt(10) and 1/sqrt(10): class 5. The query (1, 4) goes to class 8,
  # and (-1, 0.5), cosines -2/sqrt(5) and 1/sqrt(5), also to class 8.
  support = np.array([[2.0, 0.0], [0.0, 3.0]])
  queries = np.array([[3.0, 1.0], [1.0, 4.0], [-1.0, 0.5]])
  predicted = fewshot.prototype_predictions(support, np.array([5, 8]), queries)
  np.testing.assert_array_equal(predicted, [5, 8, 8])


def test_prototypes_average_the_normalised_supports():
  # Unnormalised, the mean of (10, 0) and (0, 1) would be (5, 0.5), closer in angle to (1, 0);
  # normalised it is (0.5, 0.5): the query (1, 1.2) then goes to class 1, not class 2 at (1, 0.3).
  support = np.array([[10.0, 0.0], [0.0, 1.0], [1.0, 0.3]])
  predicted = fewshot.prototype_predictions(support, np.array([1, 1, 2]), np.array([[1.0, 1.2]]))
  np.testing.assert_array_equal(predicted, [1])


def test_interval95_hand_computed():
  # mean 0.6; deviations 0.1, -0.1, 0, 0 -> s = sqrt(0.02 / 3); 1.96 * s / sqrt(4).
  mean, half = fewshot.interval95([0.7, 0.5, 0.6, 0.6])
  assert mean == pytest.approx(0.6)
  assert half == pytest.approx(1.96 * np.sqrt(0.02 / 3) / 2)
  assert half == pytest.approx(0.0800167, abs=1e-7)


@pytest.mark.parametrize("ways", [0, 3])
def test_episode_sampling(ways):
  rng = np.random.default_rng(1)
  pool = rng.permutation(np.repeat(np.arange(6), [7, 5, 9, 5, 6, 8]))
  test = rng.integers(0, 6, 40)
  for index in range(4):
    episode = fewshot.sample_episode(pool, test, ways, 4, seed=11, index=index)
    assert len(episode.classes) == (ways or 6) == len(set(episode.classes.tolist()))
    assert len(set(episode.support.tolist())) == len(episode.support) == 4 * len(episode.classes)
    np.testing.assert_array_equal(pool[episode.support], np.repeat(episode.classes, 4))
    np.testing.assert_array_equal(episode.queries, np.flatnonzero(np.isin(test, episode.classes)))
    again = fewshot.sample_episode(pool, test, ways, 4, seed=11, index=index)
    for a, b in zip(episode, again):
      np.testing.assert_array_equal(a, b)
    fewer = fewshot.sample_episode(pool, test, ways, 2, seed=11, index=index)
    np.testing.assert_array_equal(fewer.support, episode.support.reshape(-1, 4)[:, :2].ravel())
  draws = {
      tuple(fewshot.sample_episode(pool, test, ways, 4, seed, index).support)
      for seed in (11, 12)
      for index in range(4)
  }
  assert len(draws) == 8  # other seeds and indices draw other episodes


def _features(pool_labels, test_labels):
  pool_labels, test_labels = np.array(pool_labels), np.array(test_labels)
  return fine_grained.Features(
      np.ones((len(pool_labels), 2)), pool_labels, np.ones((len(test_labels), 2)), test_labels
  )


def test_episode_check_names_the_limits():
  dataset = fine_grained.Opened("flowers102", fine_grained.DATASETS["flowers102"], 102, None, None)
  f = _features([4, 4, 4, 9, 9, 6, 6, 6], [4, 9, 6])
  assert fewshot.check_episodes(dataset, f, (1, 2), 0) == 3
  assert fewshot.check_episodes(dataset, f, (2,), 2) == 2
  with pytest.raises(UsageError, match=r"--ways=4 exceeds the 3 classes.*at most 3"):
    fewshot.check_episodes(dataset, f, (1,), 4)
  with pytest.raises(UsageError, match=r"--shots=3: class 9 .* only 2 images .* 3 classes"):
    fewshot.check_episodes(dataset, f, (1, 3), 0)
  with pytest.raises(UsageError, match=r"classes \[6\] .* no test images"):
    fewshot.check_episodes(dataset, _features([4, 4, 6, 6], [4, 4]), (1,), 0)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"shots": "0,5"}, "--shots must list .* each at least 1"),
        ({"shots": []}, "--shots must list"),
        ({"shots": "five"}, "--shots must be integers"),
        ({"episodes": 1}, "--episodes must be one number, at least 2"),
        ({"ways": -1}, "--ways must be"),
        ({"ways": 1}, "at least 2, or 0 for all"),
        ({"datasets": "cub200,imagenet"}, "--datasets must name one or more of cub200"),
        ({"baseline": "no"}, "--baseline must be true or false"),
    ],
)
def test_fewshot_rejects_bad_options(options, message):
  ctx = registry.EvalContext("w", 0, simclr.get_config(), None, {}, "/nowhere", options)
  with pytest.raises(UsageError, match=message):
    fewshot.run(ctx)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"protocol": "paper"},
            "--evaluator=linear_probe.*--protocol=logreg or --protocol=fast",
        ),
        ({"protocol": "knn"}, "--protocol must be one of logreg, fast, got 'knn'"),
        ({"datasets": ""}, "--datasets must name"),
    ],
)
def test_transfer_rejects_bad_options(options, message):
  ctx = registry.EvalContext("w", 0, simclr.get_config(), None, {}, "/nowhere", options)
  with pytest.raises(UsageError, match=message):
    transfer.run(ctx)


@pytest.mark.parametrize(
    "module, name, tfds_name",
    [(transfer, "cub200", "caltech_birds2011"), (fewshot, "flowers102", "oxford_flowers102")],
)
def test_unprepared_dataset_gives_the_build_command(tmp_path, monkeypatch, module, name, tfds_name):
  def no_download(*args, **kwargs):
    raise AssertionError("the suites must never download")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_download)
  data_dir = str(tmp_path)
  options = {"datasets": name}
  ctx = registry.EvalContext("w", 0, simclr.get_config(), None, {}, data_dir, options)
  with pytest.raises(tfds_source.DatasetNotFoundError) as error:
    module.run(ctx)
  message = str(error.value)
  assert f"tfds build {tfds_name} --data_dir={data_dir} --file_format=array_record" in message
  assert "internet access" in message and repr(data_dir) in message and name in message
  assert list(tmp_path.iterdir()) == []


def test_no_data_dir_asks_for_one():
  ctx = registry.EvalContext("w", 0, simclr.get_config(), None, {}, "", {})
  with pytest.raises(UsageError, match="(?s)pass --data_dir=D.*tfds build caltech_birds2011"):
    transfer.run(ctx)


def test_flowers_pool_reads_train_then_validation_from_array_record_files(tmp_path):
  def examples(labels, split):
    return [
        {"image": encoded(_image(l, i, split), "PNG"), "label": l, "file_name": f"{split}{i}"}
        for i, l in enumerate(labels)
    ]

  labels = {"train": [5, 0, 5], "validation": [1, 0], "test": [0, 1, 5, 5]}
  write_prepared_dataset(
      tmp_path, "oxford_flowers102", {s: examples(v, s) for s, v in labels.items()}
  )
  dataset = fine_grained.open_dataset("flowers102", str(tmp_path))
  assert dataset.num_classes == 102
  assert len(dataset.train) == 5 and len(dataset.test) == 4
  pool = [(s, i, l) for s in ("train", "validation") for i, l in enumerate(labels[s])]
  for j, (split, i, label) in enumerate(pool):
    assert dataset.train[j]["label"] == label
    np.testing.assert_array_equal(dataset.train[j]["image"], _image(label, i, split))
  assert [dataset.test[j]["label"] for j in range(4)] == labels["test"]


def _mock_features(ctx, variables, name):
  """Features of the mocked dataset `name` computed here, independently of the suites."""
  spec = fine_grained.DATASETS[name]
  out = []
  for split in (spec.train_split, spec.test_split):
    source = tfds_source.TfdsSource(spec.tfds_name, split, ctx.data_dir, 1, labelled=True)
    x, y = features.eval_features(ctx.extractor, variables, source, None, labels=("label",))
    out += [x, y["label"]]
  return out


@pytest.mark.slow
def test_fewshot_end_to_end_matches_numpy_prototypes(probe, data_dir, monkeypatch):
  ctx = _context(probe, data_dir, datasets="flowers102", shots="3,1", episodes=3)
  computed = []
  eval_features = features.eval_features
  monkeypatch.setattr(
      features,
      "eval_features",
      lambda *args, **kwargs: computed.append(args[2].split) or eval_features(*args, **kwargs),
  )
  report = _report(fewshot, ctx)
  monkeypatch.undo()
  # Each split once per network (trained, random init); the 6 episodes only index them.
  assert computed == ["train+validation", "test"] * 2
  json.dumps(report)
  entry = report["datasets"]["flowers102"]
  assert report["episodes"] == 3 and "ddof=1" in report["interval"]
  assert entry["pool_split"] == "train+validation" and entry["ways"] == len(FLOWERS_CLASSES)
  assert entry["num_pool"] == 16 and entry["num_test"] == 12
  assert list(entry["accuracy"]) == ["1", "3"]
  for key, variables in (("accuracy", ctx.variables), ("random_init", probe.init_variables())):
    x_pool, y_pool, x_test, y_test = _mock_features(ctx, variables, "flowers102")
    for k in (1, 3):
      expected = []
      for e in range(3):
        episode = fewshot.sample_episode(y_pool, y_test, 0, k, probe.config.seed, e)
        assert len(episode.queries) == 12
        predicted = _numpy_prototypes(
            x_pool[episode.support], y_pool[episode.support], x_test[episode.queries]
        )
        expected.append(np.mean(predicted == y_test[episode.queries]))
      summary = entry[key][str(k)]
      np.testing.assert_allclose(summary["episodes"], expected, rtol=0, atol=1e-12)
      assert summary["queries"] == [12, 12, 12]
      assert summary["mean"] == pytest.approx(np.mean(expected))
      assert summary["ci95"] == pytest.approx(1.96 * np.std(expected, ddof=1) / np.sqrt(3))
  assert _report(fewshot, ctx)["datasets"] == report["datasets"]  # same seed, same episodes
  scalars = fewshot.scalars(report)
  assert set(scalars) == {
      f"fewshot/flowers102/{k}shot/{p}{s}"
      for k in (1, 3)
      for p in ("", "random_init/")
      for s in ("mean", "ci95")
  }
  text = fewshot.table(report)
  assert "random init" in text and f"{100 * entry['accuracy']['3']['mean']:.2f} +- " in text


@pytest.mark.slow
def test_fewshot_n_way_episodes_on_cub(probe, data_dir):
  ctx = _context(probe, data_dir, datasets=["cub200"], shots=(2,), ways=2, baseline=False)
  entry = _report(fewshot, ctx)["datasets"]["cub200"]
  assert entry["ways"] == 2 and "random_init" not in entry
  assert entry["accuracy"]["2"]["queries"] == [6] * 10  # two classes of 3 test images each
  with pytest.raises(UsageError, match=r"--shots=6: class \d+ of the train pool of cub200"):
    fewshot.run(_context(probe, data_dir, datasets="cub200", shots=6))


@pytest.mark.slow
def test_transfer_end_to_end_matches_logistic_regression(probe, data_dir):
  ctx = _context(probe, data_dir)
  report = _report(transfer, ctx)
  json.dumps(report)
  assert report["protocol"] == "logreg" and list(report["datasets"]) == ["cub200", "flowers102"]
  sizes = {"cub200": (15, 9, 200), "flowers102": (16, 12, 102)}
  for name, entry in report["datasets"].items():
    assert (entry["num_train"], entry["num_test"], entry["num_classes"]) == sizes[name]
    for key, variables in (("accuracy", ctx.variables), ("random_init", probe.init_variables())):
      x_train, y_train, x_test, y_test = _mock_features(ctx, variables, name)
      classes = {"label": sizes[name][2]}
      classifier = linear_classifier.fit_logreg(x_train, {"label": y_train}, classes)
      assert entry[key] == classifier.accuracy(x_test, {"label": y_test})["label"]
  assert transfer.scalars(report) == {
      f"transfer/{name}/{p}{k}": report["datasets"][name][key][k]
      for name in ("cub200", "flowers102")
      for key, p in (("accuracy", ""), ("random_init", "random_init/"))
      for k in ("top1", "top5")
  }
  lines = transfer.table(report).splitlines()
  assert "random init" in lines[1] and lines[2].split()[:3] == ["cub200", "15", "9"]


@pytest.mark.slow
def test_transfer_fast_protocol_uses_the_probe_settings(probe, data_dir):
  ctx = _context(probe, data_dir, datasets="flowers102", protocol="fast", baseline=False)
  entry = _report(transfer, ctx)["datasets"]["flowers102"]
  assert "random_init" not in entry
  x_train, y_train, x_test, y_test = _mock_features(ctx, ctx.variables, "flowers102")
  classifier = linear_classifier.fit_fast(
      x_train, {"label": y_train}, {"label": 102}, probe.config.probe, probe.config.seed
  )
  assert entry["accuracy"] == classifier.accuracy(x_test, {"label": y_test})["label"]
