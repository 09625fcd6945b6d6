"""The matrix: every phase x dtype x tp x graph_mode x sm cell of a plan, and what happens to it here.

A cell runs the kernel under test; the plan's `providers` (vLLM's own kernel, a named baseline) run through the
same cells (`Cell.provider`), so a page says what each of them accepts beside the kernel's verdict.

Each cell gets exactly one decision before it runs: run it, run it expecting failure, skip it
because the plan excludes it, or skip it because this machine cannot run it ("not run here").
A run may then run only a pairwise sample of the cells it can run (pairwise_sample; harness.plugin.session
decides when).
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from dataclasses import dataclass

from harness.plan.dtypes import DTYPE
from harness.cells.hardware import Hardware
from harness.plan.model import Contract, Plan
from harness.plan.vocabulary import AXES
from harness.cells.status import Status


@dataclass(frozen=True, order=True)
class Cell:
    phase: str
    dtype: str
    tp: int
    graph_mode: str
    sm: str
    provider: str = ""  # "": the kernel under test; else one of the plan's providers run through the cell

    @property
    def id(self) -> str:
        base = f"{self.phase}-{self.dtype}-tp{self.tp}-{self.graph_mode}-{self.sm}"
        return f"{base}-{self.provider}" if self.provider else base

    def axes(self) -> dict:
        return {axis: getattr(self, axis) for axis in AXES}

    @classmethod
    def from_id(cls, cell_id: str) -> "Cell":
        phase, dtype, tp, graph_mode, sm, *provider = cell_id.split("-", 5)
        return cls(phase, dtype, int(tp.removeprefix("tp")), graph_mode, sm, *provider)


@dataclass(frozen=True)
class Decision:
    """What happens to a cell before it runs, as the status that decides it: EXCLUDED or NOT_RUN, it is skipped
    and recorded so with its reason; XFAIL, it runs expecting a failure (recorded xfail, or xpass where it passes);
    None, it runs and its outcome gives the status."""

    status: Status | None = None
    reason: str = ""

    @property
    def runs(self) -> bool:
        return self.status in (None, Status.XFAIL)

    @property
    def expects_failure(self) -> bool:
        return self.status == Status.XFAIL


# Graph modes a benchmark times (torch_compile is a numerics mode: its timing is the eager kernel's).
BENCH_GRAPH_MODES = ("eager", "cuda_graph")


def bench_graph_modes(plan: Plan) -> list[str]:
    """The plan's graph modes that benchmarks time, else eager."""
    return [m for m in BENCH_GRAPH_MODES if m in plan.matrix["graph_mode"]] or ["eager"]


def expand(plan: Plan, provider: str = "") -> list[Cell]:
    """The cells of the kernel under test, or of one of the plan's providers."""
    m = plan.matrix
    return [Cell(*values, provider)
            for values in itertools.product(m["phase"], m["dtype"], m["tp"], m["graph_mode"], m["sm"])]


def every_cell(plan: Plan) -> list[Cell]:
    """The kernel's cells, then each provider's."""
    return [c for provider in ("", *plan.providers) for c in expand(plan, provider)]


def contract_of(plan: Plan, provider: str) -> Contract:
    """What the kernel under test (""), or one of the plan's implementations, is written for: op.contract, or the
    implementation's own contract."""
    if not provider:
        return plan.contract
    return plan.implementation(provider).contract or Contract()


def contract_line(plan: Plan, provider: str) -> int | None:
    """The line that states the contract of the kernel ("") or of an implementation (0: the plan states none)."""
    stated = plan.implementation(provider).contract if provider else plan.op.contract
    if stated is None:
        return 0
    return plan.where(f"implementations.{provider}.contract" if provider else "op.contract")


def provider_view(plan: Plan, provider: str) -> Plan:
    """The plan as an implementation's cells run it: its inputs drawn within that implementation's contract, and
    the one-fp8-step elements its rounding order gives allowed where it says (its max_step_fraction)."""
    if not provider:
        return plan
    # The contract is op.contract (Plan.contract reads it); model_copy keeps the privates checks derived and runs no
    # validator, so only the fields the update names change.
    view = plan.model_copy(update={"op": plan.op.model_copy(update={"contract": contract_of(plan, provider)})})
    own = plan.implementation(provider).max_step_fraction
    if own is not None:
        steps = max(own, plan.quantization.max_step_fraction)
        view = view.model_copy(update={"quantization": plan.quantization.model_copy(
            update={"max_step_fraction": steps})})
    return view


def step_allowance(plan: Plan, implementation: str) -> tuple[float, str]:
    """The fraction of quantized elements an implementation may put one step from the reference, and the plan field
    that says so: its own max_step_fraction, as its cells have it, else the plan's."""
    entry = plan.implementation(implementation) if implementation != "kernel" else None
    if entry is not None and entry.max_step_fraction is not None:
        return (provider_view(plan, implementation).quantization.max_step_fraction,
                f"implementations.{implementation}.max_step_fraction")
    return plan.quantization.max_step_fraction, "quantization.max_step_fraction"


