"""Triton's interpreter, made to run what public libraries' kernels do on a GPU (harness.runtime.interpreter
installs these patches; its docstring lists what they fix).

- typed scalars: a Python float argument is an fp32 scalar tensor, an int one int32 / int64 / uint64 by value
  (``patch_implicit_cvt``);
- loops: the index of ``range`` / ``tl.range`` is an integer tensor typed from the bounds, as scf.for's is on a
  GPU (the interpreter gives a Python int, so ``i.to(tl.int64)`` raised); ``tl.static_range`` keeps ints, as
  it unrolls on a GPU (``patch_transform_ast``, ``patch_lang``);
- libdevice and builtins imported by name (harness.runtime.interpreter_libdevice);
- ``@triton.autotune``: the first of the pruned configs runs (``patch_autotune_bench``);
- grid dependency control is a no-op; ``tl.inline_asm_elementwise`` raises InterpreterUnfaithful unless it is
  a 32-bit move; InterpreterUnfaithful leaves a launch as itself (``patch_interpreted_run``).
"""

from __future__ import annotations

import ast
import operator

import numpy as np

from harness.runtime.interpreter import InterpreterUnfaithful
from harness.runtime.interpreter_libdevice import binder

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


def patch_inline_asm(interp, original):
    TensorHandle = interp.TensorHandle

    def create_inline_asm(self, inlineAsm, constraints, values, type, isPure, pack):
        # A move of one 32-bit value to itself (a workaround that keeps the compiler from fusing, e.g.
        # flash-linear-attention's safe_dot on Blackwell) is the identity; any other PTX is not computable here.
        asm = " ".join(str(inlineAsm).split())
        if asm in _IDENTITY_ASM and len(values) == 1 and pack == 1 and not isinstance(type, (list, tuple)):
            data = values[0].data
            if data.dtype.itemsize == 4:
                return TensorHandle(data.view(interp._get_np_dtype(type.scalar)), type.scalar)
        first = asm if len(asm) <= 60 else asm[:57] + "..."
        raise InterpreterUnfaithful(f"tl.inline_asm_elementwise({first!r})")

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
    def run(self, *args, grid, warmup, **kwargs):
        # The interpreter wraps whatever a kernel raises in InterpreterError; InterpreterUnfaithful is
        # raised as itself, so a caller can tell "inconclusive" from a kernel's own error.
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
