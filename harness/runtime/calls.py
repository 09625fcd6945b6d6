"""The call adapter: one kernel call's outputs, and the reference's, by the names in the plan's `op.outputs`.

A kernel writes outputs into its arguments (output buffers, mutated inputs) or returns them; a
reference is functional (inputs in, every output returned in `op.outputs` order). Numerics cells,
TP ranks, benchmarks and vLLM items all go through these functions; `first_line` is how a call that
raised is told in one line.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.runtime.numerics import Mismatch
from harness.runtime.resolve import given_to_reference
from harness.plan.model import Plan


def kernel_outputs(plan: Plan, values: dict, returned: Any) -> dict:
    """The op's outputs after a kernel call: returned ones from `returned`, the rest from its arguments."""
    names = plan.returned_outputs
    got = returned if isinstance(returned, tuple) else (returned,)
    return {name: (got[names.index(name)] if names.index(name) < len(got) else None) if name in names
            else values[name] for name in plan.op.outputs}


def reference_inputs(plan: Plan, values: dict, copy: bool = True, fn: Callable | None = None) -> dict:
    """The keyword arguments of the reference `fn` (or the native): every input (output buffers left out), copied
    unless `copy` is off; a `name: null` only where `fn`'s signature names it (harness.runtime.resolve)."""
    return {a.name: values[a.name].clone() if copy and isinstance(values[a.name], torch.Tensor) else values[a.name]
            for a in plan.args if given_to_reference(fn, a)}


def reference_outputs(plan: Plan, reference: Callable, values: dict, copy: bool = True) -> dict:
    """Run the functional reference (on copies of the inputs, so the kernel's inputs stay as drawn)."""
    ref = reference(**reference_inputs(plan, values, copy, reference))
    ref = ref if isinstance(ref, tuple) else (ref,)
    if len(ref) != len(plan.op.outputs):
        raise Mismatch(f"the reference returned {len(ref)} values; op.outputs names {len(plan.op.outputs)}")
    return dict(zip(plan.op.outputs, ref))


def first_line(exc: BaseException) -> str:
    """What a call raised, in one line: the exception's type and the first line of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def chain_text(exc: BaseException) -> str:
    """Every message of an exception and of those it was raised from or during: torch.testing's "Comparing ...
    resulted in the unexpected exception above" hides a CUDA out-of-memory in its cause."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)
