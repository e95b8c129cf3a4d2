#!/usr/bin/env bash
# The wheels that a GPU machine with JAX, PyTorch and no network lacks for the benchmark report
# (launch/gpu_report.sh) and for training a study's runs there (launch/gpu_study.sh): downloaded here, from the package index, into .whl/ (ignored by git),
# for the GPU machine's Python (3.12 by default) on x86-64 Linux, with no dependencies beyond
# the ones named here (the others, absl-py, chex, etils, numpy, protobuf, psutil, PyYAML, come
# with JAX or PyTorch's images).
#
# Usage: launch/gpu_wheels.sh [PYTHON_VERSION]     (e.g. 3.12; the folder is emptied first)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.12}"
[[ $version =~ ^3\.[0-9]+$ ]] || { echo "gpu_wheels.sh: error: give a Python version such as 3.12, got '$version'" >&2; exit 2; }
# The pins of requirements.txt where it has them.
pinned() { grep -E "^$1==" requirements.txt | cut -d' ' -f1; }
packages=("$(pinned ml-collections)" "$(pinned grain)" "$(pinned dm-pix)" "$(pinned array-record)" "$(pinned tensorboardX)" "$(pinned simplejpeg)" "$(pinned nvidia-nvimgcodec-cu13)" "nvidia-nvjpeg==13.3.2.43" "portpicker==1.6.0")
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
  --implementation cp "${platforms[@]}" -d .whl "${packages[@]}"
ls .whl
