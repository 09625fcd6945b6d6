"""vLLM's fusion passes for a fused op: the plan's `vllm.fusion` (which of vLLM's layer sequences a pass rewrites
into its kernel) with the vLLM profiles (custom ops and IR priorities) its pattern is checked under.

A fused op's kernel reaches vLLM two ways: as a layer of its own, or through the compilation pass that
finds the unfused layers in the compiled graph and rewrites them into one call. vLLM's passes match
the layers' ops as they appear in the graph, and that depends on the profile: whether the layers'
CustomOps are enabled (their compiled kernels appear) or not (their torch code appears), and, for
vLLM IR ops, the IR priority. The fusion items (harness.vllm.fusion) run the pass under each
profile and record whether the pattern matched and which kernel the fused node calls.

Profiles are vLLM 0.32's (vllm/compilation/passes/fusion/). Plain Python: nothing here imports torch or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type hints only: the plan's checks import these facts, never the other way
    from harness.plan.model import Plan


@dataclass(frozen=True)
class FusionCase:
    """One fused op: the layer sequence vLLM's pass rewrites, the pass, and the kernel it rewrites to."""

    op: str  # the fused op's name (a plan's op.name)
    layers: str  # vLLM's layer sequence, in words
    pass_path: str  # module:class of vLLM's pass
    pass_flag: str  # the PassConfig field that turns the pass on in a deployment
    layer_custom_op: str  # the first layer's CustomOp name (the quant layer's is QUANT_CUSTOM_OP)
    ir_ops: tuple[str, ...]  # vLLM IR ops the first layer dispatches through (their priority is part of a profile)
    fused_kernel: str  # torch.ops.<fused_kernel>: what vLLM's pass rewrites the sequence into
    residual: bool = False  # the norm takes a residual (fused add)

    @property
    def pass_class(self) -> str:
        return self.pass_path.rpartition(":")[2]


QUANT_CUSTOM_OP = "quant_fp8"

# vLLM IR's provider names (as in harness.vllm_facts.names): vLLM's own kernel, and torch code.
_VLLM_C, _NATIVE = "vllm_c", "native"


@dataclass(frozen=True)
class FusionProfile:
    """A vLLM profile as the pass sees it: compilation_config.custom_ops and the IR priority of the layer's IR ops."""

    id: str  # the item id's profile part
    description: str
    custom_ops: tuple[str, ...]
    ir_priority: tuple[str, ...]  # for each of the case's IR ops

    def ir_priorities(self, case: FusionCase) -> dict[str, list[str]]:
        return {op: list(self.ir_priority) for op in case.ir_ops}

    def setting(self, case: FusionCase) -> str:
        """The profile as a deployment types it."""
        parts = [f"""--compilation-config '{{"custom_ops": [{", ".join(f'"{e}"' for e in self.custom_ops)}], """
                 f""""pass_config": {{"{case.pass_flag}": true}}}}'"""]
        for op, providers in self.ir_priorities(case).items():
            parts.append(f"""--ir-op-priority '{{"{op}": [{", ".join(f'"{p}"' for p in providers)}]}}'""")
        return " ".join(parts)


def fusion_profiles(case: FusionCase) -> list[FusionProfile]:
    """Custom ops off (vLLM's default with Inductor) and on (its default without), and each layer's op alone; the
    IR priority follows: torch code where vLLM's kernels are off, vLLM's kernel first where they are on."""
    layer = case.layer_custom_op
    return [
        FusionProfile("none", "custom ops off (vLLM's default with Inductor)", ("none",), (_NATIVE,)),
        FusionProfile("all", "custom ops on (vLLM's default without Inductor)", ("all",), (_VLLM_C, _NATIVE)),
        FusionProfile(f"+{QUANT_CUSTOM_OP}", f"only {QUANT_CUSTOM_OP} on", ("none", f"+{QUANT_CUSTOM_OP}"),
                      (_NATIVE,)),
        FusionProfile(f"+{layer}", f"only {layer} on", ("none", f"+{layer}"), (_VLLM_C, _NATIVE)),
    ]


def fusion_case(plan: Plan) -> FusionCase | None:
    """The fusion the plan's kernel is the fused kernel of, if any: the plan's `vllm.fusion`, rewriting into its
    `implementations.vllm` when the pass its switch names is on."""
    fusion, kernel = plan.vllm.fusion, plan.vllm_kernel
    if fusion is None:
        return None
    return FusionCase(plan.op.name, fusion.layers, fusion.pass_path, kernel.switch.name, fusion.layer_custom_op,
                      tuple(fusion.ir_ops), f"_C.{kernel.name}", fusion.residual)


FUSION_DTYPE = "bf16"  # the pass's patterns are traced in bf16 (vLLM's own fusion tests run fp16 and bf16)
