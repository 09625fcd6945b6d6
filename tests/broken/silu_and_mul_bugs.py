"""Deliberately broken silu_and_mul variants (signature (out, x) -> None): the harness must catch each."""

import triton
import triton.language as tl


# The unsharded intermediate size the buggy kernel bakes in; a test may set it.
INTERMEDIATE_SIZE = 512


@triton.jit
def _d_from_plan_constant_kernel(
    out_ptr, x_ptr, out_row_stride, x_row_stride, d_out, width, up_start, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d_out
    x_row = x_ptr + row * x_row_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    # BUG: the up half is taken to start at the unsharded INTERMEDIATE_SIZE; the load stays
    # masked to the row, so past its end it reads 0 instead of faulting.
    up_cols = up_start + cols
    up = tl.load(x_row + up_cols, mask=mask & (up_cols < width), other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def d_from_plan_constant(out, x):
    """Bug: the split point is the module constant INTERMEDIATE_SIZE, not x.shape[-1] // 2:
    right on the unsharded input (x.shape[-1] == 2 * INTERMEDIATE_SIZE), wrong under tensor parallelism."""
    num_tokens, width = x.shape
    d_out = out.shape[-1]  # writes stay inside out
    if num_tokens == 0 or d_out == 0:
        return
    block = min(triton.next_power_of_2(d_out), 1024)
    grid = (num_tokens, triton.cdiv(d_out, block))
    _d_from_plan_constant_kernel[grid](
        out, x, out.stride(0), x.stride(0), d_out, width, INTERMEDIATE_SIZE, BLOCK=block, num_warps=4
    )
