"""The robustness evaluator (cl_jax.evaluators.robustness): mCE by hand, the ImageNet-R / -A class
lists against the indices their authors publish, the class restriction, image folders, the
whole command on mocked TFDS data and an image folder against a NumPy computation, and the
messages for a missing dataset or classifier."""

import json
import os
import pickle

import jax
import numpy as np
import orbax.checkpoint as ocp
import PIL.Image
import pytest

from cl_jax.data import geometric, tfds_source
from cl_jax.data.image_folder import ImageFolderSource
from cl_jax.evaluators import (
    features,
    linear_classifier,
    linear_probe,
    registry,
    robustness,
    robustness_data,
)
from cl_jax.runtime import checkpoint, metrics, run_config
from cl_jax.runtime.errors import UsageError
from configs import mocov2

tfds = pytest.importorskip("tensorflow_datasets")

# Positions of the published classes among the 1000 sorted ImageNet WordNet ids, as their
# authors' evaluation scripts give them: ImageNet-R, the commented `imagenet_r_indices` of
# github.com/hendrycks/imagenet-r eval.py; ImageNet-A, the keys of `thousand_k_to_200` that
# map to a class (not -1) in github.com/hendrycks/natural-adv-examples eval.py.
IMAGENET_R_INDICES = (
    "1 2 4 6 8 9 11 13 22 23 26 29 31 39 47 63 71 76 79 84 90 94 96 97 99 100 105 107 113 122 "
    "125 130 132 144 145 147 148 150 151 155 160 161 162 163 171 172 178 187 195 199 203 207 "
    "208 219 231 232 234 235 242 245 247 250 251 254 259 260 263 265 267 269 276 277 281 288 "
    "289 291 292 293 296 299 301 308 309 310 311 314 315 319 323 327 330 334 335 337 338 340 "
    "341 344 347 353 355 361 362 365 366 367 368 372 388 390 393 397 401 407 413 414 425 428 "
    "430 435 437 441 447 448 457 462 463 469 470 471 472 476 483 487 515 546 555 558 570 579 "
    "583 587 593 594 596 609 613 617 621 629 637 657 658 701 717 724 763 768 774 776 779 780 "
    "787 805 812 815 820 824 833 847 852 866 875 883 889 895 907 928 931 932 933 934 936 937 "
    "943 945 947 948 949 951 953 954 957 963 965 967 980 981 983 988"
)
IMAGENET_A_INDICES = (
    "6 11 13 15 17 22 23 27 30 37 39 42 47 50 57 70 71 76 79 89 90 94 96 97 99 105 107 108 110 "
    "113 124 125 130 132 143 144 150 151 207 234 235 254 277 283 287 291 295 298 301 306 307 "
    "308 309 310 311 313 314 315 317 319 323 324 326 327 330 334 335 336 347 361 363 372 378 "
    "386 397 400 401 402 404 407 411 416 417 420 425 428 430 437 438 445 456 457 461 462 470 "
    "472 483 486 488 492 496 514 516 528 530 539 542 543 549 552 557 561 562 569 572 573 575 "
    "579 589 606 607 609 614 626 627 640 641 642 643 658 668 677 682 684 687 701 704 719 736 "
    "746 749 752 758 763 765 768 773 774 776 779 780 786 792 797 802 803 804 813 815 820 823 "
    "831 833 835 839 845 847 850 859 862 870 879 880 888 890 897 900 907 913 924 932 933 934 "
    "937 943 945 947 951 954 956 957 959 971 972 980 981 984 986 987 988"
)
STEP = 7
IMAGE_SIZE = 32


@pytest.fixture(name="imagenet", scope="module")
def fixture_imagenet(tmp_path_factory):
  """The 1000 sorted ImageNet WordNet ids (TFDS imagenet2012 label names)."""
  return robustness_data.imagenet_wnids(str(tmp_path_factory.mktemp("empty")))


def _in100():
  return sorted(tfds_source.read_class_list("imagenet100_classes.txt"))


# ImageNet-C: CE and mCE.


