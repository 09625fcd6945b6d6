"""The matrix: every phase x dtype x tp x graph_mode x sm cell of a plan, and what happens to it here.

Each cell gets exactly one decision before it runs: run it, run it expecting failure, skip it
because the plan excludes it, or skip it because this machine cannot run it ("not run here").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .hardware import Hardware
from .plan import AXES, Plan
from .results import Status


@dataclass(frozen=True, order=True)
class Cell:
    phase: str
    dtype: str
    tp: int
    graph_mode: str
    sm: str

    @property
    def id(self) -> str:
        return f"{self.phase}-{self.dtype}-tp{self.tp}-{self.graph_mode}-{self.sm}"

    def axes(self) -> dict:
        return {axis: getattr(self, axis) for axis in AXES}

    @classmethod
    def from_id(cls, cell_id: str) -> "Cell":
        phase, dtype, tp, graph_mode, sm = cell_id.split("-")
        return cls(phase, dtype, int(tp.removeprefix("tp")), graph_mode, sm)


@dataclass(frozen=True)
class Decision:
    """RUN and XFAIL execute; EXCLUDED and NOT_RUN are skipped with their reason."""

    kind: str
    reason: str = ""


RUN, XFAIL, EXCLUDED, NOT_RUN = "run", "xfail", Status.EXCLUDED.value, Status.NOT_RUN.value
# Graph modes a benchmark times (torch_compile is a numerics mode: its timing is the eager kernel's).
BENCH_GRAPH_MODES = ("eager", "cuda_graph")


def bench_graph_modes(plan: Plan) -> list[str]:
    """The plan's graph modes that benchmarks time, else eager."""
    return [m for m in BENCH_GRAPH_MODES if m in plan.matrix["graph_mode"]] or ["eager"]


def expand(plan: Plan) -> list[Cell]:
    m = plan.matrix
    return [Cell(*values) for values in itertools.product(m["phase"], m["dtype"], m["tp"], m["graph_mode"], m["sm"])]


def excluded_by(plan: Plan, cell: Cell) -> str | None:
    """The plan's reason when an exclude rule matches the cell (on every machine)."""
    rule = next((r for r in plan.excludes if r.matches(cell.axes())), None)
    return f"excluded by the plan (line {rule.line}): {rule.why}" if rule else None


def decide(plan: Plan, cell: Cell, hw: Hardware, max_cpu_ranks: int) -> Decision:
    excluded = excluded_by(plan, cell)
    if excluded:
        return Decision(EXCLUDED, excluded)
    why_not = not_runnable_here(cell, hw, max_cpu_ranks)
    if why_not:
        return Decision(NOT_RUN, why_not)
    for rule in plan.expects:
        if rule.matches(cell.axes()):
            return Decision(XFAIL, f"expected to fail by the plan (line {rule.line}): {rule.why}")
    return Decision(RUN)


def not_runnable_here(cell: Cell, hw: Hardware, max_cpu_ranks: int) -> str:
    """Why this machine cannot run the cell ("" if it can). These cells are 'not run here', not unsupported."""
    if cell.sm != hw.sm:
        return f"needs {cell.sm}; this machine is {hw.sm}" + (f" ({hw.gpu})" if hw.has_cuda else "")
    if cell.graph_mode in ("cuda_graph", "memcheck") and not hw.has_cuda:
        return f"{cell.graph_mode} needs a CUDA device; this machine has none"
    if cell.graph_mode == "memcheck" and cell.tp > 1:
        return "memcheck runs one process under compute-sanitizer: tp1 only"
    if cell.dtype == "fp8_e4m3fnuz" and hw.has_cuda and not hw.sm.startswith("gfx"):
        return f"fp8_e4m3fnuz is the ROCm fp8 format; this machine is {hw.sm}"
    if cell.tp > 1:
        if hw.has_cuda and cell.tp > hw.device_count:
            return f"needs {cell.tp} GPUs; this machine has {hw.device_count}"
        if not hw.has_cuda and cell.tp > max_cpu_ranks:
            return f"needs {cell.tp} ranks; CPU runs allow at most {max_cpu_ranks} (--max-cpu-ranks)"
    return ""
