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
one that is not prepared stops the command with the way to prepare it
(cl_jax.evaluators.robustness_data opens them and maps their class ids).
"""

import copy

import numpy as np
from etils import epath

from cl_jax.data.image_folder import ImageFolderSource, check_bad_images
from cl_jax.evaluators import features, linear_probe
from cl_jax.evaluators.linear_classifier import LinearClassifier
from cl_jax.evaluators.robustness_data import (
    DATASETS,
    TITLES,
    imagenet_wnids,
    model_wnids,
    open_test_sets,
)
from cl_jax.runtime.errors import UsageError

TAG = "eval_robustness"
OPTIONS = ("protocol", "datasets", "image_folders", "bad_images", "corruptions", "severities")

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
  test_sets = open_test_sets(ctx, names, corruptions, severities, model, imagenet, bad_images)

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
