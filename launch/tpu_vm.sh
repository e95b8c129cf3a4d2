#!/usr/bin/env bash
# Cloud TPU VM lifecycle for cl_jax: create a TPU VM (one host or a multi-host pod slice), install
# cl_jax on every worker, start the same training command on all workers, stream their logs,
# delete the VM. `launch/tpu_vm.sh --help` lists the subcommands and options.
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# Layout on every worker, relative to the login user's home directory.
readonly REMOTE_CODE="cl_jax"
readonly REMOTE_VENV="cl_jax_venv"
readonly REMOTE_LOG="cl_jax_logs/run.log"
readonly REMOTE_PID="cl_jax_logs/run.pid"
# requirements.txt is pinned for Python 3.11 (jax 0.10.2 needs >= 3.11); the Ubuntu 22.04 TPU
# images ship 3.10, so install pulls python3.11 from the Ubuntu archive.
readonly PYTHON="python3.11"
readonly JAX_TPU="jax[tpu]==0.10.2"
# TensorBoard event files on a gs:// workdir (tensorboardX writes them through this client).
readonly GCS_CLIENT="google-cloud-storage==3.17.1"

usage() {
  cat <<EOF
Usage: launch/$PROG SUBCOMMAND [OPTIONS] [-- CL_JAX_MAIN_ARGS...]

Subcommands:
  create    create the TPU VM
  install   put cl_jax on every worker and install it into ~/$REMOTE_VENV
            (Python 3.11, requirements.txt, then "$JAX_TPU")
  run       start python -m cl_jax.main on all workers in the background (nohup), each worker
            appending to its own ~/$REMOTE_LOG; multi-worker slices add --multihost
  logs      stream the logs of all workers until the run ends (lines prefixed by worker host)
  probe     after a multi-worker run: the linear probe and the backbone's export (flax and
            torchvision) as a single-host job on worker 0, on that worker's 4 chips, into the
            workdir (a single-worker run probes at the end of its own run)
  delete    delete the TPU VM
  all       create, install, run, logs, probe (multi-worker types), delete (the VM is deleted
            also when a step fails or the script is interrupted)

Options (OPTION VALUE or OPTION=VALUE):
  --name NAME               TPU VM name (all subcommands)
  --zone ZONE               zone, e.g. us-central2-b (all subcommands)
  --project PROJECT         Google Cloud project (default: gcloud's configured project)
  --accelerator-type TYPE   v2-N, v3-N, v4-N, v5p-N, v5litepod-N or v6e-N, e.g. v4-32,
                            v5litepod-16 (create, run, all)
  --version VERSION         TPU runtime image (create, all); default by type:
                            v2/v3/v4 tpu-ubuntu2204-base, v5litepod v2-alpha-tpuv5-lite,
                            v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e
  --spot                    create a Spot TPU VM
  --preemptible             create a preemptible TPU VM (not with --spot)
  --repo REPO               git URL to clone on the workers, or a local cl_jax checkout whose
                            cl_jax/, configs/ and requirements.txt are copied with
                            gcloud ... scp --worker=all (default: $DEFAULT_REPO)
  --config CONFIG           configs/NAME.py[:preset], relative to the repository (run, all)
  --workdir DIR             run directory (run, all): a gs:// path, which multi-worker slices
                            require (every worker writes checkpoints there), or an absolute
                            path on the VM for a single-worker type
  --batch-per-chip N        images per chip (run, all: --config.optim.batch_per_chip=N; the
                            global batch is N x chips and the lr follows it)
  --dry-run                 print every command, one per line and shell-quoted, instead of
                            running it (gcloud need not be installed); run and all also print,
                            on stderr, the per-chip batch, global batch and lr of the run
                            (python -m cl_jax.batch_plan)
  -h, --help                this message

Arguments after -- go to python -m cl_jax.main unchanged, e.g. -- --config.optim.epochs=100

Starting run again with the same --workdir resumes from the workdir's latest checkpoint.

Preemption (--spot, --preemptible, or a Spot queued resource): the workers get SIGTERM when the
VM is preempted, with a short grace period (about 30 s on Spot VMs). Every process stops at one
step and saves a checkpoint to the gs:// workdir if the save fits in the grace period; otherwise
the previous periodic checkpoint is the one kept (a half-written save never replaces it). The
slice is gone (state PREEMPTED): delete it (all deletes it itself), then create, install and run,
or all, with the same --workdir; the run resumes from its newest checkpoint. A preempted queued
resource is not provisioned again: delete it and request a new one. A workdir on the VM's own
disk goes with the VM: use gs:// on Spot and preemptible VMs.
EOF
}



