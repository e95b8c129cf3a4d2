"""Where a study's arm-seeds train (cl_jax.study --launcher): here, as N pinned worker processes
(`local`), or as one SLURM job array (`slurm`), and what each arm-seed's state is (`status`).

Both launchers hand out arm-seeds the same way: each run directory is claimed by one process
at a time (study_runs.claim, an OS lock the kernel drops when its holder dies), its record is
written atomically when its run ends, and the outputs are rebuilt from the records. A local
worker takes the pending arm-seeds in seed-major order, skipping those another process holds;
a SLURM task trains the one arm-seed it was given, waiting for a claim still held by an earlier
attempt of the same task.

SLURM through submitit (`submit_slurm`): one array of one task per pending arm-seed, submitted
with the options of SlurmOptions; a task is submitit's Checkpointable `StudyTask`: on SLURM's
warning signal (USR2, submitit's --signal=USR2@90) cl_jax.main, which was started with
--stop_signal=USR2 and is sent the signal by the task as well, stops at the end of its step with
a checkpoint; only once it has ended does submitit requeue the task (its handler of the signal,
which exits at once, would otherwise end the job step and with it the trainer before it saved),
which resumes the run from that checkpoint; a preemption (SIGTERM) saves the same way. The
array's job ids are kept in <workdir>/slurm/<study>/jobs.json for `status`.
"""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys

import submitit
from etils import epath

from cl_jax.analysis.study_records import record_path, run_dir
from cl_jax.analysis.study_runs import (
    FAILED_FILE,
    STOP_SIGNAL_ENV,
    RunFailed,
    StudyStopped,
    claim,
    ensure_record,
    is_claimed,
    write_failure,
)
from cl_jax.runtime import metrics
from cl_jax.runtime.errors import UsageError

LAUNCHERS = ("local", "slurm")
STATES = ("done", "running", "failed", "pending")
CLAIM_WAIT_S = 600.0  # a SLURM task waits this long for an earlier attempt's claim
STOP_SIGNAL = "USR2"  # submitit's warning signal (its --signal=USR2@signal_delay_s)


def arm_seeds(study, seeds: int, only=None) -> list[tuple[int, object]]:
  """(seed, arm) of the study's arms (or those named in `only`) and seeds 0 .. seeds - 1 in
  seed-major order."""
  return [(s, a) for s in range(seeds) for a in study.arms if only is None or a.name in only]


def recorded(results: str, arm_name: str, seed: int) -> bool:
  """Whether the arm-seed has a record of the current kind (with its code fingerprint)."""
  path = record_path(results, arm_name, seed)
  return path.exists() and "code" in json.loads(path.read_text())


# ---- Local workers.


def visible_gpus() -> list[str]:
  """The GPUs this process may use: CUDA_VISIBLE_DEVICES where set, else nvidia-smi's list
  (none without it)."""
  if "CUDA_VISIBLE_DEVICES" in os.environ:
    return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
  if shutil.which("nvidia-smi") is None:
    return []
  out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
  return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def worker_shares(n: int, cpus: list[int], gpus: list[str]) -> list[dict]:
  """What each of n local workers gets: {"cores": its contiguous share of `cpus` (the first
  len(cpus) % n workers one more), "env": its environment changes}. With at least n GPUs each
  worker sees its share of them (CUDA_VISIBLE_DEVICES); with fewer, all workers share every GPU,
  each with 1/n of its memory (XLA_PYTHON_CLIENT_MEM_FRACTION).

  Raises:
    UsageError: more workers than cores.
  """
  if n > len(cpus):
    raise UsageError(
        f"--workers={n}: this process may use {len(cpus)} cores ({cpus}), fewer than the "
        "workers; give at most that many"
    )
  shares = []
  for i in range(n):
    begin = i * (len(cpus) // n) + min(i, len(cpus) % n)
    end = begin + len(cpus) // n + (1 if i < len(cpus) % n else 0)
    env = {}
    if len(gpus) >= n:
      k = len(gpus) // n
      env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * k : (i + 1) * k])
    elif gpus:
      env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / n:.3f}"
    shares.append({"cores": cpus[begin:end], "env": env})
  return shares


def pin(cores: list[int]) -> None:
  """Pin this process (and the processes it starts) to `cores`."""
  os.sched_setaffinity(0, cores)


