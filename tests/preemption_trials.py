"""Stop requests at random moments of the tiny run, each resumed and compared with a run that
was never stopped: the exit status, the one stderr line, no orbax tmp folder left, one metrics
row per step, and a final train state equal bit for bit.

Used by tests/test_cluster_faults.py and tests/test_multihost.py; as a script it runs N trials
and prints one row per trial:

  python -m tests.preemption_trials --trials=10 [--signal=TERM] [--seed=0] [--processes=2]

With --processes=2 the run is 2 processes x 2 CPU devices joined on localhost, and each trial
signals one of them, chosen at random.
"""

import argparse
import glob
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from cl_jax.runtime import logs, metrics
from tests import tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 48 steps, a checkpoint every 4, the kNN monitor every 8 (so a signal can land in it).
KNN_EVERY = 8
EXTRA = (
    "--config.optim.epochs=6",
    "--config.train.checkpoint_every=4",
    f"--config.eval.every={KNN_EVERY}",
    "--config.eval.knn_k=20",
    "--probe=false",
)
TOTAL = 48


def command(workdir, *extra) -> list[str]:
  """The tiny run's command line (one process) with the `extra` flags."""
  return tiny_run.command(workdir, [*tiny_run.FLAGS, *EXTRA, *extra])


def start(workdir, *extra, processes: int = 1) -> list:
  """The tiny run with the `extra` flags, started as `processes` processes (tiny_run.start)."""
  return tiny_run.start(workdir, [*tiny_run.FLAGS, *EXTRA, *extra], processes)


def wait_for_checkpoint(workdir, proc, step: int | None = None) -> None:
  """Return once the run has a finished checkpoint (at `step`, if given), or `proc` ended,
  or 600 s passed."""
  deadline = time.time() + 600
  while time.time() < deadline and proc.poll() is None:
    done = steps(workdir)
    if done if step is None else step in done:
      return
    time.sleep(0.02)


def run(workdir, *extra, processes: int = 1, timeout=900) -> subprocess.CompletedProcess:
  """The tiny run to its end, as `processes` processes (tiny_run.start); the exit status is
  the first non-zero one, stdout and stderr those of all processes in turn (`.stdouts`: each
  process's stdout)."""
  procs = start(workdir, *extra, processes=processes)
  outs = [p.communicate(timeout=timeout) for p in procs]
  done = subprocess.CompletedProcess(
      procs[0].args,
      next((p.returncode for p in procs if p.returncode), 0),
      "".join(o for o, _ in outs),
      "".join(e for _, e in outs),
  )
  done.stdouts = [o for o, _ in outs]  # each process's own
  return done


def steps(workdir) -> list[int]:
  """The finished checkpoints' steps."""
  return sorted(
      int(os.path.basename(p))
      for p in glob.glob(os.path.join(workdir, "checkpoints", "*"))
      if os.path.basename(p).isdigit()
  )


def tmp_folders(workdir) -> list[str]:
  """Unfinished orbax saves left in the checkpoints folder."""
  return glob.glob(os.path.join(workdir, "checkpoints", "*tmp*"))


def final_state(workdir) -> dict:
  """The train state of the run's last checkpoint, as numpy arrays."""
  path = os.path.join(workdir, "checkpoints", str(steps(workdir)[-1]), "state")
  checkpointer = ocp.PyTreeCheckpointer()
  with logs.quiet():  # orbax notes the step folder's metadata file, read here from below it
    tree = checkpointer.metadata(path).item_metadata.tree
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  return checkpointer.restore(path, restore_args=as_numpy)  # on any devices, as saved


def same_state(a: dict, b: dict) -> bool:
  """Whether two train states hold the same arrays, bit for bit."""
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  return ta == tb and all(
      x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
      for x, y in zip(la, lb)
  )


def _read_lines(stream, into: list) -> None:
  """Append (arrival time, line) for every line of `stream` until it closes."""
  for line in stream:
    into.append((time.monotonic(), line))


def own_lines(stderr: str) -> list[str]:
  """cl_jax's lines of a stopped process's stderr: without the C++ note that JAX's
  preemption notifier prints in a signalled process of a multi-process run."""
  return [l for l in stderr.strip().splitlines() if "preemption_notifier.cc" not in l]


