"""What Triton's interpreter cannot compute as a GPU does: `InterpreterUnfaithful` names the construct, and a cell
that meets it is inconclusive on a CPU machine, never failed (harness.runtime.runner)."""

from __future__ import annotations

import os
import traceback

import numpy as np


class InterpreterUnfaithful(RuntimeError):
    """A kernel used a construct that Triton's interpreter cannot compute as a GPU does (``construct`` names
    it): its result on a CPU machine says nothing of the kernel, so the cell is inconclusive, not failed.
    Raised from the kernel's launch (unwrapped from the interpreter's InterpreterError)."""

    def __init__(self, construct: str):
        super().__init__(construct)
        self.construct = construct

    def __str__(self) -> str:
        return (f"{self.construct}: Triton's interpreter cannot compute this as a GPU does, so the kernel is "
                "inconclusive on a CPU machine")


def unfaithful(exc: BaseException) -> InterpreterUnfaithful | None:
    """The InterpreterUnfaithful behind `exc` (raised as it is, or as the cause of a wrapper: torch.library, a
    custom op's call), if any."""
    while exc is not None:
        if isinstance(exc, InterpreterUnfaithful):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def kernel_site() -> str:
    """' at file:line' of the innermost kernel source line on the stack (outside triton and this harness's
    interpreter modules), for an InterpreterUnfaithful's construct; '' when there is none."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep  # this package
    import triton  # here, not at import: TRITON_INTERPRET must be set before triton is imported

    skip = (os.path.dirname(os.path.abspath(triton.__file__)) + os.sep, os.path.dirname(np.__file__) + os.sep, here)
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = os.path.abspath(frame.filename)
        if path.startswith(skip):
            continue
        return f" at {os.path.basename(path)}:{frame.lineno}"
    return ""
