"""Fused residual add + RMSNorm, in place, rounded as vLLM's native RMSNorm with residual:

    s = x.float() + residual.float();  residual <- s.to(dtype)
    x <- (s * rsqrt(mean(s^2) + eps)).to(dtype) * weight

The variance is taken on the fp32 sum s (as forward_native does), not on the rounded residual.
Layout follows Triton's tutorial 05-layer-norm: one program per row.
"""

import torch
import triton
import triton.language as tl

# Same row layout as RMSNorm: one program per row, chunked past kernels.rms_norm.MAX_FUSED_BYTES.
from kernels.rms_norm import _launch_config

# Two passes from this much of x and residual read on, earlier than RMSNorm: at 8192 x 4096 bf16 (128 MiB read)
# on an H200, one pass reached 89.0% of copy bandwidth eager and two passes 92.4% (Inductor 93.5%).
FUSED_ADD_TWO_PASS_BYTES = 128 << 20


@triton.jit
def _fused_add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    x_row_stride,
    res_row_stride,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    HIDDEN: tl.constexpr,  # the width again, as a constant, for the two-pass loops (0 in one pass)
):
    # int64 row index: row * stride overflows int32 on large (or strided) activations.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    res_row = res_ptr + row * res_row_stride
    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        # Weight is shared by all rows: keep it. No hint on x and residual: evict_first cost 2-4% of copy
        # bandwidth at prefill sizes on an H200 (8192 x 4096 bf16: 94.8% with it, 96.2% without).
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(res_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        s = x + r
        tl.store(res_row + cols, s.to(res_ptr.dtype.element_ty), mask=mask)
        # Padded lanes are 0, so they add nothing; divide by the true width, not BLOCK.
        var = tl.sum(s * s, axis=0) / hidden
        rstd = tl.rsqrt(var + eps)
        # vLLM rounds the normalised row to the activation dtype before the weight multiply.
        y = (s * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(x_row + cols, y.to(x_ptr.dtype.element_ty), mask=mask)
    else:
        # Wide rows: pass 1 only reads (the fp32 sum cannot be stored anywhere), pass 2
        # re-reads x and residual (mostly from L2), recomputes s and writes both outputs.
        # Each chunk is loaded before it is overwritten, so the in-place update is safe.
        # The loops are unrolled over the constant width: every chunk's loads are issued before the sums
        # wait on them, and only the last chunk is masked (32768 x 5120 bf16 on an H200: 99.9% of copy
        # bandwidth against 94.7% with a loop over the runtime width).
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for off in tl.static_range(0, HIDDEN, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < HIDDEN
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            r = tl.load(res_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            s = x + r
            acc += s * s
        var = tl.sum(acc, axis=0) / HIDDEN
        rstd = tl.rsqrt(var + eps)
        for off in tl.static_range(0, HIDDEN, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < HIDDEN
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            r = tl.load(res_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            s = x + r
            tl.store(res_row + cols, s.to(res_ptr.dtype.element_ty), mask=mask)
            y = (s * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
            tl.store(x_row + cols, y.to(x_ptr.dtype.element_ty), mask=mask)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual <- x + residual; x <- RMSNorm(x + residual) * weight. One launch."""
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block, single_pass, num_warps = _launch_config(num_tokens, hidden, x.element_size(), streams=2,
                                                   two_pass_bytes=FUSED_ADD_TWO_PASS_BYTES)
    # Row strides are passed so strided views (last dim contiguous) need no copy.
    _fused_add_rms_norm_kernel[(num_tokens,)](
        x,
        residual,
        weight,
        x.stride(0),
        residual.stride(0),
        hidden,
        eps,
        BLOCK=block,
        SINGLE_PASS=single_pass,
        HIDDEN=0 if single_pass else hidden,  # one pass compiles once for every width
        num_warps=num_warps,
    )


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's RMSNorm.forward_native with residual; returns (out, new_residual), inputs untouched."""
    orig_dtype = x.dtype
    xf = x.float()
    xf = xf + residual.float()
    new_residual = xf.to(orig_dtype)
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return xf.to(orig_dtype) * weight, new_residual


# ---------------------------------------------------------------- the op's vLLM side (the plan's vllm section)
# How vLLM's calls map onto the kernel's arguments: the generated plugin calls these, and so do the harness's
# integration items. Each returns the kernel's inputs by the plan's names, or None for a call the kernel does not
# take (vLLM then runs its own path). The kernel writes x and residual in place; vLLM returns them as its outputs.


def vllm_layer(layer_class, x, residual, weight, eps):
    """vLLM's RMSNorm holding this call's weight, and the arguments of its forward (with a residual)."""
    layer = layer_class(x.shape[-1], eps=eps, dtype=weight.dtype)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    return layer, (x, residual)


def vllm_forward_inputs(layer, x, residual=None):
    """RMSNorm.forward(x, residual): the kernel takes the call with a residual, over the whole row, with a weight."""
    if residual is None or layer.variance_size_override is not None or not layer.has_weight:
        return None
    return {"x": x, "residual": residual, "weight": layer.weight.data, "eps": layer.variance_epsilon}


def vllm_ir_inputs(x, x_residual, weight, epsilon, variance_size=None):
    """vllm.ir.ops.fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size)."""
    if weight is None or variance_size is not None:
        return None
    return {"x": x, "residual": x_residual, "weight": weight, "eps": epsilon}
