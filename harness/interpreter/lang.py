"""Triton's interpreter, made to run what public libraries' kernels do on a GPU (harness.interpreter
installs these patches; its docstring lists what they fix).

- typed scalars: a Python float argument is an fp32 scalar tensor, an int one int32 / int64 / uint64 by value
  (``patch_implicit_cvt``);
- loops: the index of ``range`` / ``tl.range`` is an integer tensor typed from the bounds, as scf.for's is on a
  GPU (the interpreter gives a Python int, so ``i.to(tl.int64)`` raised); ``tl.static_range`` keeps ints, as
  it unrolls on a GPU (``patch_transform_ast``, ``patch_lang``);
- libdevice and builtins imported by name (harness.interpreter.libdevice);
- ``@triton.autotune``: the first of the pruned configs runs (``patch_autotune_bench``);
- grid dependency control is a no-op (``gdc_wait``, ``gdc_launch_dependents`` and their PTX, griddepcontrol);
  ``tl.inline_asm_elementwise`` raises InterpreterUnfaithful unless it is that or a 32-bit move;
  InterpreterUnfaithful leaves a launch as itself (``patch_interpreted_run``).
"""

from __future__ import annotations

import ast
import operator

import numpy as np

from harness.interpreter.unfaithful import InterpreterUnfaithful, kernel_site
from harness.interpreter.libdevice import _is_builtin, _with_semantic, binder

LOOP_RANGE = "_harness_loop_range"  # the name `for i in range(...)` in kernel source is rewritten to


def patch_implicit_cvt(interp, original):
    import triton
    import triton.language as tl

    TensorHandle = interp.TensorHandle
    mangle_type = triton.runtime.jit.mangle_type

    def _implicit_cvt(arg):
        # A Python float or int argument becomes the scalar a GPU kernel gets: fp32 (rounded to it), or
        # int32 / int64 / uint64 by value, as Triton's specialisation types it (mangle_type).
        if isinstance(arg, float) or (isinstance(arg, int) and not isinstance(arg, bool)):
            ty = tl.str_to_ty(mangle_type(arg), None)
            with np.errstate(over="ignore"):
                data = np.array([arg], dtype=interp._get_np_dtype(ty))
            return tl.tensor(TensorHandle(data, ty), ty)
        return original(arg)

    return _implicit_cvt


_IDENTITY_ASM = {"mov.b32 $0, $1;", "mov.f32 $0, $1;", "mov.u32 $0, $1;", "mov.s32 $0, $1;"}
_GRID_DEPENDENCY_ASM = {"griddepcontrol.wait", "griddepcontrol.launch_dependents"}


class _Results:
    """What create_inline_asm returns to triton.language: results by index."""

    def __init__(self, handles):
        self.handles = handles

    def get_result(self, i):
        return self.handles[i]


def patch_inline_asm(interp, original):
    TensorHandle = interp.TensorHandle

    def create_inline_asm(self, inlineAsm, constraints, values, types, isPure, pack):
        # A move of one 32-bit value to itself (a workaround that keeps the compiler from fusing, e.g.
        # flash-linear-attention's safe_dot on Blackwell) is the identity, griddepcontrol (its cyfa kernels)
        # a no-op; any other PTX is not computable here.
        asm = " ".join(str(inlineAsm).split())
        types = list(types) if isinstance(types, (list, tuple)) else [types]
        if asm.split(";")[0] in _GRID_DEPENDENCY_ASM and not values:
            # Programmatic dependent launch in PTX (as tl.extra.cuda.gdc_*): nothing to order here; the
            # output is a dummy register.
            return _Results([TensorHandle(np.zeros(1, interp._get_np_dtype(t.scalar)), t.scalar) for t in types])
        if asm in _IDENTITY_ASM and len(values) == 1 and len(types) == 1 and pack == 1:
            data, scalar = values[0].data, types[0].scalar
            if data.dtype.itemsize == 4 and scalar.primitive_bitwidth == 32:
                return _Results([TensorHandle(data.view(interp._get_np_dtype(scalar)), scalar)])
        first = asm if len(asm) <= 60 else asm[:57] + "..."
        raise InterpreterUnfaithful(f"tl.inline_asm_elementwise({first!r}){kernel_site()}")

    return create_inline_asm


def patch_no_op(interp, original):
    def no_op(self):
        # Programmatic dependent launch (gdc_wait, gdc_launch_dependents) orders launches that overlap on a
        # GPU; the interpreter runs each launch to its end before the next, so there is nothing to wait for.
        return None

    return no_op


def patch_autotune_bench(interp, original):
    def _bench(self, *args, config, **meta):
        # Timing a config needs a GPU; in the interpreter its time means nothing. Every config ties, so the
        # autotuner keeps the first of its (pruned) configs, as it does for a single one, and runs the
        # kernel once with it. Any config of a correct kernel computes the same values.
        return [0.0, 0.0, 0.0]

    return _bench


