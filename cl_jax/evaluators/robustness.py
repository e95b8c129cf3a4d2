"""Robustness suite: the run's linear-probe classifier on shifted ImageNet test sets.

python -m cl_jax.evaluate --workdir=W --evaluator=robustness [--step=N] [--protocol=P]
    [--datasets=imagenet_c,imagenet_r,imagenet_sketch,imagenet_a,stylized_imagenet]
    [--data_dir=D] [--image_folders=imagenet_c=/path/to/ImageNet-C,...] [--bad_images=skip]

The model is the run's backbone at step N and the linear classifier its probe job trained on
the pretraining classes (python -m cl_jax.evaluate --evaluator=linear_probe --protocol=P
first): ImageNet-100 (the sorted WordNet ids of imagenet100_classes.txt) or ImageNet-1k (the
sorted ids of TFDS imagenet2012).
It is evaluated on
  imagenet_c         ImageNet-C (Hendrycks & Dietterich, ICLR 2019): the 15 benchmark
                     corruptions x 5 severities of the ImageNet validation images (TFDS
                     imagenet2012_corrupted/<corruption>_<severity>, split validation);
  imagenet_r         ImageNet-R renditions (Hendrycks et al., ICCV 2021; TFDS imagenet_r, test);
  imagenet_sketch    ImageNet-Sketch (Wang et al., NeurIPS 2019; TFDS imagenet_sketch, test);
  imagenet_a         ImageNet-A natural adversarial examples (Hendrycks et al., CVPR 2021;
                     TFDS imagenet_a, test);
  stylized_imagenet  Stylized-ImageNet (Geirhos et al., ICLR 2019), not in TFDS: an image
                     folder <root>/<wnid>/<image> (github.com/rgeirhos/Stylized-ImageNet).
Any of them can be read from the released image folders instead of TFDS (--image_folders;
ImageNet-C as <root>/<corruption>/<severity>/<wnid>/*.JPEG, the others <root>/<wnid>/*).

Unreadable images in a folder (a truncated JPEG, a zero-byte file). --bad_images=stop (default)
stops the command at the first one with a line naming the file and the reason;
--bad_images=skip decodes every image of the folders once before any feature is computed (one
extra decode of every image) and leaves the unreadable ones out, each named in a warning on
stderr. The report holds "bad_images" (the mode) and "skipped_images": {dataset: [paths left
out]}, with an entry for every dataset read from an image folder (ImageNet-C's folders of all
corruptions and severities together), an empty list when none was left out (always so under
stop); the table names the datasets that lost images, and num_images counts the images
scored. TFDS records are never skipped.

Classes. A test set keeps the images whose WordNet id is among the model's classes (for -R and
-A also among their 200 published ids), and an image is classified by the argmax of the logits
restricted to the classes the test set can contain (the model's classes that are also the
set's): the protocol of Hendrycks et al. for the 200-class -R and -A (argmax over the 200
classes of a 1000-class model), and of Ge et al. (NeurIPS 2021, Sec. 4) for ImageNet-100 models.
The published id lists are cl_jax/data/imagenet_r_classes.txt (`imagenet_r_wnids` of
github.com/hendrycks/imagenet-r, eval.py) and imagenet_a_classes.txt (the classes of
`thousand_k_to_200` in github.com/hendrycks/natural-adv-examples, eval.py).

ImageNet-C. E_{s,c} is the top-1 error at severity s of corruption c, CE_c = sum_s E_{s,c} /
sum_s E^AlexNet_{s,c} and mCE = mean_c CE_c over the 15 corruptions (Hendrycks & Dietterich
2019, Sec. 4). ALEXNET_ERRORS holds AlexNet's error averaged over the 5 severities, so CE_c =
mean_s E_{s,c} / ALEXNET_ERRORS[c]; the values are those of the reference evaluation of AugMix
(Hendrycks et al., ICLR 2020; github.com/google-research/augmix, imagenet.py, ALEXNET_ERR,
"taken from github.com/hendrycks/robustness"). CE needs all 5 severities of its corruption and
mCE all 15 corruptions. No AlexNet errors on 100 classes are published, so for ImageNet-100
models the normaliser is the 1000-class error: their mCE compares runs with each other, not
with 1000-class mCEs. Beside mCE the report gives the top-1 accuracy averaged over severities,
per corruption and over all (the "ImageNet-C" column of Ge et al. 2021), and per severity.
ImageNet-C images are stored as 224-pixel centre crops (224/256 of the shorter side) of the
validation images, in the release and in TFDS alike, so their evaluation view is a resize to the
model's image size without a further crop, as the benchmark's CenterCrop(224) of 224-pixel
images; the other sets get the probe's view (resize, centre crop of data.eval_crop_fraction).

Nothing is downloaded: every requested dataset is opened before any feature is computed, and
one that is not prepared stops the command with the way to prepare it.
"""