# Runs a command, or prints it (one line, quoted) under --dry-run.
invoke() {
  if [[ $DRY_RUN == true ]]; then
    printf '%s\n' "$(quote_words "$@")"
  else
    "$@"
  fi
}


require_set() {  # OPTION VALUE: VALUE must be non-empty for this subcommand.
  [[ -n $2 ]] || die "$SUBCOMMAND needs $1 (see --help)"
}

# Prints the number of TPU VM workers (hosts) of an accelerator type. v2/v3/v4/v5p types count
# TensorCores, 8 per host; v5litepod/v6e types count chips: up to 8 on one host, 4 per host beyond.
workers_of() {
  local type=$1 family size
  if [[ ! $type =~ ^(v2|v3|v4|v5p|v5litepod|v6e)-([1-9][0-9]*)$ ]]; then
    die "--accelerator-type '$type' is not one of v2-N, v3-N, v4-N, v5p-N, v5litepod-N, v6e-N"
  fi
  family=${BASH_REMATCH[1]}
  size=${BASH_REMATCH[2]}
  case $family in
    v2 | v3 | v4 | v5p)
      ((size % 8 == 0)) || die "--accelerator-type '$type': $family sizes are multiples of 8 TensorCores"
      printf '%d' $((size / 8))
      ;;
    *)
      if ((size <= 8)); then
        printf '1'
      else
        ((size % 4 == 0)) || die "--accelerator-type '$type': $family slices above 8 chips are multiples of 4"
        printf '%d' $((size / 4))
      fi
      ;;
  esac
}

# Prints the number of chips of an accelerator type (v2/v3/v4/v5p types count TensorCores, 2 per
# chip; v5litepod/v6e types count chips).
chips_of() {
  local type=$1
  workers_of "$type" >/dev/null
  [[ $type =~ ^(v2|v3|v4|v5p|v5litepod|v6e)-([1-9][0-9]*)$ ]]
  case ${BASH_REMATCH[1]} in
    v2 | v3 | v4 | v5p) printf '%d' $((BASH_REMATCH[2] / 2)) ;;
    *) printf '%d' "${BASH_REMATCH[2]}" ;;
  esac
}

default_version() {  # ACCELERATOR_TYPE -> runtime image recommended for JAX on that generation.
  case ${1%%-*} in
    v2 | v3 | v4) printf 'tpu-ubuntu2204-base' ;;
    v5litepod) printf 'v2-alpha-tpuv5-lite' ;;
    v5p) printf 'v2-alpha-tpuv5' ;;
    v6e) printf 'v2-alpha-tpuv6e' ;;
  esac
}

