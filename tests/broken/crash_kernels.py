"""RMSNorm kernels that raise inside Triton's kernel source, with rms_norm's signature (out, x, weight, eps) -> None:
the harness must say the kernel's line, and whether a GPU's compiler rejects the kernel too
(tests/test_crash_words.py). Each carries ONE mistake, named in its docstring, at the line marked MISTAKE, but
asks_num_warps: none a GPU sees."""

import triton
import triton.language as tl
from triton.language.extra import cuda, libdevice


def _config(hidden: int):
    block = triton.next_power_of_2(hidden)
    return block, min(max(block // 256, 1), 16)


@triton.jit
def _shape_not_a_tuple_kernel(out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    acc = tl.zeros(BLOCK, dtype=tl.float32)  # MISTAKE: a shape is a tuple, [BLOCK]
    acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def shape_not_a_tuple(out, x, weight, eps):
    """Mistake: tl.zeros given an int for its shape: a TypeError in the interpreter, and on a GPU's compiler."""
    n, hidden = x.shape
    block, warps = _config(hidden)
    _shape_not_a_tuple_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block,
                                    num_warps=warps)


@triton.jit
def _tanh_16bit_kernel(out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    raw = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    x = libdevice.tanh(raw).to(tl.float32)  # MISTAKE: libdevice's tanh takes fp32 or fp64, not the 16-bit input
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def tanh_16bit(out, x, weight, eps):
    """Mistake: RMSNorm of tanh(x) with libdevice.tanh called on bf16/fp16 values, which it has no variant for."""
    n, hidden = x.shape
    block, warps = _config(hidden)
    _tanh_16bit_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, num_warps=warps)


@triton.jit
def _asks_num_warps_kernel(out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr):
    # Not a mistake on a GPU: Triton's interpreter has no num_warps to give (its options lack it).
    tl.static_assert(cuda.num_warps() <= 16)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def asks_num_warps(out, x, weight, eps):
    """No mistake a GPU sees: a correct RMSNorm that reads tl.extra.cuda.num_warps(), which only the interpreter
    cannot run."""
    n, hidden = x.shape
    block, warps = _config(hidden)
    _asks_num_warps_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block,
                                 num_warps=warps)