import copy
import os
from typing import NamedTuple

import numpy as np
from etils import epath

from cl_jax.data import tfds_source
from cl_jax.data.image_folder import ImageFolderSource, check_bad_images
from cl_jax.evaluators import features, linear_probe
from cl_jax.evaluators.linear_classifier import LinearClassifier
from cl_jax.runtime import logs
from cl_jax.runtime.errors import UsageError

TAG = "eval_robustness"
OPTIONS = ("protocol", "datasets", "image_folders", "bad_images", "corruptions", "severities")

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

# The 15 benchmark corruptions of ImageNet-C and AlexNet's top-1 error on each, averaged over
# the 5 severities (module docstring).
ALEXNET_ERRORS = {
    "gaussian_noise": 0.886428,
    "shot_noise": 0.894468,
    "impulse_noise": 0.922640,
    "defocus_blur": 0.819880,
    "glass_blur": 0.826268,
    "motion_blur": 0.785948,
    "zoom_blur": 0.798360,
    "snow": 0.866816,
    "frost": 0.826572,
    "fog": 0.819324,
    "brightness": 0.564592,
    "contrast": 0.853204,
    "elastic_transform": 0.646056,
    "pixelate": 0.717840,
    "jpeg_compression": 0.606500,
}
CORRUPTIONS = tuple(ALEXNET_ERRORS)
SEVERITIES = (1, 2, 3, 4, 5)


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


def restricted_top1(logits: np.ndarray, columns: np.ndarray, labels: np.ndarray) -> float:
  """Top-1 accuracy of the argmax over the logit columns `columns` (K,), for logits (N, C) and
  labels (N,) that are positions in `columns`."""
  return float(np.mean(np.argmax(logits[:, columns], axis=1) == labels))


def corruption_errors(errors: dict[str, dict[int, float]]) -> tuple[dict[str, float], float]:
  """({c: CE_c}, mCE) of the top-1 errors E_{s,c} (corruption -> severity -> error) of the
  given corruptions (among CORRUPTIONS), each with all 5 severities: CE_c = sum_s E_{s,c} /
  sum_s E^AlexNet_{s,c} = mean_s E_{s,c} / ALEXNET_ERRORS[c], mCE = mean_c CE_c
  (Hendrycks & Dietterich 2019, Sec. 4)."""
  ces = {}
  for c, by_severity in errors.items():
    if set(by_severity) != set(SEVERITIES):
      raise ValueError(f"CE of {c} needs all 5 severities, got {sorted(by_severity)}")
    ces[c] = float(np.mean(list(by_severity.values()))) / ALEXNET_ERRORS[c]
  return ces, float(np.mean(list(ces.values())))


