"""A plan proves it can fail: wrong kernels made from the reference, each run through the plan's own comparison on
a small example of every phase and dtype, on the CPU, in seconds. One that passes names the field that blinds the
plan: a kernel that ignores an input, reads its rows out of order, is off by twice the tolerance, leaves its last row
at zero or copies it from its neighbour would pass every cell of it.

The wrong kernels are the reference run on altered inputs (an input zeroed, its rows rolled by one) or the
reference's outputs altered (shifted by twice the allowed error, the last token row zeroed or copied from the one
before). Each is judged by `compare_judged`, the cells' own comparison, fp64 tie-break included. Quantized outputs
are compared in their quantized domain; shifting one is left out (a shifted fp8 value is a step or more, which any
allowance below one sees). Where the reference cannot run on an altered input (an index out of range), that kernel
is not made. Where zeroing an input leaves the reference's outputs as they were on every example, the op ignores it
there (an optional bound far above every value, a scale that cancels) and the plan is told which.

Runs the plan's code: in validate's child process and at a run's start (harness.runtime.check_code).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from harness.runtime.calls import reference_outputs
from harness.runtime.inputs import Example, build_args, sizes_fit
from harness.runtime.numerics import SHORT_NAMES, Mismatch, bits_equal
from harness.runtime.resolve import resolve
from harness.runtime.runner import compare_judged
from harness.cells.matrix import Cell
from harness.plan.model import Plan
from harness.plan.tolerances import output_tolerance

TOKENS = 4  # rows per example: enough to roll and to copy a neighbour, small enough for any reference on a CPU


@dataclass
class Mutant:
    """A wrong kernel: what it does wrong in words, the plan field a pass blames, and how it computes."""

    does: str
    field: str
    # (inputs as drawn, the reference's outputs, the cell's dtype) -> its outputs, or None where it cannot be made
    outputs: Callable[[dict, dict, str], dict | None]


def _examples(plan: Plan) -> list[tuple[Cell, Example]]:
    """A small example per phase and float dtype of the matrix, at the smallest sizes that fit the plan."""
    sizes = _smallest_sizes(plan)
    if sizes is None:
        return []
    optional = tuple(a.name for a in plan.tensor_args if a.optional)
    out = []
    for phase in plan.matrix["phase"]:
        for dtype in [d for d in plan.matrix["dtype"] if d in SHORT_NAMES.values()]:
            decode = TOKENS // 2 if phase == "chunked_prefill" else 0
            ex = Example(TOKENS, sizes, seed=1, decode_tokens=decode)
            cell = Cell(phase, dtype, 1, "eager", "cpu")
            out.append((cell, ex))
            if optional:  # the cells draw optional inputs passed and left out: both here too
                out.append((cell, replace(ex, omitted=optional)))
    return out


def _smallest_sizes(plan: Plan) -> dict[str, int] | None:
    choices = {sym: sorted(dict(plan.numerics.cpu_sizes).get(sym) or values) for sym, values in plan.sizes.items()}
    sizes = {sym: values[0] for sym, values in choices.items()}
    return sizes if sizes_fit(plan, sizes) else None


def _mutants(plan: Plan, reference: Callable) -> list[Mutant]:
    out = []
    for arg in plan.tensor_args:
        if arg.role != "input":
            continue

        def ignoring(values, expected, dtype, name=arg.name):
            if values[name] is None:  # left out in this example
                return None
            return reference_outputs(plan, reference, {**values, name: torch.zeros_like(values[name])})

        def rolled(values, expected, dtype, name=arg.name):
            dim = plan.token_dim(name)
            if values[name] is None or dim is None or values[name].shape[dim] < 2:
                return None
            return reference_outputs(plan, reference, {**values, name: values[name].roll(1, dim)})

        def unused(values, expected, dtype, name=arg.name):
            if values[name] is None:
                return None
            return reference_outputs(plan, reference, {**values, name: None})

        out.append(Mutant(f"ignores {arg.name}", f"op.args.{arg.name}", ignoring))
        if arg.optional:  # passed, it must change something: a bound drawn above every value binds nothing
            out.append(Mutant(f"ignores {arg.name} when it is passed", f"op.args.{arg.name}.init", unused))
        if plan.token_dim(arg.name) is not None:
            out.append(Mutant(f"reads the rows of {arg.name} out of order", f"op.args.{arg.name}", rolled))
    for name in plan.op.outputs:
        out.append(Mutant(f"leaves the last row of '{name}' at zero", "op.outputs",
                          lambda v, e, d, name=name: _row(plan, e, name, lambda t: torch.zeros_like(t[-1]))))
        out.append(Mutant(f"copies the last row of '{name}' from its neighbour", "op.outputs",
                          lambda v, e, d, name=name: _row(plan, e, name, lambda t: t[-2])))
        if not plan.quantization.of(name):
            out.append(Mutant(f"is off by twice the tolerance in '{name}'", "tolerance",
                              lambda v, e, d, name=name: _shifted(plan, e, name, d)))
    return out


def _row(plan: Plan, expected: dict, name: str, row: Callable) -> dict | None:
    """The reference's outputs with the last token row of `name` replaced by `row(tensor)`."""
    t, dim = expected[name], plan.token_dim(name)
    if not isinstance(t, torch.Tensor) or dim is None or t.dim() <= dim or t.shape[dim] < 2:
        return None
    moved = t.movedim(dim, 0).clone()
    moved[-1] = row(moved)
    return {**expected, name: moved.movedim(0, dim)}


