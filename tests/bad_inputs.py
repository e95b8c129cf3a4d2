"""Every command's bad inputs, each tried in a subprocess: exit status and first error line.

Used by tests/test_bad_inputs.py; as a script it prints the table (markdown):

  python -m tests.bad_inputs [--root=DIR]

A case is (name, command arguments, the phrase its one error line must hold). The
workdirs are made under the root: a missing one, an empty one, a half-written one
(config.json but no checkpoint), one whose only checkpoint is an unfinished save,
and a finished tiny run (made once, for the cases that need a good run).
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from tests import tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READERS = ("probe", "knn", "export", "viz", "normstd")
SMALL_RUN = (
    *tiny_run.FLAGS,
    "--config.optim.epochs=1",
    "--config.train.checkpoint_every=8",
    "--probe=false",
)


def _reader(command: str, workdir: str) -> list[str]:
  """The arguments of read-only job `command` on `workdir`."""
  if command == "viz":
    return ["cl_jax.viz", workdir]
  if command == "normstd":
    return ["cl_jax.analysis.normstd", f"--workdir={workdir}"]
  if command == "export":
    return ["cl_jax.export", f"--workdir={workdir}", "--format=flax"]
  if command == "knn":
    return ["cl_jax.evaluate", f"--workdir={workdir}", "--evaluator=knn"]
  return [f"cl_jax.{command}", f"--workdir={workdir}"]


def make_workdirs(root: str) -> dict[str, str]:
  """{kind: path} of the bad workdirs (and a finished tiny run) under `root`."""
  paths = {k: os.path.join(root, k) for k in ("missing", "empty", "half", "unfinished", "good")}
  os.makedirs(paths["empty"], exist_ok=True)
  os.makedirs(paths["half"], exist_ok=True)
  good = paths["good"]
  if not os.path.isdir(os.path.join(good, "checkpoints")):
    done = subprocess.run(
        [sys.executable, "-m", "cl_jax.main", f"--workdir={good}", *SMALL_RUN],
        cwd=ROOT,
        env=tiny_run.env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
  with open(os.path.join(good, "config.json")) as f:
    config = json.load(f)
  with open(os.path.join(paths["half"], "config.json"), "w") as f:
    json.dump(config, f)
  unfinished = os.path.join(paths["unfinished"], "checkpoints", "8.orbax-checkpoint-tmp")
  os.makedirs(unfinished, exist_ok=True)
  with open(os.path.join(paths["unfinished"], "config.json"), "w") as f:
    json.dump(config, f)
  return paths


def cases(root: str) -> list[tuple[str, list[str], str]]:
  """(name, arguments after `python -m`, a phrase the error line must contain)."""
  paths = make_workdirs(root)
  bad_config = os.path.join(root, "syntax_error.py")
  with open(bad_config, "w") as f:
    f.write("def get_config(:\n  return None\n")
  a_file = os.path.join(root, "a_file")
  open(a_file, "w").close()
  train = ["cl_jax.main", *SMALL_RUN]
  out = []
  for command in READERS:
    no_checkpoint = "has no logged metrics" if command == "viz" else "no checkpoint in"
    for kind, phrase in (
        ("missing", "does not exist"),
        ("empty", "holds no cl_jax pretraining run"),
        ("half", no_checkpoint),
        ("unfinished", no_checkpoint),
    ):
      out.append((f"{command}: {kind} workdir", _reader(command, paths[kind]), phrase))
  out += [
      (
          "evaluate: missing workdir",
          ["cl_jax.evaluate", f"--workdir={paths['missing']}", "--evaluator=robustness"],
          "does not exist",
      ),
      (
          "main: config file with a syntax error",
          ["cl_jax.main", f"--config={bad_config}", f"--workdir={root}/w0"],
          "has a syntax error at line 1",
      ),
      (
          "main: batch that does not divide over the 4 devices",
          [
              *train,
              "--config.optim.batch_size=30",
              "--config.model.bn_groups=2",
              f"--workdir={root}/w1",
          ],
          "must be divisible by the number of devices (4)",
      ),
      (
          "main: BN groups that do not divide the batch",
          [*train, "--config.optim.batch_size=30", f"--workdir={root}/w1"],
          "must divide optim.batch_size = 30",
      ),
      (
          "main: config file with an unknown preset",
          ["cl_jax.main", "--config=configs/mocov2.py:nopreset", f"--workdir={root}/w0"],
          "unknown preset 'nopreset'",
      ),
      (
          "main: unknown config field",
          [*train, "--config.moco.temprature=0.3", f"--workdir={root}/w0"],
          "did you mean moco.temperature?",
      ),
      (
          "main: workdir path with spaces and non-ASCII characters (works)",
          [*train, "--stop_at_step=1", f"--workdir={root}/a run é/x"],
          "",
      ),
      (
          "probe: a finished run (works)",
          ["cl_jax.probe", f"--workdir={paths['good']}", "--baseline=false"],
          "",
      ),
      (
          "main: queue not a multiple of the batch",
          [*train, "--config.moco.queue_size=100", f"--workdir={root}/w2"],
          "queue_size",
      ),
      (
          "main: width multiplier too small for a channel",
          [*train, "--config.model.width_multiplier=0.01", f"--workdir={root}/w3"],
          "64 x width_multiplier (the stem's channels) must be a positive integer",
      ),
      ("main: workdir is a file", [*train, f"--workdir={a_file}"], "is a file"),
      (
          "main: --stop_signal that is no signal",
          [*train, "--stop_signal=USR9", f"--workdir={root}/w4"],
          "not a signal name",
      ),
      (
          "make_texture: --out is an existing file",
          ["cl_jax.data.make_texture", f"--out={a_file}", "--dataset=trifeature"],
          "is a file",
      ),
      (
          "bench: batch that does not divide over the 4 devices",
          [
              "cl_jax.bench.step",
              "--config=configs/mocov2_patchns.py",
              "--config.optim.batch_size=30",
              "--devices=4",
          ],
          "must be divisible by the number of devices (4)",
      ),
      (
          "bench --input=jpeg: --jpeg_dir is an existing file",
          [
              "cl_jax.bench.step",
              "--config=configs/mocov2_patchns.py",
              "--input=jpeg",
              f"--jpeg_dir={a_file}",
          ],
          "is a file; give a folder",
      ),
      (
          "bench_report: no timed steps",
          ["cl_jax.bench.report", "--config=configs/mocov2.py", "--steps=0", f"--out={root}/b"],
          "--steps=0: 0 is not a positive integer",
      ),
      (
          "bench_augment: view size 0",
          ["cl_jax.bench.augment", "--size=0"],
          "--size=0: 0 is not a positive integer",
      ),
      (
          "study: unknown study",
          ["cl_jax.study", "--study=nosuch", f"--results={root}/r"],
          "no study 'nosuch'",
      ),
      (
          "study: --report_only on a folder without records",
          ["cl_jax.study", "--study=ge_alpha", "--report_only", f"--results={root}/r"],
          "no records of ge_alpha",
      ),
      (
          "study: --set of an unknown field",
          ["cl_jax.study", "--study=ge_alpha", "--set=model.nope=3", f"--results={root}/r"],
          "unknown config field model.nope",
      ),
      (
          "evaluate: unknown evaluator",
          ["cl_jax.evaluate", f"--workdir={paths['good']}", "--evaluator=nosuch"],
          "evaluator must be one of",
      ),
      (
          "tiny_imagenet: a missing zip",
          ["cl_jax.data.tiny_imagenet", f"--zip={root}/none.zip", f"--data_dir={root}/d"],
          "--zip must be the official tiny-imagenet-200.zip",
      ),
  ]
  if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None:
    out.append(
        (
            "bench_torch: PyTorch or torchvision not installed",
            ["cl_jax.bench.torch_reference", "--config=configs/mocov2.py"],
            "needs PyTorch and torchvision",
        )
    )
  return out


def devices(name: str) -> int:
  """Simulated CPU devices for case `name` (4 where it says so)."""
  return 4 if "4 devices" in name else 1


def judge(proc: subprocess.CompletedProcess, phrase: str) -> bool:
  """Whether the case behaved: a phrase means one error line holding it and a non-zero
  exit; an empty phrase means the command works (exit 0, no traceback)."""
  if not phrase:
    return proc.returncode == 0 and "Traceback" not in proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  return proc.returncode != 0 and len(lines) == 1 and phrase in lines[0]


def try_case(args: list[str], env_devices: int = 1) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "-m", *args],
      cwd=ROOT,
      env=tiny_run.env(env_devices),
      capture_output=True,
      text=True,
      timeout=900,
  )


def first_error_line(proc: subprocess.CompletedProcess) -> str:
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  return lines[0] if lines else ""


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default=None, help="folder for the workdirs (default: a tmp dir)")
  args = parser.parse_args()
  root = args.root or tempfile.mkdtemp(prefix="cl_jax_bad_inputs_")
  print("| case | exit | stderr lines | traceback | first error line |")
  print("|---|---|---|---|---|")
  bad = 0
  for name, command, phrase in cases(root):
    proc = try_case(command, devices(name))
    ok = judge(proc, phrase)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    bad += not ok
    line = first_error_line(proc).replace(root, "<root>").replace("|", "\\|")
    print(
        f"| {name} | {proc.returncode} | {len(lines)} | "
        f"{'yes' if 'Traceback' in proc.stderr else 'no'} | {line[:160]} |"
        + ("" if ok else " **FAIL**"),
        flush=True,
    )
  print(f"{bad} case(s) failed")
  sys.exit(1 if bad else 0)


if __name__ == "__main__":
  main()
