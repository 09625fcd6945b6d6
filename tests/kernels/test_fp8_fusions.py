"""The fp8-output kernels against their references: rms_norm_static_fp8_quant,
fused_add_rms_norm_static_fp8_quant, silu_and_mul_quant and dynamic_per_token_scaled_fp8_quant, on odd
and wide (chunked) rows, strided inputs, all-zero rows, saturating values and empty batches; and the
broken fp8 variants.

fp8 outputs are compared in the quantized domain, as vLLM's fp8 tests do: no NaN where the reference is
finite, no element more than one fp8 step from the reference, and at most MAX_OFF_BY_ONE of them one
step off (the dequantized error is in each message). On a CPU machine the kernels run in Triton's
interpreter, first made faithful by harness.interpreter.make_faithful(): unpatched, its fp32 -> e4m3fn
cast loses the round-up carry (124.2 -> 64, not 128) and it truncates fp32 -> bf16. On a GPU machine
the same tests run on CUDA.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

# On a CPU machine the harness plugin sets this before any kernel is defined; set it here too so the
# file also runs on its own (Triton reads it when a @triton.jit kernel is defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

from kernels.fp8_quant import dynamic_per_token_scaled_fp8_quant, dynamic_per_token_scaled_fp8_quant_ref, fp8_max
from kernels.rms_norm_quant import (
    fused_add_rms_norm_static_fp8_quant,
    fused_add_rms_norm_static_fp8_quant_ref,
    rms_norm_static_fp8_quant,
    rms_norm_static_fp8_quant_ref,
)
from kernels.silu_and_mul_quant import silu_and_mul_quant, silu_and_mul_quant_ref
from tests.broken.fp8_quant_bugs import no_clamp, scale_multiplied

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E4M3FN = torch.float8_e4m3fn
E4M3FNUZ = getattr(torch, "float8_e4m3fnuz", None)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-6
# Kernels and references round at the same points (see each kernel's docstring): on a CPU machine
# (faithful interpreter) every output here matches bit for bit. On a GPU, summation order and the
# approximate rsqrt/exp move a value by an fp32 ulp before a rounding, which moves an fp8 value one step
# very rarely. A kernel that skips the two roundings to bf16 in RMSNorm moves 1.7% of its bf16 outputs
# one step, so this bound still flags a rounding that differs from vLLM's.
MAX_OFF_BY_ONE = 0.01


@pytest.fixture(scope="module", autouse=True)
def faithful_interpreter(faithful_interpreter):
    """On a CPU machine: the interpreter patched (the conftest's fixture, for this process) to round as a GPU does;
    fail if the casts these kernels use are still wrong, since no verdict below would then mean anything."""
    still_wrong = faithful_interpreter
    used = {k: v for k, v in still_wrong.items() if k in ("fp32->bf16", "fp32->fp16", "fp32->float8_e4m3fn")}
    assert not used, f"the interpreter still computes these casts unlike a GPU: {used}"


# ----------------------------------------------------------------------------- comparison


def fp8_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in representable values between two fp8 tensors of one dtype: fp8 bits are
    sign-magnitude, so the magnitude bits count steps from zero."""

    def ordinal(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.uint8).to(torch.int32)
        return torch.where(bits >= 128, 128 - bits, bits)

    return (ordinal(a) - ordinal(b)).abs()


def assert_fp8_close(out: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor,
                     max_off_by_one: float = MAX_OFF_BY_ONE) -> None:
    """out and expected (fp8, same dtype) dequantized with `scale` (per tensor or [num_tokens, 1])."""
    assert out.dtype == expected.dtype and out.shape == expected.shape, (out.dtype, out.shape, expected.shape)
    out, expected, scale = out.cpu(), expected.cpu(), scale.cpu().float()
    got, want = out.float() * scale, expected.float() * scale
    nan = got.isnan() & ~want.isnan()
    assert not nan.any(), f"{int(nan.sum())} NaN where the reference is finite, first at {nan.nonzero()[0].tolist()}"
    steps = torch.where(got.isnan() & want.isnan(), 0, fp8_steps(out, expected))
    if steps.numel() == 0:
        return
    worst = divmod(int(steps.argmax()), steps.shape[-1])
    assert int(steps.max()) <= 1, (
        f"{int((steps > 1).sum())} of {steps.numel()} elements more than one fp8 step from the reference; "
        f"worst {int(steps.max())} steps at {list(worst)}: dequantized {float(got[worst]):.6g}, "
        f"reference {float(want[worst]):.6g}")
    off = (steps == 1).float().mean().item()
    assert off <= max_off_by_one, (
        f"{off:.2%} of elements one fp8 step off (allowed {max_off_by_one:.2%}); max dequantized error "
        f"{float((got - want).abs().max()):.3g}")


# ----------------------------------------------------------------------------- inputs


def make_x(num_tokens: int, width: int, dtype: torch.dtype, seed: int = 0, strided: bool = False) -> torch.Tensor:
    """randn * 2 activations with row 1 all zeros; strided: a column slice of a wider tensor (row
    stride width + 17, so rows are also misaligned for vector loads)."""
    g = torch.Generator().manual_seed(seed)
    full = (torch.randn(num_tokens, width + (17 if strided else 0), generator=g) * 2).to(dtype)
    if num_tokens > 1:
        full[1] = 0
    return full.to(DEVICE)[:, :width]


def make_weight(hidden: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).to(DEVICE)


def static_scale(y_ref: torch.Tensor, out_dtype: torch.dtype, saturating: bool) -> torch.Tensor:
    """A calibrated per-tensor scale (the largest |y| maps to fp8_max) or one 4x too small, which
    pushes |y / scale| far past fp8_max for the larger values."""
    amax = max(float(y_ref.abs().max()), 1e-3)
    return torch.tensor([amax / fp8_max(out_dtype) / (4 if saturating else 1)], device=DEVICE)


def nan_out(shape, dtype=E4M3FN) -> torch.Tensor:
    """Outputs start as NaN so an element the kernel never writes cannot pass."""
    return torch.full(shape, float("nan"), dtype=torch.float32, device=DEVICE).to(dtype)


# ----------------------------------------------------------------------------- rms_norm (+ residual)

# (num_tokens, hidden): one token, tiny, odd, a power of 2, odd and wider (test_wide_rows: the chunked path).
NORM_SHAPES = [(1, 8), (7, 769), (4, 1024), (3, 5125)]


@pytest.mark.parametrize("saturating", [False, True], ids=["calibrated", "saturating"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens, hidden", NORM_SHAPES)
def test_rms_norm_static_fp8_quant(num_tokens: int, hidden: int, dtype: torch.dtype, strided: bool,
                                   saturating: bool) -> None:
    x, weight = make_x(num_tokens, hidden, dtype, strided=strided), make_weight(hidden, dtype)
    x_before = x.clone()
    one = torch.ones(1, device=DEVICE)
    scale = static_scale(rms_norm_static_fp8_quant_ref(x, weight, one, EPS).float(), E4M3FN, saturating)
    expected = rms_norm_static_fp8_quant_ref(x, weight, scale, EPS)
    out = nan_out((num_tokens, hidden))
    rms_norm_static_fp8_quant(out, x, weight, scale, EPS)
    assert_fp8_close(out, expected, scale)
    assert torch.equal(x, x_before)
    if saturating:
        assert (expected.float().abs() == 448).any()  # the clamp was exercised


@pytest.mark.parametrize("saturating", [False, True], ids=["calibrated", "saturating"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens, hidden", NORM_SHAPES)
def test_fused_add_rms_norm_static_fp8_quant(num_tokens: int, hidden: int, dtype: torch.dtype, strided: bool,
                                             saturating: bool) -> None:
    x, weight = make_x(num_tokens, hidden, dtype, strided=strided), make_weight(hidden, dtype)
    residual = make_x(num_tokens, hidden, dtype, seed=2).contiguous()
    x_before = x.clone()
    one = torch.ones(1, device=DEVICE)
    scale = static_scale(fused_add_rms_norm_static_fp8_quant_ref(x, residual, weight, one, EPS)[0].float(),
                         E4M3FN, saturating)
    expected, expected_residual = fused_add_rms_norm_static_fp8_quant_ref(x, residual, weight, scale, EPS)
    out = nan_out((num_tokens, hidden))
    fused_add_rms_norm_static_fp8_quant(out, x, residual, weight, scale, EPS)
    assert_fp8_close(out, expected, scale)
    # One fp32 add rounded once to the activation dtype on both sides: bit for bit.
    assert torch.equal(residual, expected_residual)
    assert torch.equal(x, x_before)


# ----------------------------------------------------------------------------- silu_and_mul

# (num_tokens, d): d odd, a power of 2, and 2049 (three column blocks of 1024).
SILU_SHAPES = [(1, 8), (7, 385), (4, 1024), (3, 2049)]


@pytest.mark.parametrize("saturating", [False, True], ids=["calibrated", "saturating"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens, d", SILU_SHAPES)
def test_silu_and_mul_quant(num_tokens: int, d: int, dtype: torch.dtype, strided: bool, saturating: bool) -> None:
    x = make_x(num_tokens, 2 * d, dtype, strided=strided)
    x_before = x.clone()
    one = torch.ones(1, device=DEVICE)
    scale = static_scale(silu_and_mul_quant_ref(x, one).float(), E4M3FN, saturating)
    expected = silu_and_mul_quant_ref(x, scale)
    out = nan_out((num_tokens, d))
    silu_and_mul_quant(out, x, scale)
    assert_fp8_close(out, expected, scale)
    assert torch.equal(x, x_before)
    if num_tokens > 1:
        assert not out[1].float().any()  # the all-zero row stays zero


# ----------------------------------------------------------------------------- dynamic per-token

TOKEN_SHAPES = [(1, 17), (7, 769), (4, 1024), (3, 5137)]


@pytest.mark.parametrize("use_scale_ub", [False, True], ids=["no_ub", "scale_ub"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens, hidden", TOKEN_SHAPES)
def test_dynamic_per_token_scaled_fp8_quant(num_tokens: int, hidden: int, dtype: torch.dtype, strided: bool,
                                            use_scale_ub: bool) -> None:
    x = make_x(num_tokens, hidden, dtype, strided=strided)
    x_before = x.clone()
    # vLLM's test bounds the scale by the mean: rows whose max exceeds it saturate.
    scale_ub = x.float().abs().mean().reshape(1) if use_scale_ub else None
    expected, expected_scales = dynamic_per_token_scaled_fp8_quant_ref(x, scale_ub)
    out = nan_out((num_tokens, hidden))
    scales = torch.full((num_tokens, 1), float("nan"), device=DEVICE)
    dynamic_per_token_scaled_fp8_quant(out, x, scales, scale_ub)
    torch.testing.assert_close(scales, expected_scales)  # fp32 defaults, as vLLM's test
    assert_fp8_close(out, expected, expected_scales)
    assert torch.equal(x, x_before)
    if num_tokens > 1:
        # The all-zero row: vLLM's minimum scale keeps it finite, and its output is zero.
        assert float(scales[1, 0]) == pytest.approx(1 / (448 * 512), rel=1e-6)
        assert not out[1].float().any()
    if use_scale_ub:
        assert (expected.float().abs() == 448).any()  # the clamp was exercised


# ----------------------------------------------------------------------------- wide rows


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wide_rows(dtype: torch.dtype) -> None:
    """Rows over 64 KiB take the two-pass (chunked) path of the row kernels: 40_001 columns in every
    dtype, strided, with saturating static scales and a scale_ub."""
    num_tokens, hidden = 2, 40_001
    x, weight = make_x(num_tokens, hidden, dtype, strided=True), make_weight(hidden, dtype)
    one = torch.ones(1, device=DEVICE)
    scale = static_scale(rms_norm_static_fp8_quant_ref(x, weight, one, EPS).float(), E4M3FN, True)
    out = nan_out((num_tokens, hidden))
    rms_norm_static_fp8_quant(out, x, weight, scale, EPS)
    assert_fp8_close(out, rms_norm_static_fp8_quant_ref(x, weight, scale, EPS), scale)

    residual = make_x(num_tokens, hidden, dtype, seed=2).contiguous()
    expected, expected_residual = fused_add_rms_norm_static_fp8_quant_ref(x, residual, weight, scale, EPS)
    fused_add_rms_norm_static_fp8_quant(out, x, residual, weight, scale, EPS)
    assert_fp8_close(out, expected, scale)
    assert torch.equal(residual, expected_residual)

    scale_ub = x.float().abs().mean().reshape(1)
    expected, expected_scales = dynamic_per_token_scaled_fp8_quant_ref(x, scale_ub)
    scales = torch.full((num_tokens, 1), float("nan"), device=DEVICE)
    dynamic_per_token_scaled_fp8_quant(out, x, scales, scale_ub)
    torch.testing.assert_close(scales, expected_scales)
    assert_fp8_close(out, expected, expected_scales)


# ----------------------------------------------------------------------------- empty batches


def test_empty_batches() -> None:
    """num_tokens == 0: every kernel returns without launching or touching anything."""
    x, w, scale = make_x(0, 64, torch.bfloat16), make_weight(64, torch.bfloat16), torch.ones(1, device=DEVICE)
    out = nan_out((0, 64))
    residual = make_x(0, 64, torch.bfloat16)
    rms_norm_static_fp8_quant(out, x, w, scale, EPS)
    fused_add_rms_norm_static_fp8_quant(out, x, residual, w, scale, EPS)
    silu_and_mul_quant(nan_out((0, 32)), x, scale)
    scales = torch.empty((0, 1), device=DEVICE)
    dynamic_per_token_scaled_fp8_quant(out, x, scales)
    assert out.shape == (0, 64) and scales.shape == (0, 1)


# ----------------------------------------------------------------------------- e4m3fnuz


@triton.jit
def _cast_kernel(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    tl.store(out_ptr + cols, tl.load(x_ptr + cols, mask=cols < n).to(out_ptr.dtype.element_ty), mask=cols < n)


@functools.cache
def cast_mismatch(dtype: torch.dtype) -> str:
    """'' if a kernel's fp32 -> `dtype` cast matches torch on in-range values (every rounding boundary
    included), else one line saying where it differs."""
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    vals = vals[vals.isfinite() & (vals.abs() <= fp8_max(dtype))].unique()
    mid = (vals[:-1] + vals[1:]) / 2
    x = torch.cat([vals, mid, mid.nextafter(vals[1:]), mid.nextafter(vals[:-1])])
    out = torch.empty(x.shape, dtype=dtype, device=DEVICE)
    _cast_kernel[(1,)](out, x.to(DEVICE), x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    out = out.cpu()
    bad = fp8_steps(out, x.to(dtype)) != 0
    if not bad.any():
        return ""
    j = int(bad.nonzero()[0])
    return f"{int(bad.sum())} of {x.numel()} values differ, e.g. {float(x[j])} -> {float(out[j].float())} " \
           f"(torch {float(x[j].to(dtype).float())})"


def _fnuz_or_skip() -> torch.dtype:
    if E4M3FNUZ is None:
        pytest.skip("this torch has no float8_e4m3fnuz")
    if torch.cuda.is_available():
        pytest.skip("float8_e4m3fnuz is ROCm's fp8; NVIDIA GPUs have no conversion to it")
    why = cast_mismatch(E4M3FNUZ)
    if why:
        pytest.skip(f"the interpreter's fp32 -> float8_e4m3fnuz cast is not faithful ({why}); "
                    "harness.interpreter.make_faithful() does not patch that format, so no verdict is possible")
    return E4M3FNUZ


def test_e4m3fnuz_outputs() -> None:
    """The fp8 dtype comes from `out`: e4m3fnuz quantizes to vLLM's 224 (not finfo's 240)."""
    fnuz = _fnuz_or_skip()
    x, w = make_x(5, 769, torch.bfloat16), make_weight(769, torch.bfloat16)
    scale = torch.tensor([0.004], device=DEVICE)  # saturates the larger values
    out = nan_out((5, 769), fnuz)
    rms_norm_static_fp8_quant(out, x, w, scale, EPS)
    expected = rms_norm_static_fp8_quant_ref(x, w, scale, EPS, out_dtype=fnuz)
    assert_fp8_close(out, expected, scale)
    assert float(expected.float().abs().max()) == 224
    out = nan_out((5, 769), fnuz)
    scales = torch.empty((5, 1), device=DEVICE)
    dynamic_per_token_scaled_fp8_quant(out, x, scales)
    expected, expected_scales = dynamic_per_token_scaled_fp8_quant_ref(x, out_dtype=fnuz)
    torch.testing.assert_close(scales, expected_scales)
    assert_fp8_close(out, expected, expected_scales)


# ----------------------------------------------------------------------------- the checks can fail


def test_broken_scale_multiplied_fails() -> None:
    x, w = make_x(7, 769, torch.bfloat16), make_weight(769, torch.bfloat16)
    scale = torch.tensor([0.02], device=DEVICE)
    out = nan_out((7, 769))
    scale_multiplied(out, x, w, scale, EPS)
    with pytest.raises(AssertionError, match="fp8 step"):
        assert_fp8_close(out, rms_norm_static_fp8_quant_ref(x, w, scale, EPS), scale)
    # With scale 1 multiplying and dividing agree: the failure above is the bug, not the kernel's rest.
    one = torch.ones(1, device=DEVICE)
    scale_multiplied(out, x, w, one, EPS)
    assert_fp8_close(out, rms_norm_static_fp8_quant_ref(x, w, one, EPS), one)


def _no_clamp_case(out_dtype: torch.dtype):
    x = make_x(7, 2 * 385, torch.bfloat16)
    scale = static_scale(silu_and_mul_quant_ref(x, torch.ones(1, device=DEVICE)).float(), out_dtype, True)
    expected = silu_and_mul_quant_ref(x, scale, out_dtype)
    out = nan_out((7, 385), out_dtype)
    no_clamp(out, x, scale)
    return out, expected, scale


@functools.cache
def e4m3fn_cast_saturates() -> bool:
    """Whether a kernel's fp32 -> e4m3fn cast of out-of-range values gives +-448 (an H200's
    cvt.rn.satfinite, and the faithful interpreter) rather than NaN."""
    x = torch.tensor([1000.0, -1000.0, 465.0], device=DEVICE)
    out = torch.empty(3, dtype=E4M3FN, device=DEVICE)
    _cast_kernel[(1,)](out, x, 3, BLOCK=4)
    return out.float().abs().cpu().tolist() == [448.0, 448.0, 448.0]


def test_broken_no_clamp_fails_for_e4m3fnuz() -> None:
    fnuz = _fnuz_or_skip()
    out, expected, scale = _no_clamp_case(fnuz)
    with pytest.raises(AssertionError, match="NaN where the reference is finite"):
        assert_fp8_close(out, expected, scale)


def test_broken_no_clamp_on_e4m3fn_is_caught_unless_the_cast_saturates() -> None:
    """A saturating e4m3fn cast clamps by itself, so the missing clamp changes no e4m3fn output: the
    comparison must then pass (and fail if the cast does not saturate). The bug shows with e4m3fnuz."""
    out, expected, scale = _no_clamp_case(E4M3FN)
    assert (expected.float().abs() == 448).any()  # values past the range were there
    if e4m3fn_cast_saturates():
        assert_fp8_close(out, expected, scale, max_off_by_one=0.0)
    else:
        with pytest.raises(AssertionError):
            assert_fp8_close(out, expected, scale)