def patch_interpreted_run(interp, original):
    semantic = interp.interpreter_semantic

    def run(self, *args, grid, warmup, **kwargs):
        # A builtin passed as a (constexpr) argument, e.g. FN=tl.exp, is called with the interpreter's semantic,
        # as the compiler calls it. The interpreter wraps whatever a kernel raises in InterpreterError;
        # InterpreterUnfaithful is raised as itself, so a caller can tell "inconclusive" from a kernel's error.
        args = [_with_semantic(a, semantic) if _is_builtin(a) else a for a in args]
        kwargs = {k: _with_semantic(v, semantic) if _is_builtin(v) else v for k, v in kwargs.items()}
        try:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        except interp.InterpreterError as e:
            cause = e
            while cause is not None and not isinstance(cause, InterpreterUnfaithful):
                cause = cause.__cause__
            if cause is None:
                raise
            raise cause from None

    return run


def _loop_range(interp):
    import triton.language as tl

    semantic, TensorHandle = interp.interpreter_semantic, interp.TensorHandle

    def loop_range(arg1, arg2=None, step=None, **kwargs):
        # scf.for on a GPU: the index is a tensor of the bounds' promoted integer type (kwargs such as
        # num_stages or loop_unroll_factor only schedule the loop).
        start, end = (0, arg1) if arg2 is None else (arg1, arg2)
        bounds = [tl.core._unwrap_if_constexpr(b) for b in (start, end, 1 if step is None else step)]
        ty = semantic.to_tensor(bounds[0]).dtype
        for b in bounds[1:]:
            ty = semantic.integer_promote_impl(ty, semantic.to_tensor(b).dtype)
        np_dtype = interp._get_np_dtype(ty)
        for i in range(*(operator.index(b) for b in bounds)):
            yield tl.tensor(TensorHandle(np.array([i], dtype=np_dtype), ty), ty)

    return loop_range


class _LoopRanges(ast.NodeTransformer):
    """`for i in range(...)` -> `for i in _harness_loop_range(...)` in a kernel's source (the interpreter
    otherwise runs Python's range there)."""

    def visit_For(self, node):
        self.generic_visit(node)
        it = node.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            node.iter = ast.copy_location(ast.Call(func=ast.Name(id=LOOP_RANGE, ctx=ast.Load()), args=it.args,
                                                   keywords=it.keywords), it)
        return node


def patch_transform_ast(interp, original):
    # The rewritten function is run in its module's globals, into which the interpreter copies its own
    # module's names that are missing there: the loop range goes in with them.
    if getattr(interp, LOOP_RANGE, None) is None:
        setattr(interp, LOOP_RANGE, _loop_range(interp))
    # Functions the interpreter rewrote before this patch ran are rewritten again, with the loop ranges.
    getattr(getattr(interp, "InterpretedFunction", None), "rewritten_fn", {}).clear()

    def _transform_ast(self, src):
        return ast.fix_missing_locations(_LoopRanges().visit(original(self, src)))

    return _transform_ast


def patch_lang(interp, original):
    import triton.language as tl

    bind = binder(interp)
    if getattr(interp, LOOP_RANGE, None) is None:
        setattr(interp, LOOP_RANGE, _loop_range(interp))
    loop_range = getattr(interp, LOOP_RANGE)

    def _patch_lang(fn):
        # At each launch and device-function call: the interpreter's own patches, then tl.range as scf.for,
        # then libdevice and builtins imported by name.
        scope = original(fn)
        for lang in (tl, tl.core):
            if getattr(lang, "range", None) is not loop_range:
                scope.set_attr(lang, "range", loop_range)
        bind(fn, scope)
        return scope

    return _patch_lang


# ----------------------------------------------------------------------------- probe

_KERNELS: dict = {}
# Module globals the probe kernels use, bound when they are made (triton must not load at import).
tl = cuda = cuda_libdevice = libdevice = rsqrt = None


