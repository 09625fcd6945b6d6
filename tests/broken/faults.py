"""A kernel under development that faults in some cells only: the run must survive it.

Dispatches on the activation dtype so one plan gets a healthy cell beside each fault:
fp32 is correct, fp16 reads far out of bounds (an illegal address on a GPU, an out-of-bounds load
the interpreter reports at the kernel's line), bf16 never returns.
"""

import torch

from tests.broken.rms_norm_bugs import correct, never_returns, reads_far_out_of_bounds


def faulty_by_dtype(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if x.dtype == torch.float16:
        return reads_far_out_of_bounds(out, x, weight, eps)
    if x.dtype == torch.bfloat16:
        return never_returns(out, x, weight, eps)
    return correct(out, x, weight, eps)
