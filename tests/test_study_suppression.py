"""cl_jax.studies.suppression: the grid's runs as derived from each arm's config, the table's
means and sample stds and the CSV against hand-computed numbers, and the plot's lines and
PNG (cl_jax.viz.suppression_plot)."""

import csv
import dataclasses
import io
import json

import numpy as np
import pytest
from etils import epath
from PIL import Image

from cl_jax.analysis import study, study_records
from cl_jax.runtime import run_config
from cl_jax.studies import suppression
from cl_jax.studies.suppression import RunSpec
from cl_jax.viz import suppression_plot

# The grid in its order: the study's arm, then the grid point it is (its run name, T, IFM,
# beta).
GRID = [
    ("simclr_t0.05", RunSpec("simclr_t0.05", 0.05, False, None)),
    ("simclr_t0.05_ifm", RunSpec("simclr_t0.05_ifm", 0.05, True, None)),
    ("simclr_t0.2", RunSpec("simclr_t0.2", 0.2, False, None)),
    ("simclr_t0.2_ifm", RunSpec("simclr_t0.2_ifm", 0.2, True, None)),
    ("simclr", RunSpec("simclr_t0.5", 0.5, False, None)),
    ("simclr_ifm", RunSpec("simclr_t0.5_ifm", 0.5, True, None)),
    ("simclr_hcl_b0.5", RunSpec("hcl_t0.5_b0.5", 0.5, False, 0.5)),
    ("simclr_hcl_b1", RunSpec("hcl_t0.5_b1", 0.5, False, 1.0)),
    ("simclr_hcl_b2", RunSpec("hcl_t0.5_b2", 0.5, False, 2.0)),
]
GRID_NAMES = [
    "simclr_t0.05",
    "simclr_t0.05_ifm",
    "simclr_t0.2",
    "simclr_t0.2_ifm",
    "simclr_t0.5",
    "simclr_t0.5_ifm",
    "hcl_t0.5_b0.5",
    "hcl_t0.5_b1",
    "hcl_t0.5_b2",
]
ARMS = {a.name: a for a in suppression.STUDY.arms}


def _config(arm_name: str, seed: int = 0) -> dict:
  """The arm's flattened config as a record stores it (JSON values)."""
  config = study_records.arm_config(ARMS[arm_name], seed)
  return json.loads(json.dumps(run_config.flatten(config)))


def _record(arm_name: str, seed: int, colour, shape, texture, mean) -> dict:
  """The parts of a study record the suppression tables read (accuracies in percent)."""
  return {
      "arm": arm_name,
      "seed": seed,
      "config": _config(arm_name, seed),
      "metrics": {"colour": colour, "shape": shape, "texture": texture, "mean": mean},
  }


def test_grid_runs_and_their_configs():
  assert [a.name for a in suppression.STUDY.arms] == [name for name, _ in GRID]
  specs = [suppression.spec_of(_config(a.name)) for a in suppression.STUDY.arms]
  assert [s.name for s in specs] == GRID_NAMES
  assert specs == [spec for _, spec in GRID]
  # The same from the config as cl_jax.main builds it (tuples, not JSON lists).
  c = study_records.arm_config(ARMS["simclr_hcl_b1"], 3)
  assert suppression.spec_of(run_config.flatten(c)) == RunSpec("hcl_t0.5_b1", 0.5, False, 1.0)

  c = study_records.arm_config(ARMS["simclr_t0.05_ifm"], 2)
  assert (c.simclr.temperature, c.ifm.enabled, c.ifm.epsilon, c.ifm.alpha) == (0.05, True, 0.1, 1.0)
  assert not c.hcl.enabled and c.seed == 2 and c.method == "simclr"
  c = study_records.arm_config(ARMS["simclr_hcl_b2"], 0)
  assert (c.simclr.temperature, c.hcl.enabled, c.hcl.beta, c.hcl.tau_plus) == (0.5, True, 2.0, 0.1)
  assert not c.ifm.enabled and c.seed == 0 and c.method == "simclr"
  c = study_records.arm_config(ARMS["simclr"], 7)
  assert (c.simclr.temperature, c.ifm.enabled, c.hcl.enabled, c.seed) == (0.5, False, False, 7)
  assert c.data.name == "trifeature"