def _kernels() -> dict:
    global tl, cuda, cuda_libdevice, libdevice, rsqrt
    if _KERNELS:
        return _KERNELS
    import triton
    import triton.language as _tl
    from triton.language.extra import cuda as _cuda
    from triton.language.extra import libdevice as _libdevice
    from triton.language.extra.cuda import libdevice as _cuda_libdevice
    from triton.language.math import rsqrt as _rsqrt

    tl, cuda, cuda_libdevice, libdevice, rsqrt = _tl, _cuda, _cuda_libdevice, _libdevice, _rsqrt

    @triton.jit
    def scalars(x_ptr, out_ptr, s, n, N: tl.constexpr, OP: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        if OP == 0:  # fp16 * fp32 scalar: fp32 on a GPU
            tl.store(out_ptr + i, x * s + (s.to(tl.float32) - s))
        else:  # loop indices are int32 tensors on a GPU
            acc = tl.zeros([N], dtype=tl.float32)
            for j in range(0, n):
                acc += j.to(tl.float32)
            for j in tl.range(0, n, 2):
                acc += j.to(tl.float32)
            tl.store(out_ptr + i, acc)

    @triton.jit
    def math(x_ptr, y_ptr, out_ptr, N: tl.constexpr, OP: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        y = tl.load(y_ptr + i)
        if OP == 0:
            r = libdevice.rsqrt(x)
        elif OP == 1:
            r = libdevice.tanh(y)
        elif OP == 2:
            r = libdevice.erf(y)
        elif OP == 3:
            r = libdevice.pow(x, y)
        elif OP == 4:
            r = libdevice.exp2(y)
        elif OP == 5:
            r = libdevice.log2(x)
        elif OP == 6:
            r = libdevice.fast_expf(y)
        elif OP == 7:
            r = libdevice.isnan(tl.where(x > 1.0, float("nan"), x)).to(tl.float32)
        elif OP == 8:
            r = cuda_libdevice.tanh(y)
        else:
            r = rsqrt(x)  # a builtin imported by name
        tl.store(out_ptr + i, r)

    @triton.autotune(configs=[triton.Config({"B": 8}), triton.Config({"B": 16})], key=["n"])
    @triton.jit
    def autotuned(x_ptr, out_ptr, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

    @triton.jit
    def device(x_ptr, out_ptr, N: tl.constexpr, OP: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        if OP == 0:
            cuda.gdc_wait()
            cuda.gdc_launch_dependents()
            r = x
        elif OP == 1:
            r = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
        else:
            r = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                          pack=1)
        tl.store(out_ptr + i, r)

    _KERNELS.update(scalars=scalars, math=math, autotuned=autotuned, device=device)
    return _KERNELS


def _attempt(fn) -> str:
    """'' when fn returns '', else its line; what it raises, in one line."""
    try:
        with np.errstate(all="ignore"):
            return fn()
    except Exception as e:  # noqa: BLE001 - the probe reports whatever the interpreter raises
        cause = e
        while cause.__cause__ is not None and not isinstance(cause, InterpreterUnfaithful):
            cause = cause.__cause__
        return f"raised {type(cause).__name__}: {str(cause).splitlines()[0][:120] if str(cause) else ''}"


def _close(got, want, rel=2.0 ** -20) -> str:
    got, want = got.double(), want.double()
    bad = ~((got - want).abs() <= rel * want.abs() + 1e-30) & ~(got.isnan() & want.isnan())
    if not bool(bad.any()):
        return ""
    j = int(bad.nonzero()[0, 0])
    return f"{int(bad.sum())} of {bad.numel()} differ, [{j}] -> {float(got[j]):.6g} (torch {float(want[j]):.6g})"


def probe() -> dict[str, str]:
    """{construct: '' if the interpreter in use runs it as an H200 does, else one line}: typed scalar arguments,
    loop indices, libdevice (stubs, CUDA's module, a builtin imported by name), autotune, grid dependency
    control, inline asm (a 32-bit move is the identity, any other raises InterpreterUnfaithful)."""
    import torch

    k = _kernels()
    n = 64
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, generator=gen) * 4 + 0.01
    y = torch.randn(n, generator=gen) * 3
    out = torch.empty(n)
    result: dict[str, str] = {}

    def scalar():
        x16 = y.half()
        k["scalars"][(1,)](x16, out, 1 / 3, 5, N=n, OP=0)
        return _close(out, x16.float() * torch.tensor(1 / 3, dtype=torch.float32), rel=0)

    def loop():
        k["scalars"][(1,)](y, out, 0.0, 5, N=n, OP=1)
        return _close(out, torch.full((n,), 10.0 + 6.0), rel=0)

    result["float scalar argument"] = _attempt(scalar)
    result["loop index"] = _attempt(loop)
    xd, yd = x.double(), y.double()
    refs = [1 / xd.sqrt(), yd.tanh(), torch.special.erf(yd), xd.pow(yd), torch.exp2(yd), xd.log2(), yd.exp(),
            (xd > 1).double(), yd.tanh(), 1 / xd.sqrt()]
    names = ["rsqrt", "tanh", "erf", "pow", "exp2", "log2", "fast_expf", "isnan", "cuda.libdevice.tanh",
             "math.rsqrt imported by name"]
    for op, (name, ref) in enumerate(zip(names, refs)):
        def run(op=op, ref=ref):
            k["math"][(1,)](x, y, out, N=n, OP=op)
            return _close(out, ref.float())
        result[f"libdevice {name}" if "." not in name else name] = _attempt(run)

    def autotune():
        k["autotuned"][lambda meta: (_cdiv(n, meta["B"]),)](y, out, n)
        return _close(out, y * 2, rel=0)

    result["autotune"] = _attempt(autotune)

    def gdc():
        k["device"][(1,)](y, out, N=n, OP=0)
        return _close(out, y, rel=0)

    def asm():
        k["device"][(1,)](y, out, N=n, OP=1)
        line = _close(out, y, rel=0)
        if line:
            return f"mov.b32: {line}"
        try:
            k["device"][(1,)](y, out, N=n, OP=2)
        except InterpreterUnfaithful:
            return ""
        return "ex2.approx.f32 ran, where it cannot be computed as a GPU does"

    result["grid dependency control"] = _attempt(gdc)
    result["inline asm"] = _attempt(asm)
    return result


def _cdiv(a, b):
    return -(-a // b)
