"""RMSNorm: out = x * rsqrt(mean(x^2) + eps) * weight, rounded as vLLM's native RMSNorm.

Layout follows Triton's tutorial 05-layer-norm: one program per row, the whole row in
registers when it fits (one read of x, one write of out), else two passes over chunks.
"""

import torch
import triton
import triton.language as tl

# A row whose block would exceed this many bytes is processed in chunks (tutorial 05's limit).
MAX_FUSED_BYTES = 65536


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    x_ptr,
    w_ptr,
    out_row_stride,
    x_row_stride,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    # int64 row index: row * stride overflows int32 on large (or strided) activations.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    out_row = out_ptr + row * out_row_stride
    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        # x is streamed once: evict it first; every program re-reads weight: keep it in L2.
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        # Padded lanes are 0, so they add nothing; divide by the true width, not BLOCK.
        var = tl.sum(x * x, axis=0) / hidden
        rstd = tl.rsqrt(var + eps)
        # vLLM rounds the normalised row to x's dtype before the weight multiply.
        y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # Wide rows: pass 1 accumulates squares per lane, pass 2 re-reads x (mostly from L2).
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += x * x
        var = tl.sum(acc, axis=0) / hidden
        rstd = tl.rsqrt(var + eps)
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
            tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch_config(hidden: int, elem_size: int):
    """(BLOCK, single_pass, num_warps) for a row of `hidden` elements of `elem_size` bytes."""
    block = triton.next_power_of_2(hidden)
    max_block = MAX_FUSED_BYTES // elem_size
    single_pass = block <= max_block
    block = min(block, max_block)
    # 16 elements per thread (16-byte vectors, two in flight). Measured on an H200 (bf16): 8 warps beat
    # 16 at hidden 4096 for 64-256 tokens (1.58 vs 1.67 us), 16 warps are best at hidden 8192.
    num_warps = min(max(block // 512, 1), 16)
    return block, single_pass, num_warps


def rms_norm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """Write RMSNorm(x) * weight into `out`. One launch, no allocation, no host sync."""
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block, single_pass, num_warps = _launch_config(hidden, x.element_size())
    # Row strides are passed so strided views (last dim contiguous) need no copy.
    _rms_norm_kernel[(num_tokens,)](
        out,
        x,
        weight,
        out.stride(0),
        x.stride(0),
        hidden,
        eps,
        BLOCK=block,
        SINGLE_PASS=single_pass,
        num_warps=num_warps,
    )


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's RMSNorm.forward_native without residual."""
    orig_dtype = x.dtype
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return xf.to(orig_dtype) * weight
