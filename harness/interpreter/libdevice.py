"""libdevice in Triton's interpreter, computed with numpy as an H200's libdevice computes it.

On a GPU, a kernel's `libdevice.rsqrt(x)` (from `triton.language.extra.libdevice`, a module of stubs that the
compiler maps to the target's library, or from `triton.language.extra.cuda.libdevice` directly) becomes a call
of `__nv_rsqrtf`. Triton's interpreter leaves these out: the stubs return None, and the CUDA functions end in
`create_extern_elementwise`, which raises NotImplementedError. `make_faithful()` (harness.interpreter)
binds the stubs to the CUDA functions, as the compiler does, and `create_extern_elementwise` below computes
each `__nv_*` symbol with numpy. Triton's own table (which argument types each function takes, and the result
type) is kept: a call a GPU would reject is rejected here too.

Values: a float function is computed in float64 and rounded once to the result type, so an fp32 result is the
correctly rounded one (libdevice is within 1-4 ulp of it; the `fast_*` approximations within about 2^-21
relative). The `_rn` / `_rz` / `_rd` / `_ru` variants round as their names say (checked exactly with
fractions). A function with no faithful numpy form (`jn`, `yn`, `rcp64h`) raises InterpreterUnfaithful.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
from fractions import Fraction

import numpy as np
import torch

from harness.interpreter.unfaithful import InterpreterUnfaithful, kernel_site

_SIGNATURES: dict[str, tuple[str, tuple[str, ...], str]] | None = None  # symbol -> (function, arg types, result)
# Functions that cannot be computed faithfully here (see the module docstring).
UNFAITHFUL = {"jn": "Bessel function of order n", "yn": "Bessel function of order n",
              "rcp64h": "reciprocal of the high word of an fp64"}


def signatures() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """{libdevice symbol: (the function of triton.language.extra.cuda.libdevice that calls it, its argument
    types, its result type)}, read from that module's source (its table of argument types -> symbol)."""
    global _SIGNATURES
    if _SIGNATURES is None:
        from triton.language.extra.cuda import libdevice

        def dtype(node):  # core.dtype("fp32") -> "fp32"
            return node.args[0].value

        table = {}
        for fn in ast.parse(inspect.getsource(libdevice)).body:
            if isinstance(fn, ast.FunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Dict):
                        for key, value in zip(node.keys, node.values, strict=True):
                            table[value.elts[0].value] = (fn.name, tuple(dtype(e) for e in key.elts),
                                                          dtype(value.elts[1]))
        _SIGNATURES = table
    return _SIGNATURES


@functools.cache
def symbols() -> dict[str, str]:
    """{libdevice symbol: the function of triton.language.extra.cuda.libdevice that calls it}."""
    return {symbol: sig[0] for symbol, sig in signatures().items()}


# ----------------------------------------------------------------------------- helpers


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _vectorize(fn, otype=np.float64):
    return np.vectorize(fn, otypes=[otype])


def _safe(fn, nan=float("nan")):
    def call(*a):
        try:
            return fn(*a)
        except (ValueError, ZeroDivisionError):
            return nan
        except OverflowError:
            return math.inf
    return call


def _gamma(x):
    if x == 0:
        return math.copysign(math.inf, x)
    if math.isinf(x):
        return math.inf if x > 0 else math.nan
    return _safe(math.gamma)(x)


def _round_half_away(x):
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def _to_int(x, dtype, rounding):
    """Float -> integer as cvt.rXi: rounded as asked, NaN -> 0, saturating at the type's range."""
    x = rounding(_f64(x))
    info = np.iinfo(dtype)
    out = np.zeros(x.shape, dtype)
    low, high = x <= float(info.min), x >= float(info.max)  # float(int64 max) is 2^63: saturates too
    mid = ~(np.isnan(x) | low | high)
    out[mid] = x[mid].astype(dtype)
    out[low], out[high] = info.min, info.max
    return out


def _to_int_as(dtype, rounding, ret, x):
    return _to_int(x, dtype, rounding)


def _frac(v) -> Fraction:
    return Fraction(int(v)) if isinstance(v, (int, np.integer)) else Fraction(float(v))


