"""The robustness suite's test sets (cl_jax.evaluators.robustness): ImageNet-C, -R, -Sketch, -A
and Stylized-ImageNet, their WordNet ids and the class ids a model shares with each, how to
prepare each, and their opening from TFDS or from the released image folders (nothing is
downloaded; a dataset that is not prepared stops the command with the way to prepare it).
"""

import os
from typing import NamedTuple

import numpy as np

from cl_jax.data import tfds_source
from cl_jax.data.image_folder import ImageFolderSource
from cl_jax.runtime import logs
from cl_jax.runtime.errors import UsageError

DATASETS = ("imagenet_c", "imagenet_r", "imagenet_sketch", "imagenet_a", "stylized_imagenet")
TITLES = {
    "imagenet_c": "ImageNet-C",
    "imagenet_r": "ImageNet-R",
    "imagenet_sketch": "ImageNet-Sketch",
    "imagenet_a": "ImageNet-A",
    "stylized_imagenet": "Stylized-ImageNet",
}
# TFDS name and split of the datasets TFDS has (ImageNet-C: one config per corruption, severity).
TFDS_SPLITS = {
    "imagenet_c": ("imagenet2012_corrupted", "validation"),
    "imagenet_r": ("imagenet_r", "test"),
    "imagenet_sketch": ("imagenet_sketch", "test"),
    "imagenet_a": ("imagenet_a", "test"),
}
# The published 200 WordNet ids of the datasets that hold a subset of the ImageNet classes.
PUBLISHED_CLASSES = {"imagenet_r": "imagenet_r_classes.txt", "imagenet_a": "imagenet_a_classes.txt"}
FOLDER_LAYOUTS = {
    "imagenet_c": "<root>/<corruption>/<severity>/<wnid>/*.JPEG",
    "imagenet_r": "<root>/<wnid>/*.jpg",
    "imagenet_sketch": "<root>/<wnid>/*.JPEG",
    "imagenet_a": "<root>/<wnid>/*.jpg",
    "stylized_imagenet": "<root>/<wnid>/*.png",
}
RELEASES = {
    "imagenet_c": "https://zenodo.org/record/2235448",
    "imagenet_r": "https://github.com/hendrycks/imagenet-r",
    "imagenet_sketch": "https://github.com/HaohanWang/ImageNet-Sketch",
    "imagenet_a": "https://github.com/hendrycks/natural-adv-examples",
}
IMAGENET_PRETRAINING = ("imagenet100", "imagenet2012")


def imagenet_wnids(data_dir: str) -> list[str]:
  """The 1000 sorted WordNet ids of TFDS imagenet2012, whose positions are the labels of every
  TFDS ImageNet test set (read from TFDS's label file; nothing needs to be prepared)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  with logs.quiet():
    return list(
        tfds.builder("imagenet2012", data_dir=data_dir or None).info.features["label"].names
    )


def model_wnids(data_name: str, imagenet: list[str]) -> list[str]:
  """The WordNet ids of a model's classes in label order, for the pretraining dataset
  `data_name`; `imagenet` are the 1000 ids of imagenet_wnids. UsageError for a dataset whose
  classes are not ImageNet's."""
  if data_name == "imagenet100":
    return sorted(tfds_source.read_class_list("imagenet100_classes.txt"))
  if data_name == "imagenet2012":
    return list(imagenet)
  raise UsageError(
      f"the robustness suite evaluates classifiers of ImageNet classes (data.name "
      f"{' or '.join(IMAGENET_PRETRAINING)}); this run was pretrained and probed on "
      f"{data_name!r}, whose classes the ImageNet-C, -R, -Sketch, -A and Stylized-ImageNet "
      "images do not share"
  )


def dataset_wnids(name: str, imagenet: list[str]) -> list[str]:
  """The WordNet ids the test set `name` can contain: the published 200 of ImageNet-R and -A,
  all of `imagenet` (the 1000 ids) for the others."""
  if name in PUBLISHED_CLASSES:
    return tfds_source.read_class_list(PUBLISHED_CLASSES[name])
  return list(imagenet)


