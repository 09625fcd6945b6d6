"""Deliberately broken static FP8 quantization variants: the harness must catch every one.

Each carries exactly ONE bug, named in its docstring, and has the signature of the real kernel its
docstring names. The kernels are copies of the real ones with that bug planted.
"""

import triton
import triton.language as tl

from kernels.fp8_quant import dynamic_per_token_scaled_fp8_quant, fp8_max
from kernels.silu_and_mul import MAX_BLOCK

# The real kernels, for "a correct kernel passes": one per signature below.
from kernels.rms_norm_quant import rms_norm_static_fp8_quant as correct  # noqa: F401
from kernels.silu_and_mul_quant import silu_and_mul_quant as correct_silu_and_mul_quant  # noqa: F401


@triton.jit
def _scale_multiplied_kernel(
    out_ptr, x_ptr, w_ptr, scale_ptr, out_row_stride, x_row_stride, hidden, eps, fp8_max, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    act = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = ((x * rstd).to(act).to(tl.float32) * w).to(act).to(tl.float32)
    # BUG: multiplies by the scale; quantization divides by it (y * (1 / scale)).
    q = tl.minimum(tl.maximum(y * tl.load(scale_ptr), -fp8_max), fp8_max)
    tl.store(out_ptr + row * out_row_stride + cols, q.to(out_ptr.dtype.element_ty), mask=mask)


def scale_multiplied(out, x, weight, scale, eps):
    """Bug (signature of kernels.rms_norm_quant.rms_norm_static_fp8_quant: out, x, weight, scale, eps):
    y * scale instead of y / scale. Right only when scale == 1."""
    n, hidden = x.shape
    if n == 0:
        return
    block = triton.next_power_of_2(hidden)  # single pass: the whole row in one block
    _scale_multiplied_kernel[(n,)](
        out, x, weight, scale, out.stride(0), x.stride(0), hidden, eps, fp8_max(out.dtype),
        BLOCK=block, num_warps=min(max(block // 512, 1), 16),
    )


@triton.jit
def _no_clamp_kernel(out_ptr, x_ptr, scale_ptr, out_row_stride, x_row_stride, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    x_row = x_ptr + row * x_row_stride
    act = x_ptr.dtype.element_ty
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + d + cols, mask=mask, other=0.0).to(tl.float32)
    y = ((gate / (1.0 + tl.exp(-gate))).to(act).to(tl.float32) * up).to(act).to(tl.float32)
    # BUG: no clamp to +-fp8_max before the cast.
    q = y * (1.0 / tl.load(scale_ptr))
    tl.store(out_ptr + row * out_row_stride + cols, q.to(out_ptr.dtype.element_ty), mask=mask)


def no_clamp(out, x, scale):
    """Bug (signature of kernels.silu_and_mul_quant.silu_and_mul_quant: out, x, scale): casts
    y / scale to fp8 without clamping it to +-fp8_max. Values past the range become NaN in
    float8_e4m3fnuz; for float8_e4m3fn the result depends on the cast: PyTorch and a GPU's saturating
    conversion (cvt.rn.satfinite on NVIDIA) give +-448, hiding the bug, a non-saturating cast gives NaN."""
    n = x.shape[0]
    d = x.shape[-1] // 2
    if n == 0 or d == 0:
        return
    block = min(triton.next_power_of_2(d), MAX_BLOCK)
    _no_clamp_kernel[(n, triton.cdiv(d, block))](out, x, scale, out.stride(0), x.stride(0), d, BLOCK=block)


def scale_ub_ignored(out, x, scales, scale_ub=None):
    """Bug: never passes scale_ub on, so rows whose amax exceeds the bound get too large a scale (a plan that pins
    scale_ub: null never sees it)."""
    dynamic_per_token_scaled_fp8_quant(out, x, scales, None)
