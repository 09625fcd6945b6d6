"""`op.accumulation: fp32`, checked: a kernel accumulating in bf16 or fp16 can stay inside a 16-bit tolerance, so
the check compares the kernel's error against an fp64 truth with the error of the plan's reference, which
accumulates in fp32, on the same inputs.

Two statistics, over the rows of each output (its last dimension, the one an op reduces over):
- per-row systematic error: the least-squares relative scale of each row's error, b = sum(e * t) / sum(t * t).
  A reduction accumulated in 16 bits shifts a whole row (RMSNorm's variance moves every element of the row by
  the same factor), while rounding the output to 16 bits leaves b within its noise, sigma (from the reference's
  per-element errors). Rows where the reference itself is shifted are left out: on inputs of rms near 1, x * rstd
  rounds back onto x, so the reference keeps x's scale (vLLM's rounding, not an accumulator's). The kernel's b
  over the remaining rows, in units of sigma, must stay within FACTOR;
- element error: the root mean square of the error, within FACTOR of the reference's, for reductions whose
  errors land per element (a dot product per output of a linear layer).
Measured on CPU (tests/test_accumulation.py, rows of 256 to 4096): a bf16 tree-reduced sum of squares gives
5-23 sigma, the bundled Triton RMSNorm 1.3-1.9 and a correct single-rounding kernel 0.6-1.1. Rows narrower than
MIN_ROW_ELEMENTS, or fewer than MIN_ROWS clean rows, are left to the tolerance. Only 16-bit cells are checked:
in an fp32 cell fp32 is the input's own dtype.
"""

from __future__ import annotations

import torch

from harness.runtime.numerics import Mismatch

FACTOR = 4.0
CLEAN_SIGMAS = 3.0  # a reference row shifted by more than this many sigma is left out
MIN_ROWS = 8
MIN_ROW_ELEMENTS = 64
# Larger outputs are left to the tolerance: the check's fp64 copies of a 2**31-element output (the int32-overflow
# example) need more memory than an H200 has, and smaller examples of the same cell already show the accumulator.
MAX_ELEMENTS = 2**27
CHECKED_DTYPES = (torch.float16, torch.bfloat16)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.double().reshape(-1, t.shape[-1])


def row_bias(actual: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per row, the relative scale error that best explains the row's error (0 for an all-zero row)."""
    a, t = _rows(actual), _rows(truth)
    energy = (t * t).sum(-1)
    return torch.where(energy > 0, ((a - t) * t).sum(-1) / energy.clamp_min(1e-300), torch.zeros_like(energy))


def _rms(t: torch.Tensor) -> float:
    return float(t.pow(2).mean().sqrt()) if t.numel() else 0.0


def row_noise(expected: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per row, the standard deviation of row_bias that the reference's per-element rounding alone would give."""
    e, t = _rows(expected), _rows(truth)
    energy = (t * t).sum(-1).clamp_min(1e-300)
    return ((e - t).pow(2) * t.pow(2)).sum(-1).sqrt() / energy


def check(name: str, actual, expected, truth: torch.Tensor) -> None:
    """Mismatch if `actual`'s error against `truth` is consistent with a 16-bit accumulator where the reference
    (`expected`, accumulating in fp32) is not."""
    if not isinstance(actual, torch.Tensor) or actual.dtype not in CHECKED_DTYPES or actual.dim() == 0 \
            or actual.shape != truth.shape or actual.shape[-1] < MIN_ROW_ELEMENTS or actual.numel() > MAX_ELEMENTS:
        return
    a, e, t = _rows(actual), _rows(expected), _rows(truth)
    finite = torch.isfinite(a).all(-1) & torch.isfinite(e).all(-1) & torch.isfinite(t).all(-1)
    a, e, t = a[finite], e[finite], t[finite]
    element, element_ref = _rms(a - t), _rms(e - t)
    if element > FACTOR * max(element_ref, torch.finfo(actual.dtype).eps * float(t.abs().mean()) / 64):
        raise Mismatch(f"output '{name}': accumulation: the kernel's element error against fp64 (rms) is "
                       f"{element:.3g}, {element / max(element_ref, 1e-300):.1f}x the fp32-accumulating reference's "
                       f"({element_ref:.3g}) on the same inputs (at most {FACTOR:g}x): it does not accumulate in fp32 "
                       "as op.accumulation says")
    sigma = row_noise(e, t)
    clean = (row_bias(e, t).abs() <= CLEAN_SIGMAS * sigma) & (sigma > 0)
    if int(clean.sum()) < MIN_ROWS:
        return
    shift = float(row_bias(a, t)[clean].pow(2).mean().sqrt() / sigma[clean].pow(2).mean().sqrt())
    if shift > FACTOR:
        raise Mismatch(f"output '{name}': accumulation: the kernel shifts whole rows against fp64 by {shift:.1f} "
                       f"times the noise of the fp32-accumulating reference's rounding (at most {FACTOR:g}, over "
                       f"{int(clean.sum())} rows): its reduction does not accumulate in fp32 as op.accumulation says")
