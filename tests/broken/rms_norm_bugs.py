"""Deliberately broken rms_norm variants: the harness must catch every one.

Each has the signature of `kernels.rms_norm.rms_norm` (out, x, weight, eps) -> None unless its
docstring says otherwise, and carries exactly ONE bug, named in its docstring. The kernels are
copies of the real one (single-pass, one row per program) with that bug planted.
"""

import torch
import triton
import triton.language as tl

from kernels.rms_norm import rms_norm as correct  # the real kernel, for "a correct kernel passes"
from kernels.rms_norm import rms_norm as _real_rms_norm


def _config(hidden: int):
    block = triton.next_power_of_2(hidden)
    return block, min(max(block // 256, 1), 16)


# ----------------------------------------------------------------------------- wrong results


@triton.jit
def _no_load_mask_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    # BUG: no mask / other on the loads: lanes >= hidden read the next row (or past the buffer)
    # and their squares land in the sum; past the buffer, the interpreter reports the load.
    x = tl.load(x_ptr + row * x_row_stride + cols).to(tl.float32)
    w = tl.load(w_ptr + cols).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def no_load_mask(out, x, weight, eps):
    """Bug: unmasked loads; the padded block reads past the row (wrong when hidden is not a power of 2)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _no_load_mask_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


@triton.jit
def _eps_dropped_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # BUG: eps is dropped: rsqrt(0) = inf on an all-zero row, so 0 * inf = NaN.
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def eps_dropped(out, x, weight, eps):
    """Bug: rsqrt(mean(x^2)) without eps (NaN on all-zero rows; otherwise visible only for large eps)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _eps_dropped_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


@triton.jit
def _mean_over_block_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # BUG: mean over the padded block width, not the row width.
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / BLOCK + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def mean_over_block(out, x, weight, eps):
    """Bug: divides the sum of squares by BLOCK instead of hidden (wrong unless hidden is a power of 2)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _mean_over_block_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


@triton.jit
def _fp16_square_sum_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # BUG: squares and their sum in fp16 (tl.sum keeps fp16): overflows to inf once
    # x^2 > 65504 (|x| > 256) and loses bits on long rows.
    x16 = x.to(tl.float16)
    ssq = tl.sum(x16 * x16, axis=0)
    rstd = tl.rsqrt(ssq.to(tl.float32) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def fp16_square_sum(out, x, weight, eps):
    """Bug: accumulates the squares in fp16 (inf at large values, imprecise on long rows)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _fp16_square_sum_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


@triton.jit
def _row_stride_ignored_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    # BUG: assumes x is contiguous (row stride == hidden).
    x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def row_stride_ignored(out, x, weight, eps):
    """Bug: uses hidden as x's row stride (right on contiguous x, wrong on strided views)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _row_stride_ignored_kernel[(n,)](out, x, weight, out.stride(0), hidden, eps, BLOCK=block, num_warps=warps)


ROWS_PER_PROGRAM = 4


@triton.jit
def _tail_rows_dropped_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, num_tokens, hidden, eps,
    BLOCK: tl.constexpr, ROWS: tl.constexpr,
):
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for i in range(ROWS):
        row = tl.program_id(0).to(tl.int64) * ROWS + i
        # (one comparison, not mask & ...: the interpreter mis-types & of a scalar and a block)
        m = cols < tl.where(row < num_tokens, hidden, 0)
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=m, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
        y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def tail_rows_dropped(out, x, weight, eps):
    """Bug: 4 rows per program but num_tokens // 4 programs: the last num_tokens % 4 rows
    are never written."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    grid = (n // ROWS_PER_PROGRAM,)  # BUG: should be triton.cdiv(n, ROWS_PER_PROGRAM)
    _tail_rows_dropped_kernel[grid](
        out, x, weight, out.stride(0), x.stride(0), n, hidden, eps,
        BLOCK=block, ROWS=ROWS_PER_PROGRAM, num_warps=warps,
    )


@triton.jit
def _writes_input_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    xn = (x * rstd).to(x_ptr.dtype.element_ty)
    # BUG: the normalised row is also written back into the input.
    tl.store(x_ptr + row * x_row_stride + cols, xn, mask=mask)
    y = xn.to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def writes_input(out, x, weight, eps):
    """Bug: `out` is right, but x is overwritten with the normalised (pre-weight) values."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _writes_input_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


def wrong_out_dtype(out, x, weight, eps) -> torch.Tensor:
    """Bug: (out, x, weight, eps) -> Tensor: leaves `out` unwritten and returns a new float32 tensor."""
    result = torch.empty(x.shape, dtype=torch.float32, device=x.device)  # BUG: fp32, not out
    _real_rms_norm(result, x, weight, eps)
    return result


# ----------------------------------------------------------------------------- faults


def raises(out, x, weight, eps):
    """Fault: the launcher raises a Python exception."""
    raise ValueError(f"unsupported hidden size {x.shape[-1]}")


@triton.jit
def _returns_nan_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    # BUG: row 0 comes out all NaN.
    y = tl.where(row == 0, float("nan"), y)
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def returns_nan(out, x, weight, eps):
    """Fault: writes NaN into every element of row 0 (other rows correct)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _returns_nan_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


@triton.jit
def _zero_over_zero_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # BUG: a correction term that is always 0 / 0 (as a softmax's overflow gives inf / inf): every element NaN.
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    zero = tl.sum(x * 0.0, axis=0)
    y = (x * rstd * (zero / zero + 1.0)).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def zero_over_zero(out, x, weight, eps):
    """Bug: computes 0 / 0, so every element is a NaN the kernel wrote (not left unwritten)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _zero_over_zero_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


@triton.jit
def _rsqrt_in_ptx_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / hidden + eps
    rstd = tl.inline_asm_elementwise("rsqrt.approx.f32 $0, $1;", "=r,r", [var], dtype=tl.float32, is_pure=True,
                                     pack=1)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rsqrt_in_ptx(out, x, weight, eps):
    """Not a bug: rsqrt in inline PTX, right on a GPU; Triton's interpreter cannot run PTX, so on a CPU machine
    the cell is inconclusive (not run here), never failed."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _rsqrt_in_ptx_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps)


@triton.jit
def _reads_far_out_of_bounds_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    # BUG: x is read 2**40 elements past its start, unmasked: an illegal address on a GPU,
    # reported as an out-of-bounds load under the interpreter (harness.interpreter.bounds).
    far = x_ptr + (1 << 40)
    x = tl.load(far + row * x_row_stride + cols).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def reads_far_out_of_bounds(out, x, weight, eps):
    """Fault: unmasked load 2**40 elements beyond x (illegal memory access on a GPU, OutOfBounds in the
    interpreter)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _reads_far_out_of_bounds_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


@triton.jit
def _never_returns_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x_row = x_ptr + row * x_row_stride
    # BUG: spins forever. (bits | 1) is never 0 for any value (NaN included), and the
    # volatile re-load keeps the compiler from deleting the loop.
    bits = tl.load(x_row).to(tl.float32).to(tl.int32, bitcast=True)
    while (bits | 1) != 0:
        bits = tl.load(x_row, volatile=True).to(tl.float32).to(tl.int32, bitcast=True)
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def never_returns(out, x, weight, eps):
    """Fault: the kernel never terminates (hangs the GPU / the interpreter's Python process)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _never_returns_kernel[(n,)](
        out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps
    )


def allocates_too_much(out, x, weight, eps):
    """Fault: asks for a 1 PiB scratch buffer (raises on CPU and on CUDA), then would compute correctly."""
    scratch = torch.empty(1 << 50, dtype=torch.uint8, device=x.device)  # BUG
    del scratch
    _real_rms_norm(out, x, weight, eps)


# ----------------------------------------------------------------------------- graph-mode bugs


def host_sync(out, x, weight, eps):
    """Bug: a device->host sync (.item()) on every call; results are right, CUDA-graph capture fails."""
    if x.shape[0] == 0:
        return
    peak = x.abs().max().item()  # BUG: host sync, data-dependent launch decision
    if peak > 1e30:
        raise ValueError("input too large")
    _real_rms_norm(out, x, weight, eps)


_CACHE: dict = {}


def cached_output(x, weight, eps) -> torch.Tensor:
    """Bug: functional (x, weight, eps) -> Tensor that returns a module-level buffer reused across
    calls of the same shape, so a later call overwrites an earlier call's result."""
    key = (tuple(x.shape), x.dtype, x.device)
    if key not in _CACHE:
        _CACHE[key] = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = _CACHE[key]  # BUG: shared, not fresh
    _real_rms_norm(out, x, weight, eps)
    return out


# ----------------------------------------------------------------------------- functional forms
# Plans whose op returns its output (no `out` argument) use these.


def functional(x, weight, eps) -> torch.Tensor:
    """Correct: the real kernel with a fresh output per call."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _real_rms_norm(out, x, weight, eps)
    return out


def rounded_from_fp64(x, weight, eps) -> torch.Tensor:
    """Correct: the result computed in fp64 and rounded once, so at a few elements one step from the reference's
    (which computes in fp32): closer to the truth, as the fp64 tie-break finds where a tight tolerance fails it."""
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    return y.to(x.dtype)


def wrong_out_dtype_functional(x, weight, eps) -> torch.Tensor:
    """Bug: returns float32 whatever the input dtype."""
    return wrong_out_dtype(None, x, weight, eps)


def fake_wrong_dtype(x, weight, eps) -> torch.Tensor:
    """Bug (torch.compile fake implementation): claims a float32 result for every input dtype."""
    return torch.empty(x.shape, dtype=torch.float32, device=x.device)


def fake_wrong_shape(x, weight, eps) -> torch.Tensor:
    """Bug (torch.compile fake implementation): drops the last column."""
    return x.new_empty((x.shape[0], x.shape[1] - 1))


# ----------------------------------------------------------------------------- wrong only in memory


@triton.jit
def _unmasked_load_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    # BUG: the loads are unmasked. The lanes past the row are zeroed before they count, so every value is
    # right, but the last row's loads read past the end of x (and every row's past the end of weight).
    x = tl.where(mask, tl.load(x_ptr + row * x_row_stride + cols).to(tl.float32), 0.0)
    w = tl.where(mask, tl.load(w_ptr + cols).to(tl.float32), 0.0)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def unmasked_load(out, x, weight, eps):
    """Bug: unmasked loads whose extra lanes are discarded: right values, out-of-bounds reads (memcheck on a GPU, the
    interpreter's bounds check on a CPU)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _unmasked_load_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block,
                                num_warps=warps)


@triton.jit
def _weight_mask_off_by_one_kernel(
    out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    # BUG: <= for <: where hidden is not a power of two, lane `hidden` reads one element past the end of weight.
    # That lane's product is never stored, so every value is right.
    w = tl.load(w_ptr + cols, mask=cols <= hidden, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def weight_mask_off_by_one(out, x, weight, eps):
    """Bug: the weight load's mask is off by one: right values, a read one element past weight's end (memcheck on a
    GPU, the interpreter's bounds check on a CPU)."""
    n, hidden = x.shape
    if n == 0:
        return
    block, warps = _config(hidden)
    _weight_mask_off_by_one_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block,
                                         num_warps=warps)


# The size from which two_pass_short_loop takes its two-pass path: small, so a CPU machine's cells can reach it.
SHORT_LOOP_TWO_PASS_BYTES = 64 << 10


def two_pass_short_loop(out, x, weight, eps):
    """Bug in the size-selected path only: from SHORT_LOOP_TWO_PASS_BYTES of x on, the real kernel's two-pass
    loops run to hidden - 1 (the last column is never written, the variance misses it); smaller inputs are
    right."""
    from kernels.rms_norm import _launch_config, _rms_norm_kernel

    n, hidden = x.shape
    if n == 0 or n * hidden * x.element_size() < SHORT_LOOP_TWO_PASS_BYTES:
        return correct(out, x, weight, eps)
    block, _, warps = _launch_config(n, hidden, x.element_size(), two_pass_bytes=0)
    _rms_norm_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0), hidden - 1, eps, BLOCK=block,
                           SINGLE_PASS=False, num_warps=warps)


def _pairwise_sum_bf16(v: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension pairwise, each partial sum rounded to bf16 (a tree reduction in bf16)."""
    v = v.to(torch.bfloat16)
    while v.shape[-1] > 1:
        if v.shape[-1] % 2:
            v = torch.cat([v, torch.zeros_like(v[..., :1])], -1)
        v = (v[..., 0::2].float() + v[..., 1::2].float()).to(torch.bfloat16)
    return v[..., 0].float()


def bf16_accumulator(out, x, weight, eps):
    """Bug: the sum of squares is accumulated in bf16 (a pairwise tree, as a reduction over bf16 lanes), where the
    plan says accumulation: fp32. Its error stays inside the bf16 tolerance: only the accumulation check sees it.
    Plain PyTorch, so that it runs alike on every machine."""
    xf = x.float()
    var = _pairwise_sum_bf16(xf * xf) / x.shape[-1]
    y = (xf * torch.rsqrt(var[..., None] + eps)).to(x.dtype).float() * weight.float()
    out.copy_(y.to(out.dtype))


def fp32_accumulator(out, x, weight, eps):
    """Correct, in plain PyTorch: the pairwise sum in fp32 (another order than the reference's) and the weight
    multiply without the intermediate rounding, so its errors differ from the reference's element by element."""
    xf = x.float()
    var = (xf * xf).sum(-1, keepdim=True) / x.shape[-1]
    out.copy_((xf * torch.rsqrt(var + eps) * weight.float()).to(out.dtype))


def oom_inside_a_comparison(out, x, weight, eps):
    """A correct kernel on a GPU whose memory other processes hold, denied inside torch.testing's comparison: the
    "Comparing ... resulted in the unexpected exception above" RuntimeError hides the out-of-memory in its cause."""
    try:
        raise RuntimeError(OTHERS_OOM)
    except RuntimeError as oom:
        raise RuntimeError("Comparing\n\nTensorLikePair(...)\n\nresulted in the unexpected exception above.") from oom


# as CUDA words it, with other processes holding most of an H200 (tests/test_environment_failures.py)
OTHERS_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
              "1.23 GiB is free. Process 2235 has 21.29 GiB memory in use. Process 2236 has 18.00 GiB memory in use. "
              "Including non-PyTorch memory, this process has 20.00 GiB memory in use. Of the allocated memory "
              "18.50 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.")