def corruption_summary(errors: dict[str, dict[int, float]]) -> dict:
  """The ImageNet-C block of the report from the top-1 errors E_{s,c}.

  Args:
    errors: corruption -> severity -> top-1 error, corruptions among CORRUPTIONS.
  Returns:
    {"mCE", "top1", "top1_by_severity": {s: accuracy averaged over corruptions},
     "corruptions": {c: {"errors": {s: E_{s,c}}, "top1": mean_s (1 - E_{s,c}), "CE"}}}:
    CE_c and mCE of corruption_errors, CE None unless all 5 severities of c are given and
    mCE None unless all 15 corruptions have a CE; top1 the mean of the per-corruption
    accuracies. Severities are str keys (JSON).
  """
  complete = {c: e for c, e in errors.items() if set(e) == set(SEVERITIES)}
  ces, mce = corruption_errors(complete) if complete else ({}, None)
  corruptions = {
      c: {
          "errors": {str(s): float(e) for s, e in sorted(by_severity.items())},
          "top1": 1.0 - float(np.mean(list(by_severity.values()))),
          "CE": ces.get(c),
      }
      for c, by_severity in errors.items()
  }
  severities = sorted({s for by_severity in errors.values() for s in by_severity})
  return {
      "mCE": mce if set(ces) == set(CORRUPTIONS) else None,
      "top1": float(np.mean([v["top1"] for v in corruptions.values()])),
      "top1_by_severity": {
          str(s): float(np.mean([1.0 - e[s] for e in errors.values() if s in e]))
          for s in severities
      },
      "corruptions": corruptions,
  }


def _names(value, allowed: tuple, what: str) -> tuple:
  """The option `value` (a sequence, default: all of `allowed`), checked against `allowed`."""
  names = tuple(allowed if value is None else value)
  unknown = [n for n in names if n not in allowed]
  if unknown or not names:
    raise UsageError(f"{what} must be among {', '.join(map(str, allowed))}; got {list(names)}")
  return names


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


