"""harness.runtime.interpreter: the probe finds what Triton's CPU interpreter gets wrong in low precision,
make_faithful() fixes it, and kernels that compute in low precision on purpose keep their results."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("a machine with CUDA runs Triton kernels compiled, not in the interpreter",
                allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1, set before triton's first import", allow_module_level=True)

import triton  # noqa: E402  (after the check: TRITON_INTERPRET must be set before this import)
import triton.language as tl  # noqa: E402
import triton.runtime.interpreter as triton_interpreter  # noqa: E402

from harness.runtime import interpreter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def still_unfaithful():
    # The repository's conftest already made this process faithful, as every harness worker is.
    yield interpreter.make_faithful()


def test_probe_finds_known_problems_of_an_unpatched_interpreter():
    # A fresh process: make_faithful() in this one must not hide what the interpreter does unpatched.
    code = "import json; from harness.runtime import interpreter; print(json.dumps(interpreter.probe()))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for op in ("bf16 mul", "bf16 add", "bf16 sub", "fp32->bf16", "fp32->float8_e4m3fn",
               "fp32->float8_e5m2", "float8_e4m3fn->fp32", "float8_e5m2->fp32"):
        assert found[op].startswith(f"{op}: ") and " differ, " in found[op], (op, found[op])
    # Rounding carries into the exponent are lost (a ~2% class of ordinary values).
    assert "-> 0.0625 (torch 0.125)" in found["fp32->float8_e4m3fn"]
    assert "of 4096 differ" in found["bf16 mul"]
    for op in ("fp16 mul", "fp16 add", "fp32->fp16"):
        assert found[op] == "", found[op]


def test_make_faithful_leaves_nothing_unfaithful_and_is_idempotent(still_unfaithful):
    assert still_unfaithful == {}
    assert interpreter.make_faithful() == {}
    # Patching twice does not wrap a patch in another.
    patched = triton_interpreter.InterpreterBuilder.binary_op
    assert patched._harness_faithful and not getattr(patched.__wrapped__, "_harness_faithful", False)
    assert interpreter.probe() and all(line == "" for line in interpreter.probe().values())


def test_a_missing_patch_point_is_left_unpatched_and_reported(still_unfaithful, monkeypatch):
    points = interpreter._patch_points

    def with_missing(interp):
        return points(interp) + [(interp.InterpreterBuilder, "create_no_such_op", lambda i, o: o)]

    monkeypatch.setattr(interpreter, "_patch_points", with_missing)
    assert interpreter.make_faithful() == {}
    assert "InterpreterBuilder.create_no_such_op" in interpreter.MISSING_PATCH_POINTS
    assert not hasattr(triton_interpreter.InterpreterBuilder, "create_no_such_op")


@triton.jit
def _rms_norm_bf16_kernel(out_ptr, x_ptr, w_ptr, hidden, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    # The normalised row rounded to bf16, then bf16 * bf16 inside the kernel (as vLLM rounds).
    y = (xf * rstd).to(tl.bfloat16) * w
    tl.store(out_ptr + row * hidden + cols, y, mask=mask)


def test_rms_norm_multiplying_bf16_in_the_kernel_matches_torch(still_unfaithful):
    gen = torch.Generator().manual_seed(0)
    rows, hidden, eps = 8, 1000, 1e-6
    x = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(torch.bfloat16)
    out = torch.empty_like(x)
    _rms_norm_bf16_kernel[(rows,)](out, x, w, hidden, eps, BLOCK=1024)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16) * w
    assert torch.isfinite(out.float()).all()
    # Within 1 bf16 ulp (the fp32 sum of squares is added in another order than torch's).
    ulps = (out.view(torch.int16).int() - ref.view(torch.int16).int()).abs()
    assert int(ulps.max()) <= 1, f"{int((ulps > 1).sum())} elements more than 1 ulp from torch"


@triton.jit
def _fp16_square_sum_kernel(ssq_ptr, sq_ptr, x_ptr, hidden, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x16 = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float16)
    sq = x16 * x16  # fp16 on purpose
    tl.store(sq_ptr + row * hidden + cols, sq, mask=mask)
    tl.store(ssq_ptr + row, tl.sum(sq, axis=0).to(tl.float32))  # summed in fp16 on purpose


def _fp16_square_sums(x):
    rows, hidden = x.shape
    ssq = torch.empty(rows)
    sq = torch.empty(rows, hidden, dtype=torch.float16)
    _fp16_square_sum_kernel[(rows,)](ssq, sq, x, hidden, BLOCK=triton.next_power_of_2(hidden))
    return ssq, sq


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # fp16 overflows on purpose
def test_squares_summed_in_fp16_still_go_wrong_on_large_rows(still_unfaithful):
    gen = torch.Generator().manual_seed(0)
    # Large rows: the fp16 sum overflows (sum of squares ~ 16 * 8192 > 65504); fp32 does not.
    x = 4 * torch.randn(4, 8192, generator=gen)
    ssq, sq = _fp16_square_sums(x)
    ref = x.pow(2).sum(-1)
    assert torch.isfinite(ref).all() and torch.isinf(ssq).all(), (ssq, ref)
    # Each square is the fp16 product, not an fp32 one: 300 * 300 overflows fp16.
    x[0, 0] = 300.0
    _, sq = _fp16_square_sums(x)
    assert torch.isinf(sq[0, 0]) and torch.equal(sq[1:], x[1:].half() * x[1:].half())
    # Without overflow, partial sums are rounded to fp16 as on a GPU: next to an outlier (32^2), the
    # small squares (0.25^2) lose their bits, which one rounding of the exact sum would keep.
    x = torch.full((2, 8192), 0.25)
    x[:, 0] = 32.0
    ssq, _ = _fp16_square_sums(x)
    once = x.pow(2).sum(-1).half().float()  # 1535.94 rounded once: 1536
    assert (ssq < once).all(), (ssq, once)


@triton.jit
def _to_e4m3fn_kernel(out_ptr, x_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.load(x_ptr + i).to(tl.float8e4nv))


def test_fp8_cast_rounds_up_across_an_exponent_boundary(still_unfaithful):
    x = torch.tensor([124.2, 7.78, -124.2, 0.1217, 1000.0, float("nan"), 0.0, 2.0 ** -10 * 1.5])
    out = torch.empty(8, dtype=torch.float8_e4m3fn)
    _to_e4m3fn_kernel[(1,)](out, x, N=8)
    got = out.float()
    assert got[:5].tolist() == [128.0, 8.0, -128.0, 0.125, 448.0]  # 1000 saturates, as on an H200
    assert got[5].isnan() and got[6] == 0 and got[7] == 2.0 ** -9