def test_corruption_errors_by_hand():
  # gaussian_noise: errors .50 .60 .70 .80 .90, sum 3.5; AlexNet's sum 5 x .886428 = 4.43214;
  #   CE = 3.5 / 4.43214 = 0.789686.
  # brightness: errors .20 .20 .30 .30 .50, sum 1.5; AlexNet's 5 x .564592 = 2.82296;
  #   CE = 1.5 / 2.82296 = 0.531357.
  # mCE = (0.789686 + 0.531357) / 2 = 0.660522.
  errors = {
      "gaussian_noise": dict(zip(range(1, 6), [0.5, 0.6, 0.7, 0.8, 0.9])),
      "brightness": dict(zip(range(1, 6), [0.2, 0.2, 0.3, 0.3, 0.5])),
  }
  ces, mce = robustness.corruption_errors(errors)
  assert ces["gaussian_noise"] == pytest.approx(0.789686, abs=1e-6)
  assert ces["brightness"] == pytest.approx(0.531357, abs=1e-6)
  assert mce == pytest.approx(0.660522, abs=1e-6)
  with pytest.raises(ValueError, match="all 5 severities"):
    robustness.corruption_errors({"fog": {1: 0.3, 2: 0.4}})


def test_corruption_summary_reports_mce_only_for_the_full_benchmark():
  rng = np.random.default_rng(0)
  errors = {
      c: {s: float(rng.uniform(0.2, 0.9)) for s in range(1, 6)} for c in robustness.CORRUPTIONS
  }
  full = robustness.corruption_summary(errors)
  ces = [np.mean(list(e.values())) / robustness.ALEXNET_ERRORS[c] for c, e in errors.items()]
  assert full["mCE"] == pytest.approx(np.mean(ces))
  assert full["top1"] == pytest.approx(1 - np.mean([list(e.values()) for e in errors.values()]))
  assert full["top1_by_severity"]["3"] == pytest.approx(
      1 - np.mean([e[3] for e in errors.values()])
  )
  assert full["corruptions"]["fog"]["CE"] == pytest.approx(ces[robustness.CORRUPTIONS.index("fog")])
  partial = robustness.corruption_summary(
      {"fog": errors["fog"], "snow": {1: errors["snow"][1], 2: errors["snow"][2]}}
  )
  assert partial["mCE"] is None and partial["corruptions"]["snow"]["CE"] is None
  assert partial["corruptions"]["fog"]["CE"] == full["corruptions"]["fog"]["CE"]
  assert partial["top1_by_severity"]["4"] == pytest.approx(1 - errors["fog"][4])


def test_alexnet_errors_cover_the_tfds_benchmark_corruptions():
  from tensorflow_datasets.datasets.imagenet2012_corrupted import (
      imagenet2012_corrupted_dataset_builder as builder,
  )

  assert robustness.CORRUPTIONS == tuple(builder.BENCHMARK_CORRUPTIONS)


# The published class lists and the restriction.


@pytest.mark.parametrize(
    "name, indices, members",
    [
        # goldfish, great white shark, cocker spaniel, acorn.
        ("imagenet_r", IMAGENET_R_INDICES, ["n01443537", "n01484850", "n02102318", "n12267677"]),
        # stingray, goldfinch, ..., wreck, acorn.
        ("imagenet_a", IMAGENET_A_INDICES, ["n01498041", "n01531178", "n04606251", "n12267677"]),
    ],
)
def test_published_class_lists(imagenet, name, indices, members):
  wnids = robustness_data.dataset_wnids(name, imagenet)
  assert len(wnids) == len(set(wnids)) == 200 and wnids == sorted(wnids)
  assert [imagenet.index(w) for w in wnids] == [int(i) for i in indices.split()]
  assert set(members) <= set(wnids)


def test_imagenet_r_and_a_are_different_classes(imagenet):
  r = robustness_data.dataset_wnids("imagenet_r", imagenet)
  a = robustness_data.dataset_wnids("imagenet_a", imagenet)
  assert "n01443537" in r and "n01443537" not in a  # goldfish: a rendition, no adversarial set
  assert robustness_data.dataset_wnids("imagenet_sketch", imagenet) == imagenet


@pytest.mark.parametrize("name, shared", [("imagenet_r", 19), ("imagenet_a", 15)])
def test_restriction_of_an_imagenet100_model(imagenet, name, shared):
  # `shared`: len(set(imagenet100_classes.txt) & set(imagenet_{r,a}_classes.txt)), counted
  # once with Python's sets when the lists were added (19 of the 100 classes are -R's, 15 -A's).
  model = _in100()
  published = robustness_data.dataset_wnids(name, imagenet)
  kept, columns = robustness_data.restriction(model, published)
  assert kept == sorted(set(model) & set(published)) and len(kept) == shared
  assert [model[c] for c in columns] == kept
  # A logit outside the kept classes, however large, never wins.
  outside = next(i for i, w in enumerate(model) if w not in published)
  logits = np.zeros((shared, len(model)))
  logits[:, outside] = 100.0
  logits[np.arange(shared), columns] = 1.0
  assert robustness.restricted_top1(logits, columns, np.arange(shared)) == 1.0
  assert linear_classifier.topk_accuracy(logits, columns, 1) == 0.0  # unrestricted argmax