def test_three_seed_table_matches_hand_computed_means_and_stds():
  # Records in another order than the grid's: the table follows the grid. Each record's
  # "mean" is the mean of its three accuracies: 140/3, 50, 190/3 and 137.5/3.
  records = {
      "simclr_hcl_b0.5": {0: _record("simclr_hcl_b0.5", 0, 75.0, 12.5, 50.0, 137.5 / 3)},
      "simclr_t0.2_ifm": {
          0: _record("simclr_t0.2_ifm", 0, 90.0, 30.0, 20.0, 140.0 / 3),
          1: _record("simclr_t0.2_ifm", 1, 80.0, 50.0, 20.0, 50.0),
          2: _record("simclr_t0.2_ifm", 2, 100.0, 40.0, 50.0, 190.0 / 3),
      },
  }
  row, one = suppression.rows(suppression.STUDY, records)
  assert row.spec == RunSpec("simclr_t0.2_ifm", 0.2, True, None)
  assert one.spec == RunSpec("hcl_t0.5_b0.5", 0.5, False, 0.5)
  want_mean = {"colour": 90.0, "shape": 40.0, "texture": 30.0, "mean": 160.0 / 3}
  # Sample std (ddof 1): colour devs -10, 0, 10 -> 10; texture -10, -10, 20 -> sqrt(300);
  # per-seed means devs -20/3, -10/3, 10 -> sqrt((400/9 + 100/9 + 100) / 2) = sqrt(700/9).
  want_std = {"colour": 10.0, "shape": 10.0, "texture": np.sqrt(300.0), "mean": np.sqrt(700.0 / 9)}
  assert row.seeds == 3
  for k in want_mean:
    np.testing.assert_allclose(row.mean[k], want_mean[k], rtol=1e-12)
    np.testing.assert_allclose(row.std[k], want_std[k], rtol=1e-12)
  assert one.std is None and one.seeds == 1

  md = suppression.markdown_table([row, one], "## header")
  lines = md.splitlines()
  assert lines[0] == "## header" and lines[1] == "" and len(lines) == 6
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
  assert cells[0] == ["run", "T", "IFM", "beta", "colour", "shape", "texture", "mean", "seeds"]
  assert cells[2] == [
      "simclr_t0.2_ifm",
      "0.2",
      "on",
      "-",
      "90.0 ± 10.0",
      "40.0 ± 10.0",
      "30.0 ± 17.3",
      "53.3 ± 8.8",
      "3",
  ]
  assert cells[3] == ["hcl_t0.5_b0.5", "0.5", "off", "0.5", "75.0", "12.5", "50.0", "45.8", "1"]

  table = list(csv.DictReader(io.StringIO(suppression.csv_table([row, one]))))
  assert [r["run"] for r in table] == ["simclr_t0.2_ifm", "hcl_t0.5_b0.5"]
  assert (table[0]["temperature"], table[0]["ifm"], table[0]["beta"]) == ("0.2", "1", "")
  assert (table[1]["temperature"], table[1]["ifm"], table[1]["beta"]) == ("0.5", "0", "0.5")
  for k in want_mean:
    np.testing.assert_allclose(float(table[0][k]), want_mean[k], atol=1e-4)
    np.testing.assert_allclose(float(table[0][f"{k}_std"]), want_std[k], atol=1e-4)
    assert table[1][f"{k}_std"] == ""
  np.testing.assert_allclose(
      [float(table[1][k]) for k in ("colour", "shape", "texture", "mean")],
      [75.0, 12.5, 50.0, 137.5 / 3],
      atol=1e-4,
  )
  assert (table[0]["seeds"], table[1]["seeds"]) == ("3", "1")


def test_summarise_takes_the_mean_and_sample_std_over_seeds():
  spec = RunSpec("simclr_t0.2", 0.2, False, None)
  per_seed = [
      {"colour": 50.0, "shape": 20.0, "texture": 10.0, "mean": 80.0 / 3},
      {"colour": 60.0, "shape": 20.0, "texture": 40.0, "mean": 40.0},
  ]
  row = suppression.summarise(spec, per_seed)
  assert row.spec == spec and row.seeds == 2
  # Two seeds: mean (a + b) / 2, sample std |a - b| / sqrt(2).
  for k, (a, b) in {
      "colour": (50.0, 60.0),
      "shape": (20.0, 20.0),
      "texture": (10.0, 40.0),
      "mean": (80.0 / 3, 40.0),
  }.items():
    np.testing.assert_allclose(row.mean[k], (a + b) / 2, rtol=1e-12)
    np.testing.assert_allclose(row.std[k], abs(a - b) / np.sqrt(2), rtol=1e-12, atol=1e-12)


