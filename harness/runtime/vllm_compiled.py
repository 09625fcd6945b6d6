"""vLLM's own compiled kernels (`torch.ops._C.*`), wherever they can be loaded, as calls with the plan's arguments.

Two sources: an installed vLLM (`current_platform.import_kernels()` loads the right build and
registers the ops), or a compiled vLLM ops library the user names with `--vllm-ops-library PATH`
or HARNESS_VLLM_OPS_LIBRARY (e.g. vLLM 0.26.0's `_C_stable_libtorch.abi3.so`, built for torch
2.11), so a GPU machine without vLLM's Python package still measures and checks vLLM's kernels.

Which kernel does an op and how it is called is the plan's `implementations.vllm`; `compiled_op` is what a plan's `vllm`
provider runs through the numerics cells and its `vllm` baseline times (harness.runtime.providers). A kernel
registered here under another schema than the plan's or vLLM 0.26.0's (vLLM's CPU build registers placeholders
without a kernel for its fp8 quant ops), or with the pinned schema's parameters in another order, counts as not
loaded, and the item says why; one whose schema is known only to the installed vLLM is checked against the schema
it registers.

The pinned copies of vLLM's facts (harness.vllm_facts: the kernels' schemas, vLLM IR's tolerances) are read here
from the installed vLLM too (`installed_schema`, `ir_tolerances`), so that tests/test_vllm_facts.py checks each
copy against the vLLM it runs with.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

import torch

from harness.runtime.device import package_version
from harness.plan.dtypes import CELL_DTYPES, DTYPE
from harness.plan.model import Plan
from harness.vllm_facts.kernels import Param, args_problem, kernel_schema, parse_schema

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


def registered_schema(name: str):
    """The FunctionSchema torch.ops._C.<name> is registered under here, None where it is not."""
    try:
        return getattr(torch.ops._C, name).default._schema  # dir(torch.ops._C) lists nothing; attribute access loads
    except (AttributeError, RuntimeError):
        return None


def installed_schema(name: str) -> str | None:
    """The schema the installed vLLM (or the named ops library) registers torch.ops._C.<name> under, written as the
    pinned copies are (harness.vllm_facts.kernels: `rms_norm(Tensor! out, Tensor input, ...) -> ()`); None where
    vLLM's kernels cannot be loaded here or register no such op."""
    if load_vllm_ops():
        return None
    registered = registered_schema(name)
    if registered is None:
        return None
    returns = ", ".join(str(r.type) for r in registered.returns)
    return f"{name}({', '.join(str(p) for p in registered_params(registered))}) -> ({returns})"


def ir_tolerances(ir_op: str) -> dict[str, tuple[float, float]] | None:
    """(atol, rtol) per cell dtype that the installed vLLM IR checks `ir_op`'s providers with (its defaults, and the
    op's own overrides), by the plan's dtype names; None where vLLM is not installed or its IR has no such op."""
    if vllm_missing():
        return None
    try:
        import vllm.ir.ops  # noqa: F401  registers vLLM IR's ops
        from vllm.ir.op import IrOp
    except ImportError:
        return None
    op = IrOp.registry.get(ir_op)
    if op is None:
        return None
    found = {}
    for name in CELL_DTYPES:
        dtype = getattr(torch, DTYPE[name].torch, None)
        try:
            tolerance = op.get_tolerance(dtype)
        except ValueError:  # a dtype vLLM IR has no tolerance for
            continue
        found[name] = (tolerance["atol"], tolerance["rtol"])
    return found


def registered_params(registered) -> tuple[Param, ...]:
    """A registered op's parameters (a torch FunctionSchema's) in the terms of harness.vllm_facts.kernels."""
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


def _moved(ours: tuple[Param, ...], theirs: tuple[Param, ...]) -> str:
    """A parameter of `ours` that `theirs` names at another position, in words ("" where none): a renamed parameter
    (result, now out) is called alike, a moved one would get another parameter's argument."""
    names = [t.name for t in theirs]
    for i, p in enumerate(ours):
        if p.name in names and names.index(p.name) != i:
            return f"`{p.name}` is its parameter {names.index(p.name) + 1}, not {i + 1}"
    return ""


def schema_problem(kernel, schema: str, registered) -> str:
    """Why a registered op (a torch FunctionSchema) cannot be called as `schema` says ("" when it can): fewer
    parameters, other kinds, more parameters without defaults, or the same kinds in another order by name."""
    theirs, ours = registered_params(registered), parse_schema(schema)[1]
    if not (len(theirs) >= len(ours) and all(_same_kind(p, t) for p, t in zip(ours, theirs))
            and all(t.default is not None for t in theirs[len(ours):])):
        what = " (a placeholder without a kernel)" if not theirs else ""
        return f"{_source()} registers {kernel.call} as `{registered}`{what}, not as `{schema}`: no such kernel here"
    moved = _moved(ours, theirs)
    if moved:
        return (f"{_source()} registers {kernel.call} as `{registered}`, not as `{schema}`: {moved}, so a call as "
                f"`{schema}` would pass the plan's arguments to the wrong parameters")
    return ""


def compiled_op(plan: Plan) -> Callable | str:
    """vLLM's compiled op for the plan's `implementations.vllm`, loaded from the named library or an installed vLLM,
    or why it cannot be called with the plan's arguments here."""
    why = load_vllm_ops()
    if why:
        return why
    kernel = plan.vllm_kernel
    registered = registered_schema(kernel.name)
    if registered is None:
        return f"{_source()} registers no {kernel.call} here"
    op = getattr(torch.ops._C, kernel.name)
    schema = kernel_schema(kernel)
    if schema:
        return schema_problem(kernel, schema, registered) or op
    # A kernel whose schema only the installed vLLM knows: the plan's arguments against the one it registers.
    args = [plan.arg(n) for n in kernel.args]
    return args_problem(kernel, registered_params(registered), args, plan.written_args) or op