def test_a_1000_class_model_keeps_the_200_published_classes(imagenet):
  kept, columns = robustness_data.restriction(
      imagenet, robustness_data.dataset_wnids("imagenet_r", imagenet)
  )
  assert kept == robustness_data.dataset_wnids("imagenet_r", imagenet)
  np.testing.assert_array_equal(columns, [int(i) for i in IMAGENET_R_INDICES.split()])


def test_non_imagenet_pretraining_is_refused(imagenet):
  assert robustness_data.model_wnids("imagenet100", imagenet) == _in100()
  assert robustness_data.model_wnids("imagenet2012", imagenet) == imagenet
  with pytest.raises(UsageError, match="'cifar10'.*ImageNet"):
    robustness_data.model_wnids("cifar10", imagenet)


# Image folders.


def _write_image(path, image):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  PIL.Image.fromarray(image).save(path)


def test_image_folder_source(tmp_path):
  rng = np.random.default_rng(0)
  images = {}
  for cls, name in [("b", "2.PNG"), ("b", "1.png"), ("a", "x.png"), ("z", "y.png")]:
    images[cls, name] = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    _write_image(tmp_path / cls / name, images[cls, name])
  PIL.Image.fromarray(images["a", "x.png"][..., 0]).save(tmp_path / "a" / "grey.JPEG")
  (tmp_path / "a" / "notes.txt").write_text("not an image")
  source = ImageFolderSource(str(tmp_path), ["b", "a", "c"])  # class z is skipped, c is empty
  assert len(source) == 4 and source.num_classes == {"label": 3}
  order = [("b", "1.png"), ("b", "2.PNG"), ("a", "grey.JPEG"), ("a", "x.png")]
  assert [
      (os.path.basename(os.path.dirname(f)), os.path.basename(f)) for f in source.files
  ] == order
  for i, (cls, name) in enumerate(order):
    example = source[i]
    assert example["label"] == ["b", "a"].index(cls)
    assert example["image"].dtype == np.uint8 and example["image"].shape == (5, 7, 3)
    if name != "grey.JPEG":
      np.testing.assert_array_equal(example["image"], images[cls, name])
  restored = pickle.loads(pickle.dumps(source))
  np.testing.assert_array_equal(restored[3]["image"], source[3]["image"])
  with pytest.raises(IndexError):
    source[4]


def test_image_folder_errors(tmp_path):
  with pytest.raises(tfds_source.DatasetNotFoundError, match="does not exist"):
    ImageFolderSource(str(tmp_path / "nowhere"), ["a"])
  _write_image(tmp_path / "other" / "1.png", np.zeros((2, 2, 3), np.uint8))
  with pytest.raises(tfds_source.DatasetNotFoundError, match=r"<root>/<class>/<image>.*'other'"):
    ImageFolderSource(str(tmp_path), ["a"])


# The whole suite on mocked TFDS data and an image folder.


class _Records:
  """A stand-in TFDS data source: record i is {"image": images[i], "label": labels[i]}."""

  def __init__(self, images, labels):
    self.images, self.labels = images, labels

  def __len__(self):
    return len(self.labels)

  def __getitem__(self, i):
    return {"image": self.images[i], "label": np.int64(self.labels[i]), "file_name": ""}

  def __getitems__(self, keys):
    return [self[k] for k in keys]


def _write_metadata(data_dir, tfds_name, splits):
  """dataset_info.json etc. of `tfds_name` ("name" or "name/config") with the split sizes
  `splits`, as `tfds build` writes them, so that the builder reads as prepared."""
  builder = tfds.builder(tfds_name, data_dir=str(data_dir), file_format="array_record")
  builder.data_path.mkdir(parents=True)
  infos = []
  for split, size in splits.items():
    template = tfds.core.ShardedFileTemplate(
        data_dir=builder.data_path,
        dataset_name=builder.name,
        split=split,
        filetype_suffix="array_record",
    )
    infos.append(
        tfds.core.SplitInfo(
            name=split, shard_lengths=[size], num_bytes=0, filename_template=template
        )
    )
  builder.info.set_splits(tfds.core.SplitDict(infos))
  builder.info.write_to_directory(builder.data_path)


