"""harness.interpreter: the probe finds what Triton's CPU interpreter gets wrong in low precision,
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

from harness import interpreter  # noqa: E402
from harness.interpreter import faithful  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")


@pytest.fixture(scope="module")
def still_unfaithful():
    # This process is made faithful already (pytestmark), as every harness worker is: what the re-probe finds.
    yield interpreter.make_faithful()


def test_probe_finds_known_problems_of_an_unpatched_interpreter():
    # A fresh process: make_faithful() in this one must not hide what the interpreter does unpatched.
    code = "import json; from harness import interpreter; print(json.dumps(interpreter.probe()))"
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
    # What public libraries' kernels do on a GPU and the interpreter as shipped does not.
    assert found["float scalar argument"] == "raised AttributeError: 'float' object has no attribute 'to'"
    assert found["loop index"] == "raised AttributeError: 'int' object has no attribute 'to'"
    assert found["libdevice rsqrt"].startswith("raised TypeError: cannot convert None"), found["libdevice rsqrt"]
    assert "Did you forget to add @triton.jit" in found["math.rsqrt imported by name"]
    assert "0 active drivers" in found["autotune"]
    assert found["inline asm"].startswith("raised NotImplementedError"), found["inline asm"]
    # A lane past a tensor's end is performed, unreported (the probe's tensors are slices of a buffer it owns).
    assert found["out-of-bounds load"] == "a load one element past a tensor's end ran unreported"
    assert found["out-of-bounds store"] == "a store one element past a tensor's end ran unreported"


USER_SCRIPT = """
import json, torch
from harness.interpreter import make_faithful, switch_on
on = switch_on()
left = make_faithful()
import triton, triton.language as tl

@triton.jit
def mul(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.load(x_ptr + i) * tl.load(y_ptr + i))

