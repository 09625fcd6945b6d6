"""A failed cell's example kept, and a NaN in an output the kernel allocates told apart.

`example_data` / `example_from`: an Example as JSON data and back (what reports/<op>/failures/<cell>.json keeps, so
`pytest --plan P --replay <cell>` checks exactly that example again: harness.plugin.replay). `saved_inputs`: the
tensors of the example's call as torch.save's bytes, where they are small (the Example rebuilds them exactly in any
case: build_args is deterministic from it). `allocated_nan_words`: where an output the kernel allocates and returns
holds NaN or Inf the reference does not, the same example called once more with the kernel's allocations poisoned
(inputs.PoisonedAllocations), and the failure worded from that call: never written, or computed.
"""

from __future__ import annotations

import io
import math

import torch

from harness.runtime.calls import kernel_outputs, reference_outputs
from harness.runtime.inputs import TORCH_DTYPES, Example, PoisonedAllocations, batch_of, build_args
from harness.runtime.modes import Eager
from harness.runtime.numerics import NotFinite, finite, not_finite_reason
from harness.cells.matrix import Cell
from harness.plan.model import Plan

# A failure's input tensors are kept beside its example up to this many bytes; above it, the example alone (it
# rebuilds them exactly).
SAVED_INPUTS_LIMIT = 16 * 2**20


def example_data(ex: Example) -> dict:
    """An Example as JSON data (its `sequences` follow from the cell and the plan: not kept)."""
    return {"num_tokens": ex.num_tokens, "sizes": dict(ex.sizes),
            "layouts": {name: [layout, pad] for name, (layout, pad) in ex.layouts.items()}, "scale": ex.scale,
            "seed": ex.seed, "decode_tokens": ex.decode_tokens, "omitted": list(ex.omitted)}


def example_from(data: dict) -> Example:
    """The Example `example_data` wrote."""
    return Example(num_tokens=int(data["num_tokens"]), sizes={k: int(v) for k, v in data.get("sizes", {}).items()},
                   layouts={k: (str(v[0]), int(v[1])) for k, v in data.get("layouts", {}).items()},
                   scale=str(data.get("scale", "normal")), seed=int(data.get("seed", 0)),
                   decode_tokens=int(data.get("decode_tokens", 0)), omitted=tuple(data.get("omitted", ())))


def input_bytes(plan: Plan, cell: Cell, ex: Example, device: str) -> int:
    """About how many bytes the example's input tensors take (strided rows with their padding), without building
    them."""
    sizes = {**ex.sizes, **batch_of(plan, cell, ex, device).symbols(), "num_tokens": ex.num_tokens}
    total = 0
    for arg in plan.tensor_args:
        if arg.role == "output" or arg.name in ex.omitted:
            continue
        shape = [d.size(sizes) for d in arg.shape]
        if shape:
            shape[-1] += ex.layout(arg.name)[1]
        dtype = TORCH_DTYPES[cell.dtype] if arg.dtype == "act" else TORCH_DTYPES[arg.dtype]
        total += math.prod(shape) * dtype.itemsize
    return total


def saved_inputs(plan: Plan, cell: Cell, ex: Example, device: str,
                 limit: int = SAVED_INPUTS_LIMIT) -> tuple[bytes | None, str]:
    """The example's call arguments as built (every input tensor on the CPU, in its drawn layout; scalars as they
    are; output buffers left out) as torch.save's bytes, with ""; or None and why not (too large: the example
    rebuilds them)."""
    try:
        size = input_bytes(plan, cell, ex, device)
        if size > limit:
            return None, f"inputs of {size / 2**20:.1f} MiB, over the {limit / 2**20:g} MiB kept: the example " \
                         "rebuilds them exactly"
        values = build_args(plan, cell, ex, device)
        kept = {}
        for arg in plan.args:
            value = values.get(arg.name)
            if arg.role == "output":
                continue
            kept[arg.name] = value.detach().cpu() if isinstance(value, torch.Tensor) else value
        buffer = io.BytesIO()
        torch.save(kept, buffer)
        return buffer.getvalue(), ""
    except Exception as exc:  # keeping the inputs is a courtesy: never a reason for the cell's outcome
        return None, f"the inputs could not be kept ({type(exc).__name__}: {str(exc)[:200]}): the example " \
                     "rebuilds them"


def allocated_nan_words(check, ex: Example, exc: BaseException) -> str | None:
    """For a NaN/Inf failure (NotFinite) of an output the kernel allocates and returns, on one rank: the failure
    worded from one more eager call of the same example (fresh inputs) with every uninitialised floating tensor made
    during the call poisoned (PoisonedAllocations), so that elements still holding the poison were never written
    and others were computed; None for any other failure. Words only: the failure stays a failure."""
    plan = check.plan
    if not isinstance(exc, NotFinite) or exc.output not in plan.returned_outputs or not check.one_rank:
        return None
    name = exc.output
    try:
        values = build_args(plan, check.cell, ex, check.device)
        with torch.no_grad():
            expected = reference_outputs(plan, check.reference, values)[name]
        with PoisonedAllocations(), torch.no_grad():
            returned = Eager(plan, check.kernel, check.device)(values, ex)
        actual = kernel_outputs(plan, values, returned)[name]
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
            raise ValueError("the second call's output differs in shape")
        bad = ~finite(actual) & finite(expected)
    except Exception as err:
        return f"{exc} (the kernel allocated this output; a second call with its allocations poisoned could not " \
               f"tell whether it wrote these elements: {type(err).__name__}: {str(err)[:200]})"
    if not bad.any():
        return f"{exc} (the kernel allocated this output; a second call of the same example, its allocations " \
               "poisoned, gave no NaN/Inf there: not reproduced, so whether they were written cannot be told)"
    return not_finite_reason(name, actual, bad, allocated=True)
