"""Deliberately broken int8_weight_only_linear variants: the harness must catch each.

Same signature as `kernels.int8_linear.int8_weight_only_linear` (out, x, weight, weight_scale) -> None;
each carries exactly ONE bug, named in its docstring. The kernels are copies of the real one with that bug.
"""

import torch
import triton
import triton.language as tl

from kernels.int8_linear import BLOCK_K, BLOCK_N, dot_dtype


@triton.jit
def _scale_per_row_kernel(
    out_ptr, x_ptr, w_ptr, scale_ptr,
    num_tokens, out_features, in_features,
    so_m, so_n, sx_m, sx_k, sw_n, sw_k,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
):
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < num_tokens
    n_ok = n < out_features
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < in_features
        x = tl.load(x_ptr + m[:, None] * sx_m + k[None, :] * sx_k, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + n[None, :] * sw_n + k[:, None] * sw_k, mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc += tl.dot(x.to(DOT), w.to(DOT), input_precision="ieee")
    # BUG: the scale is indexed by the output row (token), not the column: out[i, j] gets
    # weight_scale[i]. The load stays in bounds (tokens past out_features get scale 1).
    scale = tl.load(scale_ptr + m, mask=m_ok & (m < out_features), other=1.0).to(tl.float32)
    y = acc * scale[:, None]
    tl.store(out_ptr + m[:, None] * so_m + n[None, :] * so_n, y.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def scale_per_row(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> None:
    """Bug: scales applied per row (per token) instead of per output column: right only when all
    scales are equal."""
    num_tokens, in_features = x.shape
    out_features = weight.shape[0]
    if num_tokens == 0 or out_features == 0:
        return
    block_m = min(max(16, triton.next_power_of_2(num_tokens)), 64)
    grid = (triton.cdiv(num_tokens, block_m), triton.cdiv(out_features, BLOCK_N))
    _scale_per_row_kernel[grid](
        out, x, weight, weight_scale,
        num_tokens, out_features, in_features,
        *out.stride(), *x.stride(), *weight.stride(),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT=dot_dtype(x.dtype, x.device),
        num_warps=4,
    )