def _fma(ret, x, y, z):
    from triton._C.libtriton import interpreter as _interpreter  # the interpreter's exact (single-rounding) fma

    x, y, z = (np.ascontiguousarray(v) for v in np.broadcast_arrays(*(np.asarray(v) for v in (x, y, z))))
    return (_interpreter.fma_fp64 if x.dtype == np.float64 else _interpreter.fma_fp32)(x, y, z)


_NATIVE = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "sqrt": np.sqrt,
           "rcp": lambda x: np.divide(x.dtype.type(1), x), "fma": lambda x, y, z: _fma(None, x, y, z)}
_EXACT = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b, "rcp": lambda a: 1 / a, "fma": lambda a, b, c: a * b + c}


def _step(flat, i, above: bool, negative: bool, mode: str) -> None:
    """flat[i] holds the nearest value, `above` or below the exact one: move it to the neighbour a directed
    rounding gives (rd: down, ru: up, rz: toward zero)."""
    v = flat[i]
    t = flat.dtype.type
    if above and (mode == "rd" or (mode == "rz" and not negative)):
        flat[i] = np.nextafter(v, t(-np.inf))
    elif not above and (mode == "ru" or (mode == "rz" and negative)):
        flat[i] = np.nextafter(v, t(np.inf))


def _sign_from(v, q) -> int:
    """Sign of (v - q), v a float (Inf allowed), q an exact Fraction."""
    if np.isinf(v):
        return 1 if v > 0 else -1
    d = _frac(v) - q
    return (d > 0) - (d < 0)


def _rounded(op, mode):
    """fp32 / fp64 arithmetic rounded as `mode` says: nearest even (numpy's own arithmetic) or directed (the
    nearest value moved by one ulp where the exact value, in fractions, lies on the other side)."""
    def fn(ret, *args):
        args = [np.ascontiguousarray(a).astype(ret) for a in np.broadcast_arrays(*(np.asarray(a) for a in args))]
        out = np.array(_NATIVE[op](*args), dtype=ret).reshape(args[0].shape)
        if mode == "rn":
            return out
        flat, flat_args = out.reshape(-1), [a.reshape(-1) for a in args]
        for i in range(flat.size):
            vals = [a[i] for a in flat_args]
            if not all(np.isfinite(vals)) or np.isnan(flat[i]):
                continue
            if op == "sqrt":  # compare squares: sqrt of a fraction is rarely one
                if vals[0] < 0:
                    continue
                q, negative = _frac(vals[0]), False
                sign = 1 if np.isinf(flat[i]) else ((_frac(flat[i]) ** 2 > q) - (_frac(flat[i]) ** 2 < q))
            else:
                try:
                    q = _EXACT[op](*map(_frac, vals))
                except ZeroDivisionError:
                    continue
                sign, negative = _sign_from(flat[i], q), q < 0
            if sign:
                _step(flat, i, sign > 0, negative, mode)
        return out
    return fn


def _converted(exact_of):
    """int / fp64 -> float rounded as the mode says (numpy's conversion is the nearest-even one)."""
    def for_mode(mode):
        def fn(ret, x):
            x = np.ascontiguousarray(x)
            out = x.astype(ret)
            if mode == "rn":
                return out
            flat, xs = out.reshape(-1), x.reshape(-1)
            for i in range(flat.size):
                if isinstance(xs[i], np.floating) and not np.isfinite(xs[i]):
                    continue
                q = exact_of(xs[i])
                sign = _sign_from(flat[i], q)
                if sign:
                    _step(flat, i, sign > 0, q < 0, mode)
            return out
        return fn
    return for_mode


_i2f = _converted(lambda v: Fraction(int(v)))
_f2f = _converted(lambda v: Fraction(float(v)))


def _float_fn(fn):
    """A float function computed in float64, rounded once to the result type by the caller."""
    return lambda ret, *a: fn(*[_f64(v) for v in a])


def _torch_fn(fn):
    return lambda ret, x: fn(torch.from_numpy(np.ascontiguousarray(_f64(x)))).numpy()


def _unsigned(x):
    x = np.asarray(x)
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint64)


def _bits(x):
    return 8 * np.asarray(x).dtype.itemsize