g = torch.Generator().manual_seed(0)
x, y = (torch.randn(256, generator=g).to(torch.bfloat16) for _ in range(2))
out = torch.empty_like(x)
mul[(1,)](x, y, out, N=256)
print(json.dumps([on, left, torch.equal(out, x * y)]))
"""


def test_a_users_script_checks_a_kernel_as_the_package_docstring_shows():
    # The public API on its own, in a fresh process that never set TRITON_INTERPRET: the switch sets it (no CUDA
    # here), and a bf16 product the stock interpreter computes on raw bits comes out as torch's.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", USER_SCRIPT], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, {}, True]


def test_make_faithful_leaves_nothing_unfaithful_and_is_idempotent(still_unfaithful):
    assert still_unfaithful == {}
    assert interpreter.make_faithful() == {}
    # Patching twice does not wrap a patch in another.
    patched = triton_interpreter.InterpreterBuilder.binary_op
    assert patched._harness_faithful and not getattr(patched.__wrapped__, "_harness_faithful", False)
    assert interpreter.probe() and all(line == "" for line in interpreter.probe().values())


def test_a_missing_patch_point_is_left_unpatched_and_reported(still_unfaithful, monkeypatch):
    points = faithful._patch_points

    def with_missing(interp):
        return points(interp) + [(interp.InterpreterBuilder, "create_no_such_op", lambda i, o: o)]

    monkeypatch.setattr(faithful, "_patch_points", with_missing)
    assert interpreter.make_faithful() == {}
    assert "InterpreterBuilder.create_no_such_op" in faithful.MISSING_PATCH_POINTS
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


# ----------------------------------------------------------------------------- what library kernels do on a GPU

from fractions import Fraction  # noqa: E402

import numpy as np  # noqa: E402
from triton.language.extra import cuda as tl_cuda  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402
from triton.language.extra.cuda import libdevice as cuda_libdevice  # noqa: E402
from triton.language.math import rsqrt as rsqrt_by_name  # noqa: E402

from harness.interpreter.unfaithful import InterpreterUnfaithful  # noqa: E402


@triton.jit
def _scalar_types_kernel(x_ptr, out_ptr, s, n, big, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)  # bf16
    tl.static_assert(s.dtype == tl.float32)
    tl.static_assert((x * s).dtype == tl.float32)  # an fp32 scalar promotes, as on a GPU
    tl.static_assert(n.dtype == tl.int32)
    tl.static_assert(big.dtype == tl.int64)
    tl.store(out_ptr + i, x * s + (s.to(tl.float64).to(tl.float32) - s) + (-big + big).to(tl.float32))


def test_float_and_int_arguments_are_typed_scalars_as_on_a_gpu(still_unfaithful):
    x = torch.randn(16).to(torch.bfloat16)
    out = torch.empty(16)
    _scalar_types_kernel[(1,)](x, out, 0.1, 7, 3_000_000_000, N=16)
    # fp32(0.1) times the bf16 value, in fp32 (a Python float would have kept the product in bf16).
    assert torch.equal(out, x.float() * torch.tensor(0.1, dtype=torch.float32))


@triton.jit
def _loop_index_kernel(out_ptr, n, n64, N: tl.constexpr):
    acc = tl.zeros([N], dtype=tl.int64)
    for i in range(n):
        tl.static_assert(i.dtype == tl.int32)
        acc += i.to(tl.int64)
    for i in tl.range(n64, n64 + 6, 2, num_stages=2):
        tl.static_assert(i.dtype == tl.int64)  # int64 bounds: an int64 index, as scf.for's
        acc += i
    for i in tl.static_range(3):  # unrolled on a GPU: the index is a constexpr
        acc += tl.full([N], i, tl.int64)
    tl.store(out_ptr + tl.arange(0, N), acc)


def test_loop_indices_are_tensors_of_the_bounds_type(still_unfaithful):
    out = torch.empty(4, dtype=torch.int64)
    _loop_index_kernel[(1,)](out, 5, 2**33, N=4)
    assert out.tolist() == [sum(range(5)) + sum(range(2**33, 2**33 + 6, 2)) + sum(range(3))] * 4


@triton.jit
def _unary_kernel(x_ptr, out_ptr, N: tl.constexpr, FN: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, FN(tl.load(x_ptr + i)))


@triton.jit
def _binary_kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr, FN: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, FN(tl.load(x_ptr + i), tl.load(y_ptr + i)))


def _domain(lo, hi, n=256, dtype=torch.float32):
    return torch.linspace(lo, hi, n, dtype=torch.float64).to(dtype)


_T = torch.special
UNARY = [  # libdevice function, its domain, torch's float64 reference
    ("rsqrt", (0.01, 100), lambda t: t.rsqrt()), ("tanh", (-8, 8), torch.tanh), ("erf", (-4, 4), _T.erf),
    ("erfc", (-4, 9), _T.erfc), ("erfinv", (-0.999, 0.999), _T.erfinv), ("erfcx", (-3, 20), _T.erfcx),
    ("normcdf", (-8, 8), _T.ndtr), ("normcdfinv", (0.001, 0.999), _T.ndtri), ("exp", (-80, 80), torch.exp),
    ("exp2", (-120, 120), torch.exp2), ("exp10", (-30, 30), lambda t: torch.pow(10.0, t)),
    ("expm1", (-5, 5), torch.expm1), ("log", (1e-6, 1e6), torch.log), ("log2", (1e-6, 1e6), torch.log2),
    ("log10", (1e-6, 1e6), torch.log10), ("log1p", (-0.9, 100), torch.log1p), ("sqrt", (0, 1e4), torch.sqrt),
    ("cbrt", (-1e3, 1e3), lambda t: t.sign() * t.abs().pow(1 / 3)), ("sin", (-10, 10), torch.sin),
    ("cos", (-10, 10), torch.cos), ("tan", (-1.5, 1.5), torch.tan), ("asin", (-1, 1), torch.asin),
    ("acos", (-1, 1), torch.acos), ("atan", (-50, 50), torch.atan), ("sinh", (-20, 20), torch.sinh),
    ("cosh", (-20, 20), torch.cosh), ("asinh", (-50, 50), torch.asinh), ("acosh", (1, 50), torch.acosh),
    ("atanh", (-0.99, 0.99), torch.atanh), ("lgamma", (0.1, 30), torch.lgamma),
    ("tgamma", (0.1, 20), lambda t: torch.lgamma(t).exp()), ("j0", (0, 30), _T.bessel_j0),
    ("j1", (0, 30), _T.bessel_j1), ("y0", (0.1, 30), _T.bessel_y0), ("cyl_bessel_i0", (-10, 10), _T.i0),
    ("fast_expf", (-20, 20), torch.exp), ("fast_logf", (1e-3, 1e3), torch.log),
    ("fast_sinf", (-3, 3), torch.sin), ("floor", (-5, 5), torch.floor), ("ceil", (-5, 5), torch.ceil),
    ("trunc", (-5, 5), torch.trunc), ("rint", (-5.5, 5.5), torch.round),
    ("round", (-5.5, 5.5), lambda t: t.sign() * (t.abs() + 0.5).floor()), ("abs", (-5, 5), torch.abs),
]


@pytest.mark.parametrize("name,domain,ref", UNARY, ids=[u[0] for u in UNARY])
def test_libdevice_function_matches_torch(still_unfaithful, name, domain, ref):
    x = _domain(*domain)
    out = torch.empty_like(x)
    _unary_kernel[(1,)](x, out, N=x.numel(), FN=getattr(libdevice, name))
    want = ref(x.double())
    # Correctly rounded here; libdevice is within a few ulp of that (the fast_* within ~2^-21).
    rel = 2.0 ** -20 if name.startswith("fast_") else 2.0 ** -22
    assert torch.allclose(out.double(), want, rtol=rel, atol=1e-37, equal_nan=True), \
        (name, (out.double() - want).abs().max())


BINARY = [
    ("pow", (0.1, 10), (-3, 3), torch.pow), ("atan2", (-5, 5), (-3, 3), torch.atan2),
    ("hypot", (-5, 5), (-3, 3), torch.hypot), ("fmod", (-50, 50), (0.5, 7), torch.fmod),
    ("remainder", (-50, 50), (0.5, 7), lambda a, b: a - b * torch.round(a / b)),
    ("copysign", (-5, 5), (-3, 3), torch.copysign), ("fdim", (-5, 5), (-3, 3), lambda a, b: (a - b).clamp(min=0)),
]


@pytest.mark.parametrize("name,dx,dy,ref", BINARY, ids=[b[0] for b in BINARY])
def test_libdevice_binary_function_matches_torch(still_unfaithful, name, dx, dy, ref):
    x, y = _domain(*dx), _domain(*dy).flip(0)
    out = torch.empty_like(x)
    _binary_kernel[(1,)](x, y, out, N=x.numel(), FN=getattr(libdevice, name))
    want = ref(x.double(), y.double())
    assert torch.allclose(out.double(), want, rtol=2.0 ** -22, atol=1e-30), (name, (out.double() - want).abs().max())


def _exact_round(q: Fraction, mode: str) -> float:
    """q rounded to fp32 toward zero / down / up, exactly."""
    v = np.float32(float(q))  # within an ulp
    lo = v if Fraction(float(v)) <= q else np.nextafter(v, np.float32(-np.inf))
    hi = lo if Fraction(float(lo)) == q else np.nextafter(lo, np.float32(np.inf))
    return float({"rd": lo, "ru": hi, "rz": lo if q >= 0 else hi}[mode])


@pytest.mark.parametrize("mode", ["rz", "rd", "ru"])
@pytest.mark.parametrize("op", ["div", "add", "mul"])
def test_directed_rounding_variants_round_as_named(still_unfaithful, op, mode):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(128, generator=gen) * 10
    y = torch.randn(128, generator=gen) * torch.tensor(2.0) ** torch.randint(-30, 30, (128,), generator=gen)
    out = torch.empty(128)
    _binary_kernel[(1,)](x, y, out, N=128, FN=getattr(libdevice, f"{op}_{mode}"))
    exact = {"div": lambda a, b: a / b, "add": lambda a, b: a + b, "mul": lambda a, b: a * b}[op]
    want = [_exact_round(exact(Fraction(float(a)), Fraction(float(b))), mode) for a, b in zip(x, y)]
    assert out.tolist() == want
    nearest = {"div": torch.div, "add": torch.add, "mul": torch.mul}[op](x, y)
    assert not torch.equal(out, nearest) or op == "mul"  # the rounding is directed, not the nearest


@pytest.mark.parametrize("name,args,want", [
    ("clz", [1, 0, -1, 256], [31, 32, 0, 23]), ("popc", [0, 7, -1, 255], [0, 3, 32, 8]),
    ("ffs", [0, 1, 8, -2**31], [0, 1, 4, 32]), ("brev", [1, 2, 0, -1], [-2**31, 2**30, 0, -1]),
])
def test_libdevice_integer_functions(still_unfaithful, name, args, want):
    x = torch.tensor(args, dtype=torch.int32)
    out = torch.empty(4, dtype=torch.int32)
    _unary_kernel[(1,)](x, out, N=4, FN=getattr(libdevice, name))
    assert out.tolist() == want


@triton.jit
def _access_paths_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(out_ptr + i, libdevice.tanh(x))  # the stub module, mapped to CUDA's as the compiler does
    tl.store(out_ptr + N + i, cuda_libdevice.tanh(x))  # CUDA's module
    tl.store(out_ptr + 2 * N + i, tl.extra.cuda.libdevice.tanh(x))  # through triton.language
    tl.store(out_ptr + 3 * N + i, rsqrt_by_name(x * x + 1))  # a builtin imported by name
    tl.store(out_ptr + 4 * N + i, libdevice.isnan(x / x).to(tl.float32))  # an int32 result
    tl_cuda.gdc_wait()  # programmatic dependent launch: nothing to wait for in the interpreter
    tl_cuda.gdc_launch_dependents()


def test_libdevice_is_reached_every_way_a_kernel_names_it(still_unfaithful):
    x = torch.linspace(-3, 3, 8)
    out = torch.empty(40)
    _access_paths_kernel[(1,)](x, out, N=8)
    t = x.double().tanh().float()
    assert torch.equal(out[:8], t) and torch.equal(out[8:16], t) and torch.equal(out[16:24], t)
    assert torch.allclose(out[24:32], torch.rsqrt(x * x + 1), rtol=2e-7)
    assert out[32:].tolist() == [0, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("name", ["exp", "exp2", "log2", "rsqrt", "sqrt_rn", "erf"])
def test_a_builtin_passed_as_an_argument_runs(still_unfaithful, name):
    # FN=tl.math.exp as a constexpr argument: the compiler calls it with its semantic, and so does the interpreter.
    x = _domain(0.1, 10, 64)
    out = torch.empty_like(x)
    _unary_kernel[(1,)](x, out, N=64, FN=getattr(tl.math, name))
    want = {"exp": torch.exp, "exp2": torch.exp2, "log2": torch.log2, "rsqrt": torch.rsqrt, "sqrt_rn": torch.sqrt,
            "erf": torch.special.erf}[name](x.double())
    assert torch.allclose(out.double(), want, rtol=2e-7)


def test_a_libdevice_call_a_gpu_rejects_is_rejected(still_unfaithful):
    # libdevice has no bf16 tanh: the compiler rejects the call, and so does the interpreter.
    x = torch.randn(8).to(torch.bfloat16)
    with pytest.raises(Exception, match="bf16|KeyError|does not match"):
        _unary_kernel[(1,)](x, torch.empty_like(x), N=8, FN=libdevice.tanh)


@triton.jit
def _asm_kernel(x_ptr, out_ptr, N: tl.constexpr, ASM: tl.constexpr):
    i = tl.arange(0, N)
    y = tl.inline_asm_elementwise(ASM, "=r,r", [tl.load(x_ptr + i)], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(out_ptr + i, y)


@triton.jit
def _griddepcontrol_kernel(x_ptr, out_ptr, N: tl.constexpr):
    # flash-linear-attention's cyfa kernels: programmatic dependent launch in PTX, with a dummy output.
    tl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.load(x_ptr + i) * 2)
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


def test_inline_ptx_raises_interpreter_unfaithful_at_the_launch(still_unfaithful):
    x = torch.randn(8)
    out = torch.empty(8)
    _asm_kernel[(1,)](x, out, N=8, ASM="mov.b32 $0, $1;")  # a move is the identity
    assert torch.equal(out, x)
    _griddepcontrol_kernel[(1,)](x, out, N=8)  # nothing to wait for in the interpreter
    assert torch.equal(out, x * 2)
    with pytest.raises(InterpreterUnfaithful) as info:
        _asm_kernel[(1,)](x, out, N=8, ASM="ex2.approx.f32 $0, $1;")
    msg = str(info.value)
    assert "tl.inline_asm_elementwise('ex2.approx.f32 $0, $1;') at test_interpreter.py:" in msg  # the kernel's line
    assert "inconclusive on a CPU machine" in msg
    assert info.value.construct.startswith("tl.inline_asm_elementwise")
    # It crosses a worker's pipe: pickles with its construct.
    import pickle
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, InterpreterUnfaithful) and str(again) == msg


def test_a_libdevice_function_without_a_faithful_form_is_inconclusive(still_unfaithful):
    n = torch.full((8,), 3, dtype=torch.int32)
    with pytest.raises(InterpreterUnfaithful, match=r"libdevice\.jn .*inconclusive on a CPU machine"):
        _binary_kernel[(1,)](n, torch.linspace(0.5, 4, 8), torch.empty(8), N=8, FN=libdevice.jn)


@triton.autotune(configs=[triton.Config({"B": 4}), triton.Config({"B": 8})], key=["n"])
@triton.jit
def _autotuned_kernel(x_ptr, out_ptr, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) + B, mask=i < n)


def test_autotune_runs_the_first_config_once(still_unfaithful):
    x = torch.zeros(16)
    out = torch.zeros(16)
    _autotuned_kernel[lambda meta: (triton.cdiv(16, meta["B"]),)](x, out, 16)
    assert out.tolist() == [4.0] * 16  # B=4: the first config, run once (no benchmark on a CPU machine)
    assert _autotuned_kernel.best_config.kwargs == {"B": 4}


def test_nothing_is_patched_without_triton_interpret():
    # On a GPU machine, or with the interpreter off, make_faithful() is inert: nothing of triton is replaced.
    code = ("import json, triton.runtime.interpreter as i, triton.runtime.autotuner as a;"
            "from triton.language.extra import libdevice as l;"
            "from harness import interpreter;"
            "print(json.dumps([interpreter.make_faithful(), interpreter.probe(),"
            " [getattr(f, '_harness_faithful', False) for f in (i._implicit_cvt, i._patch_lang,"
            " i.InterpreterBuilder.binary_op, i.InterpretedFunction.run, a.Autotuner._bench)],"
            " l.rsqrt.__module__]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    faithful, probed, patched, stub_module = json.loads(proc.stdout.strip().splitlines()[-1])
    assert faithful == {} and probed == {} and patched == [False] * 5
    assert stub_module == "triton.language.extra.libdevice"


def test_every_libdevice_symbol_is_computed_or_named_unfaithful(still_unfaithful):
    # Each of the __nv_* symbols Triton's CUDA libdevice table calls, on a few values of its argument types:
    # a value of the result type for every element, or InterpreterUnfaithful for the few without a faithful form.
    from harness.interpreter import libdevice as ld

    samples = {"fp32": np.array([0.5, 1.5, -2.25, 3.0], np.float32), "fp64": np.array([0.5, 1.5, -2.25, 3.0]),
               "int32": np.array([1, 7, -3, 2], np.int32), "uint32": np.array([1, 7, 3, 2], np.uint32),
               "int64": np.array([1, 7, -3, 2], np.int64), "uint64": np.array([1, 7, 3, 2], np.uint64)}
    np_of = {"fp32": np.float32, "fp64": np.float64, "int32": np.int32, "uint32": np.uint32, "int64": np.int64,
             "uint64": np.uint64}
    sigs = ld.signatures()
    assert len(sigs) >= 300 and len(set(ld.symbols().values())) >= 190
    unfaithful = set()
    for symbol, (name, arg_types, ret) in sigs.items():
        args = [samples[t] for t in arg_types]
        try:
            out = ld.call(symbol, args, np_of[ret])
        except InterpreterUnfaithful as e:
            assert "inconclusive on a CPU machine" in str(e)
            unfaithful.add(name)
            continue
        assert out.dtype == np_of[ret] and out.shape == (4,), (symbol, out)
    assert unfaithful == set(ld.UNFAITHFUL) == {"jn", "yn", "rcp64h"}
