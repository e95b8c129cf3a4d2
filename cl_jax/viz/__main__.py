"""PNG plots of pretraining runs.

python -m cl_jax.viz WORKDIR [WORKDIR ...] [--out=DIR] [--step=N] [--batches=K]

Writes to --out (default: <first WORKDIR>/viz):
  score_stats.png                  pos/neg(/NS) score statistics against step, every run
                                   overlaid, labelled by the config fields that differ
                                   (cl_jax.viz.curves);
  grad_landscape_<run>.png         per-layer gradient-norm landscape, layers x epochs
                                   (cl_jax.viz.landscape), for runs that logged
                                   "grad_norm/<layer>" metrics;
  sim_hist_<run>_step<N>.png       histograms of positive, negative and patch-NS
                                   similarities of the checkpoint at --step (default:
                                   the latest) on --batches batches (cl_jax.viz.histograms),
                                   for runs with a checkpoint.
<run> is the WORKDIR's basename. Each path is printed, one a line, once written.
"""

import os

from absl import app, flags, logging
from etils import epath

from cl_jax import train
from cl_jax.data import sources
from cl_jax.models.encoder import head_layout
from cl_jax.runtime import cli, metrics, run_config
from cl_jax.runtime.errors import UsageError
from cl_jax.viz import curves, histograms, landscape
from cl_jax.viz.png import save

_OUT = flags.DEFINE_string("out", None, "Directory of the PNGs (default: <first workdir>/viz).")
_STEP = flags.DEFINE_integer(
    "step",
    None,
    "Checkpoint step of the similarity histograms " "(default: each run's latest).",
    lower_bound=1,
)
_BATCHES = flags.DEFINE_integer(
    "batches", 4, "Pretraining batches drawn for the similarity " "histograms.", lower_bound=1
)


def run_name(workdir: str) -> str:
  """The basename of a run directory (a local path, made absolute, or a URL)."""
  workdir = str(workdir)
  name = epath.Path(workdir if "://" in workdir else os.path.abspath(workdir)).name
  if not name:
    raise UsageError(f"cannot name the run in {workdir!r}: give its directory, not a root")
  return name


def read_records(workdir: str) -> list[dict]:
  """The run's metrics records in step order; UsageError if absent or empty."""
  path = epath.Path(workdir) / metrics.METRICS_FILE
  if not metrics.has_metrics(workdir):
    raise UsageError(
        f"{path} not found: {workdir} has no logged metrics (pretrain " "with cl_jax.main first)"
    )
  records = metrics.read_metrics(workdir)
  if not records:
    raise UsageError(f"{path} is empty: the run has not logged a step yet")
  return records


def render(workdirs: list[str], out: epath.Path, step: int | None, batches: int) -> list[str]:
  """Write (and print) every plot of `workdirs` under `out`; returns the paths written."""
  names = [run_name(w) for w in workdirs]
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise UsageError(
        f"several workdirs are named {repeated}: their plots would overwrite "
        "each other; give the runs distinct directory names"
    )
  configs = [run_config.read(w) for w in workdirs]
  runs = [read_records(w) for w in workdirs]
  out.mkdir(parents=True, exist_ok=True)
  labels = curves.run_labels(names, [c.to_dict() for c in configs])
  written = [save(curves.plot_score_stats(labels, runs), out / "score_stats.png")]

  for workdir, name, config, records in zip(workdirs, names, configs, runs):
    if landscape.layer_keys(records):
      spe = train.steps_per_epoch(
          len(sources.open_source(config.data, "pretrain")), config.optim.batch_size
      )
      order = landscape.network_order(config.model, config.data.image_size, head_layout(config))
      grid = landscape.epoch_means(records, spe, order)
      fig = landscape.plot_landscape(
          grid,
          f"{name}: gradient L2 norm per layer, mean over each epoch's logged steps\n"
          f"({spe} steps per epoch; grey: no norm logged, or zero)",
      )
      written.append(save(fig, out / f"grad_landscape_{name}.png"))
    else:
      print(
          f"note: {workdir} logged no per-layer gradient norms "
          f"('{landscape.PREFIX}<layer>'); no gradient landscape for it"
      )

    try:
      ckpt, edges, tallies = histograms.collect(workdir, step, batches)
    except histograms.NoCheckpoint as e:
      print(f"note: {e}; no similarity histograms for it")
      continue
    fig = histograms.plot_similarity_histograms(
        edges, tallies, name, ckpt, config.nonsemantic, queue=config.method == "moco"
    )
    written.append(save(fig, out / f"sim_hist_{name}_step{ckpt}.png"))
  return written


def main(argv):
  workdirs = argv[1:]
  if not workdirs:
    raise app.UsageError(
        "give at least one run directory: python -m cl_jax.viz WORKDIR "
        "[WORKDIR ...] [--out=DIR] [--step=N] [--batches=K]"
    )
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
  out = epath.Path(_OUT.value) if _OUT.value else epath.Path(workdirs[0]) / "viz"
  with cli.report():
    render(workdirs, out, _STEP.value, _BATCHES.value)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
