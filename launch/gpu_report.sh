#!/usr/bin/env bash
# The whole benchmark report of one GPU in one command, on a fresh machine with no network:
# installs the wheels carried in .whl/ (launch/gpu_wheels.sh, run beforehand where there is a
# network) into a folder of its own, records the machine, then runs `python -m cl_jax.bench.report`
# (the step with its profile, PyTorch eager and compiled on equal work, JPEGs, memory,
# efficiency) under a deadline, and leaves in OUT: report.md, environment.txt and bench.tar.gz
# (every part's JSON, the step's trace and HLO).
#
# Usage: launch/gpu_report.sh OUT [BENCH_REPORT_FLAGS...]
#   With no flags: MoCo-v2 :imagenet100, ResNet-50, 224 px, bfloat16, batch 256, 20 steps,
#   all five parts, within CL_JAX_REPORT_DEADLINE_S seconds (default 480). Flags given replace
#   those defaults (the --out and --deadline_s flags are this script's).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?gpu_report.sh: error: give the folder for the report: launch/gpu_report.sh OUT}"
shift
python="${PYTHON:-python3}"
start=$(date +%s)
# shellcheck source=common.sh source-path=SCRIPTDIR
source launch/common.sh  # the repository root is the working directory
use_carried_wheels "$python" cl_jax.bench.report grain ml_collections dm_pix
work="$out/work"
mkdir -p "$work"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
  "$python" - <<'PY'
import importlib.metadata as m, platform, jax
names = ("jax", "flax", "optax", "chex", "orbax-checkpoint", "grain", "torch", "torchvision")
def version(n):
  try:
    return m.version(n)
  except m.PackageNotFoundError:
    return "absent"
print(platform.python_version(), *(f"{n} {version(n)}" for n in names), jax.devices())
PY
  nproc
  git describe --always --dirty --abbrev=40 2>/dev/null || echo "${CL_JAX_COMMIT:-commit unknown (no git here: set CL_JAX_COMMIT)}"
} >"$out/environment.txt"
if (($# == 0)); then
  set -- --config=configs/mocov2.py:imagenet100 --config.optim.lr_recipe=custom \
    --config.optim.batch_size=256
fi
spent=$(($(date +%s) - start))
deadline=$((${CL_JAX_REPORT_DEADLINE_S:-480} - spent))
((deadline >= 1)) || deadline=1
status=0
"$python" -m cl_jax.bench.report --out="$work" --deadline_s="$deadline" "$@" || status=$?
cp "$work/report.md" "$out/report.md" 2>/dev/null || echo "no report was written" >"$out/report.md"
trace=$(find "$work/profile" -name perfetto_trace.json.gz 2>/dev/null | head -n 1 || true)
[ -z "$trace" ] || cp "$trace" "$work/step_trace.json.gz"
hlo=$(find "$work/profile" -name step_hlo.txt 2>/dev/null | head -n 1 || true)
[ -z "$hlo" ] || gzip -c "$hlo" >"$work/step_hlo.txt.gz"
(cd "$work" && tar czf "../bench.tar.gz" --exclude=profile --exclude=jpeg_folder -- *)
echo "gpu_report.sh: $out/report.md, $out/environment.txt, $out/bench.tar.gz in $(($(date +%s) - start)) s (report status $status)"
exit "$status"
