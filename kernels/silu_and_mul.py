"""SiLU-and-mul (the gated MLP activation): out = silu(x[:, :d]) * x[:, d:], d = x.shape[-1] // 2.

A grid of rows x column blocks so wide intermediates (e.g. d = 14336) spread over many
programs; the math is done in fp32 and rounded once (vLLM's CUDA kernel does the same; the
native reference rounds silu first, so the two may differ by 1 ulp).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.host import cdiv, next_power_of_2

# Columns per program: 1024 is 16 bytes per thread for 16-bit types at 4 warps.
MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    out_ptr,
    x_ptr,
    out_row_stride,
    x_row_stride,
    d,
    BLOCK: tl.constexpr,
):
    # A 1-D grid, column blocks of a row first: programs scheduled together read neighbouring parts of
    # one row (and the grid is not bound by CUDA's 65535 limit on its second axis).
    # int64 row index: row * stride overflows int32 on large activations.
    blocks_per_row = tl.cdiv(d, BLOCK)
    pid = tl.program_id(0).to(tl.int64)
    row = pid // blocks_per_row
    cols = (pid % blocks_per_row) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    x_row = x_ptr + row * x_row_stride
    # No eviction hints: evict_first cost 4-5% of copy bandwidth on an H200 (bf16 8192 x 14336: 96.9%
    # against 101.4% without, Inductor's kernel 101.5%; scripts/kernel_sweep.py).
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + d + cols, mask=mask, other=0.0).to(tl.float32)
    # silu(g) = g * sigmoid(g) = g / (1 + exp(-g)); exp overflow to inf gives -0, the right limit.
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    """Write silu(x[:, :d]) * x[:, d:] into `out` ([num_tokens, d]). One launch, no allocation."""
    num_tokens = x.shape[0]
    d = x.shape[-1] // 2  # from the input: under tensor parallelism this is the shard's width
    if num_tokens == 0 or d == 0:
        return
    block = min(next_power_of_2(d), MAX_BLOCK)
    num_warps = min(max(block // 256, 1), 4)
    grid = (num_tokens * cdiv(d, block),)
    _silu_and_mul_kernel[grid](out, x, out.stride(0), x.stride(0), d, BLOCK=block, num_warps=num_warps)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """vLLM's SiluAndMul.forward_native."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


# ---------------------------------------------------------------- the op's vLLM side (the plan's vllm section)
# How vLLM's calls map onto the kernel's arguments: the generated plugin calls these, and so do the harness's
# integration items.


def vllm_layer(layer_class, x):
    """vLLM's SiluAndMul (no parameters), and the arguments of its forward."""
    return layer_class(), (x,)


def vllm_forward_inputs(layer, x):
    """SiluAndMul.forward(x): the kernel's input, by the plan's name."""
    return {"x": x}
