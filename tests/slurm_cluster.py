"""A one-node SLURM cluster on localhost for the launcher tests: munged, slurmctld and slurmd
from Debian's packages (`apt-get install munge slurmctld slurmd slurm-client`, which .ci/run
does), started in the foreground from a folder of their own (a new munge key, slurm.conf on free
ports, state and logs) and stopped when the tests end.

`start(folder)` returns a Cluster whose `env` (SLURM_CONF) the tests give to sbatch, squeue and
scancel. The node has this machine's cores, each task bound to the cores it asked for
(task/affinity), and allows requeueing; nothing is accounted. Without the binaries the tests
skip, unless CL_JAX_REQUIRE_SLURM=1 (CI), which makes them fail.
"""

import getpass
import os
import shutil
import socket
import subprocess
import time

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")
# A requeued job waits AuthInfo's cred_expire before it starts again (slurm.conf(5); default
# 120 s): the requeue test's task would idle two minutes. Long enough for a job step to start.
CRED_EXPIRE_S = 15


def _binary(name: str) -> str | None:
  for folder in (None, "/usr/sbin", "/usr/local/sbin"):
    found = shutil.which(name, path=folder)
    if found:
      return found
  return None


def available() -> bool:
  """Whether SLURM's daemons and clients are installed; skips the test (fails it with
  CL_JAX_REQUIRE_SLURM=1) when they are not."""
  missing = [n for n in DAEMONS + CLIENTS if _binary(n) is None]
  if not missing:
    return True
  reason = f"SLURM is not installed ({', '.join(missing)} missing): apt-get install " + (
      "munge slurmctld slurmd slurm-client"
  )
  if os.environ.get("CL_JAX_REQUIRE_SLURM") == "1":
    pytest.fail(reason)
  pytest.skip(reason)
  return False


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Cluster:

  def __init__(self, folder: str, processes: list, env: dict):
    self.folder, self.processes, self.env = folder, processes, env

  def run(self, *args: str) -> subprocess.CompletedProcess:
    """A SLURM client command with this cluster's configuration."""
    return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=False)

  def stop(self) -> None:
    for proc in reversed(self.processes):
      proc.terminate()
    for proc in reversed(self.processes):
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        proc.kill()

  def logs(self) -> str:
    """The daemons' log tails, for a failed test's message."""
    out = []
    for name in ("slurmctld.log", "slurmd.log"):
      path = os.path.join(self.folder, name)
      if os.path.exists(path):
        with open(path) as f:
          out.append(f"--- {name}\n" + "".join(f.readlines()[-30:]))
    return "\n".join(out)


def start(folder: str) -> Cluster:
  """Start the cluster in `folder`; returns it once its node is idle (or fails the test)."""
  os.makedirs(os.path.join(folder, "state"), exist_ok=True)
  os.makedirs(os.path.join(folder, "spool"), exist_ok=True)
  os.makedirs(os.path.join(folder, "munge"), exist_ok=True)
  key = os.path.join(folder, "munge.key")
  with open(key, "wb") as f:
    f.write(os.urandom(128))
  os.chmod(key, 0o600)
  socket_path = os.path.join(folder, "munge", "munge.socket")
  user, node = getpass.getuser(), socket.gethostname()
  conf = os.path.join(folder, "slurm.conf")
  with open(conf, "w") as f:
    f.write(f"""ClusterName=cljaxtest
SlurmctldHost={node}(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={socket_path},cred_expire={CRED_EXPIRE_S}
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=30
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=4000 State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
  env = {**os.environ, "SLURM_CONF": conf}
  processes = []
  cluster = Cluster(folder, processes, env)
  log = open(os.path.join(folder, "daemons.out"), "w")
  munged = [_binary("munged"), "-F", "-f", f"--socket={socket_path}", f"--key-file={key}"]
  munged += [f"--log-file={folder}/munged.log", f"--pid-file={folder}/munged.pid"]
  munged += [f"--seed-file={folder}/munged.seed"]
  processes.append(subprocess.Popen(munged, stdout=log, stderr=log, env=env))
  for _ in range(50):
    if os.path.exists(socket_path):
      break
    time.sleep(0.1)
  processes.append(
      subprocess.Popen([_binary("slurmctld"), "-D", "-f", conf], stdout=log, stderr=log, env=env)
  )
  time.sleep(1)
  processes.append(
      subprocess.Popen(
          [_binary("slurmd"), "-D", "-f", conf, "-N", node], stdout=log, stderr=log, env=env
      )
  )
  for _ in range(60):
    out = cluster.run("sinfo", "-h", "-o", "%T")
    if out.stdout.strip() == "idle":
      return cluster
    time.sleep(0.5)
  cluster.stop()
  pytest.fail(
      f"the test SLURM cluster did not start: sinfo says {out.stdout!r} {out.stderr!r}\n"
      + cluster.logs()
  )
