"""Where a study's runs train (cl_jax.analysis.study_launch, cl_jax.study --launcher): the local
workers' shares of cores and GPUs, the run directory's claim (released when its holder is
killed), the sbatch script of a dry run, and on a real one-node SLURM cluster (tests/
slurm_cluster.py): a tiny study of 2 arms x 2 seeds as a job array gives the local workers'
records, a task signalled mid-run is requeued and finishes with the same record, and a failing
task shows as failed in --status with its error while the others finish."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cl_jax.analysis import study_launch, study_records, study_runs
from cl_jax.studies import STUDIES
from tests import slurm_cluster, tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [f"--set={f[len('--config.') :]}" for f in tiny_run.FLAGS if f.startswith("--config.")]
# 64 steps; the signalled task is held still (SIGSTOP) while the signal reaches it.
TINY += ["--set=optim.epochs=8", "--set=eval.every=0"]
STEPS = 64
ARMS = ("mocov2_nojitter", "mocov2_patchns_nojitter")  # ge_nojitter's


def test_workers_get_contiguous_core_shares_and_the_gpus_split_or_shared():
  shares = study_launch.worker_shares(3, [0, 1, 2, 3, 4, 5, 6], [])
  assert [s["cores"] for s in shares] == [[0, 1, 2], [3, 4], [5, 6]]
  assert all(s["env"] == {} for s in shares)
  split = study_launch.worker_shares(2, [0, 1, 2, 3], ["0", "1", "2", "3"])
  assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in split] == ["0,1", "2,3"]
  shared = study_launch.worker_shares(2, [0, 1], ["0"])
  assert [s["env"] for s in shared] == [{"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.450"}] * 2
  with pytest.raises(study_launch.UsageError, match="--workers=3.*2 cores"):
    study_launch.worker_shares(3, [0, 1], [])


HOLDER = """
import sys, time
from etils import epath
from cl_jax.analysis import study_runs
with study_runs.claim(epath.Path(sys.argv[1])) as mine:
  print(mine, flush=True)
  time.sleep(60)
