"""vLLM's own compiled kernels (`torch.ops._C.*`), wherever they can be loaded, as calls with the plan's arguments.

Two sources: an installed vLLM (`current_platform.import_kernels()` loads the right build and
registers the ops), or a compiled vLLM ops library the user names with `--vllm-ops-library PATH`
or HARNESS_VLLM_OPS_LIBRARY (e.g. vLLM 0.26.0's `_C_stable_libtorch.abi3.so`, built for torch
2.11), so a GPU machine without vLLM's Python package still measures and checks vLLM's kernels.

Which kernel does an op and how it is called is the plan's `vllm.kernel`; `compiled_op` is what a plan's `vllm`
provider runs through the numerics cells and its `vllm` baseline times (harness.runtime.providers). A kernel
registered here under another schema than the plan's or vLLM 0.26.0's (vLLM's CPU build registers placeholders
without a kernel for its fp8 quant ops) counts as not loaded; one whose schema is known only to the installed vLLM
is checked against the schema it registers.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

import torch

from harness.runtime.device import package_version
from harness.plan.model import Plan
from harness.vllm.kernels import Param, args_problem, kernel_schema, parse_schema

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


def _source() -> str:
    library = os.environ.get(LIBRARY_ENV)
    return f"the vLLM ops library {library}" if library else f"vLLM {package_version('vllm') or '?'}"


def registered_params(registered) -> tuple[Param, ...]:
    """A registered op's parameters (a torch FunctionSchema's) in the terms of harness.vllm.kernels."""
    params = []
    for a in registered.arguments:
        kind = str(a.type)
        optional = kind.startswith("Optional[")
        kind = kind.removeprefix("Optional[").removesuffix("]") if optional else kind
        params.append(Param(a.name, {"SymInt": "int"}.get(kind, kind), bool(a.alias_info and a.alias_info.is_write),
                            optional, str(a.default_value) if a.has_default_value() else None))
    return tuple(params)


def _same_kind(ours: Param, theirs: Param) -> bool:
    """One parameter of a schema we know against the registered one: the same kind (an optional tensor takes a
    tensor)."""
    if ours.type != theirs.type:
        return False
    return theirs.optional if ours.optional else ours.type == "Tensor" or not theirs.optional


def schema_problem(kernel, schema: str, registered) -> str:
    """Why a registered op (a torch FunctionSchema) cannot be called as `schema` says ("" when it can): fewer
    parameters, other kinds, or more parameters without defaults."""
    theirs, ours = registered_params(registered), parse_schema(schema)[1]
    if len(theirs) >= len(ours) and all(_same_kind(p, t) for p, t in zip(ours, theirs)) \
            and all(t.default is not None for t in theirs[len(ours):]):
        return ""
    what = " (a placeholder without a kernel)" if not theirs else ""
    return f"{_source()} registers {kernel.call} as `{registered}`{what}, not as `{schema}`: no such kernel here"


def compiled_op(plan: Plan) -> Callable | str:
    """vLLM's compiled op for the plan's `vllm.kernel`, loaded from the named library or an installed vLLM, or why
    it cannot be called with the plan's arguments here."""
    why = load_vllm_ops()
    if why:
        return why
    kernel = plan.vllm.kernel
    try:
        op = getattr(torch.ops._C, kernel.name)  # dir(torch.ops._C) lists nothing; attribute access loads
        registered = op.default._schema
    except (AttributeError, RuntimeError):
        return f"{_source()} registers no {kernel.call} here"
    schema = kernel_schema(kernel)
    if schema:
        return schema_problem(kernel, schema, registered) or op
    # A kernel whose schema only the installed vLLM knows: the plan's arguments against the one it registers.
    args = [plan.arg(n) for n in kernel.args]
    return args_problem(kernel, registered_params(registered), args, plan.written_args) or op
