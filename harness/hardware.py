"""What this machine can run: its SM (or `cpu`), GPU name and count, and the software versions.

`use_triton_interpreter()` must run before anything imports triton: on a machine without CUDA,
Triton kernels then run in Triton's interpreter on CPU tensors.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path


def use_triton_interpreter() -> bool:
    """Set TRITON_INTERPRET=1 when there is no CUDA device; returns whether it is set."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Hardware:
    sm: str  # "cpu" or "sm90"
    device: str  # "cpu" or "cuda"
    gpu: str  # GPU name, or the CPU's
    device_count: int  # GPUs, or 0
    cpu_count: int

    @property
    def has_cuda(self) -> bool:
        return self.device == "cuda"


@lru_cache(maxsize=1)
def detect() -> Hardware:
    import torch

    cpus = os.cpu_count() or 1
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        return Hardware(f"sm{major}{minor}", "cuda", torch.cuda.get_device_name(0), torch.cuda.device_count(), cpus)
    return Hardware("cpu", "cpu", platform.processor() or platform.machine(), 0, cpus)


def _git_commit(root: Path) -> str | None:
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


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in (module, f"{module}-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def provenance(root: Path) -> dict:
    """Where and with what a run happened: stored with every result so merged reports can say it."""
    import torch

    hw = detect()
    return {
        **asdict(hw),
        "host": platform.node(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "vllm": _version("vllm"),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "triton_interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "commit": _git_commit(root),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
