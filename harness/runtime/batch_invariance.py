"""Batch invariance: a token's result must not depend on the batch it is computed in. vLLM's batch-invariant mode
(VLLM_BATCH_INVARIANT) promises that the same prompt gives the same tokens whatever else is scheduled beside it,
so each kernel on its path must compute a row the same way at every batch size and position: a reduction whose
split count or tile shape follows num_tokens adds in another order, and a row's last bits move with the batch.

The probe takes the first PROBE_ROWS rows of an example (drawn on where it has fewer), runs them alone, then
places them at the front, in the middle and at the end of larger batches (other rows drawn for the example's
sizes, layouts and value scale; the shared inputs, weights and caches, the example's own) across the cell's token
range: vLLM's scheduler limits for the phase, capped on a CPU machine by the element budget, at the sizes where a
kernel's size-selected path usually switches (plan.token_probes). Each placed copy must be bit-identical to the
rows alone. The verdict per cell, in its record's facts: "batch-invariant", or "varies from N tokens on" with the
first row and size that differ. `numerics.batch_invariance: required` fails the cell instead; `report` (the
default) only records it, as vLLM's default mode does not need it (cuBLAS chooses its tiles by M too); `off`
leaves it out.

Only where every token's rows are computed from its own rows and the shared inputs (harness.plan.token_rows):
ops whose inputs describe the batch's sequences (attention's block tables, lengths) are left out, with the reason.
Checked in eager tp1 cells: a CUDA graph replays the same launch at a captured size, and the padding check covers
what its padding rows do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from harness.runtime.calls import kernel_outputs
from harness.runtime.inputs import Example, build_args, per_token_elements, token_cap
from harness.runtime.numerics import Mismatch
from harness.runtime.rows import MAX_ELEMENTS, Difference, Probes, difference, grown, shared_from, token_dim, \
    token_rows
from harness.cells.matrix import Cell
from harness.plan.model import Plan, token_probes
from harness.plan.token_rows import batch_invariance_probed, token_inputs

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"batch invariance": 1}

NAME = "batch invariance"
PROBE_ROWS = 4  # rows moved between batches: enough for a kernel that handles rows in pairs or quads to show
# Examples probed per cell: each probe is a call per batch size (on a CPU machine about a second of the
# interpreter for a 256-token range), and the verdict is the kernel's, not the example's.
PROBED = {"cpu": 1, "cuda": 4}


def applies(plan: Plan, cell: Cell) -> bool:
    """As harness.results.checks' registry says (tests/test_vllm_hazards.py holds the two to each other)."""
    return cell.tp == 1 and cell.graph_mode == "eager" and batch_invariance_probed(plan)


@dataclass(frozen=True)
class Variance:
    """The first placement whose rows differ from the rows alone."""

    size: int  # the batch's token count
    where: str  # front, middle or end
    name: str  # the output
    row: int  # the probe's row (0 is the example's first)
    row_differs: int  # elements of that row that differ
    row_elements: int
    diff: Difference  # over the whole probe

    def verdict(self) -> str:
        return (f"varies from {self.size} tokens on (first row {self.row} of '{self.name}', at the {self.where} of "
                f"the batch: {self.row_differs} of {self.row_elements} elements differ from the rows run alone)")


def placements(size: int, rows: int) -> list[tuple[str, int]]:
    """Where the probe's rows go in a batch of `size`: the front, the end and the middle, those that fit apart."""
    out = [("front", 0)]
    if size >= 2 * rows:
        out.append(("end", size - rows))
    middle = (size - rows) // 2
    if middle >= rows and middle + rows <= size - rows:
        out.append(("middle", middle))
    return out