# ---- SLURM.


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
  """The SLURM options of a study's job array (None: the cluster's default)."""

  partition: str | None = None
  account: str | None = None
  qos: str | None = None
  time_min: int = 60
  cpus_per_task: int = 1
  gpus_per_task: int = 0
  mem: str | None = None  # e.g. "16G"
  array_parallelism: int = 256

  def parameters(self, study_name: str) -> dict:
    """submitit's SlurmExecutor parameters."""
    out = {
        "job_name": f"cl_jax-{study_name}",
        "time": self.time_min,
        "cpus_per_task": self.cpus_per_task,
        "array_parallelism": self.array_parallelism,
        "signal_delay_s": 90,
    }
    for key in ("partition", "account", "qos", "mem"):
      if getattr(self, key):
        out[key] = getattr(self, key)
    if self.gpus_per_task:
      out["gpus_per_task"] = self.gpus_per_task
    return out


def slurm_folder(workdir: str, study_name: str) -> str:
  """The folder of a study's SLURM submissions: submitit's files and logs, and jobs.json."""
  return os.path.join(os.path.abspath(workdir), "slurm", study_name)


def _executor(study_name: str, workdir: str, options: SlurmOptions):
  executor = submitit.SlurmExecutor(folder=slurm_folder(workdir, study_name))
  executor.update_parameters(**options.parameters(study_name))
  return executor


def sbatch_script(study_name: str, workdir: str, options: SlurmOptions, tasks: int) -> str:
  """The sbatch script submit_slurm would submit for `tasks` arm-seeds (submitit's own text:
  its SlurmExecutor's submission file, which it builds from the same parameters)."""
  executor = _executor(study_name, workdir, options)
  if tasks > 1:
    executor.parameters["map_count"] = tasks
  return executor._make_submission_file_text(executor._submitit_command_str, "dry-run")


class StudyTask(submitit.helpers.Checkpointable):
  """One arm-seed of a study on a SLURM node (run_task); submitit requeues it with the same
  arguments on SLURM's warning signal (Checkpointable.checkpoint)."""

  def __call__(self, arm, seed: int, workdir: str, results: str, extra: tuple,
               analyses: tuple) -> str:  # fmt: skip
    return run_task(arm, seed, workdir, results, extra, analyses)


def run_task(arm, seed: int, workdir: str, results: str, extra: tuple, analyses: tuple) -> str:
  """Train (or resume, or read) the record of arm `arm` (a study_types.Arm) at `seed`, with
  the study's `analyses`, as a scheduler's task: cl_jax.main stops on STOP_SIGNAL with a
  checkpoint (the signal passed on to it by study_runs.run_children, which holds it back from
  submitit's handler until the run has ended), after which the signal is raised again for
  submitit's handler, which requeues the task and exits; the run directory's claim is awaited for
  up to CLAIM_WAIT_S (an earlier attempt still saving). Returns the record's path.

  Raises:
    RunFailed: another process held the claim throughout the wait; whatever ensure_record
      raised (a failed run, a changed arm), its error kept beside the run first
      (study_runs.write_failure).
  """
  os.environ[STOP_SIGNAL_ENV] = STOP_SIGNAL
  arm_name = arm.name
  directory = run_dir(workdir, arm_name, seed)
  stopped = None
  with claim(directory, wait_s=CLAIM_WAIT_S) as mine:
    if not mine:
      raise RunFailed(
          f"arm {arm_name} seed {seed}: another process held {directory} for "
          f"{CLAIM_WAIT_S:.0f} s; see --status"
      )
    try:
      ensure_record(arm, seed, workdir, results, extra, analyses)
    except StudyStopped as e:  # saved; requeued below, once the claim is released
      stopped = e
    except Exception as e:  # any failure, kept for --status; the task fails with it
      write_failure(directory, str(e))
      raise
  if stopped is not None:
    print(stopped, flush=True)
    signal.raise_signal(getattr(signal, f"SIG{STOP_SIGNAL}"))  # submitit: requeue, exit
    raise stopped  # the handler returned: not submitit's
  return str(record_path(results, arm_name, seed))