def _records(seeds_per_run: int) -> dict:
  """Records of the grid; grid row i at seed s: colour 50 + i + 2 s %, shape 20 + 3 i %,
  texture 10 + 2 i %."""
  records = {}
  for i, (name, _) in enumerate(GRID):
    for s in range(seeds_per_run):
      acc = (50.0 + i + 2 * s, 20.0 + 3 * i, 10.0 + 2 * i)
      records.setdefault(name, {})[s] = _record(name, s, *acc, sum(acc) / 3)
  return records


def _rows(seeds_per_run: int):
  return suppression.rows(suppression.STUDY, _records(seeds_per_run))


def _rounded(line) -> tuple:
  """A plotted line's y values, rounded to 1e-6."""
  return tuple(np.round(np.asarray(line.get_ydata(), float), 6))


def _png_pixels(path) -> np.ndarray:
  with Image.open(path) as image:
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def test_plot_draws_the_means_and_writes_a_png_of_the_stated_size(tmp_path):
  rows = _rows(1)
  assert [r.spec.name for r in rows] == GRID_NAMES
  fig = suppression_plot.plot_suppression(rows)
  left, right = fig.axes[:2]
  # Left panel: one line per (feature, IFM) through the three temperatures' means.
  got = {(_rounded(l), l.get_linestyle()) for l in left.lines if len(l.get_ydata()) == 3}
  want = set()
  for f, (c0, step) in {
      "colour": (50.0, 1.0),
      "shape": (20.0, 3.0),
      "texture": (10.0, 2.0),
  }.items():
    for ifm, style in ((0, "--"), (1, "-")):
      want.add((tuple(np.round([c0 + step * (2 * j + ifm) for j in range(3)], 6)), style))
  assert got == want
  # Right panel: hard negatives at beta 0.5, 1, 2 (grid rows 6-8), reference simclr_t0.5.
  hcl = {_rounded(l) for l in right.lines if len(l.get_ydata()) == 3}
  assert hcl == {(56.0, 57.0, 58.0), (38.0, 41.0, 44.0), (22.0, 24.0, 26.0)}
  np.testing.assert_allclose(
      sorted(np.concatenate([l.get_xdata() for l in right.lines if len(l.get_ydata()) == 3])),
      [0.5] * 3 + [1.0] * 3 + [2.0] * 3,
  )
  references = {round(float(l.get_ydata()[0]), 6) for l in right.lines if l.get_linestyle() == ":"}
  assert references == {54.0, 32.0, 18.0}  # simclr_t0.5 is grid row 4

  # The study's own outputs over three seeds: the tables and the grid's figure.
  out = suppression.outputs(suppression.STUDY, _records(3))
  assert sorted(out) == ["suppression_grid.csv", "suppression_grid.md", "suppression_grid.png"]
  grid_csv = out["suppression_grid.csv"]
  assert [r["run"] for r in csv.DictReader(io.StringIO(grid_csv))] == GRID_NAMES
  assert out["suppression_grid.md"].count("\n| ") == 1 + len(GRID_NAMES)  # header row + runs
  suppression_plot.write_png(out["suppression_grid.png"], epath.Path(tmp_path / "suppression.png"))
  pixels = _png_pixels(tmp_path / "suppression.png")
  assert pixels.shape == (480, 1200, 3)
  assert pixels.std() > 10  # not blank
  # A grid subset without hard-negative runs: one panel, same PNG size.
  suppression_plot.write_png(
      suppression_plot.plot_suppression(_rows(1)[:2]), epath.Path(tmp_path / "one.png")
  )
  assert _png_pixels(tmp_path / "one.png").shape == (480, 1200, 3)
  with pytest.raises(ValueError, match="no runs to plot"):
    suppression_plot.plot_suppression([])


@pytest.mark.slow
def test_results_hold_the_standard_table_and_the_grid_figure(tmp_path):
  study.write_outputs(suppression.STUDY, _records(2), str(tmp_path))
  header = next(
      ln for ln in (tmp_path / "suppression.md").read_text().splitlines() if ln.startswith("| arm")
  )
  assert header.startswith("| arm | colour | shape | texture | mean |")
  assert header.endswith("| seeds |")
  assert "| run | T | IFM | beta |" in (tmp_path / "suppression_grid.md").read_text()
  assert _png_pixels(tmp_path / "suppression_grid.png").shape == (480, 1200, 3)
  assert _png_pixels(tmp_path / "suppression.png").shape != (480, 1200, 3)  # the study's own
  clashing = dataclasses.replace(suppression.STUDY, outputs=lambda s, r: {"suppression.md": ""})
  with pytest.raises(ValueError, match="clash"):
    study.write_outputs(clashing, _records(2), str(tmp_path))
