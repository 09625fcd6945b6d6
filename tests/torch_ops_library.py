"""A library whose import registers its kernels as torch.ops, as FlashInfer's and vLLM's do: `testlib::rms_norm`
(vLLM's RMSNorm, as the bundled reference computes it) and `testlib::rms_norm_scaled` (1% off: a wrong kernel), for
the `torch_ops` kind of implementation (tests/test_implementation_kinds.py)."""

import torch

from kernels.rms_norm import rms_norm_ref


@torch.library.custom_op("testlib::rms_norm", mutates_args=("out",))
def rms_norm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    out.copy_(rms_norm_ref(x, weight, eps))


@torch.library.custom_op("testlib::rms_norm_scaled", mutates_args=("out",))
def rms_norm_scaled(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    out.copy_(rms_norm_ref(x, weight, eps) * 1.01)
