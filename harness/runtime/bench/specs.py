"""What is benchmarked: one BenchSpec per shape (phase token count x sizes x dtype x graph mode on one SM), and why
this machine does not time one (skip_reason), a shape outside the kernel's contract included.

The benchmark's other modules and harness.runtime.tasks (a BenchTask holds a BenchSpec) import it from here, and it
imports none of them: the imports run one way (the layers contract in pyproject.toml).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from harness.cells.hardware import Hardware
from harness.plan.implementations import BUILTIN
from harness.runtime.inputs import sizes_fit
from harness.cells.matrix import Cell, bench_graph_modes, decide
from harness.plan.model import Plan

IMPLS = ("kernel", *BUILTIN)  # every record has these; the plan's own baselines follow them


@dataclass(frozen=True)
class BenchSpec:
    phase: str
    dtype: str
    graph_mode: str
    sm: str
    num_tokens: int
    sizes: tuple[tuple[str, int], ...] = ()
    named: tuple[str, ...] = ()  # the plan's own baselines, beside the built-in ones (not part of the id)

    @property
    def impls(self) -> tuple[str, ...]:
        """Every implementation a record of this shape holds: the kernel, the built-in baselines, the plan's own."""
        return IMPLS + self.named

    @property
    def id(self) -> str:
        dims = "".join(f"-{name}{value}" for name, value in self.sizes)
        return f"{self.phase}-{self.dtype}-{self.graph_mode}-{self.sm}-t{self.num_tokens}{dims}"

    @property
    def sizes_dict(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def shape(self) -> tuple:
        """What the compiled reference specialises on: the shape's eager and CUDA-graph items share it."""
        return self.dtype, self.num_tokens, self.sizes

    def cell(self) -> Cell:
        return Cell(self.phase, self.dtype, 1, self.graph_mode, self.sm)


def bench_specs(plan: Plan, sm: str) -> list[BenchSpec]:
    """Every benchmark shape of the plan on one SM: phase token counts x sizes x dtype x graph mode. The sizes are
    the plan's benchmark.sizes, else every combination of op.sizes their constraints allow (not a rotary_dim above
    head_size)."""
    modes = bench_graph_modes(plan)
    names = list(plan.sizes)
    named = tuple(name for name in plan.baselines if name not in BUILTIN)
    specs = []
    combos = [tuple(v for _, v in combo) for combo in plan.benchmark.sizes] or [
        values for values in itertools.product(*(plan.sizes[s] for s in names))
        if sizes_fit(plan, dict(zip(names, values)))]
    for phase, counts in plan.benchmark.shapes().items():
        for n in counts:
            for values in combos:
                for dtype in plan.matrix["dtype"]:
                    for mode in modes:
                        specs.append(BenchSpec(phase, dtype, mode, sm, n, tuple(zip(names, values)), named))
    return specs


def outside_contract(plan: Plan, name: str, spec: BenchSpec) -> str:
    """Why a benchmark shape is outside the contract of the kernel or of one of the plan's implementations ("" when
    it is not): that one is not timed on it."""
    contract = plan.contract if name == "kernel" else plan.implementation(name).contract
    why = contract.outside(plan.args, spec.sizes_dict, spec.dtype) if contract else ""
    return f"outside {'the kernel' if name == 'kernel' else name}'s contract: {why}" if why else ""


def skip_reason(plan: Plan, spec: BenchSpec, hw: Hardware, max_cpu_ranks: int = 4) -> str:
    """Why this machine does not time this spec ("" if it does)."""
    if spec.sm not in plan.matrix["sm"]:
        return f"the plan's matrix.sm does not list {spec.sm}"
    decision = decide(plan, spec.cell(), hw, max_cpu_ranks)
    if decision.expects_failure:
        return f"not timed: {decision.reason}"
    if not decision.runs:
        return decision.reason
    return outside_contract(plan, "kernel", spec)  # nothing to decide where the kernel cannot run
