"""vLLM IR's default tolerances, pinned: what vLLM IR compares an op's providers against its native implementation
with, per dtype (vllm/ir/tolerances.py `DEFAULT_TOLERANCES` in vLLM 0.32). An IR op may override one
(`override_tolerance`: rms_norm's and fused_add_rms_norm's fp16); the op's plan states that override, as it states
anything else about the op.

harness.plan.tolerances applies them. Where vLLM is installed, tests/test_vllm_facts.py checks this table and the
bundled plans' overrides against the installed vLLM IR's (harness.runtime.vllm_compiled.ir_tolerances).

Plain Python: (atol, rtol) per dtype, by the plan's dtype names.
"""

from __future__ import annotations

IR_DEFAULT_TOLERANCES = {"fp32": (1e-5, 1.3e-6), "fp16": (1e-3, 1e-3), "bf16": (1e-3, 1.6e-2)}
