"""Runs that are safe to resume and to read: the resume rule for configs, the fall-back
from damaged checkpoints, the config written only by a start that succeeded, chunks
that do not probe, and one-line errors for bad input (in subprocesses, as a user runs
them)."""

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import types

import jax
import ml_collections
import pytest

from cl_jax import train
from cl_jax.data import tfds_source
from cl_jax.evaluators import features, linear_classifier, registry
from cl_jax.runtime import cli, metrics, run_config, workdir_lock
from cl_jax.runtime.errors import UsageError
from configs import looc as looc_config
from configs import mocov2_patchns
from tests import forked_commands, tiny_run
from tests.conftest import ROOT

# The shared finished run's flags after tiny_run.FLAGS (its config), without its probe.
EXTRA = (*tiny_run.FINISHED[len(tiny_run.FLAGS) :], "--probe=false")


def _run(workdir, *extra, cwd=ROOT):
  """`python -m cl_jax.main` of the tiny run, from the repository root in a process forked
  from one that has imported the libraries (tests/forked_commands.py), elsewhere started
  afresh."""
  args = ["cl_jax.main", f"--workdir={workdir}", *tiny_run.FLAGS, *extra]
  if cwd == ROOT:
    return forked_commands.shared().run(args, timeout=600)
  return subprocess.run(
      [sys.executable, "-m", *args],
      cwd=cwd,
      capture_output=True,
      text=True,
      timeout=600,
      env=tiny_run.env(),
  )


def _error_line(proc) -> str:
  """The process's only stderr line (asserting there is exactly one and no traceback)."""
  assert proc.returncode == 1, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
  return lines[0]


def _snapshot(workdir) -> dict[str, bytes]:
  """Every file of a run directory (path -> bytes) but the writer lock, which every start
  takes (an empty file once released)."""
  out = {}
  for path in glob.glob(os.path.join(workdir, "**", "*"), recursive=True):
    if os.path.isfile(path) and os.path.basename(path) != workdir_lock.LOCK_FILE:
      with open(path, "rb") as f:
        out[os.path.relpath(path, workdir)] = f.read()
  return out


@pytest.fixture
def finished(finished_run) -> pathlib.Path:
  """The shared finished tiny run (tests/tiny_run.py FINISHED): 16 steps, checkpoints at 12
  and 16, one training row per step. Read only: the tests copy it."""
  return pathlib.Path(finished_run.workdir)


# The resume rule, on configs (no training).


def _config(**fields) -> ml_collections.ConfigDict:
  c = mocov2_patchns.get_config()
  for path, value in fields.items():
    block, field = path.split("__")
    c[block][field] = value
  return c


def test_resume_rule_names_every_differing_field():
  stored = _config()
  assert run_config.check_resume(stored, _config(), step=8, workdir="w", allow_change=False) == []
  with pytest.raises(run_config.ConfigChangeError) as e:
    run_config.check_resume(
        stored,
        _config(moco__temperature=0.5, model__head_out_dim=32, optim__epochs=40),
        step=8,
        workdir="w",
        allow_change=True,
    )
  message = str(e.value)
  assert "moco.temperature: 0.2 -> 0.5" in message and "model.head_out_dim: 64 -> 32" in message
  assert "another --workdir" in message and "optim.epochs: 16 -> 40" in message
  with pytest.raises(run_config.ConfigChangeError, match="--allow_config_change"):
    run_config.check_resume(
        stored, _config(optim__epochs=40), step=8, workdir="w", allow_change=False
    )
  # Many changes (another method): the first three fields and a count of the others.
  with pytest.raises(run_config.ConfigChangeError) as e:
    run_config.check_resume(
        stored,
        _config(
            moco__temperature=0.5,
            model__head_out_dim=32,
            model__head_hidden_dim=16,
            model__depth=50,
            moco__queue_size=256,
        ),
        step=8,
        workdir="w",
        allow_change=False,
    )
  message = str(e.value)
  assert message.count(" -> ") == 3 and "and 2 more fields" in message and len(message) < 400
  accepted = run_config.check_resume(
      stored,
      _config(
          optim__epochs=40, train__log_every=5, probe__epochs=3, data__workers=2, optim__lr=0.01
      ),
      step=8,
      workdir="w",
      allow_change=True,
  )
  assert accepted == [
      "data.workers: 0 -> 2",
      "optim.epochs: 16 -> 40",
      "optim.lr: 0.06 -> 0.01",
      "probe.epochs: 100 -> 3",
      "train.log_every: 10 -> 5",
  ]


