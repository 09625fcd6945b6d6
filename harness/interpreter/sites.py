"""Where in a kernel's own source an exception raised in Triton's interpreter came from, and what it was.

Triton's interpreter runs a @triton.jit function as Python (its source rewritten, its file and line numbers kept)
and wraps whatever it raises in InterpreterError at a frame of its own (triton/runtime/interpreter.py). The
tracebacks under that wrapper still hold the kernel's frames: `raise_site` finds the innermost of them in the
user's source and the error the wrappers hold; `interpreted_launch` finds the launch it happened in (the kernel and
its arguments), so that the same launch can be compiled for a GPU (harness.runtime.gpu_compile).
"""

from __future__ import annotations

import io
import linecache
import os
import sys
import tokenize
from dataclasses import dataclass


@dataclass(frozen=True)
class RaiseSite:
    """A line of a @triton.jit function in the user's source (the kernel, or a device function it calls) where an
    exception came from, and that exception, unwrapped from the interpreter's InterpreterError."""

    path: str  # as shown: relative to the working directory where under it
    line: int
    function: str
    source: str  # the line's text
    error: BaseException

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.function}: `{self.source}`"


def shown_path(filename: str) -> str:
    """A source file as a user finds it: an installed package's by its path in site-packages, else relative to the
    working directory where under it."""
    path = os.path.abspath(filename)
    if "site-packages" + os.sep in path:
        return path.rpartition("site-packages" + os.sep)[2]
    here = os.getcwd() + os.sep
    return path[len(here):] if path.startswith(here) else path


def code_of(line: str) -> str:
    """A source line without its comment."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[:token.start[1]].strip()
    except (tokenize.TokenError, SyntaxError):  # a line of a statement continued on the next: as it is
        pass
    return line.strip()


def chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and the exceptions it was raised from, outermost first (`raise ... from`, as the interpreter wraps an
    error: not one merely being handled when it was raised, which is no part of it)."""
    out: list[BaseException] = []
    while exc is not None and not any(exc is e for e in out):
        out.append(exc)
        exc = exc.__cause__
    return out


def _frames(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _interpreter():
    """Triton's interpreter module where this process has loaded it (never imported here: on a GPU nothing runs
    in it)."""
    return sys.modules.get("triton.runtime.interpreter")


def raise_site(exc: BaseException) -> RaiseSite | None:
    """The innermost line of a user's @triton.jit function that `exc` (or an exception behind it) passed through
    in Triton's interpreter, with the error raised there; None where no interpreted kernel's frame is in it."""
    interp = _interpreter()
    if interp is None:
        return None
    import triton

    # The code each interpreted function runs is its rewritten function's (the interpreter's own cache of them);
    # Triton's own device functions (tl.zeros, tl.sum, ...) are jit functions too, but not the user's source.
    ours = os.path.dirname(os.path.abspath(triton.__file__)) + os.sep
    functions = {rewritten.__code__: original for original, rewritten in interp.InterpretedFunction.rewritten_fn.items()
                 if not os.path.abspath(original.__code__.co_filename).startswith(ours)}
    excs = chain(exc)
    for i in reversed(range(len(excs))):
        for frame, line in reversed(list(_frames(excs[i]))):
            fn = functions.get(frame.f_code)
            if fn is not None:
                error = next((e for e in excs[i:] if not isinstance(e, interp.InterpreterError)), excs[i])
                filename = frame.f_code.co_filename
                return RaiseSite(shown_path(filename), line, fn.__name__,
                                 code_of(linecache.getline(filename, line).strip()), error)
    return None


def interpreted_launch(exc: BaseException) -> tuple | None:
    """(the @triton.jit function as written, its positional arguments, its keyword arguments) of the interpreted
    launch `exc` came out of (the innermost, under an autotuner's or heuristics' own), or None."""
    interp = _interpreter()
    if interp is None:
        return None
    for e in chain(exc):
        for frame, _ in reversed(list(_frames(e))):
            local = frame.f_locals
            if frame.f_code.co_name == "run" and isinstance(local.get("self"), interp.InterpretedFunction) \
                    and isinstance(local.get("args"), tuple) and isinstance(local.get("kwargs"), dict):
                return local["self"].fn, local["args"], local["kwargs"]
    return None


def no_variant(exc: BaseException) -> str | None:
    """In words, a libdevice (extern) function called with argument types it has no variant for, as Triton's
    dispatch table says (it raises a bare KeyError of the types: "(triton.language.bfloat16)"); None for any
    other error."""
    if not isinstance(exc, KeyError):
        return None
    frames = list(_frames(exc))
    for k, (frame, _) in enumerate(frames):
        local = frame.f_locals
        if frame.f_code.co_name == "extern_elementwise" and isinstance(local.get("arg_type_symbol_dict"), dict):
            # the function the kernel called: the nearest frame above that is not a decorator's wrapper
            name = next((f.f_code.co_name for f, _ in reversed(frames[:k])
                         if f.f_code.co_name not in ("wrapper", "<lambda>", "call")), "the function")
            takes = " or ".join(", ".join(map(str, types)) for types in local["arg_type_symbol_dict"])
            given = ", ".join(map(str, local.get("arg_types") or ()))
            return f"libdevice's {name} has no variant for {given} (it takes {takes})"
    return None
