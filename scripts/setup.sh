#!/usr/bin/env bash
# Creates .venv and installs the harness into it. `setup.sh test` adds what the test suite needs
# (pytest-xdist, and vLLM's CPU build on a machine without an NVIDIA GPU, so vLLM cells run there too).
# Idempotent: a second call installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=${1:-}
gpu=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu=1

if [ ! -x .venv/bin/python ]; then
  if [ "$gpu" = 1 ]; then
    python3 -m venv --system-site-packages .venv   # keep the machine's CUDA torch and triton
  else
    python3 -m venv .venv
  fi
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if [ "$gpu" = 0 ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # A CPU build of torch first, so the dependency range below does not pull a multi-GB CUDA build.
  # Off this machine image, point pip at PyTorch's CPU wheels: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
  "${pip[@]}" "torch==2.13.0"
fi
if [ "$want_test" = test ]; then
  "${pip[@]}" -e ".[test]"
  # Liger-Kernel's kernels for tests/thirdparty/: a pure-Python wheel whose only requirements are torch and
  # triton, which the venv already has. --no-deps, so pip never resolves torch anew from its wide range
  # (a multi-GB CUDA build on a machine without a GPU, or a second torch beside the GPU machine's own).
  "${pip[@]}" --no-deps "liger-kernel==0.8.5"
  if [ "$gpu" = 0 ] && ! .venv/bin/python -c "import vllm" 2>/dev/null; then
    PYTHON=.venv/bin/python bash .ci/install-vllm.sh
  fi
else
  "${pip[@]}" -e .
fi
