"""rms_norm kernels that are right only inside a contract: each fails where the plan draws inputs its contract
(op.contract) would rule out, and passes where the plan states that contract.

Signature of `kernels.rms_norm.rms_norm`: (out, x, weight, eps) -> None.
"""

import triton
import triton.language as tl


@triton.jit
def _packed_rows_kernel(out_ptr, x_ptr, w_ptr, hidden, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # Assumes rows packed back to back (row stride == hidden) and whole 8-element vectors: the columns of a
    # last partial vector are neither read nor written.
    mask = cols < hidden // 8 * 8
    x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * hidden + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def packed_rows(out, x, weight, eps):
    """Right for contiguous x with hidden a multiple of 8 (contract: contiguous: [x], multiple_of: {hidden: 8});
    wrong on a strided x (reads the wrong rows) and leaves the last hidden % 8 columns unwritten."""
    n, hidden = x.shape
    if n == 0:
        return
    _packed_rows_kernel[(n,)](out, x, weight, hidden, eps, BLOCK=triton.next_power_of_2(hidden))


@triton.jit
def _stride_in_vectors_kernel(out_ptr, x_ptr, w_ptr, out_row_stride, x_row_vectors, hidden, eps,
                              BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    # x's row stride arrives in 8-element vectors, as a kernel doing 16-byte loads of bf16 counts it.
    x = tl.load(x_ptr + row * x_row_vectors * 8 + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def stride_in_vectors(out, x, weight, eps):
    """Right when x's row stride is a multiple of 8 elements (contract: row_stride_multiple_of: {x: 8}), strided
    or not; on any other row stride it reads rows from the wrong place."""
    n, hidden = x.shape
    if n == 0:
        return
    _stride_in_vectors_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0) // 8, hidden, eps,
                                    BLOCK=triton.next_power_of_2(hidden))