def _config(data_dir):
  c = mocov2.get_config()
  c.data.name = "imagenet100"
  c.data.data_dir = str(data_dir)
  c.data.image_size = IMAGE_SIZE
  c.data.eval_crop_fraction = 0.875
  c.model.width_multiplier = 0.125
  c.probe.batch_size = 8
  c.probe.protocol = "fast"
  return c


class _Expected:
  """The reference computation: each image's evaluation view through the encoder one at a
  time, the classifier's logits in NumPy and the argmax over the shared classes."""

  def __init__(self, features, variables, classifier, model):
    self.features, self.variables, self.classifier, self.model = (
        features,
        variables,
        classifier,
        model,
    )

  def logits(self, images, crop_fraction):
    x = np.concatenate(
        [
            np.asarray(
                self.features(
                    self.variables, geometric.eval_view(im, IMAGE_SIZE, crop_fraction)[None]
                )
            )
            for im in images
        ]
    )
    c = self.classifier
    return ((x - c.mean) / c.std) @ c.weights["label"] + c.biases["label"]

  def labelled_set(self, rng, dataset_classes, crop_fraction, offset, num_kept=8):
    """(images, wnids, accuracy, restriction_matters): num_kept images of the classes shared
    by the model and `dataset_classes`, labelled with the restricted prediction for two in
    three of them (offset: which) and another shared class for the rest, then two images of
    classes the set may hold but the model lacks (to be skipped)."""
    shared = sorted(set(self.model) & set(dataset_classes))
    columns = [self.model.index(w) for w in shared]
    images = [rng.integers(0, 256, (36, 40 + i, 3), dtype=np.uint8) for i in range(num_kept)]
    logits = self.logits(images, crop_fraction)
    predicted = np.argmax(logits[:, columns], axis=1)
    correct = (np.arange(num_kept) + offset) % 3 != 0
    wnids = [shared[p if ok else (p + 1) % len(shared)] for p, ok in zip(predicted, correct)]
    unrestricted = [self.model[i] for i in np.argmax(logits, axis=1)]
    others = sorted(set(dataset_classes) - set(self.model))
    images += [rng.integers(0, 256, (36, 36, 3), dtype=np.uint8) for _ in range(2)]
    wnids += [others[0], others[-1]]
    matters = any(u != w for u, w, ok in zip(unrestricted, wnids, correct) if ok)
    return images, wnids, float(np.mean(correct)), matters


