"""RMSNorm with static per-tensor FP8 output, as vLLM's `rms_norm_static_fp8_quant(out, x, weight, scale, eps)`
and `fused_add_rms_norm_static_fp8_quant(out, x, residual, weight, scale, eps)`:

    s = x                                     (fused: s = (x + residual).to(dtype); residual <- s)
    y = ((s * rsqrt(mean(s^2) + eps)).to(dtype) * weight).to(dtype)
    out = fp8(clamp(y * (1 / scale), -fp8_max, fp8_max))

Rounded as vLLM's CUDA kernels (csrc/layernorm_quant_kernels.cu): the fused add is done in the
activation dtype, so the variance is taken on the rounded residual; the normalised row is rounded to
the activation dtype before the weight multiply and the product again (a 16-bit multiply there);
the scale is inverted once and multiplied. x is not modified. Layout as kernels.rms_norm: one program
per row, two passes over chunks for wide rows.
"""

import torch
import triton
import triton.language as tl

from kernels.fp8_quant import fp8_max, scaled_fp8_quant_ref
from kernels.rms_norm import _launch_config, rms_norm_ref


@triton.jit
def _normalise_and_quant(s, rstd, w, inv_scale, fp8_max, act_dtype: tl.constexpr, out_dtype: tl.constexpr):
    # Two roundings to the activation dtype, as vLLM's ((scalar_t)(s * rstd)) * weight[i].
    y = ((s * rstd).to(act_dtype).to(tl.float32) * w).to(act_dtype).to(tl.float32)
    # Clamp before the cast: out-of-range values are NaN in float8_e4m3fnuz.
    return tl.minimum(tl.maximum(y * inv_scale, -fp8_max), fp8_max).to(out_dtype)


@triton.jit
def _rms_norm_fp8_quant_kernel(
    out_ptr,
    x_ptr,
    res_ptr,
    w_ptr,
    scale_ptr,
    out_row_stride,
    x_row_stride,
    res_row_stride,
    hidden,
    eps,
    fp8_max,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    # int64 row index: row * stride overflows int32 on large (or strided) activations.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    res_row = res_ptr + row * res_row_stride
    out_row = out_ptr + row * out_row_stride
    act = x_ptr.dtype.element_ty
    inv_scale = 1.0 / tl.load(scale_ptr).to(tl.float32)
    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        # No hint on the activations, as in kernels.rms_norm's one pass (evict_first cost bandwidth there).
        s = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_row + cols, mask=mask, other=0.0).to(tl.float32)
            s = (s + r).to(act)
            tl.store(res_row + cols, s, mask=mask)
            s = s.to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        # Padded lanes are 0, so they add nothing; divide by the true width, not BLOCK.
        rstd = tl.rsqrt(tl.sum(s * s, axis=0) / hidden + eps)
        q = _normalise_and_quant(s, rstd, w, inv_scale, fp8_max, act, out_ptr.dtype.element_ty)
        tl.store(out_row + cols, q, mask=mask)
    else:
        # Wide rows: pass 1 sums squares (and writes the new residual), pass 2 re-reads the
        # normalised input (the residual when fused: the rounded sum, as vLLM) and quantizes.
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            s = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(res_row + cols, mask=mask, other=0.0).to(tl.float32)
                s = (s + r).to(act)
                tl.store(res_row + cols, s, mask=mask)
                s = s.to(tl.float32)
            acc += s * s
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / hidden + eps)
        src_row = res_row if HAS_RESIDUAL else x_row
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            s = tl.load(src_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            q = _normalise_and_quant(s, rstd, w, inv_scale, fp8_max, act, out_ptr.dtype.element_ty)
            tl.store(out_row + cols, q, mask=mask)


def _launch(out, x, residual, weight, scale, eps):
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block, single_pass, num_warps = _launch_config(num_tokens, hidden, x.element_size())
    # Row strides are passed so strided views (last dim contiguous) need no copy.
    _rms_norm_fp8_quant_kernel[(num_tokens,)](
        out,
        x,
        x if residual is None else residual,  # never touched without HAS_RESIDUAL
        weight,
        scale,
        out.stride(0),
        x.stride(0),
        0 if residual is None else residual.stride(0),
        hidden,
        eps,
        fp8_max(out.dtype),
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        SINGLE_PASS=single_pass,
        num_warps=num_warps,
    )


def rms_norm_static_fp8_quant(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float
) -> None:
    """Write fp8(RMSNorm(x) * weight / scale) into `out`. One launch, no allocation, no host sync."""
    _launch(out, x, None, weight, scale, eps)


def fused_add_rms_norm_static_fp8_quant(
    out: torch.Tensor, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
    eps: float,
) -> None:
    """residual <- x + residual (in place); out <- fp8(RMSNorm(residual) * weight / scale). One launch."""
    _launch(out, x, residual, weight, scale, eps)


def rms_norm_static_fp8_quant_ref(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float, out_dtype: torch.dtype = torch.float8_e4m3fn
) -> torch.Tensor:
    """vLLM's RMSNorm.forward_native, then QuantFP8.forward_native with the static scale."""
    return scaled_fp8_quant_ref(rms_norm_ref(x, weight, eps), scale, out_dtype)


def fused_add_rms_norm_static_fp8_quant_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, new_residual), inputs untouched. The sum is rounded before it is normalised,
    as vLLM's fused CUDA kernels do (its native RMSNorm normalises the fp32 sum instead)."""
    new_residual = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_static_fp8_quant_ref(new_residual, weight, scale, eps, out_dtype), new_residual
