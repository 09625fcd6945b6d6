"""The reference runs before any cell does: at validate, on a CPU, at the smallest and the largest sizes the plan
draws in every phase and dtype, and once per TP size on shards, recombined as the plan's `tp` section says.

A reference that cannot take the plan's own shapes or dtypes is a plan mistake, so it is said as one, at the
line of the reference and the sizes (`file:line: op.reference: raised on decode fp16 at the largest sizes
(hidden=8192): RuntimeError: ... (kernels/ref.py:12)`), not as a raw traceback or, later, as the kernel's failure
in every cell. A recombination that does not rebuild the unsharded reference from the reference's own shards is
the plan's error at the tp line: ranks running a correct kernel would fail, or crash, for it.

Where this machine is at fault (a reference calling a CUDA-only op, memory), nothing is said: the cells will say it
where they run. Runs the plan's code: in validate's child process (harness.runtime.check_code).
"""

from __future__ import annotations

import math
import os
import traceback

import torch

from harness.runtime.calls import reference_outputs
from harness.runtime.inputs import Example, build_args, sizes_fit
from harness.runtime.numerics import SHORT_NAMES, Mismatch
from harness.runtime.resolve import resolve
from harness.runtime.runner import compare_judged, exception_text
from harness.runtime.tp import local_values, output_combine, recombine, tp_multiples
from harness.cells.matrix import Cell
from harness.plan.model import Plan, PlanError

# What a CPU machine cannot do, which the plan did not get wrong: a CUDA-only op or library, memory.
NOT_THE_PLANS = ("CUDA", "cuda", "Could not run", "not implemented for 'CPU'", "NotImplementedError", "can't allocate",
                 "out of memory", "not compiled with", "No module named")


FEW_TOKENS = 8
MAX_ELEMENTS = 2**24  # the inputs' and outputs' elements a pre-flight call may hold: a fraction of a second on a CPU


class ReferenceFails(PlanError):
    """A reference that cannot run at the plan's own sizes, or shards it cannot rebuild: the plan's mistake."""

    def __init__(self, path: str, found: list[str]):
        super().__init__(path, None, "", "", None)
        self.args = (f"{path}: the reference cannot run as the plan says:\n  " + "\n  ".join(found),)


def preflight(plan: Plan) -> list[str]:
    """`file:line: field: ...` for each way the reference cannot run as the plan says (empty: it can)."""
    reference = resolve(plan).reference
    found = []
    dtypes = [d for d in plan.matrix["dtype"] if d in SHORT_NAMES.values()]
    for phase in plan.matrix["phase"]:
        for dtype in dtypes:
            # a dtype's mistakes show at any size: the largest sizes (the slow ones) once per phase
            for which, sizes in (("smallest", _smallest(plan)), ("largest", dtype == dtypes[0] and _largest(plan))):
                if not sizes:
                    continue
                ex = _example(plan, phase, sizes)
                problem = _raises(plan, reference, Cell(phase, dtype, 1, "eager", "cpu"), ex)
                if problem:
                    found.append(f"{plan.path}:{plan.where('op.reference')}: op.reference: raised on {phase} {dtype} "
                                 f"at the {which} sizes ({_sized(ex)}): {problem}; check the shapes of op.args (line "
                                 f"{plan.where('op.args')}) and op.sizes (line {plan.where('op.sizes')})")
                    break  # one per phase and dtype: the smallest's failure is the one to fix first
    return found or _recombined(plan, reference)


def _smallest(plan: Plan) -> dict | None:
    """The smallest sizes drawn here (numerics.cpu_sizes where the plan gives them, as generated wrong kernels use)."""
    return _sizes(plan, min, dict(plan.numerics.cpu_sizes)) or _sizes(plan, min)


def _largest(plan: Plan) -> dict | None:
    """The largest sizes a GPU draws, where their tensors fit MAX_ELEMENTS; else the largest a CPU machine draws
    (numerics.cpu_sizes): a reference of a 14336x14336 weight takes tens of seconds on a CPU."""
    sizes = _sizes(plan, max)
    if sizes is None or _elements(plan, sizes) <= MAX_ELEMENTS or not plan.numerics.cpu_sizes:
        return sizes if sizes is None or _elements(plan, sizes) <= MAX_ELEMENTS else None
    return _sizes(plan, max, dict(plan.numerics.cpu_sizes))


def _elements(plan: Plan, sizes: dict) -> int:
    names = {**sizes, "num_tokens": FEW_TOKENS}
    return sum(math.prod(d.size(names) for d in a.shape) for a in plan.tensor_args if a.shape
               and all(d.names <= set(names) for d in a.shape))


def _sizes(plan: Plan, pick, values: dict | None = None) -> dict | None:
    """Every size at its smallest (pick=min) or largest (max) value (of `values`, else the plan's) that the relations
    between sizes and the kernel's contract allow, each symbol after the ones its relations name (as sizes are
    drawn)."""
    chosen: dict[str, int] = {}
    pending = list(plan.sizes)
    while pending:
        sym = next((s for s in pending if all(o not in pending or o == s for o in
                                              (plan.op.sizes[s].divides, plan.op.sizes[s].at_most))), pending[0])
        pending.remove(sym)
        low, high = plan.contract.bounds(sym)
        fitting = [v for v in (values or {}).get(sym, plan.sizes[sym]) if v >= low and (high is None or v <= high)
                   and plan.op.sizes[sym].allows(v, chosen) and plan.contract.allows_size(sym, v, plan.args)]
        if not fitting:
            return None
        chosen[sym] = pick(fitting)
    return chosen if sizes_fit(plan, chosen) else None


