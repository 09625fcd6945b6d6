#!/usr/bin/env bash
# vLLM (and the harness's own requirements) for a GPU machine without network access, in two steps:
#
#   scripts/vllm_offline.sh download DIR [VLLM]   on a connected machine: every wheel the GPU machine needs, in DIR
#   scripts/vllm_offline.sh install DIR           on the GPU machine, from the repository root: installs them from DIR
#
# VLLM defaults to the vLLM whose torch pin matches the GPU machine's torch (TORCH=<version> names it; ask the GPU
# machine: python3 -c "import torch; print(torch.__version__)"); PYTHON_VERSION (default 3.12) and GLIBC (default
# 2.35; ask the GPU machine: ldd --version) describe the GPU machine (x86_64). The GPU machine's own torch and triton are kept:
# they are never downloaded, and `install` never replaces them. Copy DIR with the repository (rsync, a disk).
# Then `scripts/gpu_run.sh numerics` runs vLLM's routes, its fusion passes and an engine with CUDA graphs there.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: scripts/vllm_offline.sh download DIR [VLLM] | install DIR}
dir=${2:?a folder for the wheels}
py=${PYTHON_VERSION:-3.12}
glibc=${GLIBC:-2.35}
# Every manylinux tag a machine of that glibc installs (pip takes one --platform per tag).
platforms=(--platform manylinux2014_x86_64)
for minor in $(seq 17 "${glibc#2.}"); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done

case "$what" in
  download)
    mkdir -p "$dir"
    vllm=${3:-}
    if [ -z "$vllm" ]; then
      [ -n "${TORCH:-}" ] || { echo "name the GPU machine's torch, TORCH=2.11.0, or a vLLM: download DIR vllm==0.26.0" >&2; exit 2; }
      torch_version=$TORCH
      # vLLM releases pin one torch each; this is the newest release pinning the GPU machine's (pip resolves it).
      vllm="vllm"
      constraint=$(mktemp)
      echo "torch==${torch_version%%+*}" > "$constraint"
      trap 'rm -f "$constraint"' EXIT
      extra=(-c "$constraint")
    else
      extra=()
    fi
    # Binary wheels for the GPU machine's Python and platform; torch's wheels (and the CUDA libraries they pull,
    # several GB) are left out below, as the GPU machine has its own.
    python3 -m pip download --dest "$dir" --only-binary=:all: --python-version "$py" "${platforms[@]}" \
      "${extra[@]}" "$vllm" \
      pydantic pytest hypothesis pyyaml pytest-benchmark tabulate numpy
    rm -f "$dir"/torch-*.whl "$dir"/triton-*.whl "$dir"/nvidia_*.whl
    echo "$(ls "$dir" | wc -l) wheels in $dir ($(du -sh "$dir" | cut -f1)); copy it to the GPU machine"
    ;;
  install)
    python3 -c "import torch, triton" || { echo "the GPU machine needs its own torch and triton" >&2; exit 1; }
    # Every requirement but torch and triton from DIR; the machine's torch and triton satisfy the rest.
    keep=$(mktemp)
    trap 'rm -f "$keep"' EXIT
    python3 -c "import torch, triton; print(f'torch=={torch.__version__}'); print(f'triton=={triton.__version__}')" \
      > "$keep"
    python3 -m pip install --no-index --find-links "$dir" -c "$keep" vllm pydantic pytest hypothesis pyyaml \
      pytest-benchmark tabulate
    python3 -m pip install --no-index --no-build-isolation --no-deps -e .
    python3 -c "import vllm; print('vLLM', vllm.__version__, 'installed')"
    ;;
  *) echo "unknown: $what (download or install)" >&2; exit 2 ;;
esac