def _clz(ret, x):
    u, n = _unsigned(x), _bits(x)
    return np.array([n - int(v).bit_length() for v in u.ravel()], dtype=np.int32).reshape(u.shape)


def _popc(ret, x):
    u = _unsigned(x)
    return np.array([bin(int(v)).count("1") for v in u.ravel()], dtype=np.int32).reshape(u.shape)


def _brev(ret, x):
    u, n = _unsigned(x), _bits(x)
    out = np.array([int(f"{int(v):0{n}b}"[::-1], 2) for v in u.ravel()], dtype=u.dtype).reshape(u.shape)
    return out.view(np.asarray(x).dtype)


def _ffs(ret, x):
    u = _unsigned(x)
    return np.array([(int(v) & -int(v)).bit_length() for v in u.ravel()], dtype=np.int32).reshape(u.shape)


def _mulhi(ret, a, b):
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    n = _bits(a)
    return np.array([_wrap((int(x) * int(y)) >> n, a.dtype) for x, y in zip(a.ravel(), b.ravel())],
                    dtype=a.dtype).reshape(a.shape)


def _wrap(v: int, dtype) -> int:
    info, n = np.iinfo(dtype), 8 * np.dtype(dtype).itemsize
    v &= (1 << n) - 1
    return v - (1 << n) if info.min < 0 and v > info.max else v


