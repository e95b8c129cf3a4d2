"""Stop requests at random moments of the tiny run, each resumed and compared with a run that
was never stopped: the exit status, the one stderr line, no orbax tmp folder left, one metrics
row per step, and a final train state equal bit for bit.

Used by tests/test_preemption.py; as a script it runs N trials and prints one row per trial:

  python -m tests.preemption_trials --trials=10 [--signal=TERM] [--seed=0]
"""

import argparse
import glob
import os
import random
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from cl_jax import logs, metrics
from tests import tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 48 steps, a checkpoint every 4, the kNN monitor every 8 (so a signal can land in it).
KNN_EVERY = 8
EXTRA = (
    "--config.optim.epochs=6",
    "--config.train.checkpoint_every=4",
    f"--config.eval.knn_every={KNN_EVERY}",
    "--config.eval.knn_k=20",
    "--probe=false",
)
TOTAL = 48


def command(workdir, *extra) -> list[str]:
  return [
      sys.executable,
      "-m",
      "cl_jax.main",
      f"--workdir={workdir}",
      *tiny_run.FLAGS,
      *EXTRA,
      *extra,
  ]


def run(workdir, *extra, timeout=900) -> subprocess.CompletedProcess:
  return subprocess.run(
      command(workdir, *extra),
      cwd=ROOT,
      env=tiny_run.env(),
      capture_output=True,
      text=True,
      timeout=timeout,
  )


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


def _phase(signalled_at: float, lines: list, workdir) -> str:
  """What the run was doing at `signalled_at`: 'knn' if it fell inside a kNN evaluation
  (which ends just before its step's line is printed and took knn/seconds), 'save' if an
  orbax tmp folder existed then (set by the caller), else 'step'."""
  rows = {r["step"]: r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))}
  for arrived, line in lines:
    if not line.startswith("step "):
      continue
    step = int(line.split()[1].split("/")[0])
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
    while running() and not steps(workdir):
      time.sleep(0.01)
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


def stop_once(workdir, moment: tuple, sig: int, *extra: str) -> dict:
  """Start the run, send `sig` to its process at `moment` (_wait_for), and wait for it to
  end: {status, stderr, phase (what the run was doing when signalled: 'knn' inside the kNN
  monitor, 'save' while an orbax tmp folder existed, else 'step'), saved (the checkpoint
  step its line names, or None)}."""
  proc = subprocess.Popen(
      command(workdir, *extra),
      cwd=ROOT,
      env=tiny_run.env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  lines = []
  reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
  reader.start()
  _wait_for(moment, workdir, lines, proc)
  saving = bool(tmp_folders(workdir))
  signalled_at = time.monotonic()
  proc.send_signal(sig)
  err = proc.stderr.read()
  proc.wait(timeout=600)
  reader.join(timeout=60)
  phase = _phase(signalled_at, lines, workdir)
  if phase == "step" and saving:
    phase = "save"
  saved = None
  if "saved a checkpoint at step " in err:
    saved = int(err.split("saved a checkpoint at step ")[1].split(".")[0])
  return {"status": proc.returncode, "stderr": err, "phase": phase, "saved": saved}


def trial(workdir, moment: tuple, sig: int, reference: dict, *extra: str) -> dict:
  """stop_once at `moment` (with the `extra` flags), then the run's command again to the
  end; the checks as booleans (a signal that came after the last step ends nothing)."""
  stopped = stop_once(workdir, moment, sig, *extra)
  lines = stopped["stderr"].strip().splitlines()
  finished_early = stopped["status"] == 0  # the signal came after the last step
  after_stop = {
      "one_line": finished_early or (len(lines) == 1 and "Traceback" not in stopped["stderr"]),
      "status_ok": finished_early or stopped["status"] == 128 + sig,
      "saved_is_latest": finished_early or stopped["saved"] == steps(workdir)[-1],
      "no_tmp_after_stop": not tmp_folders(workdir),
  }
  resumed = run(workdir)
  rows = [r["step"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
  checks = {
      **after_stop,
      "resumed_ok": resumed.returncode == 0,
      "one_row_per_step": rows == list(range(1, TOTAL + 1)),
      "no_tmp_at_end": not tmp_folders(workdir),
      "state_bit_identical": same_state(final_state(workdir), reference),
  }
  return {
      "phase": stopped["phase"],
      "saved": stopped["saved"],
      "status": stopped["status"],
      "line": lines[0] if lines else "",
      "checks": checks,
      "resume_stderr": resumed.stderr[-2000:],
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=10)
  parser.add_argument(
      "--signal", default="TERM", help="TERM, or another name given to --stop_signal"
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--root", default=None, help="folder for the runs (default: a tmp dir)")
  args = parser.parse_args()
  import tempfile

  root = args.root or tempfile.mkdtemp(prefix="cl_jax_preemption_")
  sig = signal.Signals["SIG" + args.signal.upper().removeprefix("SIG")]
  straight = os.path.join(root, "straight")
  started = time.time()
  done = run(straight)
  assert done.returncode == 0, done.stderr[-3000:]
  run_s = time.time() - started
  reference = final_state(straight)
  rng = random.Random(args.seed)
  print(
      f"reference run: {run_s:.0f} s; {args.trials} trials of {sig.name}, in turn at a "
      "random moment of training (0-8 s after the first checkpoint), during the n-th save "
      "(n in 1..10), and during the k-th kNN evaluation (k in 1..5)"
  )
  print("| trial | moment | phase | exit | saved at | checks failed | stderr line |")
  print("|---|---|---|---|---|---|---|")
  failed = 0
  for i in range(args.trials):
    moment = (
        ("delay", round(rng.uniform(0, 8), 2)),
        ("save", rng.randint(1, 10)),
        ("knn", rng.randint(1, 5)),
    )[i % 3]
    extra = () if sig == signal.SIGTERM else (f"--stop_signal={sig.name}",)
    got = trial(os.path.join(root, f"trial{i}"), moment, sig, reference, *extra)
    bad = [k for k, ok in got["checks"].items() if not ok]
    failed += bool(bad)
    print(
        f"| {i} | {moment[0]} {moment[1]} | {got['phase']} | {got['status']} | {got['saved']} | "
        f"{', '.join(bad) or 'none'} | {got['line'][:90]} |",
        flush=True,
    )
  print(f"{args.trials - failed} of {args.trials} trials passed every check")
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  main()
