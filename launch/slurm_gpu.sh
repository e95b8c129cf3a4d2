#!/usr/bin/env bash
# Submits cl_jax pretraining as a multi-node SLURM GPU job: one JAX process per node owning all of
# that node's GPUs, started by srun with `python -m cl_jax.main --multihost`. The batch script is
# written to <workdir>/slurm_job.sh and submitted with sbatch. `launch/slurm_gpu.sh --help` lists
# the options.
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
readonly JOB_FILE="slurm_job.sh"
readonly HEREDOC_END="CL_JAX_SBATCH_SCRIPT"

usage() {
  cat <<EOF
Usage: launch/$PROG [OPTIONS] [-- CL_JAX_MAIN_ARGS...]

Writes <workdir>/$JOB_FILE, a batch script that runs srun with one task per node (one JAX
process per node owning all of that node's GPUs and CPU cores; the job takes whole nodes), and
submits it with sbatch.

Options (OPTION VALUE or OPTION=VALUE):
  --nodes N             number of nodes (required)
  --gpus-per-node G     GPUs on each node (required)
  --partition NAME      SLURM partition (required)
  --time LIMIT          time limit: MINUTES, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (required)
  --account NAME        SLURM account to charge (optional)
  --job-name NAME       job name (default: cl_jax-<workdir basename>); jobs of one name run one
                        at a time (--dependency=singleton)
  --config CONFIG       configs/NAME.py[:preset], relative to the repository (required)
  --workdir DIR         run directory on a filesystem all nodes share (required); relative
                        paths are made absolute against the current directory
  --venv DIR            virtualenv with cl_jax's requirements and "jax[cuda13]==0.10.2",
                        activated on the nodes (required)
  --repo DIR            cl_jax checkout on the shared filesystem, the job's working directory
                        (default: $DEFAULT_REPO)
  --batch-per-chip N     images per GPU (--config.optim.batch_per_chip=N; the global batch is
                        N x nodes x GPUs per node and the lr follows it: python -m cl_jax.batch_plan)
  --dry-run             print the commands and the batch script instead of submitting
                        (slurm need not be installed), and on stderr the per-GPU batch,
                        global batch and lr of the run (python -m cl_jax.batch_plan)
  -h, --help            this message

Arguments after -- go to python -m cl_jax.main unchanged, e.g. -- --config.optim.epochs=100

The job is requeueable (--requeue). SIGUSR1, sent 120 s before the time limit
(--signal=USR1@120), and SIGTERM, sent on preemption or scancel, make every process save a
checkpoint at one step and exit 138 (SIGUSR1) or 143 (SIGTERM). On 138 the batch script
requeues the job (scontrol requeue), which resumes from that checkpoint; a preempted job is
requeued by SLURM itself (--requeue); scancel ends the job with its checkpoint saved. A finished
run (0) or a failed one (any other status) is not requeued; sbatch <workdir>/$JOB_FILE submitted
again resumes the same way. A second job on the same workdir is refused by the workdir's lock,
and jobs of one name run one at a time (--dependency=singleton).
EOF
}




require_set() {  # OPTION VALUE
  [[ -n $2 ]] || die "missing required option $1 (see --help)"
}

require_positive_int() {  # OPTION VALUE
  [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 '$2' must be a positive integer"
}

# #SBATCH lines are read by sbatch, not by a shell, so their values cannot be quoted.
require_no_space() {  # OPTION VALUE
  [[ $2 != *[[:space:]]* ]] || die "$1 '$2' must not contain whitespace (it goes into an #SBATCH line)"
}

check_options() {
  require_set --nodes "$NODES"
  require_set --gpus-per-node "$GPUS_PER_NODE"
  require_set --partition "$PARTITION"
  require_set --time "$TIME"
  require_set --config "$CONFIG"
  require_set --workdir "$WORKDIR"
  require_set --venv "$VENV"
  require_positive_int --nodes "$NODES"
  require_positive_int --gpus-per-node "$GPUS_PER_NODE"
  if [[ ! $TIME =~ ^([0-9]+-)?[0-9]+(:[0-9]+){0,2}$ ]]; then
    die "--time '$TIME' is not a SLURM time limit (MINUTES, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"
  fi
  require_no_space --partition "$PARTITION"
  require_no_space --account "$ACCOUNT"
  require_no_space --job-name "$JOB_NAME"
  require_no_space --workdir "$WORKDIR"
  require_no_space --repo "$REPO"
  if [[ ! -f $REPO/cl_jax/main.py ]]; then
    die "--repo '$REPO' is not a cl_jax checkout (no cl_jax/main.py)"
  fi
  check_main_args "$CONFIG" "${EXTRA_ARGS[@]}"
  if [[ ! -f $REPO/${CONFIG%%:*} ]]; then
    die "--config '$CONFIG': no file ${CONFIG%%:*} in $REPO"
  fi
  local arg
  for arg in "${EXTRA_ARGS[@]}"; do
    if [[ $arg == --stop_signal || $arg == --stop_signal=* ]]; then
      die "'$arg' after -- is set by this script: the job stops on SIGUSR1 (#SBATCH --signal)"
    fi
  done
}

# Prints the batch script. SLURM's auto-detection in jax.distributed.initialize() would give each
# process only the GPU numbered SLURM_LOCALID (right for one process per GPU); with one process
# per node, JAX_LOCAL_DEVICE_IDS hands it all of the node's GPUs.
batch_script() {
  local device_ids=0 i
  for ((i = 1; i < GPUS_PER_NODE; i++)); do
    device_ids+=",$i"
  done
  cat <<EOF
#!/bin/bash
#SBATCH --job-name=$JOB_NAME
#SBATCH --partition=$PARTITION
EOF
  [[ -z $ACCOUNT ]] || printf '#SBATCH --account=%s\n' "$ACCOUNT"
  cat <<EOF
#SBATCH --nodes=$NODES
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=$GPUS_PER_NODE
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH --time=$TIME
#SBATCH --chdir=$REPO
#SBATCH --output=$WORKDIR/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=USR1@120
#SBATCH --dependency=singleton
# Written by launch/$PROG. A requeued or resubmitted job resumes from the newest checkpoint
# in the workdir.
set -eo pipefail
# shellcheck source=/dev/null
source $(quote_words "$VENV/bin/activate")
set -u
export JAX_LOCAL_DEVICE_IDS=$device_ids
# SIGUSR1 (sent to the tasks 120 s before the time limit) and SIGTERM (preemption, scancel) make
# every task save a checkpoint at one step and exit 138 or 143. This shell outlives both signals
# while the tasks save. After the time-limit warning (138) it requeues the job, which resumes
# from that checkpoint; SLURM requeues a preempted job itself, and scancel (143) ends the job.
trap '' USR1
trap 'echo "$JOB_FILE: SIGTERM: waiting for the tasks to save a checkpoint"' TERM
srun --ntasks-per-node=1 --cpus-per-task="\$SLURM_CPUS_ON_NODE" --kill-on-bad-exit=1 \\
  python -m cl_jax.main $(quote_words --multihost --stop_signal=USR1 --config="$CONFIG" --workdir="$WORKDIR" "${EXTRA_ARGS[@]}") &
srun_pid=\$!
status=0
wait "\$srun_pid" || status=\$?
while kill -0 "\$srun_pid" 2>/dev/null; do  # a trapped signal ended wait early: wait again
  status=0
  wait "\$srun_pid" || status=\$?
done
if ((status == 138)); then
  echo "$JOB_FILE: stopped with a checkpoint before the time limit: requeueing job \$SLURM_JOB_ID"
  scontrol requeue "\$SLURM_JOB_ID" || true
fi
exit "\$status"
EOF
}

submit() {
  local job_path=$WORKDIR/$JOB_FILE
  if [[ $DRY_RUN == true ]]; then
    local python=python3
    if [[ -x $VENV/bin/python ]]; then python=$VENV/bin/python; fi
    print_batch_plan "$python" "$CONFIG" $((NODES * GPUS_PER_NODE)) "${EXTRA_ARGS[@]}"
    printf '%s\n' "$(quote_words mkdir -p "$WORKDIR")"
    printf "cat > %s <<'%s'\n" "$(quote_words "$job_path")" "$HEREDOC_END"
    batch_script
    printf '%s\n' "$HEREDOC_END" "$(quote_words sbatch "$job_path")"
    return
  fi
  command -v sbatch >/dev/null || die "sbatch not found on PATH: run this on a SLURM login node, or use --dry-run"
  [[ -f $VENV/bin/activate ]] || die "--venv '$VENV' has no bin/activate: create it first (see launch/README.md)"
  mkdir -p "$WORKDIR"
  batch_script >"$job_path"
  sbatch "$job_path"
}

parse_args() {
  NODES="" GPUS_PER_NODE="" PARTITION="" TIME="" ACCOUNT="" JOB_NAME="" CONFIG="" WORKDIR=""
  VENV="" REPO="$DEFAULT_REPO" DRY_RUN=false EXTRA_ARGS=() BATCH_PER_CHIP=""
  parse_options "nodes gpus-per-node partition time account job-name config workdir venv repo batch-per-chip" \
    "dry-run" "$@"
  ((${#POSITIONAL[@]} == 0)) || die "unknown option '${POSITIONAL[0]}' (see --help)"
}

# Relative paths are taken against the submitting shell's directory: the job runs in --repo.
absolute() {
  if [[ $1 == /* ]]; then printf '%s' "$1"; else printf '%s' "$PWD/$1"; fi
}

main() {
  parse_args "$@"
  add_batch_per_chip
  [[ -z $WORKDIR ]] || WORKDIR=$(absolute "${WORKDIR%/}")
  [[ -z $VENV ]] || VENV=$(absolute "$VENV")
  REPO=$(absolute "$REPO")
  [[ -n $JOB_NAME || -z $WORKDIR ]] || JOB_NAME="cl_jax-${WORKDIR##*/}"
  check_options
  submit
}

main "$@"