def _shifted(plan: Plan, expected: dict, name: str, dtype: str) -> dict | None:
    t = expected[name]
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return None
    tol = output_tolerance(plan, dtype, name, SHORT_NAMES.get(t.dtype))
    wide = t.double()
    return {**expected, name: (wide + 2 * (tol.atol + tol.rtol * wide.abs())).to(t.dtype)}


def _passes(plan: Plan, reference, dtype: str, values: dict, expected: dict, actual: dict) -> bool:
    for name in plan.op.outputs:
        try:
            compare_judged(plan, reference, dtype, None, name, actual[name], expected[name], values, False)
        except Mismatch:
            return False
    return True


def blind_spots(plan: Plan) -> list[str]:
    """`file:line: field: ...` for each generated wrong kernel the plan's own comparison passes on every example,
    but one ignoring an input the plan says a correct kernel may leave unread (`ignorable`: explained_blind_spots)."""
    return judge_wrong_kernels(plan)[1]


def explained_blind_spots(plan: Plan) -> tuple[list[str], list[str]]:
    """(refusals, warnings): blind_spots, and those the plan explains with the input's `ignorable`, as warnings."""
    _, refused, explained = judge_wrong_kernels(plan)
    return refused, explained


def judge_wrong_kernels(plan: Plan) -> tuple[int, list[str], list[str]]:
    """How many wrong kernels were made from the plan's reference, and the words for each one its comparison
    passes on every example it was made for: (count, unexplained, explained by an input's `ignorable`)."""
    reference = resolve(plan).reference
    examples = []
    for cell, ex in _examples(plan):
        try:
            values = build_args(plan, cell, ex, "cpu")
            with torch.no_grad():
                examples.append((cell, values, reference_outputs(plan, reference, values)))
        except Exception:  # a reference that cannot run on a CPU machine: nothing to judge here
            continue
    if not examples:
        return 0, [], []
    found, explained, kinds = [], [], 0
    for mutant in _mutants(plan, reference):
        passed, unchanged, made = 0, 0, 0
        for cell, values, expected in examples:
            try:
                with torch.no_grad():
                    actual = mutant.outputs(values, expected, cell.dtype)
            except Exception:  # the reference cannot take the altered input: this wrong kernel is not made
                continue
            if actual is None:
                continue
            made += 1
            if _passes(plan, reference, cell.dtype, values, expected, actual):
                passed += 1
                unchanged += all(bits_equal(actual[n], expected[n]) for n in plan.op.outputs
                                 if isinstance(actual[n], torch.Tensor))
        kinds += bool(made)
        if made and passed == made:
            words = _words(plan, mutant, mutant.does.startswith("ignores") and unchanged == made, examples)
            why = mutant.does.startswith("ignores") and plan.arg(mutant.field.split(".")[2]).ignorable
            if why:
                explained.append(f"{words} (accepted: {why})")
            else:
                found.append(words)
    return kinds, found, explained


def _words(plan: Plan, mutant: Mutant, ignored: bool, examples: list) -> str:
    where = f"{plan.path}:{plan.where(mutant.field)}: {mutant.field}"
    tried = (f"{'/'.join(dict.fromkeys(c.phase for c, *_ in examples))} × "
             f"{'/'.join(dict.fromkeys(c.dtype for c, *_ in examples))}, {TOKENS} tokens at the smallest sizes")
    fixed = ", ".join(f"{a.name}={a.value!r}" for a in plan.args if not a.is_tensor and a.value is not None)
    if ignored and mutant.field.endswith(".init"):
        return (f"{where}: a kernel that {mutant.does} passes this plan: every output equals the reference's without "
                f"it ({tried}): the values drawn for it never bind; draw some that do")
    if ignored:
        check = f": check the values the plan fixes ({fixed})" if fixed else ""
        return (f"{where}: a kernel that {mutant.does} passes this plan: every output equals the reference's with "
                f"it zeroed ({tried}){check}")
    return f"{where}: a kernel that {mutant.does} passes this plan's comparison ({tried})"