def _open(
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


def _classifier(ctx, protocol: str, num_classes: int) -> tuple[LinearClassifier, str]:
  """(classifier, path) of the run's `protocol` probe at ctx.step, checked to classify the
  model's `num_classes` classes."""
  which = ctx.config.probe.get("features", "backbone")
  name = linear_probe.file_stem(f"probe_step{ctx.step}", protocol, which)
  path = epath.Path(ctx.workdir) / f"{name}_classifier.npz"
  if not path.exists():
    raise UsageError(
        f"no {protocol} probe classifier of step {ctx.step} in {ctx.workdir} ({path.name}): "
        f"run python -m cl_jax.evaluate --evaluator=linear_probe --workdir={ctx.workdir} "
        f"--step={ctx.step} --protocol={protocol} first"
    )
  classifier = LinearClassifier.load(path)
  if "label" not in classifier.weights or classifier.weights["label"].shape[1] != num_classes:
    shapes = {k: w.shape[1] for k, w in classifier.weights.items()}
    raise UsageError(
        f"{path} classifies {shapes} (label: classes), not the {num_classes} classes of the "
        f"run's {ctx.config.data.name} under 'label': probe the run again"
    )
  return classifier, str(path)


def run(ctx) -> dict:
  """The suite on ctx (cl_jax.evaluators.registry.EvalContext); options: protocol, datasets,
  image_folders, bad_images ("stop" or "skip", default stop: module docstring), corruptions
  and severities (ImageNet-C subsets; default all 15 x 5)."""
  opts = ctx.options
  protocol = opts.get("protocol") or ctx.config.probe.protocol
  names = _names(opts.get("datasets"), DATASETS, "--datasets")
  corruptions = _names(opts.get("corruptions"), CORRUPTIONS, "ImageNet-C corruptions")
  severities = _names(opts.get("severities"), SEVERITIES, "ImageNet-C severities")
  bad_images = check_bad_images(opts.get("bad_images") or "stop")
  imagenet = imagenet_wnids(ctx.data_dir)
  model = model_wnids(ctx.config.data.name, imagenet)
  classifier, path = _classifier(ctx, protocol, len(model))
  test_sets = _open(ctx, names, corruptions, severities, model, imagenet, bad_images)

  # ImageNet-C images are stored centre-cropped: resized to the model's size, not cropped again.
  uncropped = copy.deepcopy(ctx.extractor.config)
  uncropped.data.eval_crop_fraction = 1.0
  uncropped_extractor = ctx.extractor._replace(config=uncropped)
  datasets, errors, skipped = {}, {}, {}
  for t in test_sets:
    if isinstance(t.source, ImageFolderSource):
      skipped.setdefault(t.name, []).extend(file for file, _ in t.source.skipped)
    desc = TITLES[t.name] + (f" {t.corruption} {t.severity}" if t.corruption else "")
    extractor = uncropped_extractor if t.name == "imagenet_c" else ctx.extractor
    x, y = features.eval_features(extractor, ctx.variables, t.source, desc, labels=("label",))
    top1 = restricted_top1(classifier.logits(x)["label"], t.columns, y["label"])
    entry = datasets.setdefault(t.name, {"num_images": 0, "num_classes": len(t.kept)})
    entry["num_images"] += len(t.source)
    if t.corruption is None:
      entry["top1"] = top1
    else:
      errors.setdefault(t.corruption, {})[t.severity] = 1.0 - top1
  if errors:
    datasets["imagenet_c"].update(corruption_summary(errors))
  return {
      "protocol": protocol,
      "classifier": path,
      "pretraining_dataset": ctx.config.data.name,
      "model_classes": len(model),
      "datasets": datasets,
      "bad_images": bad_images,
      "skipped_images": skipped,
  }


def scalars(report: dict) -> dict[str, float]:
  """The report's numbers as metrics: robustness/<dataset>/top1, robustness/imagenet_c/mCE,
  robustness/imagenet_c/severity<s>/top1 and robustness/imagenet_c/<corruption>/top1|CE."""
  out = {}
  for name, entry in report["datasets"].items():
    out[f"robustness/{name}/top1"] = entry["top1"]
  c = report["datasets"].get("imagenet_c")
  if c is not None:
    if c["mCE"] is not None:
      out["robustness/imagenet_c/mCE"] = c["mCE"]
    for s, acc in c["top1_by_severity"].items():
      out[f"robustness/imagenet_c/severity{s}/top1"] = acc
    for corruption, v in c["corruptions"].items():
      out[f"robustness/imagenet_c/{corruption}/top1"] = v["top1"]
      if v["CE"] is not None:
        out[f"robustness/imagenet_c/{corruption}/CE"] = v["CE"]
  return out


def _percent(value: float | None, width: int) -> str:
  return f"{'-':>{width}}" if value is None else f"{100 * value:{width}.2f}"


def table(report: dict) -> str:
  """The report as aligned text: top-1 per dataset, then ImageNet-C per corruption."""
  lines = [
      f"robustness of {report['workdir']} at step {report['step']}: the {report['protocol']} "
      f"probe's classifier of the {report['model_classes']} {report['pretraining_dataset']} "
      "classes, scored on the classes each test set shares with them",
      f"  {'dataset':<18} {'top-1 %':>8} {'images':>8} {'classes':>8}",
  ]
  for name, entry in report["datasets"].items():
    lines.append(
        f"  {TITLES[name]:<18} {_percent(entry['top1'], 8)} {entry['num_images']:>8} "
        f"{entry['num_classes']:>8}"
    )
  for name, paths in report.get("skipped_images", {}).items():
    if paths:
      lines.append(
          f"  {TITLES[name]}: {len(paths)} unreadable image{'s' if len(paths) > 1 else ''} "
          "skipped (--bad_images=skip; listed in the report under skipped_images)"
      )
  c = report["datasets"].get("imagenet_c")
  if c is not None:
    if c["mCE"] is None:
      mce = "mCE: needs all 15 corruptions x 5 severities"
    else:
      mce = f"mCE {100 * c['mCE']:.2f}% (CE normalised by AlexNet's errors)"
    by_severity = ", ".join(f"{s}: {100 * a:.2f}" for s, a in c["top1_by_severity"].items())
    lines += [
        f"ImageNet-C: {mce}; top-1 % by severity {by_severity}",
        f"  {'corruption':<18} "
        + " ".join(f"{'err s' + str(s):>7}" for s in SEVERITIES)
        + f" {'top-1':>7} {'CE':>7}",
    ]
    for corruption, v in c["corruptions"].items():
      errs = " ".join(_percent(v["errors"].get(str(s)), 7) for s in SEVERITIES)
      lines.append(f"  {corruption:<18} {errs} {_percent(v['top1'], 7)} {_percent(v['CE'], 7)}")
  return "\n".join(lines)