@pytest.mark.slow
def test_suite_on_mocked_datasets_matches_numpy(tmp_path, imagenet):
  rng = np.random.default_rng(0)
  data_dir, workdir, folder = tmp_path / "data", tmp_path / "run", tmp_path / "stylized"
  config = _config(data_dir)
  model = _in100()
  records = {}  # (TFDS name, split) -> _Records

  def add(tfds_name, split, images, wnids):
    records[tfds_name, split] = _Records(images, [imagenet.index(w) for w in wnids])
    _write_metadata(data_dir, tfds_name, {split: len(wnids)})

  # The probe's own splits (features.setup opens them): a few ImageNet-100 images.
  probe_images = [rng.integers(0, 256, (36, 36, 3), dtype=np.uint8) for _ in range(3)]
  probe_wnids = [model[0], model[1], imagenet[0]]
  for split in ("train", "validation"):
    records["imagenet2012", split] = _Records(
        probe_images, [imagenet.index(w) for w in probe_wnids]
    )
  _write_metadata(data_dir, "imagenet2012", {"train": 3, "validation": 3})

  def as_data_source(builder, split, decoders=None, deserialize_method=None):
    del decoders, deserialize_method
    config_name = f"/{builder.builder_config.name}" if builder.builder_config else ""
    return records[builder.name + config_name, split]

  with tfds.testing.mock_data(data_dir=str(data_dir), as_data_source_fn=as_data_source):
    probe = features.setup(config)
    # The checkpoint: the initial encoder, rescaled so that it differs from the run's init.
    variables = jax.tree.map(lambda v: np.asarray(v) * 1.25, jax.device_get(probe.init_variables()))
    run_config.save_start(config, str(workdir), STEP)
    manager = checkpoint.make_manager(str(workdir))
    state = {**variables, "step": np.int32(STEP)}
    manager.save(STEP, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()
    dim = probe.features(variables, np.zeros((1, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)).shape[1]
    classifier = linear_classifier.LinearClassifier(
        rng.standard_normal(dim).astype(np.float32),
        (rng.random(dim) + 0.5).astype(np.float32),
        {"label": rng.standard_normal((dim, len(model))).astype(np.float32)},
        {"label": rng.standard_normal(len(model)).astype(np.float32)},
    )
    name = linear_probe.file_stem(f"probe_step{STEP}", "fast")
    classifier.save(workdir / f"{name}_classifier.npz")
    expected = _Expected(probe.features, variables, classifier, model)

    want, matters = {}, []
    for offset, name in enumerate(["imagenet_r", "imagenet_sketch", "imagenet_a"]):
      images, wnids, want[name], m = expected.labelled_set(
          rng, robustness_data.dataset_wnids(name, imagenet), 0.875, offset
      )
      add(name, "test", images, wnids)
      matters.append(m)
    images, wnids, want["stylized_imagenet"], m = expected.labelled_set(rng, imagenet, 0.875, 2)
    matters.append(m)
    for j, (image, wnid) in enumerate(zip(images, wnids)):
      _write_image(folder / wnid / f"{j}.png", image)
    _write_image(folder / "not_a_class" / "0.png", images[0])
    empty = folder / wnids[0] / "empty.jpg"  # an unreadable image, left out with a warning
    empty.write_bytes(b"")
    corruptions = ("gaussian_noise", "fog")
    want_errors = {}
    for c in corruptions:
      for s in range(1, 6):
        # ImageNet-C views are not cropped (crop fraction 1).
        images, wnids, accuracy, m = expected.labelled_set(rng, imagenet, 1.0, s)
        add(f"imagenet2012_corrupted/{c}_{s}", "validation", images, wnids)
        want_errors.setdefault(c, {})[s] = 1.0 - accuracy
        matters.append(m)

    (report,) = registry.evaluate(
        str(workdir),
        ("robustness",),
        image_folders={"stylized_imagenet": str(folder)},
        corruptions=corruptions,
        bad_images="skip",
    )

  assert any(matters)  # the unrestricted argmax would have scored differently
  datasets = report["datasets"]
  assert list(datasets) == list(robustness_data.DATASETS)
  for name, accuracy in want.items():
    assert datasets[name]["top1"] == pytest.approx(accuracy), name
    assert datasets[name]["num_images"] == 8
  assert datasets["imagenet_r"]["num_classes"] == 19 and datasets["imagenet_a"]["num_classes"] == 15
  assert datasets["imagenet_sketch"]["num_classes"] == 100
  c = datasets["imagenet_c"]
  assert c["num_images"] == 8 * 10 and c["mCE"] is None  # 2 of the 15 corruptions
  for corruption, by_severity in want_errors.items():
    got = c["corruptions"][corruption]
    assert got["errors"] == {str(s): pytest.approx(e) for s, e in by_severity.items()}
    mean_error = np.mean(list(by_severity.values()))
    assert got["CE"] == pytest.approx(mean_error / robustness.ALEXNET_ERRORS[corruption])
  assert c["top1"] == pytest.approx(1 - np.mean([list(e.values()) for e in want_errors.values()]))

  assert report["step"] == STEP and report["protocol"] == "fast"
  assert report["bad_images"] == "skip"
  assert report["skipped_images"] == {"stylized_imagenet": [str(empty)]}  # TFDS sets: none
  saved = json.loads((workdir / f"eval_robustness_step{STEP}.json").read_text())
  assert saved["datasets"] == json.loads(json.dumps(datasets))
  assert saved["skipped_images"] == {"stylized_imagenet": [str(empty)]}
  row = metrics.read_metrics(str(workdir))[-1]
  assert row["step"] == STEP
  assert row["robustness/imagenet_r/top1"] == pytest.approx(want["imagenet_r"])
  assert row["robustness/imagenet_c/fog/CE"] == pytest.approx(c["corruptions"]["fog"]["CE"])
  assert "robustness/imagenet_c/mCE" not in row
  text = registry.table(report)
  assert "ImageNet-R" in text and "Stylized-ImageNet" in text and "gaussian_noise" in text
  assert "Stylized-ImageNet: 1 unreadable image skipped" in text


# Messages.


def _context(workdir, data_dir, **options):
  config = _config(data_dir)
  return registry.EvalContext(str(workdir), STEP, config, None, None, str(data_dir), options)


def _save_classifier(workdir, num_classes=100):
  workdir.mkdir(exist_ok=True)
  name = linear_probe.file_stem(f"probe_step{STEP}", "fast")
  linear_classifier.LinearClassifier(
      np.zeros(4),
      np.ones(4),
      {"label": np.zeros((4, num_classes))},
      {"label": np.zeros(num_classes)},
  ).save(workdir / f"{name}_classifier.npz")


def test_missing_classifier_says_to_run_the_probe(tmp_path):
  ctx = _context(tmp_path, tmp_path, protocol="logreg")
  with pytest.raises(UsageError) as error:
    robustness.run(ctx)
  assert (
      f"python -m cl_jax.evaluate --evaluator=linear_probe --workdir={tmp_path} "
      f"--step={STEP} --protocol=logreg first" in str(error.value)
  )
  _save_classifier(tmp_path, num_classes=10)
  with pytest.raises(UsageError, match="not the 100 classes"):
    robustness.run(_context(tmp_path, tmp_path))


@pytest.mark.parametrize(
    "name, fragments",
    [
        (
            "imagenet_r",
            [
                "ImageNet-R",
                "tfds build imagenet_r --data_dir={d} --file_format=array_record",
                "--image_folders=imagenet_r=",
            ],
        ),
        (
            "imagenet_c",
            [
                "ImageNet-C: 75 of the 75",
                "imagenet2012_corrupted/gaussian_noise_1",
                "tfds build imagenet2012_corrupted --data_dir={d} --file_format=array_record",
                "ILSVRC2012_img_val.tar",
                os.path.join("{d}", "downloads", "manual"),
                "--image_folders=imagenet_c=",
                "<root>/<corruption>/<severity>/<wnid>",
            ],
        ),
        (
            "stylized_imagenet",
            [
                "Stylized-ImageNet",
                "github.com/rgeirhos/Stylized-ImageNet",
                "--image_folders=stylized_imagenet=",
            ],
        ),
    ],
)
def test_unprepared_dataset_names_the_preparation(tmp_path, monkeypatch, name, fragments):
  def no_download(*args, **kwargs):
    raise AssertionError("the suite must never download")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_download)
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  _save_classifier(tmp_path / "run")
  with pytest.raises(tfds_source.DatasetNotFoundError) as error:
    robustness.run(_context(tmp_path / "run", data_dir, datasets=(name,)))
  message = str(error.value)
  for fragment in fragments:
    assert fragment.format(d=data_dir) in message
  if name != "stylized_imagenet":
    assert repr(str(data_dir)) in message
  assert list(data_dir.iterdir()) == []


def test_unknown_options_are_refused(tmp_path):
  _save_classifier(tmp_path)
  with pytest.raises(UsageError, match="imagenet_v2"):
    robustness.run(_context(tmp_path, tmp_path, datasets=("imagenet_v2",)))
  with pytest.raises(UsageError, match="--image_folders names"):
    robustness.run(_context(tmp_path, tmp_path, image_folders={"imagenet": "/x"}))
  with pytest.raises(UsageError, match="bad_images must be one of stop, skip"):
    robustness.run(_context(tmp_path, tmp_path, bad_images="ignore"))


def test_no_data_dir_or_no_image_of_the_model_classes(tmp_path, imagenet):
  _save_classifier(tmp_path)
  with pytest.raises(tfds_source.DatasetNotFoundError, match="neither --data_dir nor"):
    robustness.run(_context(tmp_path, "", datasets=("imagenet_r",)))
  # ImageNet-R records of renditions whose classes an ImageNet-100 model lacks.
  r = robustness_data.dataset_wnids("imagenet_r", imagenet)
  outside = [w for w in r if w not in _in100()][:3]
  records = _Records([np.zeros((4, 4, 3), np.uint8)] * 3, [imagenet.index(w) for w in outside])
  _write_metadata(tmp_path / "data", "imagenet_r", {"test": 3})
  with tfds.testing.mock_data(
      data_dir=str(tmp_path / "data"), as_data_source_fn=lambda *args, **kwargs: records
  ):
    with pytest.raises(UsageError, match="ImageNet-R holds no image of the 19 classes"):
      robustness.run(_context(tmp_path, tmp_path / "data", datasets=("imagenet_r",)))
