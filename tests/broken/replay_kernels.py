"""Broken RMSNorm kernels for tests/test_failure_replay.py: two distinct failures in one kernel, a failure that comes
and goes with the environment, and outputs the kernel allocates itself with rows never written or NaN computed.

Signatures as `kernels.rms_norm.rms_norm` (out, x, weight, eps) -> None, or, where the name says `returned`, the
functional (x, weight, eps) -> y.
"""

import os

import torch

from kernels.rms_norm import rms_norm as _real_rms_norm

COUNTED = 96  # two_bugs: the columns its mean square counts
FLAG = "HARNESS_TEST_BROKEN"  # broken_while_flagged: wrong while this is set to 1


def two_bugs(out, x, weight, eps):
    """Two bugs: the mean square taken as the unbiased variance rescaled plus the squared mean (exact for hidden > 1,
    NaN at hidden = 1: no degrees of freedom), over the first COUNTED columns only (wrong from hidden COUNTED + 1
    on)."""
    xf = x.float()
    head = xf[..., :COUNTED]
    n = head.shape[-1]
    mean_sq = head.var(-1, keepdim=True) * (n - 1) / n + head.mean(-1, keepdim=True) ** 2
    out.copy_((xf * torch.rsqrt(mean_sq + eps) * weight.float()).to(out.dtype))


def broken_while_flagged(out, x, weight, eps):
    """The real kernel, but while HARNESS_TEST_BROKEN=1 is in the environment the weight is left out: a failure
    that comes and goes with the machine's state, as a flaky one does."""
    _real_rms_norm(out, x, torch.ones_like(weight) if os.environ.get(FLAG) == "1" else weight, eps)


def half_written_returned(x, weight, eps) -> torch.Tensor:
    """Bug: allocates its output and normalises only the first half of the rows (rounded up): the others are never
    written, and hold whatever the memory held (NaN where torch fills fresh memory, as under
    torch.use_deterministic_algorithms)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rows = (x.shape[0] + 1) // 2
    _real_rms_norm(out[:rows], x[:rows], weight, eps)
    return out


def nan_rows_returned(x, weight, eps) -> torch.Tensor:
    """Bug: allocates its output, writes every row, then multiplies the rows after the first by NaN: NaN computed."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _real_rms_norm(out, x, weight, eps)
    out[1:] *= float("nan")
    return out