def _phase(signalled_at: float, lines: list, workdir) -> str:
  """What the run was doing at `signalled_at`: 'knn' if it fell inside a kNN evaluation
  (which ends just before its step's line is printed and took knn/seconds), 'save' if an
  orbax tmp folder existed then (set by the caller), else 'step'."""
  rows = {r["step"]: r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))}
  for arrived, line in lines:
    progress = re.match(r"step (\d+)/", line)  # a progress line, not a notice "step N: ..."
    if progress is None:
      continue
    step = int(progress.group(1))
    seconds = rows.get(step, {}).get("knn/seconds")
    if seconds is not None and arrived - seconds <= signalled_at <= arrived:
      return "knn"
  return "step"


def _wait_for(moment: tuple, workdir, lines: list, proc) -> None:
  """Return at `moment` of the run: ("delay", s) s seconds after its first checkpoint;
  ("save", n) as soon as its n-th save is under way (an orbax tmp folder exists);
  ("knn", k) just after the step before its k-th kNN evaluation was logged (the kNN
  monitor runs at the end of every KNN_EVERY-th step)."""
  kind, value = moment
  deadline = time.time() + 600

  def running() -> bool:
    return time.time() < deadline and proc.poll() is None

  if kind == "delay":
    wait_for_checkpoint(workdir, proc)
    time.sleep(value)
  elif kind == "save":
    seen = set()
    while running() and len(seen) < value:
      seen.update(tmp_folders(workdir))
      time.sleep(0.001)
  elif kind == "knn":
    before = f"step {KNN_EVERY * value - 1}/"
    while running() and not any(line.startswith(before) for _, line in lines):
      time.sleep(0.001)
    time.sleep(0.1)  # into the next step (about 30 ms here), whose end runs the kNN (0.2-0.4 s)
  else:
    raise ValueError(f"unknown moment {moment}")


def stop_once(workdir, moment: tuple, sig: int, *extra: str, processes=1, target=0) -> dict:
  """Start the run as `processes` processes, send `sig` to process `target` at `moment`
  (_wait_for, timed on process 0's output), and wait for all to end: {status, stderr (one
  per process), phase (what the run was doing when signalled: 'knn' inside the kNN
  monitor, 'save' while an orbax tmp folder existed, else 'step'), saved (per process,
  the checkpoint step its line names, or None)}."""
  procs = start(workdir, *extra, processes=processes)
  lines, errs = [], [[] for _ in procs]
  readers = [
      threading.Thread(target=_read_lines, args=(p.stdout, lines if i == 0 else []), daemon=True)
      for i, p in enumerate(procs)
  ] + [
      threading.Thread(target=_read_lines, args=(p.stderr, err), daemon=True)
      for p, err in zip(procs, errs)
  ]
  for r in readers:
    r.start()
  _wait_for(moment, workdir, lines, procs[0])
  saving = bool(tmp_folders(workdir))
  signalled_at = time.monotonic()
  procs[target].send_signal(sig)
  for p in procs:
    p.wait(timeout=600)
  for r in readers:
    r.join(timeout=60)
  phase = _phase(signalled_at, lines, workdir)
  if phase == "step" and saving:
    phase = "save"
  stderrs = ["".join(line for _, line in err) for err in errs]
  saved = [
      int(e.split("saved a checkpoint at step ")[1].split(".")[0])
      if "saved a checkpoint at step " in e
      else None
      for e in stderrs
  ]
  return {
      "status": [p.returncode for p in procs],
      "stderr": stderrs,
      "phase": phase,
      "saved": saved,
  }