def excluded_by(plan: Plan, cell: Cell) -> str | None:
    """The plan's reason when an exclude rule matches the cell, or its dtype is not one the contract of the cell's
    kernel or provider supports (on every machine)."""
    i, rule = next(((i, r) for i, r in enumerate(plan.exclude) if r.matches(cell.axes())), (0, None))
    if rule:
        return f"excluded by the plan (line {plan.where(f'exclude[{i}]')}): {rule.why}"
    contract = contract_of(plan, cell.provider)
    if contract.dtypes and cell.dtype not in contract.dtypes:
        why = f" ({contract.why})" if contract.why else ""
        whose = f"{cell.provider}'s contract" if cell.provider else "the kernel's contract"
        line = f" (line {contract_line(plan, cell.provider)})" if contract_line(plan, cell.provider) else ""
        return f"outside {whose}{line}: dtypes {', '.join(contract.dtypes)}{why}"
    return None


def decide(plan: Plan, cell: Cell, hw: Hardware, max_cpu_ranks: int) -> Decision:
    excluded = excluded_by(plan, cell)
    if excluded:
        return Decision(Status.EXCLUDED, excluded)
    why_not = not_runnable_here(cell, hw, max_cpu_ranks)
    if why_not:
        return Decision(Status.NOT_RUN, why_not)
    for i, rule in enumerate(() if cell.provider else plan.expect):  # the plan's expected failures are its kernel's
        if rule.matches(cell.axes()):
            return Decision(Status.XFAIL, f"expected to fail by the plan (line {plan.where(f'expect[{i}]')}): "
                            f"{rule.why}")
    return Decision()


def not_runnable_here(cell: Cell, hw: Hardware, max_cpu_ranks: int) -> str:
    """Why this machine cannot run the cell ("" if it can). These cells are 'not run here', not unsupported."""
    if cell.sm != hw.sm:
        return f"needs {cell.sm}; this machine is {hw.sm}" + (f" ({hw.gpu})" if hw.has_cuda else "")
    if cell.graph_mode in ("cuda_graph", "memcheck") and not hw.has_cuda:
        return f"{cell.graph_mode} needs a CUDA device; this machine has none"
    if cell.graph_mode == "memcheck" and cell.tp > 1:
        return "memcheck runs one process under compute-sanitizer: tp1 only"
    if DTYPE[cell.dtype].rocm_only and hw.has_cuda and not hw.sm.startswith("gfx"):
        return f"{cell.dtype} is the ROCm fp8 format; this machine is {hw.sm}"
    if cell.tp > 1:
        if hw.has_cuda and cell.tp > hw.device_count:
            return f"needs {cell.tp} GPUs; this machine has {hw.device_count}"
        if not hw.has_cuda and cell.tp > max_cpu_ranks:
            return f"needs {cell.tp} ranks; CPU runs allow at most {max_cpu_ranks} (--max-cpu-ranks)"
    return ""


def cost(cell: Cell) -> int:
    """A cell's rough price, for choosing between cells that cover as much: one process per rank, each doing twice
    the work outside eager mode (compiling, capturing, or running under compute-sanitizer)."""
    return cell.tp * (1 if cell.graph_mode == "eager" else 2)


def pairwise_sample(cells: list[Cell], seed: str, tries: int = 32) -> list[Cell]:
    """A few of `cells` such that every pair of axis values found together in one of `cells` (decode with bf16,
    bf16 with tp2, tp2 with torch_compile, ...) is found together in a chosen one; so every axis value is chosen
    too. Axes with one value among `cells` (this machine's SM) are left out of the pairs, or they would favour cells
    unlike the ones chosen over an even spread. Greedy: the cell covering the most pairs not covered yet, until none
    is left; ties go to the cheaper cell (`cost`), then by a hash of `seed` and the cell's id. One greedy run often
    misses the smallest sample, so `tries` tie orders are tried and the smallest, then cheapest, sample kept (the
    first such; it stops early at the bound no sample can beat: the count of one axis pair's value pairs). The same
    cells and seed always give the same sample, in the order of `cells`."""
    varying = [a for a in AXES if len({getattr(c, a) for c in cells}) > 1]
    size = min(2, len(varying))  # with one varying axis: each of its values; with none: any one cell
    covers = {c: set(itertools.combinations([(a, getattr(c, a)) for a in varying], size)) for c in cells}
    everything = set().union(*covers.values())
    bound = max(Counter(tuple(a for a, _ in item) for item in everything).values(), default=0)
    best: list[Cell] | None = None
    for attempt in range(tries):
        rank = {c: hashlib.sha256(f"{seed}/{attempt}/{c.id}".encode()).hexdigest() for c in cells}
        todo, chosen = set(everything), []
        while todo:
            pick = max((c for c in cells if c not in chosen), key=lambda c: (len(covers[c] & todo), -cost(c), rank[c]))
            chosen.append(pick)
            todo -= covers[pick]
        if best is None or (len(chosen), sum(map(cost, chosen))) < (len(best), sum(map(cost, best))):
            best = chosen
        if len(best) <= bound:
            break
    return [c for c in cells if c in (best or ())]
