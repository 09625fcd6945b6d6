"""Padding isolation: vLLM pads a batch of n tokens to the CUDA-graph size it captured and replays the graph, so the
kernel runs on `size` rows of which the last `size - n` hold whatever the previous batch left there. The real rows
must not depend on them: a kernel that reduces over every row of its buffer (a mean over the batch, a per-tensor
scale), or whose programs spill across rows, gives each batch a result that depends on its neighbour's garbage.

The padded call is made with the padding rows of floating-point inputs holding NaN, then huge finite values (each
dtype's max / 4); integer and bool inputs (positions, lengths, ids) keep the plan's `pad` value, the valid value
vLLM writes there. The real rows of every output (and every output without a num_tokens dimension, whole) must be
bit-identical to an unpadded call of the same kernel. Where they differ alike whatever the padding holds (the
plan's pad values as well), the padding is not read: the kernel's result depends on the batch size it is launched
at, which harness.runtime.batch_invariance reports; the record says so, and the cell is not failed for it.

In cuda_graph cells on a GPU the padded call is a graph captured at the padded size and replayed, as vLLM does; on
a CPU machine, which runs no cuda_graph cell, the eager cells make the same padded launch eagerly (a graph replays
the launch it captured: the padding rows reach the kernel alike).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch

from harness.runtime.calls import kernel_outputs
from harness.runtime.inputs import Example, build_args
from harness.runtime.numerics import Mismatch
from harness.runtime.rows import Probes, difference, fill_, grown, token_dim, token_rows
from harness.cells.matrix import Cell
from harness.plan.model import Plan
from harness.plan.token_rows import token_inputs

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"padding isolation": 1}

NAME = "padding isolation"
PROBED_ON_CPU = 2  # examples per cell on a CPU machine (two or three padded calls each); a GPU: each
BEYOND_CAPTURE = 256  # past the largest capture size, padded to the next multiple of this (as the cuda_graph cells)
HUGE = "huge finite values (each dtype's max/4)"


def applies(plan: Plan, cell: Cell) -> bool:
    """As harness.results.checks' registry says (tests/test_vllm_hazards.py holds the two to each other)."""
    return cell.tp == 1 and bool(token_inputs(plan)) and (
        cell.graph_mode == "cuda_graph" or (cell.graph_mode == "eager" and cell.sm == "cpu"))