def _mul24(ret, a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == np.int32:
        a24 = (a.astype(np.int64) << 40) >> 40
        b24 = (b.astype(np.int64) << 40) >> 40
    else:
        a24, b24 = a.astype(np.uint64) & 0xFFFFFF, b.astype(np.uint64) & 0xFFFFFF
    return (a24 * b24).astype(a.dtype)  # the low 32 bits


def _byte_perm(ret, x, y, s):
    x, y, s = np.broadcast_arrays(*(np.asarray(v).astype(np.int64) & 0xFFFFFFFF for v in (x, y, s)))
    src = (y << 32) | x
    out = np.zeros_like(src)
    for i in range(4):
        sel = (s >> (4 * i)) & 0x7
        out |= ((src >> (8 * sel)) & 0xFF) << (8 * i)
    return out.astype(np.uint32).view(np.int32)


def _ilogb(ret, x):
    x = _f64(x)
    with np.errstate(all="ignore"):
        e = np.frexp(x)[1] - 1
    return np.where(np.isnan(x) | (x == 0), np.iinfo(np.int32).min,
                    np.where(np.isinf(x), np.iinfo(np.int32).max, e)).astype(np.int32)


def _logb(ret, x):
    x = _f64(x)
    with np.errstate(all="ignore"):
        e = (np.frexp(x)[1] - 1).astype(np.float64)
    return np.where(x == 0, -np.inf, np.where(np.isinf(x), np.inf, np.where(np.isnan(x), x, e)))


def _sinpi(x):
    r = np.remainder(x, 2.0)
    out = np.sin(np.pi * r)
    out = np.where(r == np.floor(r), np.copysign(0.0, x), out)  # exact zeros at integers
    return np.where(r == 0.5, 1.0, np.where(r == 1.5, -1.0, out))


def _cospi(x):
    r = np.remainder(np.abs(x), 2.0)
    out = np.cos(np.pi * r)
    out = np.where((r == 0.5) | (r == 1.5), 0.0, out)
    return np.where(r == 0.0, 1.0, np.where(r == 1.0, -1.0, out))


def _view(dtype):
    return lambda ret, x: np.ascontiguousarray(x).view(dtype)


def _hiloint2double(ret, hi, lo):
    hi, lo = np.broadcast_arrays(np.asarray(hi), np.asarray(lo))
    u = (hi.view(np.uint32).astype(np.uint64) << np.uint64(32)) | lo.view(np.uint32).astype(np.uint64)
    return u.view(np.float64)


def _predicate(fn):
    return lambda ret, *a: fn(*[np.asarray(v) for v in a]).astype(np.int32)


def _same_dtype(fn):
    """Computed in the argument's own dtype (exact there): nextafter, copysign, abs."""
    return lambda ret, *a: fn(*a)


_remainder = _vectorize(_safe(math.remainder))

IMPLS = {
    # rounding to integers, absolute values, bits
    "abs": _same_dtype(np.abs), "floor": _float_fn(np.floor), "ceil": _float_fn(np.ceil),
    "trunc": _float_fn(np.trunc), "rint": _float_fn(np.rint), "nearbyint": _float_fn(np.rint),
    "round": _float_fn(_round_half_away), "llrint": lambda r, x: _to_int(x, np.int64, np.rint),
    "llround": lambda r, x: _to_int(x, np.int64, _round_half_away),
    "clz": _clz, "popc": _popc, "brev": _brev, "ffs": _ffs, "mulhi": _mulhi, "mul24": _mul24,
    "byte_perm": _byte_perm,
    "hadd": lambda r, a, b: ((np.asarray(a).astype(np.int64) + np.asarray(b).astype(np.int64)) >> 1),
    "rhadd": lambda r, a, b: ((np.asarray(a).astype(np.int64) + np.asarray(b).astype(np.int64) + 1) >> 1),
    "sad": lambda r, a, b, c: np.abs(np.asarray(a).astype(np.int64) - np.asarray(b).astype(np.int64))
    + np.asarray(c).astype(np.int64),
    # exponentials, logarithms, powers, roots
    "exp": _float_fn(np.exp), "exp2": _float_fn(np.exp2), "exp10": _float_fn(lambda x: np.power(10.0, x)),
    "expm1": _float_fn(np.expm1), "log": _float_fn(np.log), "log2": _float_fn(np.log2),
    "log10": _float_fn(np.log10), "log1p": _float_fn(np.log1p), "pow": _float_fn(np.power),
    "sqrt": _float_fn(np.sqrt), "rsqrt": _float_fn(lambda x: 1.0 / np.sqrt(x)), "cbrt": _float_fn(np.cbrt),
    "rcbrt": _float_fn(lambda x: 1.0 / np.cbrt(x)), "rsqrt_rn": _float_fn(lambda x: 1.0 / np.sqrt(x)),
    "ldexp": lambda r, x, n: np.ldexp(_f64(x), np.asarray(n)),
    "scalbn": lambda r, x, n: np.ldexp(_f64(x), np.asarray(n)),
    "ilogb": _ilogb, "logb": _logb,
    "fast_expf": _float_fn(np.exp), "fast_exp10f": _float_fn(lambda x: np.power(10.0, x)),
    "fast_logf": _float_fn(np.log), "fast_log2f": _float_fn(np.log2), "fast_log10f": _float_fn(np.log10),
    "fast_powf": _float_fn(np.power), "fast_dividef": _float_fn(np.divide),
    # trigonometric and hyperbolic
    "sin": _float_fn(np.sin), "cos": _float_fn(np.cos), "tan": _float_fn(np.tan), "sinpi": _float_fn(_sinpi),
    "cospi": _float_fn(_cospi), "asin": _float_fn(np.arcsin), "acos": _float_fn(np.arccos),
    "atan": _float_fn(np.arctan), "atan2": _float_fn(np.arctan2), "sinh": _float_fn(np.sinh),
    "cosh": _float_fn(np.cosh), "tanh": _float_fn(np.tanh), "asinh": _float_fn(np.arcsinh),
    "acosh": _float_fn(np.arccosh), "atanh": _float_fn(np.arctanh),
    "fast_sinf": _float_fn(np.sin), "fast_cosf": _float_fn(np.cos), "fast_tanf": _float_fn(np.tan),
    "hypot": _float_fn(np.hypot), "rhypot": _float_fn(lambda x, y: 1.0 / np.hypot(x, y)),
    "norm3d": _float_fn(lambda a, b, c: np.sqrt(a * a + b * b + c * c)),
    "rnorm3d": _float_fn(lambda a, b, c: 1.0 / np.sqrt(a * a + b * b + c * c)),
    "norm4d": _float_fn(lambda a, b, c, d: np.sqrt(a * a + b * b + c * c + d * d)),
    "rnorm4d": _float_fn(lambda a, b, c, d: 1.0 / np.sqrt(a * a + b * b + c * c + d * d)),
    # special functions
    "erf": _torch_fn(torch.special.erf), "erfc": _torch_fn(torch.special.erfc),
    "erfcx": _torch_fn(torch.special.erfcx), "erfinv": _torch_fn(torch.special.erfinv),
    "erfcinv": _torch_fn(lambda t: -torch.special.ndtri(t / 2) / math.sqrt(2)),
    "normcdf": _torch_fn(torch.special.ndtr), "normcdfinv": _torch_fn(torch.special.ndtri),
    "lgamma": _torch_fn(torch.lgamma), "tgamma": _float_fn(_vectorize(_gamma)),
    "j0": _torch_fn(torch.special.bessel_j0), "j1": _torch_fn(torch.special.bessel_j1),
    "y0": _torch_fn(torch.special.bessel_y0), "y1": _torch_fn(torch.special.bessel_y1),
    "cyl_bessel_i0": _torch_fn(torch.special.i0), "cyl_bessel_i1": _torch_fn(torch.special.i1),
    # floating-point manipulation and classification
    "copysign": _same_dtype(np.copysign), "nextafter": _same_dtype(np.nextafter),
    "fmod": _float_fn(np.fmod), "remainder": _float_fn(_remainder),
    "fdim": _float_fn(lambda x, y: np.where(np.isnan(x) | np.isnan(y), x + y, np.where(x > y, x - y, 0.0))),
    "saturatef": _float_fn(lambda x: np.where(np.isnan(x), 0.0, np.clip(x, 0.0, 1.0))),
    "isnan": _predicate(np.isnan), "isinf": _predicate(np.isinf), "finitef": _predicate(np.isfinite),
    "isfinited": _predicate(np.isfinite), "signbit": _predicate(np.signbit),
    "fma": _fma, "fma_rn": _fma,
    # reinterpretation
    "int_as_float": _view(np.float32), "float_as_int": _view(np.int32), "uint_as_float": _view(np.float32),
    "float_as_uint": _view(np.int32), "longlong_as_double": _view(np.float64),
    "double_as_longlong": _view(np.int64), "hiloint2double": _hiloint2double,
    "double2loint": lambda r, x: np.ascontiguousarray(x).view(np.uint64).astype(np.uint32).view(np.int32),
    "double2hiint": lambda r, x: (np.ascontiguousarray(x).view(np.uint64) >> np.uint64(32)).astype(np.uint32)
    .view(np.int32),
}
_INT_ROUNDING = {"rn": np.rint, "rz": np.trunc, "rd": np.floor, "ru": np.ceil}
for _m, _rounding in _INT_ROUNDING.items():
    for _op in ("add", "sub", "mul", "div", "rcp", "sqrt"):
        IMPLS[f"{_op}_{_m}"] = _rounded(_op, _m)
    if _m != "rn":
        IMPLS[f"fma_{_m}"] = _rounded("fma", _m)
    IMPLS[f"double2float_{_m}"] = _f2f(_m)
    for _src in ("int", "uint", "ll", "ull"):
        IMPLS[f"{_src}2float_{_m}"] = _i2f(_m)
        IMPLS[f"{_src}2double_{_m}"] = _i2f(_m)
    for _src in ("float", "double"):
        for _dst, _dt in (("int", np.int32), ("uint", np.uint32), ("ll", np.int64), ("ull", np.uint64)):
            IMPLS[f"{_src}2{_dst}_{_m}"] = functools.partial(_to_int_as, _dt, _rounding)


# ----------------------------------------------------------------------------- binding, as the compiler does


class _Globals:
    """A function's globals dict as an object, so the interpreter's patch scope can set and restore names."""

    def __init__(self, namespace: dict):
        object.__setattr__(self, "_ns", namespace)

    def __getattr__(self, name):
        try:
            return self._ns[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self._ns[name] = value

    def __delattr__(self, name):
        del self._ns[name]


_STUBS = "triton.language.extra.libdevice"


def _is_builtin(value) -> bool:
    try:
        return bool(getattr(value, "__triton_builtin__", False))
    except Exception:  # noqa: BLE001 - a global whose __getattr__ misbehaves is no builtin
        return False


def _binding(value, cuda_libdevice):
    """What a global of a kernel's module means on an H200: a stub function (imported before binder() ran) ->
    CUDA's function of that name; a builtin (``from triton.language.math import rsqrt``) -> itself, called with
    the interpreter's semantic. None when the global needs nothing."""
    if callable(value) and getattr(value, "__module__", "") == _STUBS and hasattr(cuda_libdevice, value.__name__):
        return "stub"
    if _is_builtin(value):
        return "builtin"
    return None


def _with_semantic(member, semantic):
    """A builtin that a kernel calls as on a GPU, given the interpreter's semantic (as the interpreter's own
    _patch_attr does for triton.language, but kept: libdevice's stubs and functions mean nothing else here)."""
    @functools.wraps(member)
    def call(*args, **kwargs):
        kwargs.pop("_semantic", None)
        return member(*args, **kwargs, _semantic=semantic)

    del call.__triton_builtin__  # copied by wraps: a builtin is patched again at each launch, this need not be
    call._harness_faithful = True
    return call


def binder(interp):
    """Binds libdevice as the compiler's module map does for the CUDA target, once: CUDA's functions (and
    triton.language.extra.cuda's) take the interpreter's semantic, and the stubs become them. Returns
    bind(fn, scope), which binds, in the patch scope of a launch or device-function call of `fn`, the names
    its module imported by name: stub functions (imported before this ran), builtins."""
    from triton.language.extra import cuda
    from triton.language.extra import libdevice as stubs
    from triton.language.extra.cuda import libdevice as cuda_libdevice

    builder, semantic = interp.interpreter_builder, interp.interpreter_semantic
    for module in (cuda_libdevice, cuda):
        for name, member in list(vars(module).items()):
            if _is_builtin(member):
                setattr(module, name, _with_semantic(member, semantic))
    for name, stub in list(vars(stubs).items()):
        if callable(stub) and getattr(stub, "__module__", "") == _STUBS and hasattr(cuda_libdevice, name):
            setattr(stubs, name, getattr(cuda_libdevice, name))
    kinds: dict[int, list[tuple[str, str]]] = {}  # id(globals) -> [(name, kind)], computed once per module

    def bind(fn, scope):
        namespace = fn.__globals__
        if id(namespace) not in kinds:
            kinds[id(namespace)] = [(k, kind) for k, v in list(namespace.items())
                                    if (kind := _binding(v, cuda_libdevice))]
        target = _Globals(namespace)
        for name, kind in kinds[id(namespace)]:
            value = namespace.get(name)
            if kind == "stub" and getattr(value, "__module__", "") == _STUBS:
                scope.set_attr(target, name, getattr(cuda_libdevice, value.__name__))
            elif kind == "builtin" and _is_builtin(value):
                interp._patch_attr(target, name, value, builder, scope)

    return bind


def patch_extern_elementwise(interp, original):
    TensorHandle = interp.TensorHandle

    def create_extern_elementwise(self, libName, libPath, symbol, argList, retType, isPure):
        # libdevice's __nv_* functions, computed with numpy (this module's call()).
        scalar = retType.scalar
        return TensorHandle(call(symbol, [h.data for h in argList], interp._get_np_dtype(scalar)), scalar)

    return create_extern_elementwise


# ----------------------------------------------------------------------------- values


def call(symbol: str, args: list[np.ndarray], ret_np_dtype) -> np.ndarray:
    """The value of libdevice's `symbol` on `args` (numpy arrays of one shape), as `ret_np_dtype`."""
    name = symbols().get(symbol)
    if name in UNFAITHFUL:
        raise InterpreterUnfaithful(f"libdevice.{name} ({UNFAITHFUL[name]}){kernel_site()}")
    impl = IMPLS.get(name)
    if impl is None:
        raise InterpreterUnfaithful(f"libdevice symbol {symbol}, which the harness does not compute{kernel_site()}")
    ret = np.dtype(ret_np_dtype).type
    with np.errstate(all="ignore"):
        out = np.asarray(impl(ret, *args))
        # Unsigned results (float2uint) keep their bits in the signed type Triton's table declares.
        if out.dtype.kind == "u" and np.dtype(ret).kind == "i" and out.dtype.itemsize == np.dtype(ret).itemsize:
            return out.view(ret)
        return out.astype(ret)