def submit_slurm(
    study, items: list, workdir: str, results: str, extra: tuple, options: SlurmOptions
) -> list[dict]:
  """Submit the arm-seeds `items` ((seed, arm), ...) as one SLURM job array (one task each);
  returns and keeps (jobs.json) their {"arm", "seed", "job_id"}."""
  executor = _executor(study.name, workdir, options)
  task = StudyTask()
  workdir, results = os.path.abspath(workdir), os.path.abspath(results)
  with executor.batch():
    jobs = [executor.submit(task, a, s, workdir, results, extra, study.analyses) for s, a in items]
  submitted = [{"arm": a.name, "seed": s, "job_id": j.job_id} for (s, a), j in zip(items, jobs)]
  path = epath.Path(slurm_folder(workdir, study.name)) / "jobs.json"
  known = json.loads(path.read_text()) if path.exists() else []
  ours = {(j["arm"], j["seed"]) for j in submitted}
  kept = [j for j in known if (j["arm"], j["seed"]) not in ours] + submitted
  metrics.write_atomically(path, json.dumps(kept, indent=1))
  return submitted


def scheduler_states(job_ids: list[str]) -> dict[str, str]:
  """{job id: SLURM state} of the jobs squeue still lists (PENDING, RUNNING, REQUEUED, ...);
  empty without squeue."""
  if not job_ids or shutil.which("squeue") is None:
    return {}
  arrays = sorted({j.split("_")[0] for j in job_ids})
  out = subprocess.run(
      ["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(arrays)],
      capture_output=True,
      text=True,
      check=False,
  )
  states = {}
  for line in out.stdout.splitlines():
    parts = line.split()
    if len(parts) == 2:
      states[parts[0]] = parts[1]
  return states


# ---- Status.


def status(study, seeds: int, workdir: str, results: str, only=None) -> list[dict]:
  """Each arm-seed's state, from its record, its run directory and the scheduler: done (a
  record), running (a live claim, or SLURM runs its task), failed (its last attempt failed and
  nothing runs it: "error" and the log's "last_line"), else pending (with SLURM's state of its
  task where it has one). Rows: {"arm", "seed", "state", "job_id", "detail"}."""
  jobs_path = epath.Path(slurm_folder(workdir, study.name)) / "jobs.json"
  jobs = {}
  if jobs_path.exists():
    jobs = {(j["arm"], j["seed"]): j["job_id"] for j in json.loads(jobs_path.read_text())}
  states = scheduler_states(list(jobs.values()))
  rows = []
  for s, a in arm_seeds(study, seeds, only):
    directory = run_dir(workdir, a.name, s)
    job = jobs.get((a.name, s))
    queued = states.get(job) if job else None
    detail = queued or ""
    if recorded(results, a.name, s):
      state = "done"
    elif is_claimed(directory) or queued in ("RUNNING", "COMPLETING"):
      state = "running"
    elif (directory / FAILED_FILE).exists() and queued is None:
      failure = json.loads((directory / FAILED_FILE).read_text())
      state = "failed"
      detail = failure["error"] + (
          f"; log: {failure['last_line']}" if failure.get("last_line") else ""
      )
    else:
      state = "pending"
    rows.append({"arm": a.name, "seed": s, "state": state, "job_id": job, "detail": detail})
  return rows


def status_table(study_name: str, rows: list[dict]) -> str:
  """status's rows as text, one line per arm-seed, and the count of each state."""
  lines = [f"{study_name}:"]
  for r in rows:
    job = f" (SLURM {r['job_id']})" if r["job_id"] else ""
    detail = f": {r['detail']}" if r["detail"] else ""
    lines.append(f"  {r['arm']} seed {r['seed']}: {r['state']}{job}{detail}")
  counts = {state: sum(r["state"] == state for r in rows) for state in STATES}
  lines.append("  " + ", ".join(f"{n} {state}" for state, n in counts.items()))
  return "\n".join(lines)


def local_worker_commands(argv: list[str], n: int) -> tuple[list[list[str]], list[dict]]:
  """The commands and environments of n local workers of this study command (`argv`, without
  its --workers): each `python -m cl_jax.study ... --worker_cores=C` pinned to its share of
  this process's cores, with its share of the GPUs (worker_shares)."""
  shares = worker_shares(n, sorted(os.sched_getaffinity(0)), visible_gpus())
  cmds, envs = [], []
  for share in shares:
    cores = ",".join(map(str, share["cores"]))
    cmds.append([sys.executable, "-m", "cl_jax.study", *argv, f"--worker_cores={cores}"])
    envs.append({**os.environ, **share["env"]})
  return cmds, envs