def padded_size(plan: Plan, n: int) -> int:
    """The size vLLM pads `n` tokens to: the smallest capture size above n (at n itself there is no padding to
    check), past the largest the next multiple of BEYOND_CAPTURE."""
    return next((s for s in plan.cuda_graph_sizes() if s > n), (n // BEYOND_CAPTURE + 1) * BEYOND_CAPTURE)


def huge(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max / 4


def padded_args(plan: Plan, base: dict, ex: Example, size: int, fill: str | None) -> dict:
    """`base` (a call of ex.num_tokens tokens, as drawn) grown to `size` rows: the real rows `base`'s, the padding
    rows of floating-point inputs NaN (`fill` "nan"), huge ("huge") or, with None, the plan's pad value as every
    other input's padding rows."""
    n = ex.num_tokens
    values = grown(plan, base, ex, size)
    for name in token_inputs(plan):
        if base[name] is None:
            continue
        token_rows(plan, values, name, 0, n).copy_(base[name])
        pad = token_rows(plan, values, name, n, size - n)
        if pad.is_floating_point() and fill is not None:
            fill_(pad, math.nan if fill == "nan" else huge(pad.dtype))
        else:
            fill_(pad, plan.arg(name).pad)
    return values


def real_rows(plan: Plan, outputs: dict, n: int, size: int) -> dict:
    """Each output's first `n` rows along its token dimension; an output without one, whole."""
    out = {}
    for name, t in outputs.items():
        dim = token_dim(plan, name, t, size)
        out[name] = t.narrow(dim, 0, n) if dim is not None else t
    return out


def isolation(plan: Plan, padded: Callable[[str | None], dict], plain: dict, n: int, size: int) -> tuple[str, str]:
    """The core, for any way of making the padded call: `padded(fill)` is the op's outputs at `size` rows with the
    padding holding `fill` (harness.runtime.padding.padded_args), `plain` its outputs unpadded. Returns (failure,
    note): the failure's words where the real rows change with what the padding holds, else ""; the note where they
    differ from the unpadded call alike whatever it holds."""
    note = ""
    for fill in ("nan", "huge"):
        got = real_rows(plan, padded(fill), n, size)
        changed = _first_change(plan, plain, got, n)
        if changed is None:
            continue
        benign = real_rows(plan, padded(None), n, size)
        if _first_change(plan, benign, got, n) is None:  # the same whatever the padding holds: not read
            name, _, _ = changed
            note = (f"real rows of '{name}' differ from the unpadded call alike whatever the padding holds (at "
                    f"num_tokens={n} padded to {size}): the kernel's result depends on the batch size it runs at")
            continue
        if not _nan_from_padding(plan, plain, got) and \
                _first_change(plan, benign, real_rows(plan, padded(None), n, size), n) is not None:
            # the same padded call twice differs: a kernel that is not deterministic (the determinism check's
            # finding), whose padding cannot be judged by its bits
            return "", "undecided: the same padded call gives other bits each time (the kernel is not deterministic)"
        return _words(plan, changed, fill, plain, got, n, size), note
    return "", note


def _nan_from_padding(plan: Plan, plain: dict, got: dict) -> bool:
    """Whether a real row holds NaN where the unpadded call has none: what only the padding's NaN could put there."""
    return any(isinstance(got[name], torch.Tensor) and got[name].is_floating_point() and
               bool((torch.isnan(got[name]) & ~torch.isnan(plain[name])).any()) for name in plan.op.outputs
               if isinstance(plain[name], torch.Tensor) and plain[name].shape == got[name].shape)


def _first_change(plan: Plan, before: dict, after: dict, n: int):
    """(output, its token dimension or None, the Difference) of the first output whose real rows differ."""
    for name in plan.op.outputs:
        diff = difference(before[name], after[name])
        if diff is not None:
            return name, token_dim(plan, name, before[name], n), diff
    return None


def _words(plan: Plan, changed, fill: str, plain: dict, got: dict, n: int, size: int) -> str:
    name, dim, diff = changed
    held = "NaN" if fill == "nan" else HUGE
    rows = f"the {size - n} padding row{'s' if size - n > 1 else ''}"
    where = f"(num_tokens={n} padded to {size}, as a CUDA graph captured at {size} tokens replays it)"
    if dim is None or not diff.index:
        return (f"padding isolation: output '{name}', which has no num_tokens dimension, changed when {rows} held "
                f"{held} ({diff.words('unpadded', 'padded')}): the kernel reduces over the padding rows {where}")
    row = diff.index[dim]
    before, after = plain[name].select(dim, row), got[name].select(dim, row)
    nan = int((torch.isnan(after) & ~torch.isnan(before)).sum()) if after.is_floating_point() else 0
    what = f"NaN in {nan} of its {after.numel()} elements" if nan else \
        f"{diff.words('unpadded', 'padded')}"
    return (f"padding isolation: real row {row} of '{name}' changed when {rows} held {held} ({what}): the kernel "
            f"reads the padding rows {where}")


class Captured:
    """The padded call as vLLM makes it on a GPU: captured once in a CUDA graph on static buffers of `size` rows,
    then per fill the buffers rewritten (the real rows as drawn, the padding as asked) and the graph replayed."""

    def __init__(self, plan: Plan, kernel: Callable, base: dict, ex: Example, size: int):
        self.plan, self.base, self.ex, self.size = plan, base, ex, size
        self.static = padded_args(plan, base, ex, size, None)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            kernel(**self.static)  # compiles outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.returned = kernel(**self.static)

    def __call__(self, fill: str | None) -> dict:
        for name, v in padded_args(self.plan, self.base, self.ex, self.size, fill).items():
            if isinstance(v, torch.Tensor) and v is not self.static[name]:  # shared read-only inputs stay as they are
                self.static[name].copy_(v)
        self.graph.replay()
        torch.cuda.synchronize()
        out = kernel_outputs(self.plan, self.static, self.returned)
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


class PaddingIsolation:
    """The check in one cell: `check` after each example's value checks, `fact` for its record."""

    name = NAME  # its record's fact, under the check's name
    unsteady = False  # only the determinism check finds a kernel's bits changing call to call

    def __init__(self, plan: Plan, cell: Cell, device: str, kernel: Callable):
        self.plan, self.cell, self.device, self.kernel = plan, cell, device, kernel
        self.probes = Probes(None if device == "cuda" else PROBED_ON_CPU)
        self.note = ""
        self.leak = ""  # the first failure's words

    def check(self, ex: Example, actual: dict, guard: Callable) -> None:
        """`actual`: the example's outputs from the cell's call (unpadded in an eager cell); `guard(run)` makes a
        call as the cell makes its own."""
        if self.probes.wants(actual):
            self.probes.run(self._check, ex, actual, guard)

    def _check(self, ex: Example, actual: dict, guard: Callable) -> None:
        plan, n = self.plan, ex.num_tokens
        size = padded_size(plan, n)
        base = build_args(plan, self.cell, ex, self.device)  # as drawn: the source of every call's real rows
        if self.cell.graph_mode == "eager":
            plain = actual
        else:  # the cell's own call was a padded replay: the unpadded call is an eager one
            fresh = build_args(plan, self.cell, ex, self.device)
            plain = kernel_outputs(plan, fresh, guard(lambda: self.kernel(**fresh)))
        if self.cell.graph_mode == "cuda_graph":
            captured = guard(lambda: Captured(plan, self.kernel, base, ex, size))

            def padded(fill):
                return guard(lambda: captured(fill))
        else:
            def padded(fill):
                values = padded_args(plan, base, ex, size, fill)
                with warnings.catch_warnings():  # the interpreter's numpy overflowing on huge padding rows: meant
                    warnings.simplefilter("ignore", RuntimeWarning)
                    return kernel_outputs(plan, values, guard(lambda: self.kernel(**values)))
        failure, note = isolation(plan, padded, plain, n, size)
        self.note = self.note or note
        if failure:
            self.leak = self.leak or failure.removeprefix("padding isolation: ")
            raise Mismatch(failure)

    def fact(self) -> str | None:
        if self.leak:
            return f"not isolated: {self.leak}"
        if not self.probes.ran:
            return None
        if self.note.startswith("undecided"):
            return self.note
        return "padding isolated" + (f"; {self.note}" if self.note else "")

