"""Whether a kernel that raised in Triton's interpreter compiles for the plan's GPUs.

The launch that raised (the @triton.jit function, its arguments' types, its constexprs and launch options) is
compiled with Triton's own compiler for each `smXY` of the plan's matrix, through to the cubin (Triton ships
ptxas: no GPU is needed). Where that fails too, a GPU fails alike; where it compiles, the crash is the
interpreter's own and the cell says nothing of a GPU. A child process does it, with the interpreter off (the
kernel's module imported afresh, as on a GPU) and a time limit: a compiler that aborts or hangs costs the words,
never the run. Where the launch cannot be compiled here at all (a kernel not importable by its module's name, an
argument that cannot be described to the child, a compiler that fails for its own reasons), nothing is said.

    python -m harness.runtime.gpu_compile < launch.json    # the child: {arch: null or what failed} on stdout
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from harness.interpreter.sites import chain, code_of, no_variant

# At most this long for the child to import the kernel's module and compile it for every target.
COMPILE_LIMIT_S = 60.0

_said: dict[str, dict | None] = {}  # a launch's description -> the child's answer, for the cells that repeat it


def gpu_archs(sms) -> list[int]:
    """The CUDA compute capabilities (90 for sm90) among a plan's `matrix.sm` values."""
    return sorted({int(sm[2:]) for sm in sms if re.fullmatch(r"sm\d+", sm)})


def _described(value):
    """A launch argument as JSON the child rebuilds it from: a tensor by its dtype (Triton specializes on nothing
    else of it that a compile error could depend on), a tl.dtype by name, a function by where it is defined.
    ValueError for anything else."""
    import torch
    import triton.language as tl

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, tl.dtype):
        return {"tl_dtype": value.name}
    if isinstance(value, tl.constexpr):
        return _described(value.value)
    if isinstance(value, (tuple, list)):
        return {"tuple": [_described(v) for v in value]}
    while not callable(getattr(value, "__code__", None)) and hasattr(value, "fn"):  # a jit function: its Python one
        value = value.fn
    qualname, module = getattr(value, "__qualname__", ""), getattr(value, "__module__", "")
    if callable(value) and module and module != "__main__" and qualname and "<" not in qualname:
        return {"ref": f"{module}:{qualname}"}
    raise ValueError(f"cannot describe {type(value).__name__}")


def describe_launch(fn, args: tuple, kwargs: dict) -> dict | None:
    """The launch of `fn` (a @triton.jit function as written) as the child compiles it; None where it cannot be."""
    if fn.__module__ == "__main__" or "<" in fn.__qualname__:
        return None
    try:
        return {"kernel": f"{fn.__module__}:{fn.__qualname__}", "args": [_described(a) for a in args],
                "kwargs": {k: _described(v) for k, v in kwargs.items()}}
    except ValueError:
        return None


def compile_words(launch: dict, archs: list[int], limit_s: float = COMPILE_LIMIT_S, raised_at: str = "") -> str:
    """What compiling `launch` for each of `archs` says of a crash in the interpreter, for a cell's reason:
    "a GPU fails alike (compiling for sm_90 fails: ...)", "interpreter only: inconclusive (the kernel compiles
    for sm_90)", or "" where it could not be tried. `raised_at`: the source line the interpreter raised at, the
    reason's already (a compile failing there too does not say it again)."""
    if not archs:
        return ""
    key = json.dumps({**launch, "archs": archs}, sort_keys=True)
    if key not in _said:
        _said[key] = _in_child(key, limit_s)
    answer = _said[key]
    if not answer or set(answer) != {str(a) for a in archs}:
        return ""
    failed: dict[str, list[str]] = {}  # what failed -> the targets it failed on
    for arch in archs:
        if answer[str(arch)]:
            where, what = answer[str(arch)]
            failed.setdefault(what if where in ("", raised_at) else f"`{where}`: {what}", []).append(f"sm_{arch}")
    compiled = [f"sm_{a}" for a in archs if not answer[str(a)]]
    if not failed:
        return f"interpreter only: inconclusive (the kernel compiles for {' and '.join(compiled)})"
    fails = "; ".join(f"compiling for {' and '.join(targets)} fails: {what}" for what, targets in failed.items())
    return f"a GPU fails alike ({fails}" + (f"; it compiles for {' and '.join(compiled)})" if compiled else ")")


def _in_child(request: str, limit_s: float) -> dict | None:
    # This process's import path, so that the child finds the harness and the kernel's module as this one did.
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
           "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    try:
        done = subprocess.run([sys.executable, "-m", "harness.runtime.gpu_compile"], input=request, env=env,
                              capture_output=True, text=True, timeout=limit_s)
        return json.loads(done.stdout) if done.returncode == 0 else None
    except Exception:  # a hang past the limit, a child that died, an answer that is not one: nothing to say
        return None


# ----------------------------------------------------------------------------- the child


def _rebuilt(value):
    import importlib

    import torch
    import triton.language as tl
    from triton.runtime.jit import MockTensor

    if isinstance(value, list):
        return [_rebuilt(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        return MockTensor(getattr(torch, value["tensor"]))  # what Triton's own warmup stands in for a tensor
    if "tl_dtype" in value:
        return tl.dtype(value["tl_dtype"])
    if "tuple" in value:
        return tuple(_rebuilt(v) for v in value["tuple"])
    module, _, qualname = value["ref"].partition(":")
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def compile_for(launch: dict, arch: int) -> tuple[str, str] | None:
    """Compile `launch` for sm_`arch` as JITFunction.run would on that GPU: None where it compiles, else (the line
    of the kernel it failed at, or "", and what failed). Raises where the failure is not the kernel's (its module
    not importable, the compiler's own)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import PTXASError
    from triton.runtime.jit import create_function_from_signature

    jit = _rebuilt({"ref": launch["kernel"]})
    while not isinstance(jit, triton.runtime.JITFunction):  # under @triton.autotune or @triton.heuristics
        jit = jit.fn
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    args, kwargs = _rebuilt(launch["args"]), {k: _rebuilt(v) for k, v in launch["kwargs"].items()}
    kwargs["debug"] = kwargs.get("debug", jit.debug) or triton.knobs.runtime.debug
    bound, specialization, options = create_function_from_signature(jit.signature, jit.params, backend)(
        *args, **kwargs)
    options, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialization, options)
    try:
        triton.compile(ASTSource(jit, signature, constexprs, attrs), target=target, options=options.__dict__)
    except CompilationError as exc:  # the front end: types, shapes, what a function accepts
        # the outermost error is at the launched kernel's line; the innermost says what was wrong
        lineno = getattr(exc.node, "lineno", None)
        where = code_of(exc.src.split("\n")[lineno - 1]) if exc.src and lineno else ""
        root = chain(exc)[-1]
        what = no_variant(root) or (root.error_message or type(root).__name__ if isinstance(root, CompilationError)
                                    else f"{type(root).__name__}: {str(root)[:500]}")
        return where, what
    except PTXASError as exc:
        return "", f"ptxas: {str(exc).strip().splitlines()[0][:300]}"
    except RuntimeError as exc:
        if "PassManager::run failed" not in str(exc):
            raise
        return "", "Triton's MLIR passes rejected it (PassManager::run failed)"
    return None


def main() -> int:
    answer_to = sys.stdout
    sys.stdout = sys.stderr  # what the kernel's module prints must not garble the answer
    launch = json.load(sys.stdin)
    answer_to.write(json.dumps({str(arch): compile_for(launch, arch) for arch in launch["archs"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