def restriction(model: list[str], dataset: list[str]) -> tuple[list[str], np.ndarray]:
  """(kept, columns): the classes a test set is scored on and their logits.

  Args:
    model: the model's C WordNet ids, in the order of its logits.
    dataset: the WordNet ids the test set can contain.
  Returns:
    kept: the K ids of both, sorted (the test labels are positions in it).
    columns: (K,) int64 positions of `kept` in `model`: logits[:, columns] are the restricted
      logits, whose argmax is the predicted position in `kept`.
  """
  kept = sorted(set(model) & set(dataset))
  position = {w: i for i, w in enumerate(model)}
  return kept, np.array([position[w] for w in kept], np.int64)


def preparation_instructions(name: str, data_dir: str) -> str:
  """How to make dataset `name` readable: the exact tfds build command, or the image folder."""
  folder = f"--image_folders={name}=/path/to/{TITLES[name]} (laid out as {FOLDER_LAYOUTS[name]})"
  skip = f"or leave it out: --datasets={','.join(d for d in DATASETS if d != name)}"
  if name == "stylized_imagenet":
    return (
        "Stylized-ImageNet is not in TFDS: make it from the ImageNet validation images with "
        "the AdaIN style transfer of github.com/rgeirhos/Stylized-ImageNet and pass the folder "
        f"of the stylized validation images: {folder}; {skip}"
    )
  if name == "imagenet_c":
    manual = os.path.join(data_dir, "downloads", "manual")
    return (
        "TFDS generates ImageNet-C (imagenet2012_corrupted, one config per corruption and "
        f"severity) from the ImageNet validation images: put ILSVRC2012_img_val.tar (from "
        f"image-net.org) into {manual} and, on a machine with internet access (the frost "
        f"images are downloaded), run\n  "
        f"{tfds_source.build_command('imagenet2012_corrupted', data_dir)}\n(all 19 corruptions "
        f"x 5 severities, the 75 of the benchmark among them; or one config, e.g. "
        f"imagenet2012_corrupted/fog_3); or read the release ({RELEASES[name]}) from a folder: "
        f"{folder}; {skip}"
    )
  tfds_name = TFDS_SPLITS[name][0]
  return (
      f"Prepare it on a machine with internet access:\n  "
      f"{tfds_source.build_command(tfds_name, data_dir)}\nand copy the folder {tfds_name} it "
      f"makes into {data_dir}; or read the release ({RELEASES[name]}) from a folder: {folder}; "
      f"{skip}"
  )


def _check_data_dir(name: str, data_dir: str) -> None:
  """DatasetNotFoundError if dataset `name` is to be read from TFDS without a data_dir."""
  if not data_dir:
    raise tfds_source.DatasetNotFoundError(
        f"{TITLES[name]} is read from a TFDS data_dir, and neither --data_dir nor the run's "
        f"data.data_dir is set. {preparation_instructions(name, '<data_dir>')}"
    )


def _tfds_source(tfds_name: str, name: str, data_dir: str, kept: list[str], what: str):
  """The TfdsSource of the test split of `tfds_name` restricted to the classes `kept` (labels:
  positions in kept); DatasetNotFoundError naming `what` if it is not prepared."""
  builder = tfds_source.prepared_builder(
      tfds_name, data_dir, what, preparation_instructions(name, data_dir)
  )
  split = TFDS_SPLITS[name][1]
  names = builder.info.features["label"].names
  label_map = tfds_source.subset_label_map(names, kept)
  index = None
  if not set(dataset_wnids(name, names)) <= set(kept):  # records of other classes to skip
    index = tfds_source.cached_subset_index(
        builder, split, label_map, kept, data_dir, tfds_source.default_fallback_cache_dir()
    )
  return tfds_source.TfdsSource(
      tfds_name, split, data_dir, len(kept), labelled=True, index=index, label_map=label_map
  )


