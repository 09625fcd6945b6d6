"""Which tolerance a comparison uses: the plan's, else vLLM IR's for the op, else vLLM's kernel-test defaults.

The one place a tolerance is looked up, for numerics cells, benchmark re-checks and vLLM items alike, and the
one place vLLM's kernel-test default tolerances are written down (vLLM IR's: harness.vllm_facts.ir_tolerances).
"""

from __future__ import annotations

from harness.plan.model import Plan, Tolerance
from harness.vllm_facts.ir_tolerances import IR_DEFAULT_TOLERANCES

# vLLM IR's default tolerances per dtype (pinned in harness.vllm_facts.ir_tolerances); where vLLM IR overrides one for
# an op (rms_norm's fp16), the op's plan states it, as it states anything else about the op.
IR_DEFAULT_TOLERANCE = {dtype: Tolerance(atol, rtol) for dtype, (atol, rtol) in IR_DEFAULT_TOLERANCES.items()}
# vLLM's kernel-test defaults (tests/kernels/allclose_default.py, as vLLM IR's), with fp8 and int8 added.
DEFAULT_TOLERANCE = {**IR_DEFAULT_TOLERANCE, "fp8_e4m3fn": Tolerance(0.1, 0.1), "fp8_e4m3fnuz": Tolerance(0.1, 0.1),
                     "int8": Tolerance(1.0, 0.0)}


def ir_tolerance(plan: Plan, dtype: str) -> Tolerance | None:
    """The tolerance vLLM IR checks this op with in `dtype`, or None where the plan names no IR op for it."""
    if plan.vllm.ir_op is None or dtype not in IR_DEFAULT_TOLERANCE:
        return None
    return IR_DEFAULT_TOLERANCE[dtype]


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
