"""Does the function the `native` and `compiled` baselines time compute in the activation dtype, as vLLM does?

The reference is the accuracy oracle and may compute in fp32; the speed baselines must be what vLLM runs without
the custom op. A plan whose reference multiplies matrices in fp32 on 16-bit activations (dequantize in fp32, then
an fp32 GEMM) and that names no `op.native` would time its kernel against an oracle: 4-6x "speedups" that a user
never sees. `upcast_warnings` runs that function once on a tiny CPU example in the plan's first 16-bit dtype under
a TorchDispatchMode and notes every matrix-multiply-family aten op (mm, addmm, bmm, baddbmm, convolution, the
attention kernels; einsum, matmul and F.linear reach one of these) whose product (its first output: an attention
kernel's fp32 logsumexp is not one) is float32 or float64.

Only those ops count. An fp32 reduction or element-wise step on 16-bit activations is what vLLM's own
forward_native does (RMSNorm's variance, a quantization's scale and division): those are faithful, and the
check says nothing about them. Attention called as one function (`F.scaled_dot_product_attention`) is judged by
the dtype the user's code passes it, not by what PyTorch's CPU kernel does inside: its math fallback (3-D or 5-D
inputs, dropout, a torch whose CPU flash kernel does not take GQA) upcasts 16-bit q, k and v to fp32 internally,
which a GPU's attention kernels do not. Nothing runs on a GPU: resolving a plan (`python -m harness validate`, the start
of a run) calls this in the process that resolves it.
"""

from __future__ import annotations

import itertools

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from harness.runtime.calls import reference_inputs
from harness.runtime.inputs import Example, build_args, sizes_fit
from harness.runtime.resolve import OPTIONAL_PACKAGE, resolve
from harness.cells.matrix import Cell
from harness.plan.model import Plan

aten = torch.ops.aten
# The matrix-multiply family at the aten level (what einsum, matmul, F.linear and SDPA dispatch to).
MATMUL_OPS = tuple(getattr(aten, name) for name in (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "convolution",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math",
) if hasattr(aten, name))
WIDE = (torch.float32, torch.float64)
SIXTEEN_BIT = {"bf16": torch.bfloat16, "fp16": torch.float16}
PROBE_TOKENS = 2


class _WideMatmuls(TorchDispatchMode):
    """Notes each matrix-multiply-family op whose output is float32 or float64 (none inside an attention function:
    _WholeAttention judges those)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, str] = {}  # op name -> output dtype, in the order first seen
        self.inside_attention = 0  # how deep in attention functions the ops now dispatched are

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # The product is the first output; the attention kernels' others are auxiliary (an fp32 logsumexp).
        product = tree_flatten(out)[0][:1]
        if func.overloadpacket in MATMUL_OPS and product and isinstance(product[0], torch.Tensor) \
                and product[0].dtype in WIDE and not self.inside_attention:
            self.seen.setdefault(func.overloadpacket.__name__, str(product[0].dtype).removeprefix("torch."))
        return out


# Attention functions whose product is in their inputs' dtype on a GPU, whatever their CPU kernels compute in.
ATTENTION_FUNCTIONS = (torch.nn.functional.scaled_dot_product_attention,)


class _WholeAttention(TorchFunctionMode):
    """An attention function as the user's code calls it: noted where its query is float32 or float64 (an upcast the
    code made), and the ops PyTorch's CPU kernel runs inside it left unnoted."""

    def __init__(self, matmuls: _WideMatmuls):
        super().__init__()
        self.matmuls = matmuls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in ATTENTION_FUNCTIONS:
            return func(*args, **kwargs)
        query = args[0] if args else kwargs.get("query")
        if isinstance(query, torch.Tensor) and query.dtype in WIDE:
            self.matmuls.seen.setdefault(func.__name__, str(query.dtype).removeprefix("torch."))
        self.matmuls.inside_attention += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.matmuls.inside_attention -= 1


def _probe_sizes(plan: Plan) -> dict[str, int] | None:
    """The smallest sizes of the plan (a CPU machine's where the plan gives them) that fit its constraints."""
    cpu = dict(plan.numerics.cpu_sizes)
    choices = {sym: sorted(cpu.get(sym) or values) for sym, values in plan.sizes.items()}
    for values in itertools.product(*choices.values()):
        sizes = dict(zip(choices, values))
        if sizes_fit(plan, sizes):
            return sizes
    return None


def wide_matmuls(plan: Plan, fn, dtype: str) -> dict[str, str]:
    """The matrix-multiply-family ops `fn` (called like the reference) runs in float32/float64 on a tiny CPU example
    of `dtype` activations: op name -> output dtype. Empty where it computes in the activation dtype."""
    sizes = _probe_sizes(plan)
    if sizes is None:
        return {}
    values = build_args(plan, Cell("decode", dtype, 1, "eager", "cpu"), Example(PROBE_TOKENS, sizes, seed=0), "cpu")
    mode = _WideMatmuls()
    with torch.no_grad(), mode, _WholeAttention(mode):
        fn(**reference_inputs(plan, values, fn=fn))
    return mode.seen


def upcast_warnings(plan: Plan) -> list[str]:
    """`file:line: op.reference: ...` (or `op.native`) where the function timed as `native` and `compiled` multiplies
    matrices in float32 on 16-bit activations: a speed baseline computing as an oracle does, not as vLLM does."""
    dtype = next((d for d in plan.matrix["dtype"] if d in SIXTEEN_BIT), None)
    field_name = "op.native" if plan.op.native else "op.reference"
    if dtype is None or plan.native_path.split(".")[0] == OPTIONAL_PACKAGE:  # vLLM's forward_native is what vLLM runs
        return []
    try:
        seen = wide_matmuls(plan, resolve(plan).native, dtype)
    except Exception:  # a function that cannot run on a CPU machine: checked nowhere else, and never a crash here
        return []
    if not seen:
        return []
    ops = ", ".join(f"aten.{name} in {out}" for name, out in seen.items())
    where = f"{plan.path}:{plan.where(field_name)}: {field_name}"
    if plan.op.native:
        return [f"{where}: op.native computes in float32 on {dtype} activations ({ops}): the native and compiled "
                "baselines must be what vLLM runs without the custom op, in the activation dtype"]
    return [f"{where}: the reference computes in float32 on {dtype} activations ({ops}), so the native and compiled "
            "baselines would time an accuracy oracle: name op.native (what vLLM runs without the custom op, in the "
            "activation dtype)"]