def _folder_source(
    root: str, kept: list[str], name: str, what: str, bad_images: str = "stop"
) -> ImageFolderSource:
  """The ImageFolderSource of `root` restricted to `kept`, reading unreadable images as
  `bad_images` says (image_folder.BAD_IMAGES); its errors name `what`."""
  try:
    return ImageFolderSource(root, kept, bad_images)
  except tfds_source.DatasetNotFoundError as error:
    raise tfds_source.DatasetNotFoundError(
        f"{what} (--image_folders={name}=...): {error}. {TITLES[name]}'s layout is "
        f"{FOLDER_LAYOUTS[name]}"
    ) from None


class _TestSet(NamedTuple):
  """One test split to score: the dataset, its ImageNet-C corruption and severity (or None),
  the source, the classes it is scored on and their logit columns."""

  name: str
  corruption: str | None
  severity: int | None
  source: object
  kept: list[str]
  columns: np.ndarray


def open_test_sets(
    ctx, names, corruptions, severities, model: list[str], imagenet: list[str], bad_images: str
) -> list:
  """Every test set of the requested datasets, opened (nothing computed yet), so that a
  missing or empty dataset stops the command at once; the missing ImageNet-C configs are
  named together. Image folders read unreadable images as `bad_images` says ("skip": they
  are decoded here, once)."""
  folders = dict(ctx.options.get("image_folders") or {})
  unknown = sorted(set(folders) - set(DATASETS))
  if unknown:
    raise UsageError(f"--image_folders names {unknown}; the datasets are {', '.join(DATASETS)}")
  out = []

  def add(test_set: _TestSet, what: str) -> None:
    if len(test_set.source) == 0:
      raise UsageError(f"{what} holds no image of the {len(test_set.kept)} classes it is scored on")
    out.append(test_set)

  for name in names:
    kept, columns = restriction(model, dataset_wnids(name, imagenet))
    if not kept:
      raise UsageError(f"{TITLES[name]} shares none of the model's {len(model)} classes")
    if name not in folders and name in TFDS_SPLITS:
      _check_data_dir(name, ctx.data_dir)
    if name == "imagenet_c":
      missing = []
      for c in corruptions:
        for s in severities:
          what = f"{TITLES[name]} {c} severity {s}"
          if name in folders:
            root = os.path.join(folders[name], c, str(s))
            source = _folder_source(root, kept, name, what, bad_images)
          else:
            try:
              tfds_name = f"imagenet2012_corrupted/{c}_{s}"
              source = _tfds_source(tfds_name, name, ctx.data_dir, kept, what)
            except tfds_source.DatasetNotFoundError:
              missing.append(f"{c}_{s}")
              continue
          add(_TestSet(name, c, s, source, kept, columns), what)
      if missing:
        raise tfds_source.DatasetNotFoundError(
            f"{TITLES[name]}: {len(missing)} of the {len(corruptions) * len(severities)} "
            f"corruption/severity configs (TFDS imagenet2012_corrupted/{missing[0]}"
            f"{', ' + ', '.join(missing[1:4]) if len(missing) > 1 else ''}"
            f"{', ...' if len(missing) > 4 else ''}) are not prepared in data_dir "
            f"{ctx.data_dir!r} and are never downloaded at run time.\n"
            f"{preparation_instructions(name, ctx.data_dir)}"
        )
    elif name in folders:
      source = _folder_source(folders[name], kept, name, TITLES[name], bad_images)
      add(_TestSet(name, None, None, source, kept, columns), TITLES[name])
    elif name in TFDS_SPLITS:
      source = _tfds_source(TFDS_SPLITS[name][0], name, ctx.data_dir, kept, TITLES[name])
      add(_TestSet(name, None, None, source, kept, columns), TITLES[name])
    else:
      raise tfds_source.DatasetNotFoundError(
          f"{TITLES[name]} is not given. {preparation_instructions(name, ctx.data_dir)}"
      )
  return out
