"""cl_jax.bench.compile_table: cell names, the table's rows computed from hand-made records,
and the queue's records (one per cell, kept on a second run, a failure's last line, replaced
when another config spelling wrote it; a mistyped config refused before anything compiles)."""

import json
import os
import subprocess
import sys

import pytest

from cl_jax.bench import compile_table
from tests import conftest, tiny_run

GIB = 2**30


def _analysis(batch_per_chip: int, peak_gib: float, fits: bool = True) -> dict:
  return {
      "batch_per_chip": batch_per_chip,
      "memory": {"peak": peak_gib * GIB},
      "hbm_bytes": 16 * GIB,
      "fits": fits,
      "flops_per_image": 41.2e9,
      "analytic_flops_per_image": 40.0e9,
      "collectives": [
          {"purpose": "gradient reduction", "count": 2, "bytes": 50e6},
          {"purpose": "shuffled key batch", "count": 3, "bytes": 10e6},
          {"purpose": "unexpected", "count": 1, "bytes": 2.5e6},
      ],
  }


def test_cell_names_say_config_preset_and_target():
  assert compile_table.cell_name("configs/mocov2.py:imagenet100", "v5e:2x2") == (
      "mocov2-imagenet100-v5e_2x2"
  )
  assert compile_table.cell_name("configs/mocov2_patchns.py", "h100:8") == (
      "mocov2_patchns-quick-h100_8"
  )
  assert compile_table.cell_name("configs/dicr.py:simclr,cifar10", "v4:2x2x1") == (
      "dicr-simclr_cifar10-v4_2x2x1"
  )


def test_rows_sum_the_collectives_and_show_the_fitted_batch():
  record = {
      "config": "configs/mocov2_patchns.py:imagenet100",
      "target": "v5e:2x2",
      "commit": "abc1234",
      "processor": "AMD EPYC, 2 cores",
      "result": {
          "first": _analysis(32, 3.5),
          "checked": _analysis(128, 14.5),
          "fit": {"batch": 136, "config_batch": 128},
      },
  }
  failed = {
      "config": "configs/looc.py:imagenet100",
      "target": "h100:8",
      "commit": "abc1234",
      "processor": "AMD EPYC, 2 cores",
      "failed": "error: something one line",
  }
  cells = [c.strip() for c in compile_table.row(record).strip("|").split("|")]
  assert cells == [
      "`mocov2_patchns.py:imagenet100`",
      "v5e:2x2",
      "yes",
      "3.50 of 16.0 (batch 32)",
      "128 (14.5 GiB, fits); memory alone 136",
      "6, 62.5 MB",
      "1",
      "41.2 (40.0)",
      "`abc1234`",
  ]
  table = compile_table.render([failed, record])
  lines = table.splitlines()
  # The CONFIGS order: the imagenet100 MoCo-v2 + patch negatives cell before LooC's.
  assert lines[2].startswith("| `mocov2_patchns.py:imagenet100` | v5e:2x2 | yes")
  assert lines[3].startswith("| `looc.py:imagenet100` | h100:8 | no: error: something one line")
  assert lines[3].count("|") == lines[0].count("|") == lines[2].count("|")
  assert lines[3].endswith("| `abc1234` |")
  assert "at commit `abc1234` on AMD EPYC, 2 cores" in table


