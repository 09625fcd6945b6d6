"""int8_weight_only_linear against int8_weight_only_linear_ref: odd sizes, empty and single-token batches,
strided views, tensor-parallel shards, and its broken variant.

On a CPU machine the kernel runs in Triton's interpreter; on a GPU machine the same tests run on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from kernels.int8_linear import int8_weight_only_linear, int8_weight_only_linear_ref
from tests.broken.int8_linear_bugs import scale_per_row

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (atol, rtol). The kernel is exact up to fp32 summation order and the final rounding (which a CPU
# machine truncates for bf16: 1 ulp). Measured worst cases here: fp32 1.2e-6, fp16 4.9e-4, bf16 1.6e-2
# on outputs of magnitude ~3.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_inputs(num_tokens: int, in_features: int, out_features: int, dtype: torch.dtype,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1), weight uniform int8, scales varying 3x across columns and sized so outputs are O(1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, in_features, generator=g).to(dtype)
    weight = torch.randint(-128, 128, (out_features, in_features), generator=g, dtype=torch.int8)
    weight_scale = (0.5 + torch.rand(out_features, generator=g)) / (74 * max(in_features, 1) ** 0.5)
    return x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE)


def _check(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


# (num_tokens, in_features, out_features): single token, odd sizes on every axis, several tiles.
SHAPES = [(1, 64, 48), (7, 100, 33), (33, 129, 65), (70, 256, 130), (16, 1, 1), (3, 0, 5)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens, in_features, out_features", SHAPES)
def test_matches_reference(num_tokens: int, in_features: int, out_features: int, dtype: torch.dtype) -> None:
    x, weight, weight_scale = make_inputs(num_tokens, in_features, out_features, dtype)
    expected = int8_weight_only_linear_ref(x, weight, weight_scale)
    out = torch.full((num_tokens, out_features), float("nan"), dtype=dtype, device=DEVICE)
    int8_weight_only_linear(out, x, weight, weight_scale)
    _check(out, expected, dtype)


def test_empty_batch() -> None:
    x, weight, weight_scale = make_inputs(0, 64, 32, torch.float16)
    out = torch.empty(0, 32, dtype=torch.float16, device=DEVICE)
    int8_weight_only_linear(out, x, weight, weight_scale)
    assert int8_weight_only_linear_ref(x, weight, weight_scale).shape == (0, 32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_strided_x_and_out(dtype: torch.dtype) -> None:
    """x a column slice of a wider activation (row stride > in_features); out a column block of a wider buffer."""
    wide, weight, weight_scale = make_inputs(9, 150, 40, dtype)
    weight = weight[:, :97].contiguous()
    x = wide[:, 5:102]
    expected = int8_weight_only_linear_ref(x, weight, weight_scale)
    buffer = torch.full((9, 60), float("nan"), dtype=dtype, device=DEVICE)
    int8_weight_only_linear(buffer[:, 10:50], x, weight, weight_scale)
    _check(buffer[:, 10:50], expected, dtype)
    assert buffer[:, :10].isnan().all() and buffer[:, 50:].isnan().all()  # nothing written outside out


@pytest.mark.parametrize("tp_size", [2, 3])
def test_column_parallel(tp_size: int) -> None:
    """Each rank holds weight/weight_scale rows n0:n1 and writes its column block of the output."""
    dtype = torch.bfloat16
    x, weight, weight_scale = make_inputs(5, 96, 77, dtype)
    expected = int8_weight_only_linear_ref(x, weight, weight_scale)
    out = torch.full((5, 77), float("nan"), dtype=dtype, device=DEVICE)
    for w_shard, s_shard, cols in zip(weight.tensor_split(tp_size), weight_scale.tensor_split(tp_size),
                                      torch.arange(77).tensor_split(tp_size)):
        int8_weight_only_linear(out[:, cols[0]:cols[-1] + 1], x, w_shard, s_shard)
    _check(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_parallel(dtype: torch.dtype) -> None:
    """Each rank holds x[:, k0:k1] and weight[:, k0:k1]; each partial matches its shard's reference, and
    their sum (an all-reduce in x's dtype) matches the full reference within one extra rounding per rank."""
    x, weight, weight_scale = make_inputs(6, 131, 45, dtype)
    partials = []
    for x_shard, w_shard in zip(x.tensor_split(2, dim=1), weight.tensor_split(2, dim=1)):
        expected = int8_weight_only_linear_ref(x_shard, w_shard, weight_scale)
        out = torch.empty(6, 45, dtype=dtype, device=DEVICE)
        int8_weight_only_linear(out, x_shard, w_shard.contiguous(), weight_scale)
        _check(out, expected, dtype)
        partials.append(out)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(partials[0] + partials[1], int8_weight_only_linear_ref(x, weight, weight_scale),
                               atol=3 * atol, rtol=3 * rtol)


def test_broken_variant_fails() -> None:
    """Per-row scales are caught by the same comparison (and coincide when every scale is equal)."""
    dtype = torch.float32
    x, weight, weight_scale = make_inputs(7, 100, 33, dtype)
    expected = int8_weight_only_linear_ref(x, weight, weight_scale)
    out = torch.empty(7, 33, dtype=dtype, device=DEVICE)
    scale_per_row(out, x, weight, weight_scale)
    with pytest.raises(AssertionError, match="Mismatched elements"):
        _check(out, expected, dtype)
    uniform = torch.full_like(weight_scale, 0.01)
    scale_per_row(out, x, weight, uniform)
    _check(out, int8_weight_only_linear_ref(x, weight, uniform), dtype)
