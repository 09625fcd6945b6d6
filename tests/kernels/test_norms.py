"""The bundled RMSNorm and fused add + RMSNorm on each launch path `kernels.rms_norm._launch_config` picks:
one pass with the row in registers, and two passes over chunks (rows wider than MAX_FUSED_BYTES, and
activations over TWO_PASS_BYTES, here lowered so small tensors take that path). On a CPU machine the
kernels run in Triton's interpreter, made faithful first (it truncates fp32 -> bf16 otherwise).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # as in test_fp8_fusions: set before any kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import fused_add_rms_norm as fa
from kernels import rms_norm as rn
from kernels.fused_add_rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref
from kernels.rms_norm import rms_norm, rms_norm_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-6
# (num_tokens, hidden, TWO_PASS_BYTES for the test): one pass; two passes for a large activation (5120 is
# no power of two: the last chunk is masked); two passes for a row wider than MAX_FUSED_BYTES.
SHAPES = [(5, 4096, rn.TWO_PASS_BYTES), (3, 5120, 1), (2, 40_001, rn.TWO_PASS_BYTES)]


@pytest.fixture(scope="module", autouse=True)
def faithful_interpreter(faithful_interpreter):
    """The kernels run here in Triton's interpreter made faithful (the conftest's fixture), the casts they use
    right."""
    still_wrong = faithful_interpreter
    assert "fp32->bf16" not in still_wrong and "fp32->fp16" not in still_wrong, still_wrong


def tolerance(dtype: torch.dtype) -> dict:
    # One rounding of the output apart (summation order differs on a GPU), as vLLM's layernorm tests allow.
    return {"atol": 1e-2, "rtol": 1e-2} if dtype != torch.float32 else {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("num_tokens, hidden, two_pass_bytes", SHAPES, ids=["one-pass", "two-pass", "wide"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_paths(num_tokens: int, hidden: int, two_pass_bytes: int, dtype: torch.dtype, monkeypatch) -> None:
    monkeypatch.setattr(rn, "TWO_PASS_BYTES", two_pass_bytes)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(num_tokens, hidden, generator=gen, device=DEVICE).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen, device=DEVICE)).to(dtype)
    expected = rms_norm_ref(x, weight, EPS)
    out = torch.full_like(x, float("nan"))
    rms_norm(out, x, weight, EPS)
    torch.testing.assert_close(out, expected, **tolerance(dtype))


@pytest.mark.parametrize("num_tokens, hidden, two_pass_bytes", SHAPES, ids=["one-pass", "two-pass", "wide"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_rms_norm_paths(num_tokens: int, hidden: int, two_pass_bytes: int, dtype: torch.dtype,
                                  monkeypatch) -> None:
    monkeypatch.setattr(fa, "FUSED_ADD_TWO_PASS_BYTES", two_pass_bytes)
    single_pass = rn._launch_config(num_tokens, hidden, dtype.itemsize, streams=2, two_pass_bytes=two_pass_bytes)[1]
    assert single_pass == (two_pass_bytes > 1 and hidden < 40_001)  # each shape takes the path it is named for
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(num_tokens, hidden, generator=gen, device=DEVICE).to(dtype)
    residual = torch.randn(num_tokens, hidden, generator=gen, device=DEVICE).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen, device=DEVICE)).to(dtype)
    expected, expected_residual = fused_add_rms_norm_ref(x, residual, weight, EPS)
    fused_add_rms_norm(x, residual, weight, EPS)
    torch.testing.assert_close(residual, expected_residual, **tolerance(dtype))
    torch.testing.assert_close(x, expected, **tolerance(dtype))


def test_the_fused_adds_two_pass_threshold_counts_both_tensors_it_reads() -> None:
    num_tokens = fa.FUSED_ADD_TWO_PASS_BYTES * 3 // 4 // (4096 * 2)  # each bf16 activation 3/4 of the threshold
    assert rn._launch_config(num_tokens, 4096, 2, streams=2, two_pass_bytes=fa.FUSED_ADD_TWO_PASS_BYTES)[1] is False
    assert rn._launch_config(num_tokens, 4096, 2)[1] is True  # RMSNorm reads one tensor: one pass


def test_prefill_batches_of_narrow_rows_get_fewer_warps() -> None:
    """32 elements per thread from PREFILL_ROWS rows on (rows up to 2048 wide), 16 for decode batches."""
    assert rn._launch_config(rn.PREFILL_ROWS, 2048, 2) == (2048, True, 2)
    assert rn._launch_config(rn.PREFILL_ROWS - 1, 2048, 2) == (2048, True, 4)
    assert rn._launch_config(rn.PREFILL_ROWS, 4096, 2) == (4096, True, 8)
