"""vLLM general plugin template: SiluAndMul runs a Triton kernel (silu_and_mul)."""

import torch
from torch import Tensor
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul

from kernels.silu_and_mul import silu_and_mul as kernel  # harness: kernel

OP = "kernels::silu_and_mul"  # harness: op
PROVIDER = "silu_and_mul_kernel"  # harness: provider
ROUTE = "custom_op"  # harness: route


@torch.library.custom_op(OP, mutates_args=("out",))
def silu_and_mul_op(out: Tensor, x: Tensor) -> None:
    """The kernel as an opaque op: torch.compile keeps it as one node, CUDA graphs capture its launch."""
    kernel(out, x)


@silu_and_mul_op.register_fake
def _(out: Tensor, x: Tensor) -> None:
    return None  # writes its output argument only: nothing to allocate


def supports_args(x: Tensor) -> bool:
    """What the kernel handles: 2-D rows with unit column stride and an even width; then the plan's op.contract,
    where it states one."""
    if not (x.dim() == 2 and x.stride(-1) == 1 and x.shape[-1] % 2 == 0):
        return False
    return True  # harness: contract


def silu_and_mul_impl(x: Tensor) -> Tensor:
    out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
    silu_and_mul_op(out, x)
    return out


class PluginSiluAndMul(SiluAndMul):
    """vLLM's SiluAndMul with the kernel on the platform path; forward_native stays vLLM's."""

    def forward_cuda(self, x):
        if not supports_args(x):
            return self.forward_native(x)
        return silu_and_mul_impl(x)

    forward_cpu = forward_cuda  # CPUs run Triton kernels only in Triton's interpreter (tests)


def register_custom_op() -> None:
    """The kernel in an out-of-tree replacement of vLLM's SiluAndMul (CustomOp.register_oot).

    vLLM finds out-of-tree classes by the in-tree class name and renames them to it, so custom_ops
    must enable "+SiluAndMul" ("+silu_and_mul" turns on vLLM's own kernel instead).
    """
    if "SiluAndMul" not in op_registry_oot:  # vLLM may load a plugin more than once per process
        CustomOp.register_oot(PluginSiluAndMul, name="SiluAndMul")


def register() -> None:
    """The vllm.general_plugins entry point."""
    {"custom_op": register_custom_op}[ROUTE]()
