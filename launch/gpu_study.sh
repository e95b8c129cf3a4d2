#!/usr/bin/env bash
# The next pending arm-seeds of a study (a rung of the scale ladder) on one GPU machine in one
# command of bounded length, on a fresh machine with no network: installs the wheels carried in
# .whl/ (launch/gpu_wheels.sh), copies the committed records so that only pending arm-seeds train,
# runs `python -m cl_jax.study` with several runs at once on the GPU (the Trifeature data is
# generated there) and a deadline by which no run is still going, and leaves in OUT the new
# records (OUT/runs/<arm>/seed<s>.json; a command stopped before its end leaves them among
# copies of the committed ones in OUT/results/runs, each written as its run ends), the study's
# log and environment.txt.
#
# Usage: launch/gpu_study.sh STUDY OUT [CL_JAX_STUDY_FLAGS...]
#   CL_JAX_STUDY_WORKERS runs at once (default 4), CL_JAX_STUDY_DEADLINE_S seconds for the whole
#   command (default 480: leaves a 10-minute device session time to start and bring OUT back).
# Then, in the repository: for d in FILES/runs FILES/results/runs; do [ -d $d ] &&
#   cp -rn $d/. results/studies/runs/; done; python -m cl_jax.study --study=STUDY --report_only
#   and commit the records and tables (-n: leaves the committed records as they are).
set -euo pipefail
cd "$(dirname "$0")/.."
study="${1:?gpu_study.sh: error: give the study and the output folder: launch/gpu_study.sh STUDY OUT}"
out="${2:?gpu_study.sh: error: give the output folder: launch/gpu_study.sh STUDY OUT}"
shift 2
python="${PYTHON:-python3}"
start=$(date +%s)
# shellcheck source=common.sh source-path=SCRIPTDIR
source launch/common.sh  # the repository root is the working directory
use_carried_wheels "$python" cl_jax.study cl_jax.train grain ml_collections dm_pix tensorboardX
# The study reads and writes its records in OUT: the committed ones tell it what is done.
mkdir -p "$out/results"
cp -r results/studies/runs "$out/results/runs"
# The runs' work folders: a folder of this command's own (another on the machine keeps its own),
# removed however the command ends.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/cl_jax_gpu_study.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  nproc
  git describe --always --dirty --abbrev=40 2>/dev/null || echo "${CL_JAX_COMMIT:-commit unknown (no git here: set CL_JAX_COMMIT)}"
} >"$out/environment.txt"
spent=$(($(date +%s) - start))
deadline=$((${CL_JAX_STUDY_DEADLINE_S:-480} - spent))
((deadline >= 1)) || deadline=1
status=0
"$python" -m cl_jax.study --study="$study" --results="$out/results" \
  --workdir="$scratch/work" --workers="${CL_JAX_STUDY_WORKERS:-4}" --deadline_s="$deadline" \
  "$@" >"$out/study.log" 2>&1 || status=$?
# The records that were not in the repository (the new ones) move to OUT/runs.
mkdir -p "$out/runs"
(cd "$out/results/runs" && find . -name 'seed*.json') | while read -r record; do
  if [ ! -e "results/studies/runs/$record" ]; then
    mkdir -p "$out/runs/$(dirname "$record")"
    mv "$out/results/runs/$record" "$out/runs/$record"
  fi
done
rm -rf "$out/results"
echo "gpu_study.sh: $(find "$out/runs" -name '*.json' | wc -l) new records in $out/runs, status $status, $(($(date +%s) - start)) s"
exit "$status"
