"""vLLM general plugin template: RMSNorm runs a Triton kernel (rms_norm)."""

from typing import Optional

import torch
from torch import Tensor
from vllm import ir
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.layernorm import RMSNorm

from kernels.rms_norm import rms_norm as kernel  # harness: kernel

OP = "kernels::rms_norm"  # harness: op
PROVIDER = "rms_norm_kernel"  # harness: provider
ROUTE = "ir"  # harness: route


@torch.library.custom_op(OP, mutates_args=("out",))
def rms_norm_op(out: Tensor, x: Tensor, weight: Tensor, eps: float) -> None:
    """The kernel as an opaque op: torch.compile keeps it as one node, CUDA graphs capture its launch."""
    kernel(out, x, weight, eps)


@rms_norm_op.register_fake
def _(out: Tensor, x: Tensor, weight: Tensor, eps: float) -> None:
    return None  # writes its output argument only: nothing to allocate


def supports_args(x: Tensor, weight: Optional[Tensor], epsilon: float, variance_size: Optional[int] = None) -> bool:
    """What the kernel handles: 2-D rows with unit column stride, a weight of x's dtype, whole-row variance; then
    the plan's op.contract, where it states one."""
    if not (x.dim() == 2 and x.stride(-1) == 1 and weight is not None and weight.dtype == x.dtype
            and variance_size is None):
        return False
    return True  # harness: contract


def rms_norm_impl(x: Tensor, weight: Optional[Tensor], epsilon: float, variance_size: Optional[int] = None) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rms_norm_op(out, x, weight, epsilon)
    return out


def register_ir() -> None:
    """The kernel as a provider of vllm.ir.ops.rms_norm (RMSNorm.forward_native dispatches through it)."""
    if PROVIDER not in ir.ops.rms_norm.impls:  # vLLM may load a plugin more than once per process
        ir.ops.rms_norm.register_impl(PROVIDER, supports_args=supports_args)(rms_norm_impl)


class PluginRMSNorm(RMSNorm):
    """vLLM's RMSNorm with the kernel on the platform path; forward_native stays vLLM's."""

    def forward_cuda(self, x, residual=None):
        weight = self.weight.data if self.has_weight else None
        if residual is not None or not supports_args(x, weight, self.variance_epsilon, self.variance_size_override):
            return self.forward_native(x, residual)
        return rms_norm_impl(x, weight, self.variance_epsilon)

    forward_cpu = forward_cuda  # CPUs run Triton kernels only in Triton's interpreter (tests)


def register_custom_op() -> None:
    """The kernel in an out-of-tree replacement of vLLM's RMSNorm (CustomOp.register_oot).

    vLLM finds out-of-tree classes by the in-tree class name and renames them to it, so custom_ops
    must enable "+RMSNorm" ("+rms_norm" turns on vLLM's own kernel instead).
    """
    if "RMSNorm" not in op_registry_oot:  # vLLM may load a plugin more than once per process
        CustomOp.register_oot(PluginRMSNorm, name="RMSNorm")


def register() -> None:
    """The vllm.general_plugins entry point."""
    {"ir": register_ir, "custom_op": register_custom_op}[ROUTE]()