def test_stored_config_reads_back_equal(tmp_path):
  config = _config(optim__epochs=3)
  run_config.save_start(config, str(tmp_path), 0)
  run_config.save_start(_config(optim__epochs=5), str(tmp_path), 12)
  assert run_config.differences(run_config.read(str(tmp_path)), _config(optim__epochs=5)) == []
  first = json.loads((tmp_path / "config.step0.json").read_text())
  assert first["optim"]["epochs"] == 3
  assert json.loads((tmp_path / "config.step12.json").read_text())["optim"]["epochs"] == 5


def test_config_without_newer_fields_resumes_when_they_keep_its_behaviour():
  stored = _config()
  for field in ("looc", "probe.rotation", "aug.rotation_prob", "optim.schedule"):
    block, _, name = field.partition(".")
    if name:
      del stored[block][name]
    else:
      del stored[block]
  assert run_config.check_resume(stored, _config(), step=8, workdir="w", allow_change=False) == []
  with pytest.raises(run_config.ConfigChangeError, match=r"aug.rotation_prob: '<absent>' -> 0.5"):
    run_config.check_resume(
        stored, _config(aug__rotation_prob=0.5), step=8, workdir="w", allow_change=False
    )


def test_tuple_fields_read_back_as_tuples(tmp_path):
  config = looc_config.get_config(None)
  config.optim.update(schedule="step", decay_epochs=(4, 8))
  run_config.save_start(config, str(tmp_path), 0)
  back = run_config.read(str(tmp_path))
  assert back.looc.augmentations == ("rotation",) and back.optim.decay_epochs == (4, 8)
  assert run_config.check_resume(back, config, step=8, workdir="w", allow_change=False) == []


@pytest.mark.slow
def test_resume_refuses_a_changed_config_and_touches_nothing(finished, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(finished, workdir)
  before = _snapshot(workdir)
  refused = _run(
      workdir, *EXTRA, "--config.moco.temperature=0.5", "--config.model.width_multiplier=0.25"
  )
  line = _error_line(refused)
  assert "moco.temperature: 0.2 -> 0.5" in line and "model.width_multiplier: 0.125 -> 0.25" in line
  assert "another --workdir" in line
  longer = [f.replace("optim.epochs=2", "optim.epochs=3") for f in EXTRA]
  line = _error_line(_run(workdir, *longer))
  assert "optim.epochs: 2 -> 3" in line and "--allow_config_change" in line
  assert _snapshot(workdir) == before  # neither attempt changed a byte

  accepted = _run(workdir, *longer, "--allow_config_change")
  assert accepted.returncode == 0, accepted.stderr[-3000:]
  assert "changed   optim.epochs: 2 -> 3" in accepted.stdout
  assert run_config.read(workdir).optim.epochs == 3
  assert json.loads((workdir / "config.step0.json").read_text())["optim"]["epochs"] == 2
  assert json.loads((workdir / "config.step16.json").read_text())["optim"]["epochs"] == 3
  rows = metrics.read_jsonl(workdir / "metrics.jsonl")
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 25))  # not the probe's row


def test_failed_start_leaves_the_stored_config(tmp_path):
  workdir = str(tmp_path)
  good = _config()
  run_config.save_start(good, workdir, 0)
  before = _snapshot(workdir)
  bad = _config(data__name="cifar10", data__data_dir=str(tmp_path / "no_tfds_here"))
  with pytest.raises(tfds_source.DatasetNotFoundError):
    train.pretrain(bad, workdir)
  assert _snapshot(workdir) == before


# Damaged checkpoints.


