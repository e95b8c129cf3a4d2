"""cl_jax.suppression: the grid, the per-run configs, the table's means and sample stds
against hand-computed numbers, the plot's lines and PNG, resume and failure handling of
the study loop (with a stand-in for training), and the command on a tiny real 2-run grid."""

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from etils import epath
from PIL import Image

from cl_jax import run_config, suppression, train
from cl_jax.errors import UsageError
from cl_jax.viz import suppression_plot
from configs import mocov2, simclr
from tests import tiny_run
from tests.conftest import ROOT

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


def _report(colour, shape, texture):
  """A probe report as cl_jax.linear_probe writes it (top-1 fractions)."""
  return {
      "accuracy": {
          "colour": {"top1": colour, "top5": 1.0},
          "shape": {"top1": shape, "top5": 1.0},
          "texture": {"top1": texture, "top5": 1.0},
      }
  }


def _spec(name):
  return next(s for s in suppression.grid() if s.name == name)


def test_grid_runs_and_their_configs():
  specs = suppression.grid()
  assert [s.name for s in specs] == GRID_NAMES
  assert [(s.temperature, s.ifm, s.beta) for s in specs] == [
      (0.05, False, None),
      (0.05, True, None),
      (0.2, False, None),
      (0.2, True, None),
      (0.5, False, None),
      (0.5, True, None),
      (0.5, False, 0.5),
      (0.5, False, 1.0),
      (0.5, False, 2.0),
  ]

  base = simclr.get_config()
  base.seed = 7
  c = suppression.run_config(base, _spec("simclr_t0.05_ifm"), 2)
  assert (c.simclr.temperature, c.ifm.enabled, c.ifm.epsilon, c.ifm.alpha) == (0.05, True, 0.1, 1.0)
  assert not c.hcl.enabled and c.seed == 9 and c.method == "simclr"
  c = suppression.run_config(base, _spec("hcl_t0.5_b2"), 0)
  assert (c.simclr.temperature, c.hcl.enabled, c.hcl.beta, c.hcl.tau_plus) == (0.5, True, 2.0, 0.1)
  assert not c.ifm.enabled and c.seed == 7
  # The base config is left as it was.
  assert (base.simclr.temperature, base.ifm.enabled, base.hcl.enabled, base.seed) == (
      0.5,
      False,
      False,
      7,
  )
  assert str(suppression.run_dir("/r", _spec("hcl_t0.5_b2"), c)) == "/r/hcl_t0.5_b2/seed7"


def test_bad_selections_overrides_and_configs_are_refused():
  specs = suppression.grid()
  assert [s.name for s in suppression.select(specs, ["hcl_t0.5_b1", "simclr_t0.2"])] == [
      "simclr_t0.2",
      "hcl_t0.5_b1",
  ]  # grid order
  with pytest.raises(UsageError, match=r"\['simclr_t0.3'\].*simclr_t0.05, simclr_t0.05_ifm"):
    suppression.select(specs, ["simclr_t0.2", "simclr_t0.3"])
  suppression.check_overrides({"optim.epochs": 2, "data.image_size": 16})
  with pytest.raises(UsageError, match="--config.simclr.temperature is set by the study"):
    suppression.check_overrides({"optim.epochs": 2, "simclr.temperature": 0.1})
  suppression.check_base(simclr.get_config())
  with pytest.raises(UsageError, match="method is 'moco'"):
    suppression.check_base(mocov2.get_config())
  with pytest.raises(UsageError, match="no accuracy for \\['texture'\\]"):
    suppression.accuracies({"accuracy": {"colour": {"top1": 1.0}, "shape": {"top1": 1.0}}})


