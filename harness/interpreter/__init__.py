"""Triton's CPU interpreter, made to compute what a GPU computes: the fidelity layer the harness loads in every
worker on a CPU machine, usable in your own scripts to check a kernel the way the harness does.

Triton's interpreter (TRITON_INTERPRET=1) runs a kernel's ops with numpy on CPU tensors. As shipped it computes
bf16 and fp8 unlike a GPU (bit patterns multiplied as integers, casts truncated), keeps fp16 partial sums in fp32,
and cannot run much of what public libraries' kernels do (libdevice, builtins passed as arguments, float scalar
arguments, loop indices as tensors, autotuning): faithful.py's docstring lists it all.

    from harness.interpreter import switch_on, make_faithful
    switch_on()                  # where there is no CUDA device; before anything imports triton
    still_wrong = make_faithful()  # {} when every probed operation computes what an H200 computes
    import my_kernels            # then run the kernel on CPU tensors and compare against your reference

A load, store or atomic of a kernel with an active lane (mask true) outside every tensor the launch was given
raises OutOfBounds (harness.interpreter.bounds) at the kernel's line, and is not performed: the interpreter's
counterpart of compute-sanitizer's memcheck on a GPU.

A kernel that uses what the interpreter cannot compute as a GPU does (inline PTX other than a 32-bit move,
libdevice's jn, yn, rcp64h) raises InterpreterUnfaithful at its launch; `unfaithful(exc)` finds it behind a
wrapper's exception. A result from such a run says nothing of the kernel: the harness calls the cell
inconclusive on a CPU machine, not failed. `probe()` reports, per operation, what the interpreter in this process
computes unlike a GPU ("" where it agrees).

On a CUDA machine, or without TRITON_INTERPRET=1, `make_faithful()` and `probe()` return {} and patch nothing.
This package imports nothing else of the harness.
"""

from __future__ import annotations

import os

from harness.interpreter.bounds import OutOfBounds
from harness.interpreter.faithful import make_faithful, probe
from harness.interpreter.unfaithful import InterpreterUnfaithful, unfaithful

__all__ = ["InterpreterUnfaithful", "OutOfBounds", "make_faithful", "probe", "switch_on", "unfaithful"]


def switch_on() -> bool:
    """Set TRITON_INTERPRET=1 where there is no CUDA device (kernels then run in the interpreter on CPU tensors);
    returns whether it is set. Must run before anything imports triton."""
    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET") == "1"
