"""Do the quick recipes learn? Every quick Trifeature default over seeds, beside random init.

Besides the study's standard tables it writes recipe_check_runs.md: one row per config and seed
with colour, shape and texture top-1 (random init -> trained), the final loss, the final
embedding std x sqrt(d) (cl_jax.objectives.health; about 1 healthy, 0 collapsed), the logged
steps that show a collapse under the default health thresholds ("end" when the run ends
collapsed), the wall time of cl_jax.main (start-up, compilation, training and the probe), and
the commit and processor that made the record. The same table over the records the claims
wrote is results/studies/quick_runs.md (cl_jax.study --study=claims).
"""

from collections.abc import Sequence

from cl_jax.analysis.study_types import Study
from cl_jax.studies.arms import QUICK

LABELS = ("colour", "shape", "texture")


def _steps_text(steps: Sequence[int], last: int) -> str:
  """ "-" for none, else the first and last flagged logging step ("end" if it is the last)."""
  if not steps:
    return "-"
  end = "end" if steps[-1] == last else str(steps[-1])
  return f"steps {steps[0]}-{end} ({len(steps)} log{'s' if len(steps) > 1 else ''})"


def _made_by(record: dict) -> tuple[str, str]:
  """(commit, processor) of a record: the commit "-" for a record older than the code versions
  records keep; the processor as its model and widest vector instructions."""
  commit = record.get("code", {}).get("commit") or "-"
  env = record.get("environment") or {}
  isa = (env.get("isa") or "").split()
  processor = f"{env.get('cpu') or '?'}" + (f" ({isa[0]})" if isa else "")
  return f"`{commit}`" if commit != "-" else commit, processor


def markdown_table(study: Study, records: dict) -> str:
  """One row per arm and seed (records {arm: {seed: record}})."""
  head = (
      "| config | seed | colour | shape | texture | final loss | std x sqrt(d) | collapse "
      "flagged at | wall s | commit | processor |\n"
      "|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|"
  )
  lines = [head]
  for a in study.arms:
    for seed, r in sorted(records.get(a.name, {}).items()):
      m = r["metrics"]
      cells = [
          f"{m[f'random_init/{k}']:.1f} -> {m[k]:.1f} ({m[k] - m[f'random_init/{k}']:+.1f})"
          for k in LABELS
      ]
      std = "-" if "std_sqrt_d" not in m else f"{m['std_sqrt_d']:.2f}"
      wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f}"
      flagged = _steps_text(r["collapse_flagged_steps"], r["step"])
      commit, processor = _made_by(r)
      lines.append(
          f"| {a.name} | {seed} | {' | '.join(cells)} | {m['loss']:.3f} | {std} | "
          f"{flagged} | {wall} | {commit} | {processor} |"
      )
  return "\n".join(lines) + "\n"


STUDY = Study(
    name="recipe_check",
    title="The quick recipes over seeds, beside random init",
    arms=tuple(QUICK.values()),
    metrics=("colour", "shape", "texture", "std_sqrt_d"),
    outputs=lambda study, records: {"recipe_check_runs.md": markdown_table(study, records)},
)