def _truncate_largest_array(step_dir):
  files = sorted(
      glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")), key=os.path.getsize
  )
  with open(files[-1], "r+b") as f:
    f.truncate(os.path.getsize(files[-1]) // 2)


def _empty(step_dir):
  shutil.rmtree(step_dir)
  os.makedirs(step_dir)


DAMAGE = {
    "truncated array file": _truncate_largest_array,
    "missing _METADATA": lambda d: os.remove(os.path.join(d, "state", "_METADATA")),
    "missing input position": lambda d: os.remove(os.path.join(d, "data", "process_0-of-1.json")),
    "empty step folder": _empty,
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_and_is_kept(finished, tmp_path, damage):
  workdir = tmp_path / "run"
  shutil.copytree(finished, workdir)
  DAMAGE[damage](str(workdir / "checkpoints" / "16"))
  proc = _run(workdir, *EXTRA)
  assert proc.returncode == 0, proc.stderr[-3000:]
  # The storm of "Event loop is closed" errors of orbax's aborted reads is silenced. (A
  # truncated array file still leaves, in about one run in four, asyncio's log of an
  # unretrieved read task.)
  assert "Event loop is closed" not in proc.stderr
  if damage != "truncated array file":
    assert "Traceback" not in proc.stderr
  warning = f"checkpoint 16 in {workdir} cannot be read"
  assert warning in proc.stdout and "moved to" in proc.stdout
  assert "resuming from the checkpoint at step 12 of 16" in proc.stdout
  assert warning in (workdir / "warnings.log").read_text()
  assert (workdir / "checkpoints_damaged" / "16").is_dir()  # set aside, not deleted
  assert sorted(os.listdir(workdir / "checkpoints")) == ["12", "16"]
  # Steps 13-16 ran again from step 12: one row each, equal to the first run's.
  rows = metrics.read_jsonl(workdir / "metrics.jsonl")
  rows_before = metrics.read_jsonl(finished / "metrics.jsonl")
  first = {r["step"]: r["loss"] for r in rows_before if "loss" in r}  # not the probe's row
  assert [r["step"] for r in rows] == list(range(1, 17))
  assert {r["step"]: r["loss"] for r in rows} == first


# What a user sees.


@pytest.mark.slow
def test_stop_at_step_chunk_does_not_probe(tmp_path):
  proc = _run(
      tmp_path / "run",
      "--config.model.depth=18",  # the shared finished run's step: compiled once for both
      "--config.optim.epochs=2",
      "--config.train.checkpoint_every=4",
      "--stop_at_step=4",
      "--probe=true",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "stopped at step 4 of 16" in proc.stdout and "linear probe" not in proc.stdout
  assert not glob.glob(str(tmp_path / "run" / "probe_step*.json"))


@pytest.mark.slow
def test_bad_inputs_get_one_line(tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  line = _error_line(_run(a_file))
  assert f"--workdir={a_file} is a file" in line
  missing = subprocess.run(
      [sys.executable, "-m", "cl_jax.main", "--config=configs/nope.py"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
      env=tiny_run.env(),
  )
  assert "config file configs/nope.py not found" in _error_line(missing)
  line = _error_line(_run(tmp_path / "w", "--config.moco.temprature=0.3"))
  assert "unknown config field moco.temprature" in line
  assert "did you mean moco.temperature?" in line


@pytest.mark.slow
def test_bad_workdirs_and_refused_configs_get_one_line_and_leave_nothing(tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  for workdir, phrase in (
      (a_file / "run", f"lies under {a_file}, a file; give a directory"),
      ("/proc/cl_jax_run", "/proc/cl_jax_run cannot be created (No such file or directory)"),
  ):
    proc = _run(workdir)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert phrase in _error_line(proc)
  # A config that fails its check creates no workdir (no lock file, nothing).
  proc = _run(tmp_path / "w", "--config.optim.batch_size=7")
  assert "must divide optim.batch_size = 7" in _error_line(proc)
  assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_help_exits_with_status_zero():
  for module in ("cl_jax.main", "cl_jax.study"):
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=tiny_run.env(),
    )
    assert proc.returncode == 0 and "--workdir" in proc.stdout + proc.stderr, module


@pytest.mark.slow
def test_commands_work_from_another_directory(tmp_path):
  proc = _run(tmp_path / "run", "--config.optim.epochs=1", "--stop_at_step=1", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (tmp_path / "run" / "checkpoints" / "1").is_dir()


def test_only_bad_input_becomes_one_line():
  with pytest.raises(SystemExit) as e:
    with cli.report():
      raise UsageError("bad value")
  assert str(e.value) == "error: bad value"
  with pytest.raises(ValueError, match="an internal bug"):  # keeps its traceback
    with cli.report():
      raise ValueError("an internal bug")
  assert issubclass(tfds_source.DatasetNotFoundError, UsageError)
  with pytest.raises(UsageError, match="workdir /nonexistent/run does not exist"):
    registry.evaluate("/nonexistent/run", ("linear_probe",))


@pytest.mark.slow
def test_probe_reads_only_the_encoder_variables(finished, tmp_path, monkeypatch):
  """The probe needs the online encoder's params and batch statistics, and the probe
  splits: it neither opens the pretraining split nor restores the optimizer or queue. Its
  accuracies join the run's metrics at the checkpoint's step and its classifier is saved."""
  from cl_jax.data import sources
  from cl_jax.runtime import checkpoint

  opened = []
  real_open = sources.open_source

  def open_source(data, role):
    opened.append(role)
    return real_open(data, role)

  monkeypatch.setattr(sources, "open_source", open_source)
  workdir = tmp_path / "run"
  shutil.copytree(finished, workdir)
  (report,) = registry.evaluate(str(workdir), ("linear_probe",), baseline=False)
  assert report["step"] == 16 and "pretrain" not in opened
  row = metrics.read_metrics(str(workdir))[-1]
  assert row["step"] == 16 and "loss" in row
  for label, acc in report["accuracy"].items():
    assert row[f"probe/fast/{label}/top1"] == acc["top1"]
  saved = linear_classifier.LinearClassifier.load(workdir / "probe_step16_fast_classifier.npz")
  assert set(saved.weights) == set(report["accuracy"])
  manager = checkpoint.make_manager(str(finished), read_only=True)
  template = jax.eval_shape(features.setup(run_config.read(finished)).init_variables)
  step, variables = checkpoint.restore_variables(manager, template)
  assert step == 16 and set(variables) == {"params", "batch_stats"}


def test_the_summary_names_dicr_and_its_variant():
  """The start-up summary's add-on line for DICR and for its ICR variant, from the config."""
  from cl_jax import addons
  from configs import dicr as dicr_config

  c = dicr_config.get_config("simclr")
  d = c.dicr
  tail = (
      f"lambda {d.weight} reached at epoch {d.warmup_epochs}, tau {d.temperature}, "
      f"epsilon {d.epsilon_area} px)"
  )
  assert f"intra-image regularisation (DICR, {tail}" in addons.describe(c)
  c.dicr.variant, c.dicr.icr_layers = "icr", 2
  assert f"intra-image regularisation (ICR, 2-layer projector, {tail}" in addons.describe(c)
  c.dicr.enabled = False
  assert not any("intra-image" in line for line in addons.describe(c))


def test_aborted_read_leftovers_are_dropped_and_the_rest_reported(monkeypatch):
  """The unraisable hook of a failed restore drops "Event loop is closed" and what orbax's
  read coroutines leave, and hands anything else to Python's default hook."""
  from cl_jax.runtime import checkpoint

  reported = []
  monkeypatch.setattr(sys, "__unraisablehook__", reported.append)
  closed = types.SimpleNamespace(exc_value=RuntimeError("Event loop is closed"), object=None)
  orbax_read = types.SimpleNamespace(
      exc_value=OSError("read"),
      object=types.SimpleNamespace(
          cr_code=types.SimpleNamespace(co_filename=f"{os.sep}orbax{os.sep}x.py")
      ),
  )
  other = types.SimpleNamespace(exc_value=ValueError("a bug"), object=None)
  for unraisable in (closed, orbax_read, other):
    checkpoint._quiet_aborted_reads(unraisable)
  assert reported == [other]


def test_only_the_lead_process_reports_a_stop_at_step_chunk(tmp_path):
  """In a multi-host run every process returns at a --stop_at_step chunk; process 0 alone
  prints the "stopped at step" line, and no process runs the probe (tests/stubbed_main.py:
  cl_jax.main with the start-up and the training stubbed)."""
  lead = (
      "stopped at step 8 of 16 (--stop_at_step); run the same command again to continue. "
      "The probe runs when the run is finished."
  )
  args = ["--config=configs/mocov2_patchns.py", f"--workdir={tmp_path}", "--multihost"]
  for index, want in ((1, []), (0, [lead])):
    proc = forked_commands.shared().run(
        ["tests.stubbed_main", str(index), *args, "--stop_at_step=8", "--probe=true"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["start-up (None, None, None)", *want], proc.stdout
