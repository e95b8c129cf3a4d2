"""The tiny runs shared by the subprocess tests: the pretraining run's flags, environment and
processes (one, or several joined on localhost), and the benchmarks' flags."""

import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# MoCo-v2 + patch negatives on 16 px Trifeature, ResNet-10 x0.125, batch 32 (8 steps/epoch).
FLAGS = [
    "--config=configs/mocov2_patchns.py",
    "--config.data.image_size=16",
    "--config.data.trifeature_train=256",
    "--config.data.trifeature_test=128",
    "--config.model.depth=10",
    "--config.model.width_multiplier=0.125",
    "--config.model.head_hidden_dim=32",
    "--config.model.head_out_dim=16",
    "--config.moco.queue_size=128",
    "--config.nonsemantic.patch_min=2",
    "--config.nonsemantic.patch_max=6",
    "--config.optim.batch_size=32",
    "--config.train.log_every=1",
]

# Plain MoCo-v2 (patch negatives off) on 16 px, ResNet-10 x0.125, batch 16: the benchmark tests
# (tests/test_bench.py, test_bench_report.py, test_bench_torch.py) time this one program.
BENCH_FLAGS = [
    "--config=configs/mocov2_patchns.py",
    "--config.data.image_size=16",
    "--config.model.depth=10",
    "--config.model.width_multiplier=0.125",
    "--config.model.head_hidden_dim=16",
    "--config.model.head_out_dim=8",
    "--config.moco.queue_size=256",
    "--config.optim.batch_size=16",
    "--config.nonsemantic.enabled=False",
]


def env(devices: int = 1) -> dict:
  """The test process's environment (its XLA_FLAGS included: tests/conftest.py) with `devices`
  simulated CPU devices."""
  out = dict(os.environ)
  out["JAX_NUM_CPU_DEVICES"] = str(devices)
  out["JAX_PLATFORMS"] = "cpu"
  return out


def free_port() -> int:
  """A TCP port on localhost that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def command(workdir, flags) -> list[str]:
  """`python -m cl_jax.main --workdir=workdir *flags` as an argument list."""
  return [sys.executable, "-m", "cl_jax.main", f"--workdir={workdir}", *flags]


def start(workdir, flags, processes: int = 1) -> list[subprocess.Popen]:
  """`python -m cl_jax.main --workdir=workdir *flags` as `processes` processes (stdout and
  stderr piped, text): one on one CPU device, or several with 2 CPU devices each, joined
  by jax.distributed through a coordinator on localhost."""
  one = command(workdir, flags)
  if processes == 1:
    commands, devices = [one], 1
  else:
    port = free_port()
    commands = [
        one
        + [
            f"--coordinator_address=localhost:{port}",
            f"--num_processes={processes}",
            f"--process_id={i}",
        ]
        for i in range(processes)
    ]
    devices = 2
  return [
      subprocess.Popen(
          c,
          cwd=ROOT,
          env=env(devices),
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for c in commands
  ]


# The finished run the read-only tests share (tests/conftest.py, fixture `finished_run`): 2 epochs
# = 16 steps, checkpoints at steps 12 and 16, the kNN monitor at steps 8 and 16, and the fast
# probe's report (with its random-init baseline) at step 16. A ResNet-18, which torchvision
# also builds, so that its export is checked too.
FINISHED = [
    *FLAGS,
    "--config.model.depth=18",
    "--config.optim.epochs=2",
    "--config.train.checkpoint_every=4",
    "--config.eval.every=8",
    "--config.eval.knn_k=20",
    "--config.probe.epochs=5",
    "--config.probe.batch_size=64",
    "--config.probe.decay_epochs=(3,)",
]
