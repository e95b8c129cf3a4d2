"""`python -m MODULE ARGS` in a process forked from one that has already imported the libraries
every cl_jax command imports (JAX, Flax, Optax, Orbax and cl_jax's own modules), for the tests
that start many short commands and read only their exit status, stdout and stderr.

Each command still runs in a process of its own: its own exit status, its own stdout and
stderr (file descriptors 1 and 2, so C-level writes are caught), its own JAX backend with the
device count asked for, and the interpreter's normal exit (atexit handlers included). What it
saves is the import of those libraries, about 2.5 s of CPU per command on a 2-core machine.
The entry module itself is not imported before the fork: it runs as __main__, defining its
flags once, as `python -m` does.

The server is a subprocess of the test (a pytest worker has started JAX's backend and its
threads, which a fork must not copy); it answers one JSON line per request on its stdout.
"""

import atexit
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Imported once by the server: the libraries, and the cl_jax modules that define no flags.
PRELOAD = (
    "jax",
    "flax.linen",
    "optax",
    "orbax.checkpoint",
    "cl_jax.train",
    "cl_jax.evaluators.registry",
    "cl_jax.runtime.checkpoint",
)


class Server:
  """A forking server (`python -m tests.forked_commands`) started with the environment `env`
  (default: the test's); `run` is subprocess.run for `python -m MODULE ARGS` with capture_output and
  text. Close it (or use it as a context manager) to end the server."""

  def __init__(self, env: dict | None = None):
    self._proc = subprocess.Popen(
        [sys.executable, "-m", "tests.forked_commands"],
        cwd=ROOT,
        env=os.environ if env is None else env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    self._lock = threading.Lock()

  def run(self, args: list[str], devices: int = 1, timeout: float = 900):
    """`python -m *args` on `devices` CPU devices: a CompletedProcess (args, returncode,
    stdout, stderr); a command still running after `timeout` s is killed (returncode -9)."""
    with self._lock:
      request = {
          "args": list(args),
          "devices": devices,
          "timeout": timeout,
          "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
      }
      self._proc.stdin.write(json.dumps(request) + "\n")
      self._proc.stdin.flush()
      line = self._proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the forking server ended (exit {self._proc.wait()})")
    answer = json.loads(line)
    return subprocess.CompletedProcess(
        [sys.executable, "-m", *args], answer["returncode"], answer["stdout"], answer["stderr"]
    )

  def close(self) -> None:
    self._proc.stdin.close()
    self._proc.wait(timeout=60)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


_SHARED: list[Server] = []


def shared() -> Server:
  """This process's Server with the tiny run's environment (tests/tiny_run.py env()), started
  at the first call and ended when the process exits."""
  if not _SHARED:
    from tests import tiny_run

    _SHARED.append(Server(tiny_run.env()))
    atexit.register(_SHARED[0].close)
  return _SHARED[0]


def _child(request: dict, out_path: str, err_path: str) -> None:
  """In the forked process: stdout and stderr to the files, then `python -m *args` on
  `devices` CPU devices, as the test `test` asked. Never returns: SystemExit or an uncaught
  exception ends the process as the interpreter would."""
  import jax

  args, devices = request["args"], request["devices"]
  os.environ["PYTEST_CURRENT_TEST"] = request["test"]
  if "tests.suite_profile" in sys.modules:  # a profiled test run (tests/suite_profile.py)
    sys.modules["tests.suite_profile"].restart_subprocess_record(request["test"])

  for fd, path in ((1, out_path), (2, err_path)):
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, fd)
    os.close(target)
  os.environ["JAX_NUM_CPU_DEVICES"] = str(devices)
  jax.config.update("jax_num_cpu_devices", devices)
  sys.stdin = open(os.devnull)
  sys.argv = ["-m", *args[1:]]
  # What `python -m` itself calls (CPython's runpy): the same module lookup, the same one-line
  # error for a module that cannot be found, the same sys.argv[0].
  runpy._run_module_as_main(args[0])
  sys.exit(0)


def _serve() -> None:
  """Reads one request per stdin line, forks, waits, answers one JSON line on stdout."""
  import importlib
  import signal
  import time

  for name in PRELOAD:
    importlib.import_module(name)
  if "tests.suite_profile" in sys.modules:  # the server itself is not a command: no record
    sys.modules["tests.suite_profile"].restart_subprocess_record("")
  answers = sys.stdout
  for line in sys.stdin:
    request = json.loads(line)
    # Not a TemporaryDirectory: the child leaves through this frame, and must not remove it.
    tmp = tempfile.mkdtemp(prefix="cl_jax_forked_")
    out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
    pid = os.fork()
    if pid == 0:
      _child(request, out_path, err_path)
    deadline = time.monotonic() + request["timeout"]
    while True:
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        break
      if time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        break
      time.sleep(0.01)
    with open(out_path, errors="replace") as o, open(err_path, errors="replace") as e:
      answer = {"returncode": os.waitstatus_to_exitcode(status), "stdout": o.read()}
      answer["stderr"] = e.read()
    shutil.rmtree(tmp)
    answers.write(json.dumps(answer) + "\n")
    answers.flush()


if __name__ == "__main__":
  _serve()