"""


@pytest.mark.slow
def test_a_claim_is_exclusive_and_released_when_its_holder_is_killed(tmp_path):
  directory = tmp_path / "arm" / "seed0"
  holder = subprocess.Popen(
      [sys.executable, "-c", HOLDER, str(directory)], cwd=ROOT, stdout=subprocess.PIPE, text=True
  )
  try:
    assert holder.stdout.readline().strip() == "True"
    assert study_runs.is_claimed(directory)
    with study_runs.claim(directory, wait_s=0.5) as mine:
      assert not mine
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  assert not study_runs.is_claimed(directory)
  with study_runs.claim(directory) as mine:
    assert mine


@pytest.mark.slow
def test_a_dry_run_prints_the_arrays_sbatch_script(tmp_path):
  options = study_launch.SlurmOptions(
      partition="gpu", account="lab", qos="high", time_min=90, cpus_per_task=8, gpus_per_task=1,
      mem="32G", array_parallelism=4,
  )  # fmt: skip
  script = study_launch.sbatch_script("ge_nojitter", str(tmp_path), options, 10)
  for line in (
      "#SBATCH --partition=gpu",
      "#SBATCH --account=lab",
      "#SBATCH --qos=high",
      "#SBATCH --time=90",
      "#SBATCH --cpus-per-task=8",
      "#SBATCH --gpus-per-task=1",
      "#SBATCH --mem=32G",
      "#SBATCH --array=0-9%4",
      "#SBATCH --signal=USR2@90",
      "#SBATCH --job-name=cl_jax-ge_nojitter",
  ):
    assert line in script, line
  assert "submitit.core._submit" in script
  out = subprocess.run(
      [sys.executable, "-m", "cl_jax.study", "--study=ge_nojitter", "--seeds=2",
       "--launcher=slurm", "--dry_run", "--slurm_partition=gpu", f"--workdir={tmp_path}/w",
       f"--results={tmp_path}/r", *TINY],
      cwd=ROOT, capture_output=True, text=True, check=False,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-2000:]
  assert (
      "ge_nojitter: 4 tasks: mocov2_nojitter seed 0, mocov2_patchns_nojitter seed 0" in out.stdout
  )
  assert "#SBATCH --array=0-3" in out.stdout and "#SBATCH --partition=gpu" in out.stdout
  assert not os.path.exists(tmp_path / "w" / "slurm" / "ge_nojitter" / "jobs.json")


def _study(*flags: str, env=None, root=None) -> subprocess.CompletedProcess:
  cmd = [sys.executable, "-m", "cl_jax.study", "--study=ge_nojitter", "--seeds=2", *TINY, *flags]
  return subprocess.run(
      cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False
  )


def _records(results) -> dict:
  out = {}
  for arm in ARMS:
    for seed in (0, 1):
      path = study_records.record_path(str(results), arm, seed)
      if path.exists():
        record = json.loads(path.read_text())
        out[(arm, seed)] = (record["metrics"], record["code"]["fingerprint"])
  return out


def _pid_of(*words: str) -> int:
  """The process whose command line holds all `words` as arguments (waits up to 60 s)."""
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    for entry in filter(str.isdigit, os.listdir("/proc")):
      try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
          args = f.read().decode(errors="replace").split("\0")
      except OSError:
        continue
      if all(w in args for w in words):
        return int(entry)
    time.sleep(0.1)
  raise AssertionError(f"no process with {words}")


def _signalled_or_going(pid: int, signum: int) -> bool:
  """Whether the stopped process `pid` has `signum` pending, or runs again (the scheduler's
  job kill sends SIGCONT before its SIGTERM), or has ended."""
  try:
    with open(f"/proc/{pid}/status") as f:
      fields = dict(line.split(":", 1) for line in f if ":" in line)
  except FileNotFoundError:
    return True
  pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
  return bool(pending >> (signum - 1) & 1) or not fields["State"].strip().startswith("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  slurm_cluster.available()
  started = slurm_cluster.start(str(tmp_path_factory.mktemp("slurm")))
  yield started
  started.stop()


@pytest.mark.slow
def test_a_study_on_slurm_gives_the_local_workers_records(tmp_path, cluster, monkeypatch):
  """Local, 2 pinned workers: the 4 records. SLURM, one array of 4 tasks of 1 core each: one
  arm-seed fails (its run directory was started under other code) and shows as failed with its
  error in --status; one task, shown running, gets SLURM's warning signal mid-run, saves, is
  requeued and resumes; the other three records equal the local ones (probe metrics and code
  fingerprints). The failed run's directory emptied, a second array of its one task completes
  the study: the local workers' 4 records and report."""
  local = _study(f"--workdir={tmp_path}/lw", f"--results={tmp_path}/lr", "--workers=2")
  assert local.returncode == 0, local.stderr[-3000:]
  want = _records(tmp_path / "lr")
  assert len(want) == 4
  work, results = tmp_path / "sw", tmp_path / "sr"
  broken = study_records.run_dir(str(work), ARMS[1], 1)
  broken.mkdir(parents=True)
  (broken / "source.json").write_text(json.dumps({"sha256": "0" * 64, "commit": "elsewhere"}))
  submitted = _study(
      f"--workdir={work}", f"--results={results}", "--launcher=slurm", env=cluster.env
  )
  assert submitted.returncode == 0, submitted.stderr[-3000:]
  assert "submitted 4 tasks as SLURM array" in submitted.stdout
  jobs = json.loads((work / "slurm" / "ge_nojitter" / "jobs.json").read_text())
  signalled = next(j["job_id"] for j in jobs if (j["arm"], j["seed"]) == (ARMS[0], 0))
  metrics_file = study_records.run_dir(str(work), ARMS[0], 0) / "metrics.jsonl"
  steps = lambda: len(metrics_file.read_text().splitlines()) if metrics_file.exists() else 0
  deadline = time.monotonic() + 900
  while steps() < 2 and time.monotonic() < deadline:  # the task trains
    time.sleep(0.1)
  # Held still (SIGSTOP) while it is signalled: the signal is pending when it goes on, mid-run
  # however long the scheduler takes to deliver it.
  trainer = _pid_of("cl_jax.main", f"--workdir={study_records.run_dir(str(work), ARMS[0], 0)}")
  os.kill(trainer, signal.SIGSTOP)
  try:
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])  # for squeue
    rows = study_launch.status(STUDIES["ge_nojitter"], 2, str(work), str(results))
    assert rows[0]["state"] == "running" and rows[0]["job_id"] == signalled, rows
    cluster.run("scancel", f"--signal={study_launch.STOP_SIGNAL}", signalled)
    while not _signalled_or_going(trainer, signal.SIGUSR2) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert 0 < steps() < STEPS, f"the signal came at step {steps()} of {STEPS}, not mid-run"
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.kill(trainer, signal.SIGCONT)
  while time.monotonic() < deadline:
    if not cluster.run("squeue", "-h", "-r").stdout.strip():
      break
    time.sleep(2)
  else:
    pytest.fail("the array did not end\n" + cluster.run("squeue", "-r").stdout + cluster.logs())
  got = _records(results)
  assert sorted(got) == sorted(k for k in want if k != (ARMS[1], 1)), _study(
      f"--workdir={work}", f"--results={results}", "--status", env=cluster.env
  ).stdout
  for key, value in got.items():
    assert value == want[key], key
  log = (study_records.run_dir(str(work), ARMS[0], 0) / study_runs.LOG_FILE).read_text()
  assert "resum" in log.lower(), log[-3000:]  # it was stopped and resumed from its checkpoint
  status = _study(f"--workdir={work}", f"--results={results}", "--status", env=cluster.env)
  assert status.returncode == 0, status.stderr[-2000:]
  assert (
      f"{ARMS[1]} seed 1: failed" in status.stdout and "started under other code" in status.stdout
  )
  assert (
      status.stdout.count(": done") == 3
      and "3 done, 0 running, 1 failed, 0 pending" in status.stdout
  )
  # The failed run's directory emptied, the same command submits only it; then the report.
  for path in broken.iterdir():
    path.unlink()
  again = _study(f"--workdir={work}", f"--results={results}", "--launcher=slurm", env=cluster.env)
  assert "submitted 1 tasks as SLURM array" in again.stdout, again.stdout + again.stderr[-2000:]
  deadline = time.monotonic() + 600
  while cluster.run("squeue", "-h", "-r").stdout.strip() and time.monotonic() < deadline:
    time.sleep(2)
  assert _records(results) == want
  report = _study(f"--workdir={work}", f"--results={results}", "--report_only", env=cluster.env)
  assert report.returncode == 0, report.stderr[-2000:]
  assert (results / "ge_nojitter.md").read_text() == (
      tmp_path / "lr" / "ge_nojitter.md"
  ).read_text()
