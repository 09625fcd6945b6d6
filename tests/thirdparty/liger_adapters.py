"""Liger-Kernel's Triton kernels in the signature a plan calls (tests/thirdparty/liger_rms_norm.yaml), with the
PyTorch references written from Liger-Kernel's docstrings, and deliberately wrong adapters that the harness
must fail.

`liger_kernel.ops.rms_norm.rms_norm_forward(X, W, eps, offset, casting_mode, row_mode)` returns
`(Y, X, RSTD, BLOCK_SIZE, num_warps, casting_mode)`; LigerRMSNormFunction's docstring: y = (x / RMS(x)) *
(offset + w), and in the 'llama' casting mode "only the inverse RMS is computed on fp32" (x * rstd is cast
back to x's dtype before the weight multiply, as Hugging Face's Llama does).
"""

from __future__ import annotations

import torch
from liger_kernel.ops.rms_norm import rms_norm_forward


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm with Liger's kernel: y = x * rsqrt(mean(x^2) + eps) * weight."""
    return rms_norm_forward(x, weight, eps, 0.0, "llama", None)[0]


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The 'llama' casting mode in PyTorch: the inverse RMS in fp32, the weight multiply in x's dtype."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


# ----------------------------------------------------------------------------- deliberately wrong adapters


def rms_norm_weight_offset(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Wrong: Gemma's weight offset (y = x / RMS * (1 + w)) where the model wants Llama's (offset 0)."""
    return rms_norm_forward(x, weight, eps, 1.0, "llama", None)[0]


def rms_norm_transposed_weight_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Wrong: the weight reversed along hidden (a transposed or mis-sharded weight)."""
    return rms_norm_forward(x, weight.flip(0).contiguous(), eps, 0.0, "llama", None)[0]