def test_three_seed_table_matches_hand_computed_means_and_stds():
  reports = [_report(0.9, 0.3, 0.2), _report(0.8, 0.5, 0.2), _report(1.0, 0.4, 0.5)]
  row = suppression.summarise(_spec("simclr_t0.2_ifm"), reports)
  # Per seed, the mean of the three features: 140/3, 50, 190/3 -> mean 160/3.
  want_mean = {"colour": 90.0, "shape": 40.0, "texture": 30.0, "mean": 160.0 / 3}
  # Sample std (ddof 1): colour devs -10, 0, 10 -> 10; texture -10, -10, 20 -> sqrt(300);
  # per-seed means devs -20/3, -10/3, 10 -> sqrt((400/9 + 100/9 + 100) / 2) = sqrt(700/9).
  want_std = {"colour": 10.0, "shape": 10.0, "texture": np.sqrt(300.0), "mean": np.sqrt(700.0 / 9)}
  assert row.seeds == 3
  for k in want_mean:
    np.testing.assert_allclose(row.mean[k], want_mean[k], rtol=1e-12)
    np.testing.assert_allclose(row.std[k], want_std[k], rtol=1e-12)

  one = suppression.summarise(_spec("hcl_t0.5_b0.5"), [_report(0.75, 0.125, 0.5)])
  assert one.std is None and one.seeds == 1
  md = suppression.markdown_table([row, one], "## header")
  lines = md.splitlines()
  assert lines[0] == "## header" and lines[1] == ""
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


def _rows(seeds_per_run: int):
  """Rows of the grid; row i at seed s: colour 50 + i + 2 s %, shape 20 + 3 i %,
  texture 10 + 2 i %."""
  rows = []
  for i, spec in enumerate(suppression.grid()):
    reports = [
        _report(0.5 + 0.01 * i + 0.02 * s, 0.2 + 0.03 * i, 0.1 + 0.02 * i)
        for s in range(seeds_per_run)
    ]
    rows.append(suppression.summarise(spec, reports))
  return rows


def _rounded(line) -> tuple:
  """A plotted line's y values, rounded to 1e-6."""
  return tuple(np.round(np.asarray(line.get_ydata(), float), 6))


def _png_pixels(path) -> np.ndarray:
  with Image.open(path) as image:
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def test_plot_draws_the_means_and_writes_a_png_of_the_stated_size(tmp_path):
  fig = suppression_plot.plot_suppression(_rows(1))
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

  paths = suppression.write_results(_rows(3), str(tmp_path), "## h")
  assert [p.rsplit("/", 1)[1] for p in paths] == [
      "suppression.md",
      "suppression.csv",
      "suppression.png",
  ]
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


def _tiny_base():
  c = simclr.get_config()
  c.data.update(image_size=16, trifeature_train=64, trifeature_test=32)
  c.optim.update(batch_size=32, epochs=2)  # 4 steps: reports probe_step4_fast
  c.eval.knn_k = 32  # the kNN monitor's bank is the 64 training images
  return c


@pytest.mark.slow
def test_study_loop_resumes_from_reports_and_goes_on_after_a_divergence(tmp_path):
  base, root = _tiny_base(), str(tmp_path / "study")
  calls = []

  def fake_train(config, workdir):
    """Writes what pretrain + probe would: config.json and the step-4 report."""
    calls.append(
        (
            str(workdir),
            config.simclr.temperature,
            config.ifm.enabled,
            config.hcl.enabled,
            config.hcl.beta,
            config.seed,
        )
    )
    if config.simclr.temperature == 0.05 and not config.ifm.enabled:
      raise train.TrainingDiverged("loss became NaN")
    run_config.save_start(config, str(workdir), 0)
    report = _report(0.5 + 0.1 * config.seed, config.simclr.temperature, 0.25)
    (workdir / "probe_step4_fast.json").write_text(json.dumps(report))
    return report

  some = suppression.select(suppression.grid(), ["simclr_t0.2", "hcl_t0.5_b1"])
  rows, failures = suppression.run_study(
      base, root, some, 2, "## h", fake_train, log=lambda s: None
  )
  assert calls == [
      (f"{root}/simclr_t0.2/seed0", 0.2, False, False, 1.0, 0),
      (f"{root}/simclr_t0.2/seed1", 0.2, False, False, 1.0, 1),
      (f"{root}/hcl_t0.5_b1/seed0", 0.5, False, True, 1.0, 0),
      (f"{root}/hcl_t0.5_b1/seed1", 0.5, False, True, 1.0, 1),
  ]
  assert failures == [] and [r.spec.name for r in rows] == ["simclr_t0.2", "hcl_t0.5_b1"]
  # colour 50 and 60 over the two seeds: mean 55, sample std sqrt(50).
  np.testing.assert_allclose(
      [rows[0].mean["colour"], rows[0].std["colour"]], [55.0, np.sqrt(50.0)], rtol=1e-12
  )
  np.testing.assert_allclose(rows[1].mean["shape"], 50.0, rtol=1e-12)
  table = list(csv.DictReader(open(f"{root}/suppression.csv")))
  assert [r["run"] for r in table] == ["simclr_t0.2", "hcl_t0.5_b1"]

  # The whole grid: the finished runs are read, not retrained; a divergence is
  # reported and the other runs go on.
  calls.clear()
  logged = []
  rows, failures = suppression.run_study(
      base, root, suppression.grid(), 2, "## h", fake_train, log=logged.append
  )
  trained = sorted({c[0].split("/")[-2] for c in calls})
  assert trained == sorted(set(GRID_NAMES) - {"simclr_t0.2", "hcl_t0.5_b1"})
  assert len(failures) == 2 and all(f.startswith("simclr_t0.05 seed") for f in failures)
  assert [r.spec.name for r in rows] == [n for n in GRID_NAMES if n != "simclr_t0.05"]
  assert sum("not retrained" in line for line in logged) == 4
  md = (tmp_path / "study" / "suppression.md").read_text()
  assert md.count("\n| ") == 1 + 8  # header row + 8 finished runs

  # A run directory trained at other settings is refused, not mixed in.
  other = _tiny_base()
  other.optim.lr = 0.5
  with pytest.raises(UsageError, match="optim.lr: 0.06 there, 0.5 now"):
    suppression.run_study(other, root, some, 1, "## h", fake_train, log=lambda s: None)


