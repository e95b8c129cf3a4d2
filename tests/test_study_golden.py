"""The suppression and recipe studies give the same tables as the old runners
(cl_jax.suppression, cl_jax.recipe_check) on the same finished runs.

tests/data/studies holds what the old runners wrote for fake finished runs made with
tests/study_fakes.make_run (suppression.md with the placeholder header "HEADER",
suppression.csv and recipe_check.md). Here the same fake runs are laid out where the study
runner looks for them, the runner is run with a stand-in for training, and its tables are
compared with the old ones byte for byte.
"""

import pytest
from etils import epath

from cl_jax.analysis import study, study_records
from cl_jax.studies import recipe, suppression
from tests import study_fakes as F

GOLDEN = epath.Path(__file__).parent / "data" / "studies"

# The old grid in its order, each run under the name of the study's arm that is it now.
GRID_ARMS = [
    ("simclr_t0.05", "simclr_t0.05"),
    ("simclr_t0.05_ifm", "simclr_t0.05_ifm"),
    ("simclr_t0.2", "simclr_t0.2"),
    ("simclr_t0.2_ifm", "simclr_t0.2_ifm"),
    ("simclr_t0.5", "simclr"),
    ("simclr_t0.5_ifm", "simclr_ifm"),
    ("hcl_t0.5_b0.5", "simclr_hcl_b0.5"),
    ("hcl_t0.5_b1", "simclr_hcl_b1"),
    ("hcl_t0.5_b2", "simclr_hcl_b2"),
]
RECIPE_ARMS = ["mocov2", "simclr"]


def _fake_train(calls):
  """A stand-in for cl_jax.main: the run is already there; its wall time is 100 + seed."""

  def fake(arm, seed, extra, directory, analyses):
    calls.append((arm.name, seed, str(directory), tuple(extra), tuple(analyses)))
    return 100.0 + seed

  return fake


def _table(text: bytes) -> bytes:
  """The markdown table of suppression.md: everything from the line "| run ..." on."""
  return text[text.index(b"\n| run |") + 1 :]


@pytest.mark.slow
def test_suppression_tables_match_the_old_runner(tmp_path):
  workdir, results = tmp_path / "runs", tmp_path / "results"
  arms = {a.name: a for a in suppression.STUDY.arms}
  assert sorted(arms) == sorted(name for _, name in GRID_ARMS)
  for n, (_, name) in enumerate(GRID_ARMS):
    for seed in range(2):
      config = study_records.arm_config(arms[name], seed, F.TINY)
      F.make_run(
          study_records.run_dir(str(workdir), name, seed),
          config,
          F.accuracies(seed, 0.2 + 0.05 * n),
          F.accuracies(seed, 0.1),
      )
  calls = []
  study.run(
      suppression.STUDY,
      seeds=2,
      workdir=str(workdir),
      results=str(results),
      extra=F.TINY,
      train=_fake_train(calls),
      log=lambda line: None,
  )
  # Every run was handed to the stand-in once, in its own directory, with the tiny overrides,
  # seed-major (every arm of seed 0 before seed 1).
  assert calls == [
      (name, s, str(workdir / name / f"seed{s}"), F.TINY, ())
      for s in range(2)
      for _, name in GRID_ARMS
  ]
  got_md = (results / "suppression_grid.md").read_bytes()
  assert _table(got_md) == _table((GOLDEN / "suppression.md").read_bytes())
  assert (results / "suppression_grid.csv").read_bytes() == (
      GOLDEN / "suppression.csv"
  ).read_bytes()


@pytest.mark.slow
def test_recipe_table_matches_the_old_runner(tmp_path):
  workdir, results = tmp_path / "runs", tmp_path / "results"
  arms = {a.name: a for a in recipe.STUDY.arms}
  for n, name in enumerate(RECIPE_ARMS):
    for seed in range(2):
      F.make_run(
          study_records.run_dir(str(workdir), name, seed),
          study_records.arm_config(arms[name], seed, F.TINY),
          F.accuracies(seed, 0.5 + 0.1 * n),
          F.accuracies(seed, 0.1),
          std_sqrt_d=(0.1, 0.6 + 0.1 * seed),
      )
  calls = []
  study.run(
      recipe.STUDY,
      seeds=2,
      workdir=str(workdir),
      results=str(results),
      extra=F.TINY,
      only=RECIPE_ARMS,
      train=_fake_train(calls),
      log=lambda line: None,
  )
  assert [(c[0], c[1]) for c in calls] == [(name, s) for s in range(2) for name in RECIPE_ARMS]
  # The golden table predates the commit and processor columns, which name this machine and
  # checkout (tests/test_study_recipe.py checks them): compare the columns before them.
  lines = (results / "recipe_check_runs.md").read_text().splitlines()
  assert lines[1].endswith("|---|---|") and lines[0].endswith("| commit | processor |")
  got = [lines[1][: -len("---|---|")]] + [
      ln.rsplit(" | ", 2)[0] + " |" for ln in lines[:1] + lines[2:]
  ]
  want = (GOLDEN / "recipe_check.md").read_text().splitlines()
  assert [got[1], got[0], *got[2:]] == want
