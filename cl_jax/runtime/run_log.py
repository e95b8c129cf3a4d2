"""A run's warnings: printed above the progress line and kept in workdir/warnings.log, and the
notices of a representation entering and leaving collapse."""

from etils import epath

from cl_jax.runtime.progress import Progress


def collapse_notice(
    warning: str | None, collapsed_logs: int, scalars: dict[str, float]
) -> tuple[str | None, int]:
  """(line to report or None, updated count) for one logging step's collapse warning.

  collapsed_logs counts the consecutive logging steps with a warning so far. The
  warning is reported when the run enters the collapsed state and at every 10th
  logging step it stays there; the first healthy logging step after it reports
  the recovery with the health signals of `scalars`.
  """
  if warning is not None:
    return (warning if collapsed_logs % 10 == 0 else None), collapsed_logs + 1
  if not collapsed_logs:
    return None, 0
  signals = ", ".join(
      f"{k} = {scalars[k]:.3g}" for k in ("health/std_sqrt_d", "health/rank") if k in scalars
  )
  return f"representation recovered after {collapsed_logs} collapsed logging steps: {signals}", 0


def report_warning(line: str, workdir: str, progress: Progress) -> None:
  """Print `line` (above the progress bar) and append it to workdir/warnings.log
  (object stores cannot append: the file is read and rewritten)."""
  progress.write(line)
  path = epath.Path(workdir) / "warnings.log"
  if "://" in str(workdir):
    path.write_text((path.read_text() if path.exists() else "") + line + "\n")
  else:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
      f.write(line + "\n")