def test_a_preset_out_of_hbm_shows_the_largest_batch_that_fits():
  """A TPU compile of the preset's batch refused for HBM: the row says so and shows the
  communication and FLOPs of the largest batch that fits, naming its batch."""
  refused = {"batch_per_chip": 128, "memory": None, "hbm_bytes": 16 * GIB, "fits": False}
  record = {
      "config": "configs/byol.py:imagenet100",
      "target": "v5e:2x2",
      "result": {
          "first": refused,
          "checked": _analysis(96, 15.1),
          "fit": {"batch": None, "config_batch": 96, "refits": 3},
      },
  }
  cells = [c.strip() for c in compile_table.row(record).strip("|").split("|")]
  assert cells[2:] == [
      "no: out of HBM",
      "over 16.0 (batch 128)",
      "96 (15.1 GiB, fits); 3 refits",
      "6, 62.5 MB (batch 96)",
      "1",
      "41.2 (40.0)",
      "",
  ]
  # The largest batch recomputes activations to fit: more FLOPs per image than the preset's.
  fits = dict(record["result"], first=_analysis(128, 9.0), checked=_analysis(256, 15.2))
  fits["checked"]["flops_per_image"] = 47.5e9
  cells = [c.strip() for c in compile_table.row(dict(record, result=fits)).strip("|").split("|")]
  assert cells[4] == "256 (15.2 GiB, fits); 3 refits; 47.5 GFLOP per image (recomputed to fit)"
  assert cells[7] == "41.2 (40.0)"
  # More FLOPs that the analytic count has too (a batch contrast at a larger batch): no remark.
  fits["checked"]["analytic_flops_per_image"] = 46.2e9
  cells = [c.strip() for c in compile_table.row(dict(record, result=fits)).strip("|").split("|")]
  assert cells[4] == "256 (15.2 GiB, fits); 3 refits"
  record["result"].update(checked=None, fit=None)
  cells = [c.strip() for c in compile_table.row(record).strip("|").split("|")]
  assert cells[2:5] == ["no: out of HBM", "over 16.0 (batch 128)", "none"]
  assert len(cells) == 9


@pytest.mark.slow
def test_the_queue_writes_a_record_per_cell_and_keeps_it(tmp_path):
  out = tmp_path / "compile"
  command = [
      sys.executable,
      "-m",
      "cl_jax.bench.compile_table",
      f"--out={out}",
      "--configs=configs/mocov2_patchns.py",
      "--configs=configs/dicr.py:simclr,cifar10",  # a preset with a comma is one config
      "--targets=v9:2x2",  # no such chip: the compile fails at once, in one line
  ]

  def run(args):
    return subprocess.run(
        args, cwd=conftest.ROOT, env=tiny_run.env(), capture_output=True, text=True, timeout=300
    )

  out.mkdir()
  collided = out / "dicr-simclr_cifar10-v9_2x2.json"  # a mistyped preset's record, same stem
  collided.write_text(json.dumps({"config": "configs/dicr.py:simclr_cifar10", "target": "v9:2x2"}))
  first = run(command)
  assert first.returncode == 0, first.stderr[-3000:]
  replaced = "replacing the record of configs/dicr.py:simclr_cifar10"
  assert f"dicr-simclr_cifar10-v9_2x2.json: {replaced}" in first.stdout
  path = out / "mocov2_patchns-quick-v9_2x2.json"
  record = json.loads(path.read_text())
  assert record["failed"].startswith("error: --target=v9:2x2: give FAMILY:SHAPE"), record
  assert record["command"].endswith(
      "cl_jax.bench.compile --config=configs/mocov2_patchns.py --target=v9:2x2 --max_batch --json"
  )
  assert json.loads((out / "dicr-simclr_cifar10-v9_2x2.json").read_text())["config"] == (
      "configs/dicr.py:simclr,cifar10"
  )
  table = (out / "table.md").read_text()
  assert "| `mocov2_patchns.py` | v9:2x2 | no: error: --target=v9:2x2" in table
  os.utime(path, (0, 0))
  again = run(command)
  assert again.returncode == 0 and os.stat(path).st_mtime == 0  # kept, not compiled again
  missing = run(command[:3] + [f"--out={tmp_path / 'none'}", "--render_only"])
  assert missing.returncode != 0 and missing.stderr.strip().count("\n") == 0
  assert "is not a folder of cell records" in missing.stderr
  mistyped = run(
      command[:3] + [f"--out={tmp_path / 'typo'}", "--configs=configs/dicr.py:simclr_cifar10"]
  )
  assert mistyped.returncode != 0 and mistyped.stderr.strip().count("\n") == 0
  assert "--configs=configs/dicr.py:simclr_cifar10: configs/dicr.py: method must be" in (
      mistyped.stderr
  )
  assert not list((tmp_path / "typo").glob("*.json"))  # refused before any cell compiled
