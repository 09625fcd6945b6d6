"""Dynamic per-token FP8 quantization, as vLLM's `dynamic_per_token_scaled_fp8_quant(out, x, scales, scale_ub)`:

    amax_t  = max_j |x[t, j]|, clamped to scale_ub when one is given
    scale_t = max(amax_t / fp8_max, 1 / (fp8_max * 512))     (written to scales[t, 0], fp32)
    out[t]  = fp8(clamp(x[t] / scale_t, -fp8_max, fp8_max))

The minimum scale keeps an all-zero row finite (its output is all zeros). fp8_max is 448 for
float8_e4m3fn and 224 for float8_e4m3fnuz: vLLM quantizes to 224 on ROCm, not finfo's 240, which it
reports hurts dynamic quantization's accuracy (get_fp8_min_max, quant_type_max). All math is fp32; the CUDA
kernel divides by the per-token scale (vLLM's native QuantFP8 multiplies by its reciprocal: the two
differ by at most one fp32 rounding before the fp8 cast).
"""

import torch
import triton
import triton.language as tl

# One program per row, whole row in registers when it fits, else two passes over chunks (as RMSNorm).
from kernels.rms_norm import _launch_config


def fp8_max(dtype: torch.dtype) -> float:
    """The largest magnitude vLLM quantizes to for an fp8 dtype."""
    if dtype == getattr(torch, "float8_e4m3fnuz", None):
        return 224.0
    return float(torch.finfo(dtype).max)


@triton.jit
def _dynamic_per_token_fp8_quant_kernel(
    out_ptr,
    scale_ptr,
    x_ptr,
    ub_ptr,
    out_row_stride,
    x_row_stride,
    scale_row_stride,
    hidden,
    fp8_max,
    min_scale,
    HAS_UB: tl.constexpr,
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
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)  # padded lanes are 0: they never win
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < hidden, other=0.0, eviction_policy="evict_last")
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
        amax = tl.max(acc, axis=0)
    if HAS_UB:
        amax = tl.minimum(amax, tl.load(ub_ptr).to(tl.float32))
    scale = tl.maximum(amax / fp8_max, min_scale)
    tl.store(scale_ptr + row * scale_row_stride, scale)
    if SINGLE_PASS:
        # Clamp before the cast: out-of-range values are NaN in float8_e4m3fnuz.
        q = tl.minimum(tl.maximum(x / scale, -fp8_max), fp8_max)
        tl.store(out_row + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            q = tl.minimum(tl.maximum(x / scale, -fp8_max), fp8_max)
            tl.store(out_row + cols, q.to(out_ptr.dtype.element_ty), mask=mask)


def dynamic_per_token_scaled_fp8_quant(
    out: torch.Tensor, x: torch.Tensor, scales: torch.Tensor, scale_ub: torch.Tensor | None = None
) -> None:
    """Write fp8 x into `out` and each row's fp32 scale into `scales` ([num_tokens, 1]). One launch."""
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block, single_pass, num_warps = _launch_config(num_tokens, hidden, x.element_size())
    qmax = fp8_max(out.dtype)
    _dynamic_per_token_fp8_quant_kernel[(num_tokens,)](
        out,
        scales,
        x,
        scales if scale_ub is None else scale_ub,  # never read without HAS_UB
        out.stride(0),
        x.stride(0),
        scales.stride(0),
        hidden,
        qmax,
        1.0 / (qmax * 512.0),
        HAS_UB=scale_ub is not None,
        BLOCK=block,
        SINGLE_PASS=single_pass,
        num_warps=num_warps,
    )


def scaled_fp8_quant_ref(y: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Static quantization as vLLM's CUDA kernels and its native QuantFP8 both do it: fp32 y * (1 / scale),
    clamped to +-fp8_max, cast."""
    qmax = fp8_max(out_dtype)
    return (y.float() * scale.float().reciprocal()).clamp(-qmax, qmax).to(out_dtype)


def dynamic_per_token_scaled_fp8_quant_ref(
    x: torch.Tensor, scale_ub: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per-token dynamic quantization; returns (out, scales [num_tokens, 1]). Divides by the scale
    as the CUDA kernel does (QuantFP8.forward_native multiplies by its reciprocal instead: one fp8 step
    apart on under 0.2% of elements)."""
    qmax = fp8_max(out_dtype)
    x_max = x.abs().amax(dim=-1, keepdim=True).float()
    if scale_ub is not None:
        x_max = x_max.clamp(max=scale_ub.float())
    scales = (x_max / qmax).clamp(min=1.0 / (qmax * 512.0))
    return (x.float() / scales).clamp(-qmax, qmax).to(out_dtype), scales


# ---------------------------------------------------------------- the op's vLLM side (the plan's vllm section)
# How vLLM's calls map onto the kernel's arguments (dynamic_per_token_fp8_quant's plan): the generated plugin calls
# these, and so do the harness's integration items. vLLM's QuantFP8 returns (out, scales), as the kernel writes them.


def vllm_layer(layer_class, x, scale_ub=None):
    """vLLM's QuantFP8 quantizing dynamically per token, and the arguments of its forward (x, scale, scale_ub)."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    return layer_class(static=False, group_shape=GroupShape.PER_TOKEN), (x, None, scale_ub)


def vllm_forward_inputs(layer, x, scale=None, scale_ub=None):
    """QuantFP8.forward(x, scale, scale_ub): the kernel quantizes dynamically per token, scales in a column."""
    if layer.static or layer.is_group_quant or not layer.use_per_token_if_dynamic or scale is not None \
            or layer.column_major_scales or layer.num_token_padding:
        return None
    return {"x": x, "scale_ub": scale_ub}
