"""NormStd per layer for each augmentation, and NormDist against IoU (DICR paper, 2025
submission, Sec. 2.2 and 4.2), for a run's checkpoint and for the same network at random
initialisation.

python -m cl_jax.analysis.normstd --workdir=W [--step=N] [--images=256] [--views=10]
    [--bins=10] [--seed=0] [--crop_scale=a,b] [--out=DIR]

--images pretraining images (a seeded sample) each get --views one-vs-rest views per
augmentation (cl_jax.analysis.one_vs_rest); every residual block's pooled output and the unit
embedding are compared (cl_jax.analysis.dispersion). Writes to --out (default W/normstd):
normstd_step<N>.json (every number), normstd_step<N>.md (the tables), normstd_step<N>.png
(NormStd against layer, one line per augmentation, trained solid and random init dashed) and
normdist_iou_step<N>.png (NormDist of crop-view pairs against their IoU, per layer). Each path
is printed once written.
"""

import functools
import json

import jax
import ml_collections
import numpy as np
from absl import app, flags
from etils import epath
from matplotlib.figure import Figure

from cl_jax.analysis import dispersion, one_vs_rest
from cl_jax.data import photometric, sources
from cl_jax.models.encoder import encoder_for
from cl_jax.runtime import checkpoint, cli, run_config, write_faults
from cl_jax.runtime.errors import UsageError
from cl_jax.runtime.metrics import write_atomically
from cl_jax.state import init_variables
from cl_jax.viz.png import save

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory with a checkpoint.")
_CROP_SCALE = flags.DEFINE_list(
    "crop_scale",
    None,
    "Area range 'a,b' of the crops (default: the run's data.crop_scale; 0.08,1 reaches IoU 0).",
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).", lower_bound=1)
_IMAGES = flags.DEFINE_integer("images", 256, "Pretraining images analysed.", lower_bound=2)
_VIEWS = flags.DEFINE_integer("views", 10, "One-vs-rest views per image.", lower_bound=2)
_BINS = flags.DEFINE_integer("bins", 10, "IoU bins of NormDist over [0, 1].", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the image sample and the views.", lower_bound=0)
_OUT = flags.DEFINE_string("out", None, "Output directory (default: <workdir>/normstd).")
_CHUNK = 512  # views per forward pass


def analyse(
    config: ml_collections.ConfigDict,
    networks: dict[str, dict],
    images: list[np.ndarray],
    repeats: int,
    bins: int,
    seed: int,
    crop_scale: tuple[float, float],
) -> dict:
  """NormStd and NormDist of each network in `networks` ({name: encoder variables}) on the same
  one-vs-rest views of `images`; crops of crop_scale of the image area.

  Returns:
    {"augmentations", "layers", "iou_bins" (bins + 1 edges), "iou_pairs" (pairs per bin),
     name: {"normstd": {aug: {layer: float}}, "normdist_iou": {layer: [bins floats, None if
     empty]}, "sigma_all": {layer: float}}}.
  """
  spec = photometric.config_spec(config)
  encoder = encoder_for(config)
  forward = jax.jit(functools.partial(one_vs_rest.representations, encoder))
  rng, key = np.random.default_rng(seed), jax.random.key(seed)
  scale = tuple(crop_scale)
  crops, params = one_vs_rest.base_draws(rng, key, images, scale, spec)
  augs = one_vs_rest.augmentations(spec)
  reps = {name: {} for name in networks}
  crop_boxes = None
  for i, aug in enumerate(augs):
    views, boxes = one_vs_rest.views(
        aug,
        rng,
        jax.random.fold_in(key, i + 1),
        images,
        crops,
        params,
        repeats,
        config.data.image_size,
        scale,
        spec,
    )
    crop_boxes = boxes if aug == "crop" else crop_boxes
    for name, variables in networks.items():
      chunks = [forward(variables, views[s : s + _CHUNK]) for s in range(0, len(views), _CHUNK)]
      reps[name][aug] = {
          layer: np.concatenate([np.asarray(c[layer]) for c in chunks]).reshape(
              len(images), repeats, -1
          )
          for layer in chunks[0]
      }
  layers = one_vs_rest.layer_names(reps[next(iter(networks))]["crop"])
  report = {"augmentations": list(augs), "layers": layers}
  for name in networks:
    sigma, normstd, normdist = {}, {a: {} for a in augs}, {}
    for layer in layers:
      everything = np.concatenate(
          [reps[name][a][layer].reshape(-1, reps[name][a][layer].shape[-1]) for a in augs]
      )
      sigma[layer] = float(dispersion.spread(everything[None])[0])
      for a in augs:
        normstd[a][layer] = dispersion.norm_std(reps[name][a][layer], sigma[layer])
      means, counts = dispersion.norm_dist_by_iou(
          reps[name]["crop"][layer], crop_boxes, sigma[layer], bins
      )
      normdist[layer] = [None if np.isnan(m) else float(m) for m in means]
    report[name] = {"normstd": normstd, "normdist_iou": normdist, "sigma_all": sigma}
  report["iou_pairs"] = [int(c) for c in counts]  # the crop boxes' pairs: one count per bin
  report["iou_bins"] = [float(e) for e in np.linspace(0.0, 1.0, bins + 1)]
  return report


def tables(report: dict) -> str:
  """The report as Markdown: NormStd (augmentation x layer) and NormDist (IoU bin x layer) for
  the trained network and for random init."""
  layers = report["layers"]
  short = [l.replace("stage", "s").replace("_block", "b") for l in layers]
  lines = []
  for name in ("trained", "random_init"):
    lines += [
        f"NormStd, {name} (step {report['step']})" if name == "trained" else f"NormStd, {name}",
        "",
        "| augmentation | " + " | ".join(short) + " |",
        "|---" * (len(layers) + 1) + "|",
    ]
    for aug in report["augmentations"]:
      values = " | ".join(f"{report[name]['normstd'][aug][l]:.3f}" for l in layers)
      lines.append(f"| {aug} | {values} |")
    lines.append("")
  edges = report["iou_bins"]
  for name in ("trained", "random_init"):
    lines += [
        f"NormDist of crop-view pairs against IoU, {name}",
        "",
        "| IoU | pairs | " + " | ".join(short) + " |",
        "|---" * (len(layers) + 2) + "|",
    ]
    for b, count in enumerate(report["iou_pairs"]):
      cells = [report[name]["normdist_iou"][l][b] for l in layers]
      values = " | ".join("-" if v is None else f"{v:.3f}" for v in cells)
      lines.append(f"| {edges[b]:.1f}-{edges[b + 1]:.1f} | {count} | {values} |")
    lines.append("")
  return "\n".join(lines)


def plot_normstd(report: dict) -> Figure:
  """NormStd against layer, one colour per augmentation; trained solid, random init dashed."""
  fig = Figure(figsize=(11, 4.5), layout="constrained")
  ax = fig.add_subplot()
  x = np.arange(len(report["layers"]))
  for i, aug in enumerate(report["augmentations"]):
    for name, style in (("trained", "-"), ("random_init", "--")):
      y = [report[name]["normstd"][aug][l] for l in report["layers"]]
      ax.plot(x, y, style, color=f"C{i}", marker="o", ms=3, label=f"{aug} ({name})")
  ax.set_xticks(x, [l.replace("stage", "s").replace("_block", "b") for l in report["layers"]])
  ax.set_ylabel("NormStd")
  ax.set_title(f"{report['workdir']}, step {report['step']}: one-vs-rest NormStd per layer")
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  return fig


def plot_normdist(report: dict) -> Figure:
  """NormDist of crop-view pairs against IoU, one panel per layer; trained solid, random dashed."""
  layers = report["layers"]
  cols = 5
  rows = -(-len(layers) // cols)
  fig = Figure(figsize=(3 * cols, 2.6 * rows), layout="constrained")
  edges = np.asarray(report["iou_bins"])
  centres = (edges[:-1] + edges[1:]) / 2
  for i, layer in enumerate(layers):
    ax = fig.add_subplot(rows, cols, i + 1)
    for name, style in (("trained", "-"), ("random_init", "--")):
      y = [np.nan if v is None else v for v in report[name]["normdist_iou"][layer]]
      ax.plot(centres, y, style, marker="o", ms=3, color="C0", label=name)
    ax.set_title(layer, fontsize=9)
    ax.set_xlabel("IoU")
    if i % cols == 0:
      ax.set_ylabel("NormDist")
  fig.axes[0].legend(fontsize=7)
  return fig


def run(
    workdir: str,
    step: int | None = None,
    images: int = 256,
    views: int = 10,
    bins: int = 10,
    seed: int = 0,
    out: str | None = None,
    crop_scale: tuple[float, float] | None = None,
) -> dict:
  """Analyse the checkpoint `step` (default: the latest) of the run in `workdir` and the same
  network at random initialisation; write and print the outputs; return the report."""
  config = run_config.read(workdir)
  write_faults.check_writable(out or f"{workdir}/normstd", "the NormStd report")
  scale = tuple(config.data.crop_scale) if crop_scale is None else tuple(crop_scale)
  if len(scale) != 2 or not 0.0 < scale[0] <= scale[1] <= 1.0:
    raise UsageError(f"crop_scale must be two areas 0 < a <= b <= 1, got {crop_scale}")
  encoder = encoder_for(config)
  init = jax.jit(functools.partial(init_variables, config.seed, encoder, config.data.image_size))
  step, trained = checkpoint.restore_encoder(workdir, init, step)
  source = sources.open_source(config.data, "pretrain")
  if images > len(source):
    raise UsageError(f"--images={images} exceeds the {len(source)} pretraining images")
  picked = np.sort(np.random.default_rng(seed).choice(len(source), images, replace=False))
  pictures = [np.asarray(source[int(i)]["image"]) for i in picked]
  report = {
      "workdir": workdir,
      "step": step,
      "images": images,
      "views": views,
      "crop_scale": list(scale),
  }
  networks = {"trained": trained, "random_init": init()}
  report.update(analyse(config, networks, pictures, views, bins, seed, scale))
  root = epath.Path(out) if out else epath.Path(workdir) / "normstd"
  root.mkdir(parents=True, exist_ok=True)
  stem = f"normstd_step{step}"
  write_atomically(root / f"{stem}.json", json.dumps(report, indent=2))
  print(root / f"{stem}.json", flush=True)
  write_atomically(root / f"{stem}.md", tables(report))
  print(root / f"{stem}.md", flush=True)
  save(plot_normstd(report), root / f"{stem}.png")
  save(plot_normdist(report), root / f"normdist_iou_step{step}.png")
  return report


def main(argv):
  cli.start_reader(argv, _WORKDIR.value, "analyse")
  with cli.report():
    scale = None
    if _CROP_SCALE.value is not None:
      try:
        scale = tuple(float(v) for v in _CROP_SCALE.value)
      except ValueError:
        raise UsageError(f"--crop_scale must be two numbers a,b, got {_CROP_SCALE.value}") from None
    report = run(
        _WORKDIR.value,
        _STEP.value,
        _IMAGES.value,
        _VIEWS.value,
        _BINS.value,
        _SEED.value,
        _OUT.value,
        scale,
    )
    print(tables(report))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
