"""Plot of the Trifeature feature-suppression study (Robinson et al. 2021, Figs. 3 and 6).

Linear-probe top-1 accuracy (%) of colour, shape and texture, one colour per
feature:
  left panel   SimCLR against the InfoNCE temperature T (log axis), IFM off
               (dashed, open markers) and on (solid, filled markers): Fig. 6,
               and the temperature half of Fig. 3;
  right panel  hard-negative sampling against its concentration beta, with the
               plain SimCLR run at the same temperature as a dotted reference
               line per feature: the beta half of Fig. 3.
A panel is drawn only when there are runs for it. Error bars are the sample
standard deviation over seeds when a run has more than one. A grey line marks
chance (10 values per feature).

The rows are cl_jax.studies.suppression.Row objects: `.spec` (a RunSpec with
`.temperature`, `.ifm`, `.beta`, beta None for runs without hard-negative
sampling), `.mean` and `.std` (feature -> percent; std None for one seed).
"""

from collections.abc import Sequence

from matplotlib import ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

FEATURES = ("colour", "shape", "texture")
FEATURE_COLOURS = {"colour": "C3", "shape": "C0", "texture": "C2"}
CHANCE = 10.0  # percent: each Trifeature feature takes 10 values
FIGSIZE = (12.0, 4.8)  # inches
DPI = 100  # the PNG is FIGSIZE * DPI pixels: 1200 x 480
DODGE = 1.03  # multiplicative x offset of IFM off / on points on the log T axis


def _err(rows, feature: str):
  """Per-row std of `feature`, or None when no row has one (a single seed)."""
  if all(r.std is None for r in rows):
    return None
  return [r.std[feature] if r.std is not None else 0.0 for r in rows]


def _temperature_panel(ax, rows) -> None:
  """Accuracy vs T, one line per (feature, IFM off/on); the IFM-off points sit DODGE
  to the left of their T and the IFM-on points to the right, so error bars stay apart."""
  temps = sorted({r.spec.temperature for r in rows})
  for ifm, style, face in ((False, "--", "white"), (True, "-", None)):
    line = sorted((r for r in rows if r.spec.ifm == ifm), key=lambda r: r.spec.temperature)
    if not line:
      continue
    x = [r.spec.temperature * (DODGE if ifm else 1.0 / DODGE) for r in line]
    for f in FEATURES:
      c = FEATURE_COLOURS[f]
      _feature_line(
          ax, x, line, f, linestyle=style, marker="o", markerfacecolor=face or c, markeredgecolor=c
      )
  ax.set_xscale("log")
  ax.xaxis.set_major_locator(ticker.FixedLocator(temps))
  ax.xaxis.set_major_formatter(ticker.FixedFormatter([f"{t:g}" for t in temps]))
  ax.xaxis.set_minor_locator(ticker.NullLocator())
  ax.set_xlabel("temperature T")
  ax.set_title("SimCLR: IFM off (dashed) vs on (solid)", fontsize=10)


def _feature_line(ax, x, rows, feature: str, **style) -> None:
  """Mean accuracy of `feature` over `rows` at `x`, with its error bars, in the feature's
  colour; `style`: matplotlib's line and marker keywords."""
  ax.errorbar(
      x,
      [r.mean[feature] for r in rows],
      yerr=_err(rows, feature),
      color=FEATURE_COLOURS[feature],
      capsize=3,
      linewidth=1.5,
      **style,
  )


def _beta_panel(ax, rows, reference) -> None:
  """Accuracy vs beta, one line per feature; `reference`: plain SimCLR row or None."""
  line = sorted(rows, key=lambda r: r.spec.beta)
  x = [r.spec.beta for r in line]
  for f in FEATURES:
    _feature_line(ax, x, line, f, marker="s")
    if reference is not None:
      ax.axhline(reference.mean[f], color=FEATURE_COLOURS[f], linestyle=":", linewidth=1.2)
  ax.xaxis.set_major_locator(ticker.FixedLocator(x))
  ax.xaxis.set_major_formatter(ticker.FixedFormatter([f"{b:g}" for b in x]))
  ax.set_xlabel("hardness concentration β")
  temps = sorted({r.spec.temperature for r in line})
  title = f"hard-negative sampling, T {', '.join(f'{t:g}' for t in temps)}"
  if reference is not None:
    title += "\n(dotted: SimCLR, same T, no hard negatives)"
  ax.set_title(title, fontsize=10)


def plot_suppression(rows: Sequence) -> Figure:
  """The study's figure (module docstring) from summarised rows.

  Args:
    rows: cl_jax.studies.suppression.Row objects, at least one.
  Returns:
    A FIGSIZE figure at DPI with one or two panels and a shared legend below.
  """
  if not rows:
    raise ValueError("no runs to plot: the study has no finished run yet")
  temp_rows = [r for r in rows if r.spec.beta is None]
  beta_rows = [r for r in rows if r.spec.beta is not None]
  panels = [p for p, rs in (("T", temp_rows), ("beta", beta_rows)) if rs]
  fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
  axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
  for ax, panel in zip(axes, panels):
    if panel == "T":
      _temperature_panel(ax, temp_rows)
    else:
      hcl_temps = {r.spec.temperature for r in beta_rows}
      refs = [r for r in temp_rows if not r.spec.ifm and r.spec.temperature in hcl_temps]
      _beta_panel(ax, beta_rows, refs[0] if len(refs) == 1 and len(hcl_temps) == 1 else None)
    ax.axhline(CHANCE, color="0.6", linewidth=1.0)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("linear probe top-1 accuracy (%)")
  lo = min(min(r.mean[f] for f in FEATURES) for r in rows)
  axes[0].set_ylim(min(CHANCE, lo) - 5.0, 100.0)
  handles = [Line2D([], [], color=FEATURE_COLOURS[f], linewidth=2.5, label=f) for f in FEATURES]
  handles += [
      Line2D(
          [], [], color="k", linestyle="--", marker="o", markerfacecolor="white", label="IFM off"
      ),
      Line2D([], [], color="k", linestyle="-", marker="o", label="IFM on (ε 0.1)"),
      Line2D([], [], color="0.6", label=f"chance ({CHANCE:g}%)"),
  ]
  if beta_rows:
    handles.insert(5, Line2D([], [], color="k", marker="s", label="hard negatives"))
  fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9)
  fig.suptitle("Trifeature feature suppression: linear readout of colour, shape and texture")
  return fig


def write_png(fig: Figure, path) -> None:
  """Render `fig` with the Agg canvas as a PNG to `path` (an etils epath.Path)."""
  FigureCanvasAgg(fig)
  with path.open("wb") as f:
    fig.savefig(f, format="png", dpi=DPI)
