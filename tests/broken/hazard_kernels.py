"""RMSNorm kernels whose values pass but that vLLM would be bitten by: each carries ONE hazard, named in its
docstring, that harness.runtime.padding, batch_invariance or determinism must catch. Signature of
`kernels.rms_norm.rms_norm`: (out, x, weight, eps) -> None, out written in place.
"""

import torch
import triton
import triton.language as tl

from kernels.rms_norm import rms_norm as correct


def _block(hidden: int) -> int:
    return triton.next_power_of_2(hidden)


# ----------------------------------------------------------------------------- reads the padding rows


@triton.jit
def _scaled_kernel(out_ptr, x_ptr, w_ptr, s_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    s = tl.load(s_ptr)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32) / s
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # x / s normalised is x normalised: eps scales by 1 / s^2 alongside
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps / (s * s))
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def batch_absmax_scaled(out, x, weight, eps):
    """Hazard: divides every row by the absmax of the whole x buffer first (to keep the squares in range): the same
    values up to rounding on the call's own rows, but under a CUDA graph the buffer's padding rows set the scale."""
    n, hidden = x.shape
    if n == 0:
        return
    # BUG: a reduction over every row of the buffer, padding rows included (on the device: capturable)
    s = x.abs().amax().float().clamp_min(torch.finfo(torch.float32).tiny).reshape(1)
    _scaled_kernel[(n,)](out, x, weight, s, out.stride(0), x.stride(0), hidden, eps, BLOCK=_block(hidden))


# ----------------------------------------------------------------------------- depends on the batch size

SPLIT_BELOW = 32  # batches of fewer tokens split each row's sum of squares


@triton.jit
def _split_kernel(out_ptr, x_ptr, w_ptr, out_row_stride, x_row_stride, hidden, eps, BLOCK: tl.constexpr,
                  SPLITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    CHUNK: tl.constexpr = BLOCK // SPLITS
    acc = 0.0
    for i in tl.static_range(SPLITS):  # partial sums of SPLITS chunks, added in turn
        cols = i * CHUNK + tl.arange(0, CHUNK)
        xc = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        acc += tl.sum(xc * xc, axis=0)
    rstd = tl.rsqrt(acc / hidden + eps)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def split_by_batch(out, x, weight, eps):
    """Hazard: small batches split each row's sum of squares into 4 partial sums (more parallelism for decode), larger
    ones sum it whole: the fp32 additions come in another order, so a row's last bits depend on the batch size."""
    n, hidden = x.shape
    if n == 0:
        return
    block = max(_block(hidden), 4)
    splits = 4 if n < SPLIT_BELOW else 1  # BUG: the summation order follows num_tokens
    _split_kernel[(n,)](out, x, weight, out.stride(0), x.stride(0), hidden, eps, BLOCK=block, SPLITS=splits)


# ----------------------------------------------------------------------------- not deterministic


def noisy(out, x, weight, eps):
    """Hazard: a correct result with one ulp of random noise on about half the elements (from torch's global
    generator, never seeded here): inside every tolerance, different on every call."""
    correct(out, x, weight, eps)
    bits = out.view({2: torch.int16, 4: torch.int32}[out.element_size()])
    bits += (torch.rand(out.shape, device=out.device) < 0.5).to(bits.dtype)  # BUG: next float up, at random


@triton.jit
def _square_sums_kernel(sums_ptr, x_ptr, x_row_stride, hidden, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    tl.atomic_add(sums_ptr + row, tl.sum(x * x, axis=0))  # BUG: added in whatever order the programs finish


@triton.jit
def _normalise_kernel(out_ptr, x_ptr, w_ptr, sums_ptr, out_row_stride, x_row_stride, hidden, eps,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.load(sums_ptr + row) / hidden + eps)
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


ATOMIC_CHUNK = 16


def atomic_sum(out, x, weight, eps):
    """Hazard: each row's sum of squares is added up with atomics from one program per 16 columns, in whatever
    order the programs finish on a GPU (Triton's CPU interpreter runs them in turn: deterministic there)."""
    n, hidden = x.shape
    if n == 0:
        return
    sums = torch.zeros(n, dtype=torch.float32, device=x.device)
    _square_sums_kernel[(n, triton.cdiv(hidden, ATOMIC_CHUNK))](sums, x, x.stride(0), hidden, CHUNK=ATOMIC_CHUNK)
    _normalise_kernel[(n,)](out, x, weight, sums, out.stride(0), x.stride(0), hidden, eps, BLOCK=_block(hidden))
