"""Writing matplotlib figures as PNG files."""

from etils import epath
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def save(fig: Figure, path: epath.Path) -> str:
  """Render `fig` with the Agg canvas to a PNG at `path`, print the path and return it."""
  FigureCanvasAgg(fig)
  with path.open("wb") as f:
    fig.savefig(f, format="png")
  print(path, flush=True)
  return str(path)
