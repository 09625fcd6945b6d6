"""flash-linear-attention's (fla-core's) Triton kernels in the signature a plan calls (tests/thirdparty/
fla_swiglu.yaml), with the PyTorch reference written from fla's docstrings, and a deliberately wrong adapter.

`fla.modules.activations.swiglu_fwd(x, y)` returns z = swish(x) * y = x * sigmoid(x) * y (SwiGLU's gate times
its up projection). vLLM's SiLU-and-mul takes one merged [gate | up] tensor of 2 * intermediate columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fla.modules.activations import swiglu_fwd


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """out = silu(x[:, :d]) * x[:, d:] with fla's SwiGLU kernel (it reads the two halves in place, by stride)."""
    d = x.shape[-1] // 2
    return swiglu_fwd(x[..., :d], x[..., d:])


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, in fp32, rounded once to x's dtype (fla's kernel computes in fp32)."""
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)


# ----------------------------------------------------------------------------- deliberately wrong adapter


def silu_and_mul_swapped_halves(x: torch.Tensor) -> torch.Tensor:
    """Wrong: gate and up swapped (silu(up) * gate), as with a [up | gate] checkpoint layout."""
    d = x.shape[-1] // 2
    return swiglu_fwd(x[..., d:], x[..., :d])
