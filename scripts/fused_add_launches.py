"""Other launches of the shipped fused add + RMSNorm kernel, as named baselines of scripts/fused_add_launches.yaml:
timed beside the kernel, Inductor and each other in the plan's own benchmark items (the timings that ship), where a
script's own timing loop ranks variants differently (docs/performance.md, "The fused add at 2048 tokens").

    pytest --plan scripts/fused_add_launches.yaml --bench -m bench

- `warps4`: the one pass with 4 warps, whatever the width (the kernel: 16 elements a thread, 32 at prefill
  batches of rows up to 2048 wide).
- `two_pass`: two passes over whole-row chunks at every size, the form of Inductor's kernel for the reference at
  2048 tokens (a looped reduction, R0_BLOCK = the row, 16 warps), but written in place as the op is.
"""

from kernels import fused_add_rms_norm as fa
from kernels.rms_norm import _launch_config


def _launch(x, residual, weight, eps, two_pass: bool, warps: int | None):
    num_tokens, hidden = x.shape
    block, single_pass, num_warps = _launch_config(
        num_tokens, hidden, x.element_size(), streams=2,
        two_pass_bytes=0 if two_pass else fa.FUSED_ADD_TWO_PASS_BYTES)
    fa._fused_add_rms_norm_kernel[(num_tokens,)](
        x, residual, weight, x.stride(0), residual.stride(0), hidden, eps,
        BLOCK=block, SINGLE_PASS=single_pass, HIDDEN=0 if single_pass else hidden, num_warps=warps or num_warps)


def warps4(x, residual, weight, eps):
    _launch(x, residual, weight, eps, two_pass=False, warps=4)


def two_pass(x, residual, weight, eps):
    _launch(x, residual, weight, eps, two_pass=True, warps=None)
