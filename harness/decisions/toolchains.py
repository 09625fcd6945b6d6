"""What a toolchain change changed: per cell and benchmark, the results of the latest two toolchains (torch, Triton,
vLLM) on one GPU side by side, grouped by the change (python -m harness diff, the page's section). A user upgrading
Triton reads whether numerics and speed moved with it. Plain Python."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from harness.decisions.speedups import impl_order, median
from harness.results.merge import Merged
from harness.results.store import BenchRecord, CellRecord, outdates
from harness.results.toolchains import is_result, toolchain
from harness.plan.model import Plan
from harness.plan.vocabulary import PHASES

Toolchain = tuple[str | None, str | None, str | None]  # torch, Triton, vLLM (harness.results.toolchains)


@dataclass
class ToolchainChange:
    """One SM and GPU's records under two toolchains: each cell and benchmark holding results of both, in plan order,
    as (key, older toolchain's record, newer's)."""

    sm: str
    gpu: str
    old: Toolchain
    new: Toolchain
    cells: list[tuple[str, CellRecord, CellRecord]] = field(default_factory=list)
    benchmarks: list[tuple[str, BenchRecord, BenchRecord]] = field(default_factory=list)
    # Pairs whose records other checks, plan fields or implementations made too (outdates): their differences need
    # not be the toolchain's.
    other_checks: int = 0

    def status_changes(self) -> list[tuple[str, CellRecord, CellRecord]]:
        return [(cid, old, new) for cid, old, new in self.cells if old.status is not new.status]

    def times(self, rec_old: BenchRecord, rec_new: BenchRecord) -> list[tuple[str, float, float]]:
        """Each implementation timed under both toolchains: (name, old median µs, new median µs)."""
        names = sorted(rec_old.impls.keys() & rec_new.impls.keys(), key=impl_order)
        pairs = [(n, median(rec_old.impls[n]), median(rec_new.impls[n])) for n in names]
        return [(n, old, new) for n, old, new in pairs if old and new]

    def kernel_times(self) -> list[tuple[tuple[str, str, str], int, float, float]]:
        """The kernel's median over each (phase, dtype, graph mode)'s shapes timed under both toolchains: (that
        group, shapes, old µs, new µs), in plan order."""
        groups: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
        for _, old, new in self.benchmarks:
            kernel = [(o, n) for name, o, n in self.times(old, new) if name == "kernel"]
            if kernel:
                groups.setdefault((new.phase, new.dtype, str(new.graph_mode)), []).extend(kernel)
        return [(g, len(pairs), statistics.median(o for o, _ in pairs), statistics.median(n for _, n in pairs))
                for g, pairs in groups.items()]


def _bench_order(plan: Plan, bid: str, rec: BenchRecord) -> tuple:
    """Benchmarks by phase, dtype, graph mode, token count and sizes (the Performance section's order)."""
    return (PHASES.index(rec.phase) if rec.phase in PHASES else len(PHASES),
            plan.matrix["dtype"].index(rec.dtype) if rec.dtype in plan.matrix["dtype"] else len(plan.matrix["dtype"]),
            str(rec.graph_mode), rec.num_tokens, sorted((k, str(v)) for k, v in rec.sizes.items()), bid)


def _latest_two(res: Merged, section: str, key: str, latest) -> list[tuple]:
    """Per GPU, the key's results of its latest two toolchains, (older, newer): the latest record first, then the
    earlier ones, newest first (at most one per GPU and toolchain: harness.results.store.Results.put)."""
    by_gpu: dict[str, list] = {}
    for rec in [latest, *res.earlier.section(section).get(key, [])]:
        prov = res.source(rec) if rec is not None else None
        if prov is not None and is_result(prov, rec):
            by_gpu.setdefault(prov.gpu, []).append(rec)
    return [(recs[1], recs[0]) for recs in by_gpu.values() if len(recs) > 1]


def toolchain_changes(res: Merged, sm: str | None = None) -> list[ToolchainChange]:
    """The plan's cells and benchmarks (of one SM, or all) holding results of two toolchains on one GPU, grouped by
    SM, GPU and the change; empty where every GPU's results are of one toolchain."""
    plan = res.plan
    changes: dict[tuple, ToolchainChange] = {}

    def add(section: str, key: str, old, new) -> None:
        was, now = res.source(old), res.source(new)
        group = (new.sm, now.gpu, toolchain(was, old), toolchain(now, new))
        change = changes.setdefault(group, ToolchainChange(*group))
        (change.cells if section == "cells" else change.benchmarks).append((key, old, new))
        change.other_checks += outdates(old.stamp, new.stamp) or outdates(new.stamp, old.stamp)

    cells = [*res.cells, *(c for p in plan.providers for c in res.provider_cells(p))]
    for c in cells:
        if sm in (None, c.sm):
            for old, new in _latest_two(res, "cells", c.id, res.records.get(c.id)):
                add("cells", c.id, old, new)
    for bid, rec in sorted(res.benchmarks + res.untimed, key=lambda item: _bench_order(plan, *item)):
        if sm in (None, rec.sm):
            for old, new in _latest_two(res, "benchmarks", bid, rec):
                add("benchmarks", bid, old, new)

    def order(group: tuple) -> tuple:
        sm_, gpu, old, new = group
        return plan.matrix["sm"].index(sm_), gpu, [v or "" for v in old], [v or "" for v in new]

    return [changes[g] for g in sorted(changes, key=order)]
