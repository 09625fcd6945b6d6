"""Determinism: the same call twice on the same inputs gives the same bits, and on a GPU once more on a second CUDA
stream. vLLM's batch-invariant mode (and every RL or eval run that compares two generations) rests on it, and a
value check cannot see it: two results within tolerance can still differ. A kernel that is not deterministic races
(an unsynchronised read of another program's output), reads memory it never wrote, or adds with atomics in
whatever order the programs finish.

Checked in eager tp1 cells: a CUDA graph replays the same launches, torch.compile calls the same kernel as an
opaque op, and tensor-parallel ranks run the same kernel on shards. On a CPU machine Triton's interpreter runs a
launch's programs one after another, so an atomic reduction is deterministic there: a GPU run decides those.

`numerics.determinism: required` (the default) fails the cell with where the two calls differ; `report` records it
in the record's facts for a kernel that reduces with atomics by design.
"""

from __future__ import annotations

from typing import Callable

import torch

from harness.runtime.calls import kernel_outputs
from harness.runtime.inputs import Example, build_args
from harness.runtime.numerics import Mismatch
from harness.runtime.rows import Difference, Probes, difference
from harness.cells.matrix import Cell
from harness.plan.model import Plan

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"determinism": 1}

NAME = "determinism"
# On a CPU machine the interpreter costs about 2 ms a row, so the first two examples of a cell; a GPU checks each.
PROBED_ON_CPU = 2
# What the other hazard checks of a cell record once this one found the kernel not deterministic: they compare bits
# of several calls, and stop there.
UNDECIDED = "undecided: the kernel is not deterministic (its bits change from call to call)"


def applies(plan: Plan, cell: Cell) -> bool:
    """As harness.results.checks' registry says (tests/test_vllm_hazards.py holds the two to each other)."""
    return cell.tp == 1 and cell.graph_mode == "eager"


def repeat_difference(plan: Plan, first: dict, again: dict) -> tuple[str, Difference] | None:
    """The first output (in op.outputs' order) whose two results differ, and where; None: every one is the same."""
    for name in plan.op.outputs:
        diff = difference(first[name], again[name])
        if diff is not None:
            return name, diff
    return None


def on_side_stream(run: Callable):
    """`run()` on a CUDA stream of its own, after the current stream's work and before its next."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        returned = run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return returned


class Determinism:
    """The check in one cell: `check` after each example's value checks, `fact` for its record."""

    name = NAME  # its record's fact, under the check's name

    def __init__(self, plan: Plan, cell: Cell, device: str, kernel: Callable):
        self.plan, self.cell, self.device, self.kernel = plan, cell, device, kernel
        self.probes = Probes(None if device == "cuda" else PROBED_ON_CPU)
        self.found: str | None = None  # the first difference seen, in words

    def check(self, ex: Example, actual: dict, guard: Callable) -> None:
        """`actual`: the example's outputs from the cell's call; `guard(run)` makes a call as the cell makes its own
        (what the kernel raises said alike)."""
        if self.probes.wants(actual):
            self.probes.run(self._check, ex, actual, guard)

    def _check(self, ex: Example, actual: dict, guard: Callable) -> None:
        plan = self.plan
        ways = [("called again", lambda run: run())]
        if self.device == "cuda":
            ways.append(("called again on a second CUDA stream", on_side_stream))
        for how, way in ways:
            values = build_args(plan, self.cell, ex, self.device)  # the inputs as drawn, outputs poisoned again
            again = kernel_outputs(plan, values, guard(lambda: way(lambda: self.kernel(**values))))
            found = repeat_difference(plan, actual, again)
            if found is None:
                continue
            name, diff = found
            words = (f"output '{name}' differs when the op is {how} on the same inputs "
                     f"({diff.words('the first time', 'the second')})")
            self.found = self.found or f"not deterministic: {words} at {ex.describe()}"
            if plan.numerics.determinism == "required":
                raise Mismatch(f"determinism: {words}: the kernel is not deterministic (a race, an atomic reduction "
                               "or a read of memory it never wrote; numerics.determinism: report records it instead)")
            return

    @property
    def unsteady(self) -> bool:
        """Whether the kernel's bits changed from one call to the next in this cell."""
        return self.found is not None

    def fact(self) -> str | None:
        if self.found:
            return self.found
        if not self.probes.ran:
            return None
        return "deterministic: " + ("called twice on the same inputs, and on a second CUDA stream"
                                    if self.device == "cuda" else "called twice on the same inputs")