is_git_url() {
  [[ $1 == *://* || $1 == git@*:* ]]
}

gcloud_tpu() {  # SUBCOMMAND ARGS...: gcloud compute tpus tpu-vm with zone and project.
  local sub=$1
  shift
  local scope=(--zone="$ZONE")
  [[ -z $PROJECT ]] || scope+=(--project="$PROJECT")
  invoke gcloud compute tpus tpu-vm "$sub" "$@" "${scope[@]}"
}

on_all_workers() {  # REMOTE_COMMAND: the same shell command on every worker, concurrently.
  gcloud_tpu ssh "$NAME" --worker=all --command "$1"
}

check_create_options() {
  check_vm_options
  require_set --accelerator-type "$ACCELERATOR_TYPE"
  workers_of "$ACCELERATOR_TYPE" >/dev/null
  if [[ $SPOT == true && $PREEMPTIBLE == true ]]; then
    die "--spot and --preemptible exclude each other: give one"
  fi
}

check_vm_options() {
  require_set --name "$NAME"
  require_set --zone "$ZONE"
}

check_install_options() {
  check_vm_options
  if ! is_git_url "$REPO" && [[ ! -f $REPO/cl_jax/main.py || ! -f $REPO/requirements.txt ]]; then
    die "--repo '$REPO' is neither a git URL nor a cl_jax checkout (no cl_jax/main.py and requirements.txt)"
  fi
}

check_run_options() {
  local workers
  check_vm_options
  require_set --accelerator-type "$ACCELERATOR_TYPE"
  require_set --config "$CONFIG"
  require_set --workdir "$WORKDIR"
  workers=$(workers_of "$ACCELERATOR_TYPE")
  if ((workers > 1)) && [[ $WORKDIR != gs://* ]]; then
    die "--workdir '$WORKDIR' must be a gs:// path: $ACCELERATOR_TYPE has $workers workers, which all write checkpoints into the workdir"
  fi
  if [[ $WORKDIR != gs://* && $WORKDIR != /* ]]; then
    die "--workdir '$WORKDIR' must be gs://... or an absolute path on the TPU VM"
  fi
  check_main_args "$CONFIG" "${EXTRA_ARGS[@]}"
  if ! is_git_url "$REPO" && [[ ! -f $REPO/${CONFIG%%:*} ]]; then
    die "--config '$CONFIG': no file ${CONFIG%%:*} in $REPO"
  fi
}

cmd_create() {
  local extra=()
  [[ $SPOT == false ]] || extra+=(--spot)
  [[ $PREEMPTIBLE == false ]] || extra+=(--preemptible)
  gcloud_tpu create "$NAME" --accelerator-type="$ACCELERATOR_TYPE" \
    --version="${VERSION:-$(default_version "$ACCELERATOR_TYPE")}" "${extra[@]}"
}

cmd_install() {
  if is_git_url "$REPO"; then
    on_all_workers "rm -rf ~/$REMOTE_CODE && git clone --depth=1 $(quote_words "$REPO") ~/$REMOTE_CODE"
  else
    on_all_workers "rm -rf ~/$REMOTE_CODE && mkdir -p ~/$REMOTE_CODE"
    gcloud_tpu scp --recurse --worker=all "$REPO/cl_jax" "$REPO/configs" "$REPO/requirements.txt" \
      "$NAME:$REMOTE_CODE/"
  fi
  # Fresh TPU VMs run unattended-upgrades at boot, hence the wait for the dpkg lock.
  local apt="sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq"
  # shellcheck disable=SC2088  # ~ expands on the worker.
  local pip="~/$REMOTE_VENV/bin/pip install -q"
  on_all_workers "set -e; if ! command -v $PYTHON >/dev/null; then $apt update && $apt install -y $PYTHON $PYTHON-venv; fi; $PYTHON -m venv ~/$REMOTE_VENV; $pip --upgrade pip; $pip -r ~/$REMOTE_CODE/requirements.txt; $pip \"$JAX_TPU\" \"$GCS_CLIENT\""
}

cmd_run() {
  if [[ $DRY_RUN == true ]]; then
    print_batch_plan python3 "$CONFIG" "$(chips_of "$ACCELERATOR_TYPE")" "${EXTRA_ARGS[@]}"
  fi
  local args=(--config="$CONFIG" --workdir="$WORKDIR")
  if (($(workers_of "$ACCELERATOR_TYPE") > 1)); then
    args=(--multihost "${args[@]}")
  fi
  args+=("${EXTRA_ARGS[@]}")
  # shellcheck disable=SC2016  # $(...) and $! expand on the worker, not here.
  on_all_workers "set -e; mkdir -p ~/${REMOTE_LOG%/*}; if [ -f ~/$REMOTE_PID ] && kill -0 \"\$(cat ~/$REMOTE_PID)\" 2>/dev/null; then echo \"cl_jax is already running on \$(hostname)\" >&2; exit 1; fi; cd ~/$REMOTE_CODE; echo \"=== \$(date -u) ===\" >>~/$REMOTE_LOG; nohup ~/$REMOTE_VENV/bin/python -m cl_jax.main $(quote_words "${args[@]}") >>~/$REMOTE_LOG 2>&1 </dev/null & echo \$! >~/$REMOTE_PID"
}

cmd_logs() {
  # tail --pid ends the stream when the worker's run ends.
  on_all_workers "set -e; test -f ~/$REMOTE_PID || { echo \"no cl_jax run on \$(hostname)\" >&2; exit 1; }; tail -n +1 --pid=\"\$(cat ~/$REMOTE_PID)\" -F ~/$REMOTE_LOG | sed -u \"s/^/[\$(hostname)] /\""
}

# The TPU runtime's view of one host alone (its 2x2 chips) for a single-host job on a worker of
# a multi-host slice, which would otherwise wait for the other hosts.
readonly ONE_HOST="TPU_CHIPS_PER_PROCESS_BOUNDS=2,2,1 TPU_PROCESS_BOUNDS=1,1,1 TPU_VISIBLE_CHIPS=0,1,2,3"

cmd_probe() {
  # shellcheck disable=SC2088  # ~ expands on the worker.
  local python="~/$REMOTE_VENV/bin/python" workdir
  workdir=$(quote_words "--workdir=$WORKDIR")
  gcloud_tpu ssh "$NAME" --worker=0 --command "set -e; cd ~/$REMOTE_CODE; export $ONE_HOST; $python -m cl_jax.probe $workdir; $python -m cl_jax.export $workdir --format=flax; $python -m cl_jax.export $workdir --format=torchvision"
}

cmd_delete() {
  gcloud_tpu delete "$NAME" --quiet
}

cmd_all() {
  cmd_create
  trap cmd_delete EXIT
  trap 'exit 130' INT TERM
  cmd_install
  cmd_run
  cmd_logs
  if (($(workers_of "$ACCELERATOR_TYPE") > 1)); then
    cmd_probe
  fi
}

parse_args() {
  SUBCOMMAND="" NAME="" ZONE="" PROJECT="" ACCELERATOR_TYPE="" VERSION="" REPO="$DEFAULT_REPO"
  CONFIG="" WORKDIR="" SPOT=false PREEMPTIBLE=false DRY_RUN=false EXTRA_ARGS=() BATCH_PER_CHIP=""
  parse_options "name zone project accelerator-type version repo config workdir batch-per-chip" \
    "spot preemptible dry-run" "$@"
  local word
  for word in "${POSITIONAL[@]}"; do
    case $word in
      create | install | run | logs | probe | delete | all)
        [[ -z $SUBCOMMAND ]] || die "two subcommands given: '$SUBCOMMAND' and '$word'"
        SUBCOMMAND=$word
        ;;
      *) die "unknown subcommand '$word': use create, install, run, logs, probe, delete or all" ;;
    esac
  done
  [[ -n $SUBCOMMAND ]] || die "no subcommand: use create, install, run, logs, probe, delete or all (see --help)"
}

main() {
  parse_args "$@"
  add_batch_per_chip
  case $SUBCOMMAND in
    create) check_create_options ;;
    install) check_install_options ;;
    logs | delete) check_vm_options ;;
    probe) check_vm_options; require_set --workdir "$WORKDIR" ;;
    run) check_run_options ;;
    all) check_create_options; check_install_options; check_run_options ;;
  esac
  if [[ $DRY_RUN == false ]] && ! command -v gcloud >/dev/null; then
    die "gcloud not found on PATH: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), or use --dry-run"
  fi
  "cmd_$SUBCOMMAND"
}

main "$@"