def batch_sizes(plan: Plan, cell: Cell, ex: Example, device: str) -> tuple[int, list[int]]:
    """The probe's rows (PROBE_ROWS, fewer where the cell's tokens are capped below it) and the batch sizes they are
    placed in: the cell's token range (a CPU machine's cap, and at most MAX_ELEMENTS in any tensor), at the sizes
    plan.token_probes tries, above the probe's own."""
    low, high = plan.token_range(cell.phase)
    cap = token_cap(plan, ex.sizes, device)
    per_token = max((per_token_elements(a, ex.sizes) for a in plan.tensor_args), default=1)
    high = min(high, cap or high, max(1, MAX_ELEMENTS // max(per_token, 1)))
    rows = min(PROBE_ROWS, high)
    return rows, [m for m in token_probes(min(low, high), high) if m > rows]


def probe(plan: Plan, call: Callable[[dict], dict], base: dict, ex: Example, rows: int,
          batch: Callable[[int], dict], sizes: list[int]) -> Variance | None:
    """The core, for any way of calling the op: `call(values)` its outputs; `base` the arguments of example `ex` as
    drawn, whose first `rows` rows are the probe; `batch(m)` the arguments of another call of `m` tokens, whose rows the
    probe's replace at each placement. The first placement (smallest size first) that changes a row, or None."""
    first = call(alone(plan, base, ex, rows))
    for m in sizes:
        values = shared_from(plan, batch(m), base)
        spots = placements(m, rows)
        for name in token_inputs(plan):
            if base[name] is not None:
                for _, at in spots:
                    token_rows(plan, values, name, at, rows).copy_(token_rows(plan, base, name, 0, rows))
        out = call(values)
        for where, at in spots:
            for name in plan.op.outputs:
                dim = token_dim(plan, name, out[name], m)
                if dim is None:  # a returned result of every token at once: nothing of the probe's to place
                    continue
                placed = out[name].narrow(dim, at, rows)
                diff = difference(first[name], placed)
                if diff is not None:
                    row = diff.index[dim] if diff.index else 0
                    in_row = difference(first[name].select(dim, row), placed.select(dim, row)) if diff.index else diff
                    return Variance(m, where, name, row, in_row.count, first[name].select(dim, row).numel(), diff)
    return None


def alone(plan: Plan, base: dict, ex: Example, rows: int) -> dict:
    """`base`'s first `rows` rows as a call of their own, in the example's layout."""
    values = grown(plan, base, ex, rows)
    for name in token_inputs(plan):
        if base[name] is not None:
            token_rows(plan, values, name, 0, rows).copy_(token_rows(plan, base, name, 0, rows))
    return values


class BatchInvariance:
    """The check in one cell: `check` after each example's value checks, `fact` for its record."""

    name = NAME  # its record's fact, under the check's name
    unsteady = False  # only the determinism check finds a kernel's bits changing call to call

    def __init__(self, plan: Plan, cell: Cell, device: str, kernel: Callable):
        self.plan, self.cell, self.device, self.kernel = plan, cell, device, kernel
        self.probes = Probes(PROBED.get(device, 1))
        self.found: Variance | None = None
        self.sizes: tuple[int, int, int] | None = None  # (rows, smallest batch, largest batch) probed

    def check(self, ex: Example, actual: dict, guard: Callable) -> None:
        """`actual`: the example's outputs (only their sizes are read); `guard(run)` makes a call as the cell makes
        its own."""
        if self.probes.wants(actual):
            self.probes.run(self._check, ex, guard)

    def _check(self, ex: Example, guard: Callable) -> None:
        plan, cell, device = self.plan, self.cell, self.device
        rows, sizes = batch_sizes(plan, cell, ex, device)
        if not sizes:
            return
        # the example's rows, drawn on to PROBE_ROWS where it has fewer (a decode cell's first example has one)
        if ex.num_tokens < rows:
            ex = replace(ex, num_tokens=rows, decode_tokens=min(ex.decode_tokens, rows - 1))
        base = build_args(plan, cell, ex, device)

        made = {"of": None}  # the example of the batch a call makes: a crash there is its own

        def call(values):
            return kernel_outputs(plan, values, guard(lambda: self.kernel(**values), of=made["of"] or ex))

        def batch(m):  # other rows, drawn like the example's (its own seed would repeat its rows)
            made["of"] = replace(ex, num_tokens=m, decode_tokens=min(ex.decode_tokens, m - 1), seed=ex.seed + m)
            return build_args(plan, cell, made["of"], device)

        found = probe(plan, call, base, ex, rows, batch, sizes)
        self.sizes = (rows, sizes[0], sizes[-1])
        if found is None:
            return
        self.found = self.found or found
        if plan.numerics.batch_invariance == "required":
            raise Mismatch(f"batch invariance: row {found.row} of '{found.name}' differs at the {found.where} of a "
                           f"{found.size}-token batch from the same {rows} row{'s' if rows > 1 else ''} run alone "
                           f"({found.diff.words('alone', 'batched')}; smaller batches tried agree): "
                           "numerics.batch_invariance is required")

    def fact(self) -> str | None:
        if self.found:
            return self.found.verdict()
        if self.sizes is None:
            return None
        rows, low, high = self.sizes
        batches = f"a {low}-token batch" if low == high else f"{low} … {high}-token batches"
        return f"batch-invariant: {rows} row{'s' if rows > 1 else ''} alone and at the front, middle and end of " \
            + batches
