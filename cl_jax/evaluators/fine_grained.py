"""The fine-grained datasets of the transfer and few-shot suites, their options and features.

Xiao et al. 2021 (Sec. 4, App. B) evaluate transfer on
  cub200      CUB-200-2011 (Wah et al. 2011), TFDS caltech_birds2011: 200 bird species,
              5,994 training and 5,794 test images;
  flowers102  Flowers-102 (Nilsback & Zisserman 2008), TFDS oxford_flowers102: 102 flower
              categories, train and validation 1,020 images each (10 per class), test 6,149;
              classifiers and few-shot supports use train+validation.
Both are read from a prepared TFDS data_dir, never downloaded: a dataset missing there stops
with the `tfds build` command that prepares it. Features are those of the run's linear probe
(cl_jax.evaluators.features): every image once in its evaluation view (resize, centre crop to
config.data.image_size), computed data-parallel on the probe's mesh.
"""

from typing import NamedTuple

import numpy as np

from cl_jax.data import tfds_source
from cl_jax.evaluators import features
from cl_jax.runtime.errors import UsageError


class FineGrained(NamedTuple):
  """How one dataset maps onto TFDS: builder name, title, the split a classifier is fitted on
  (the few-shot support pool) and the split it is tested on."""

  tfds_name: str
  title: str
  train_split: str
  test_split: str


DATASETS = {
    "cub200": FineGrained("caltech_birds2011", "CUB-200-2011", "train", "test"),
    "flowers102": FineGrained("oxford_flowers102", "Flowers-102", "train+validation", "test"),
}


class Opened(NamedTuple):
  """A prepared dataset: its name (a key of DATASETS), spec, number of classes, and the
  TfdsSource {"image", "label"} of its training and test splits."""

  name: str
  spec: FineGrained
  num_classes: int
  train: tfds_source.TfdsSource
  test: tfds_source.TfdsSource


class Features(NamedTuple):
  """Frozen features of a dataset's splits: x_train (N, D), y_train (N,), x_test (M, D),
  y_test (M,)."""

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray


def preparation_instructions(tfds_name: str, data_dir: str) -> str:
  """How to prepare TFDS `tfds_name` in `data_dir`, with the exact `tfds build` command."""
  return (
      "Prepare it on a machine with internet access:\n  "
      f"{tfds_source.build_command(tfds_name, data_dir)}"
  )


def dataset_names(options: dict, default: tuple[str, ...]) -> tuple[str, ...]:
  """The names of options["datasets"] (comma-separated text or a sequence; None or absent:
  `default`), checked against DATASETS, in the order given, each once."""
  value = options.get("datasets")
  if value is None:
    return default
  names = value.split(",") if isinstance(value, str) else list(value)
  names = [str(n).strip() for n in names if str(n).strip()]
  unknown = [n for n in names if n not in DATASETS]
  if unknown or not names:
    raise UsageError(
        f"--datasets must name one or more of {', '.join(DATASETS)} (comma-separated), "
        f"got {value!r}"
    )
  return tuple(dict.fromkeys(names))


def baseline_option(options: dict) -> bool:
  """options["baseline"]: True (the default, also for None) or False."""
  value = options.get("baseline")
  if value is None:
    return True
  if not isinstance(value, bool):
    raise UsageError(f"--baseline must be true or false, got {value!r}")
  return value


def open_dataset(name: str, data_dir: str) -> Opened:
  """The training and test sources of dataset `name` (a key of DATASETS) in `data_dir`.

  Raises:
    UsageError: no data_dir.
    tfds_source.DatasetNotFoundError: not prepared (the message holds the `tfds build`
      command); tfds_source.DatasetFormatError: prepared without random access.
  """
  spec = DATASETS[name]
  if not data_dir:
    raise UsageError(
        f"{spec.title} is read from a prepared TFDS data_dir: pass --data_dir=D (the run's "
        f"config has no data.data_dir). {preparation_instructions(spec.tfds_name, 'D')}"
    )
  builder = tfds_source.prepared_builder(
      spec.tfds_name,
      data_dir,
      f"Dataset {name!r} ({spec.title})",
      preparation_instructions(spec.tfds_name, data_dir),
  )
  num_classes = builder.info.features["label"].num_classes
  train, test = (
      tfds_source.TfdsSource(spec.tfds_name, split, data_dir, num_classes, labelled=True)
      for split in (spec.train_split, spec.test_split)
  )
  return Opened(name, spec, num_classes, train, test)


def split_features(ctx, variables: dict, dataset: Opened) -> Features:
  """Features of both splits of `dataset` under the encoder `variables`, with the feature
  function and mesh of the run's probe (EvalContext ctx)."""
  out = []
  for source in (dataset.train, dataset.test):
    x, y = features.eval_features(
        ctx.extractor,
        variables,
        source,
        f"{dataset.name} {source.split} features",
        labels=("label",),
    )
    out += [x, y["label"]]
  return Features(*out)


def dataset_scalars(report: dict, suite: str, leaves) -> dict[str, float]:
  """<suite>/<dataset>/<path>: the numbers of every dataset of a suite's report, of the
  checkpoint (entry "accuracy") and of the random init (entry "random_init"); leaves(key,
  value, infix) gives the (path, number) pairs of one entry item, infix being "" or
  "random_init/"."""
  out = {}
  for name, entry in report["datasets"].items():
    for key, infix in (("accuracy", ""), ("random_init", "random_init/")):
      for k, value in entry.get(key, {}).items():
        out.update({f"{suite}/{name}/{path}": x for path, x in leaves(k, value, infix)})
  return out
