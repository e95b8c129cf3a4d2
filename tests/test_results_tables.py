"""The study tables that the docs include (`--8<-- "results/studies/NAME.md"`) are what the study
runner rebuilds from the committed records (`python -m cl_jax.study --study=... --report_only`):
a page never shows a table that its records do not give."""

import glob
import os
import re

import pytest

from cl_jax.analysis import study as study_lib
from cl_jax.analysis import study_summary
from cl_jax.studies import CLAIMS, STUDIES, recipe
from tests.conftest import ROOT

RESULTS = os.path.join(ROOT, "results", "studies")
SEEDS = 5  # the seeds the committed tables were built with (the runner's default)


def included_tables() -> list[str]:
  """results/studies/*.md files that a docs page includes."""
  out = set()
  for path in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True):
    with open(path) as f:
      out.update(re.findall(r'^--8<-- "results/studies/([\w.]+\.md)"', f.read(), re.M))
  return sorted(out)


def _committed(name: str) -> str:
  with open(os.path.join(RESULTS, name)) as f:
    return f.read()


def test_the_docs_include_the_claims_table_and_each_claims_table():
  assert set(included_tables()) >= {"claims.md"} | {f"{s.name}.md" for s in CLAIMS}


@pytest.mark.parametrize(
    "name", [n for n in included_tables() if n not in ("claims.md", "quick_runs.md")]
)
def test_an_included_study_table_is_rebuilt_from_its_records(name):
  study = STUDIES[name[: -len(".md")]]
  records = study_lib.read_records(study, SEEDS, RESULTS)
  assert study_summary.markdown(study, study_summary.summarise(study, records)) == _committed(name)


def test_the_quick_defaults_records_table_is_rebuilt_from_the_records():
  """results/studies/quick_runs.md (written with claims.md) is one row per record of a quick
  default, as cl_jax.studies.recipe renders it, and the docs include it."""
  assert "quick_runs.md" in included_tables()
  records = study_lib.read_records(recipe.STUDY, SEEDS, RESULTS)
  assert records, "no record of a quick default under results/studies/runs"
  assert recipe.markdown_table(recipe.STUDY, records) == _committed("quick_runs.md")


def test_the_claims_table_is_rebuilt_from_the_records():
  summaries = [
      study_summary.summarise(s, study_lib.read_records(s, SEEDS, RESULTS)) for s in CLAIMS
  ]
  assert study_summary.claims_table(CLAIMS, summaries, SEEDS) == _committed("claims.md")


def test_the_readme_shows_the_verdicts_as_the_records_give_them():
  summaries = [
      study_summary.summarise(s, study_lib.read_records(s, SEEDS, RESULTS)) for s in CLAIMS
  ]
  table = study_summary.verdicts_table(CLAIMS, summaries)
  assert table == _committed("verdicts.md")
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  block = re.search(
      r"<!-- verdicts: results/studies/verdicts.md -->\n(.*?)<!-- end verdicts -->", readme, re.S
  )
  assert block and block.group(1) == table