def _example(plan: Plan, phase: str, sizes: dict, tokens: int | None = None) -> Example:
    """The phase's fewest tokens, at most FEW_TOKENS (a shape's mistake does not wait for a long batch; a chunked
    prefill: one decode token and one prefill token)."""
    low = plan.token_range(phase)[0]
    n = tokens or (2 if phase == "chunked_prefill" else max(1, min(low, FEW_TOKENS)))
    return Example(n, sizes, seed=1, decode_tokens=n // 2 if phase == "chunked_prefill" else 0)


def _sized(ex: Example) -> str:
    return ", ".join([f"num_tokens={ex.num_tokens}", *(f"{k}={v}" for k, v in ex.sizes.items())])


def _raises(plan: Plan, reference, cell: Cell, ex: Example) -> str:
    """What the reference raised on this example, where it is the plan's to fix ("" where it ran, or where this
    machine is at fault)."""
    try:
        values = build_args(plan, cell, ex, "cpu")
    except Exception:  # the harness's own inputs: the cells say it, with the example
        return ""
    try:
        with torch.no_grad():
            reference_outputs(plan, reference, values)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exception_text(exc)}"
        if any(mark in text for mark in NOT_THE_PLANS):
            return ""
        return f"{text.splitlines()[0][:300]} ({_where(exc)})"
    return ""


def _where(exc: BaseException) -> str:
    """The innermost frame outside torch's and the harness's code: the reference's own line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename and "/harness/" not in f.filename]
    frame = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    path = frame.filename.rpartition("site-packages/")[2]
    here = f"{os.getcwd()}/"
    return f"{path.removeprefix(here)}:{frame.lineno} in {frame.name}"


def _recombined(plan: Plan, reference) -> list[str]:
    """Per TP size of the matrix: the reference on every rank's shard, recombined as the plan says, against the
    reference on the whole example, with the cells' comparison (in fp32 where the matrix has it, so a sum of
    rounded partial results is not blamed on the plan)."""
    sizes = [n for n in plan.matrix["tp"] if n > 1]
    if not sizes or plan.tp.kind != "sharded":
        return []
    dtype = "fp32" if "fp32" in plan.matrix["dtype"] else plan.matrix["dtype"][0]
    found = []
    for size in sizes:
        base = _smallest(plan)
        if base is None:
            return []
        need = tp_multiples(plan, size)
        sized = {sym: v if v % need.get(sym, 1) == 0 else need[sym] * -(-v // need[sym]) for sym, v in base.items()}
        if not sizes_fit(plan, sized):
            continue
        phase = plan.matrix["phase"][0]
        ex = _example(plan, phase, sized, tokens=4)
        cell = Cell(phase, dtype, size, "eager", "cpu")
        try:
            full = build_args(plan, cell, ex, "cpu")
            with torch.no_grad():
                whole = reference_outputs(plan, reference, full)
        except Exception:  # the unsharded run's failure is said above, or this machine's
            continue
        problem = _shards_rebuild(plan, reference, cell, ex, full, whole, size)
        if problem:
            field, words = problem
            found.append(f"{plan.path}:{plan.where(field)}: {field}: {words} (tp {size}, {dtype}, {_sized(ex)})")
    return found


def _shards_rebuild(plan: Plan, reference, cell: Cell, ex: Example, full: dict, whole: dict, size: int):
    """(field, words) where the recombined shards' reference is not the whole one; None where it is."""
    pieces: dict[str, list] = {name: [] for name in plan.op.outputs}
    for rank in range(size):
        try:
            local = local_values(plan, ex, full, rank, size)
            with torch.no_grad():
                outputs = reference_outputs(plan, reference, local)
        except Exception as exc:
            return "tp.inputs", (f"the reference raised on rank {rank}'s shard: {type(exc).__name__}: "
                                 f"{exception_text(exc).splitlines()[0][:300]} ({_where(exc)}): a split the op "
                                 "cannot compute on (check each input's shard dimension)")
        for name in plan.op.outputs:
            pieces[name].append(outputs[name])
    for name in plan.op.outputs:
        how, dim, merged = output_combine(plan, name)
        field = f"tp.outputs.{name}"
        try:
            rebuilt = recombine(plan, name, pieces[name], ex.num_tokens, ex.sizes)
            compare_judged(plan, reference, cell.dtype, None, name, rebuilt, whole[name], full, False)
        except (Mismatch, RuntimeError, ValueError, IndexError) as exc:
            said = "replicated" if how == "replicated" else f"{how} along dimension {dim}" + \
                (f" of {merged} merged parts" if merged > 1 else "")
            return field, (f"the reference run on each rank's shard and recombined as '{said}' is not the unsharded "
                           f"reference: {exception_text(exc).splitlines()[0][:300]} (a row-parallel output is summed, "
                           "a column-parallel one gathered along its sharded dimension)")
    return None
