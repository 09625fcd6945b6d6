"""Which tolerance a comparison uses: the plan's, else vLLM IR's for the op, else vLLM's kernel-test defaults.

The one place a tolerance is looked up, for numerics cells, benchmark re-checks and vLLM items alike.
"""

from __future__ import annotations

from harness.spec.plan import Plan, Tolerance
from harness.spec.vllm_ops import ir_tolerance

# vLLM's kernel-test defaults (tests/kernels/allclose_default.py, vllm.ir tolerances); fp8 and int8 as vLLM IR.
DEFAULT_TOLERANCE = {
    "fp32": Tolerance(1e-5, 1.3e-6), "fp16": Tolerance(1e-3, 1e-3), "bf16": Tolerance(1e-3, 1.6e-2),
    "fp8_e4m3fn": Tolerance(0.1, 0.1), "fp8_e4m3fnuz": Tolerance(0.1, 0.1), "int8": Tolerance(1.0, 0.0),
}


def tolerance_for(plan: Plan, dtype: str) -> Tolerance:
    return plan.tolerance.get(dtype) or ir_tolerance(plan, dtype) or DEFAULT_TOLERANCE[dtype]


def tolerance_source(plan: Plan, dtype: str) -> str:
    """Where `tolerance_for` took it from, as the report says it."""
    if dtype in plan.tolerance:
        return "plan"
    return "vLLM IR" if ir_tolerance(plan, dtype) else "vLLM default"


def output_tolerance(plan: Plan, dtype: str, output: str, output_dtype: str | None) -> Tolerance:
    """One output's tolerance: the plan's for that output, else the table's for the output's own dtype where it
    is not the activation dtype (fp32 scales in a bf16 cell), else the cell's."""
    if output in plan.output_tolerance:
        return plan.output_tolerance[output]
    if output_dtype in DEFAULT_TOLERANCE and output_dtype != dtype:
        return tolerance_for(plan, output_dtype)
    return tolerance_for(plan, dtype)