TINY = [
    "--config.data.image_size=16",
    "--config.data.trifeature_train=128",
    "--config.data.trifeature_test=64",
    "--config.eval.knn_k=32",
    "--config.model.width_multiplier=0.125",
    "--config.model.head_hidden_dim=32",
    "--config.model.head_out_dim=16",
    "--config.optim.batch_size=32",
    "--config.optim.epochs=1",  # 4 steps
    "--config.probe.epochs=3",
    "--config.probe.batch_size=64",
    "--config.probe.decay_epochs=(2,)",
]


@pytest.mark.slow
def test_command_trains_a_two_run_subset_then_resumes_without_training(tmp_path):
  root = tmp_path / "study"
  cmd = [
      sys.executable,
      "-m",
      "cl_jax.suppression",
      f"--workdir={root}",
      "--only=simclr_t0.2_ifm,hcl_t0.5_b1",
      *TINY,
  ]
  proc = subprocess.run(
      cmd, cwd=ROOT, env=tiny_run.env(1), capture_output=True, text=True, timeout=600, check=False
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  runs = ["simclr_t0.2_ifm", "hcl_t0.5_b1"]
  reports = [json.loads((root / r / "seed0" / "probe_step4_fast.json").read_text()) for r in runs]
  stored = json.loads((root / "hcl_t0.5_b1" / "seed0" / "config.json").read_text())
  assert stored["hcl"] == {"enabled": True, "beta": 1.0, "tau_plus": 0.1}
  assert stored["ifm"]["enabled"] is False and stored["simclr"]["temperature"] == 0.5
  assert stored["optim"]["epochs"] == 1 and stored["data"]["image_size"] == 16

  table = list(csv.DictReader(open(root / "suppression.csv")))
  assert [r["run"] for r in table] == runs
  for row, report in zip(table, reports):
    acc = [100 * report["accuracy"][f]["top1"] for f in ("colour", "shape", "texture")]
    np.testing.assert_allclose(
        [float(row[f]) for f in ("colour", "shape", "texture", "mean")],
        [*acc, np.mean(acc)],
        atol=1e-4,
    )
  md = (root / "suppression.md").read_text()
  assert "| simclr_t0.2_ifm | 0.2 | on | - |" in md and "| hcl_t0.5_b1 | 0.5 | off | 1 |" in md
  assert md.split("\n\n", 2)[2] in proc.stdout  # the table is printed at the end
  assert _png_pixels(root / "suppression.png").shape == (480, 1200, 3)

  again = subprocess.run(
      cmd, cwd=ROOT, env=tiny_run.env(1), capture_output=True, text=True, timeout=600, check=False
  )
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("not retrained") == 2 and "pretrain" not in again.stderr
  assert (root / "suppression.md").read_text() == md

  bad = subprocess.run(
      [*cmd, "--config.simclr.temperature=0.1"],
      cwd=ROOT,
      env=tiny_run.env(1),
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert bad.returncode != 0 and "set by the study" in bad.stderr