def trial(
    workdir, moment: tuple, sig: int, reference: dict, *extra, processes=1, target=0, total=TOTAL
):
  """stop_once at `moment` (with the `extra` flags), then the run's command again to the
  end, `total` steps (the `extra` flags may shorten the run); the checks as booleans (a
  signal that came after the last step ends nothing). The
  signalled process exits with 128 + `sig`; in a multi-process run the others stop at
  the same step for JAX's preemption service's SIGTERM (143)."""
  stopped = stop_once(workdir, moment, sig, *extra, processes=processes, target=target)
  finished_early = stopped["status"] == [0] * processes  # the signal came after the last step
  want_status = [128 + (sig if i == target else signal.SIGTERM) for i in range(processes)]
  lines = [own_lines(e) for e in stopped["stderr"]]
  # A signal after the loop (its last save done) ends the process at once, with its own line.
  outside = processes == 1 and "outside the training loop" in stopped["stderr"][0]
  after_stop = {
      "one_line": finished_early
      or all(len(l) == 1 and "Traceback" not in e for l, e in zip(lines, stopped["stderr"])),
      "status_ok": finished_early or stopped["status"] == want_status,
      "saved_is_latest": finished_early
      or outside
      or stopped["saved"] == [steps(workdir)[-1]] * processes,
      "no_tmp_after_stop": not tmp_folders(workdir),
  }
  resumed = run(workdir, *extra, processes=processes)
  rows = [r["step"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
  checks = {
      **after_stop,
      "resumed_ok": resumed.returncode == 0,
      "one_row_per_step": rows == list(range(1, total + 1)),
      "no_tmp_at_end": not tmp_folders(workdir),
      "state_bit_identical": same_state(final_state(workdir), reference),
  }
  return {
      "phase": "after the loop" if outside else stopped["phase"],
      "saved": stopped["saved"][target],
      "status": stopped["status"],
      "line": lines[target][0] if lines[target] else "",
      "checks": checks,
      "resume_stderr": resumed.stderr[-2000:],
      "resume_stdouts": resumed.stdouts,
  }


def reference_run(workdir, processes: int = 1) -> tuple[float, float]:
  """Run the tiny run to its end, never stopped: (its seconds, the seconds from its first
  checkpoint to its end, the window in which a random stop lands inside training)."""
  started = time.time()
  procs = start(workdir, processes=processes)
  wait_for_checkpoint(workdir, procs[0])
  first = time.time()
  outs = [p.communicate(timeout=900) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  end = time.time()
  return end - started, end - first


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=10)
  parser.add_argument(
      "--signal", default="TERM", help="TERM, or another name given to --stop_signal"
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
      "--processes", type=int, default=1, help="1, or 2 (x 2 devices, one signalled)"
  )
  parser.add_argument("--root", default=None, help="folder for the runs (default: a tmp dir)")
  args = parser.parse_args()
  import tempfile

  root = args.root or tempfile.mkdtemp(prefix="cl_jax_preemption_")
  sig = signal.Signals["SIG" + args.signal.upper().removeprefix("SIG")]
  straight = os.path.join(root, "straight")
  run_s, span_s = reference_run(straight, args.processes)
  reference = final_state(straight)
  rng = random.Random(args.seed)
  window = round(0.6 * span_s, 1)  # a stop late in the window may come after the last step
  print(
      f"reference run ({args.processes} process(es)): {run_s:.0f} s, {span_s:.1f} s of them "
      f"after the first checkpoint; {args.trials} trials of {sig.name}, in turn at a random "
      f"moment of training (0-{window} s after the first checkpoint), during the n-th save "
      "(n in 1..10), and during the k-th kNN evaluation (k in 1..5)"
  )
  print("| trial | moment | signalled | phase | exit | saved at | checks failed | stderr line |")
  print("|---|---|---|---|---|---|---|---|")
  failed = 0
  for i in range(args.trials):
    moment = (
        ("delay", round(rng.uniform(0, window), 2)),
        ("save", rng.randint(1, 10)),
        ("knn", rng.randint(1, 5)),
    )[i % 3]
    extra = () if sig == signal.SIGTERM else (f"--stop_signal={sig.name}",)
    target = rng.randrange(args.processes)
    got = trial(
        os.path.join(root, f"trial{i}"),
        moment,
        sig,
        reference,
        *extra,
        processes=args.processes,
        target=target,
    )
    bad = [k for k, ok in got["checks"].items() if not ok]
    failed += bool(bad)
    status = ", ".join(map(str, got["status"]))
    print(
        f"| {i} | {moment[0]} {moment[1]} | {target} | {got['phase']} | {status} | "
        f"{got['saved']} | "
        f"{', '.join(bad) or 'none'} | {got['line'][:90]} |",
        flush=True,
    )
  print(f"{args.trials - failed} of {args.trials} trials passed every check")
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  main()
