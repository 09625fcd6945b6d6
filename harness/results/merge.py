"""One op's results from every machine, merged and narrowed to its plan: the plan's cells with their winning records
(per cell the latest wins), the benchmarks of the plan's SMs, and where each record came from. Plain Python."""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from harness.results.stamps import staleness, unchecked
from harness.results.store import BenchRecord, CellRecord, Earlier, IntegrationRecord, Provenance, merge_dir, \
    steps_over
from harness.cells.matrix import Cell, every_cell, excluded_by, expand, step_allowance
from harness.plan.model import Plan
from harness.cells.status import Status
from harness.vllm_facts.names import ROUTE_KINDS, integration_routes

# The routes of the integration items a plan's plugin gets: the routes the harness drives, and the plugin loaded.
PLUGIN_ITEM_ROUTES = {name for name, kind in ROUTE_KINDS.items() if kind.driven} | {"plugin"}


@dataclass
class Merged:
    """The plan's cells with their winning records, and where each record came from."""

    plan: Plan
    runs: dict[str, Provenance]
    records: dict[str, CellRecord]  # cell id -> record, plan cells only
    cells: list  # every cell of the kernel under test, in plan order (`records` holds the providers' too)
    benchmarks: list[tuple[str, BenchRecord]]  # for the plan's SMs, with at least one implementation timed
    untimed: list[tuple[str, BenchRecord]]  # where nothing was timed (skipped on this machine)
    problems: list  # results that could not be used, as returned to the caller
    op_dir: Path = Path(".")
    ignored: int = 0  # stored results for cells or SMs the plan no longer has
    covered: dict = field(default_factory=dict)  # sm -> runs on a machine of that SM that gave cell results
    sources: dict = field(default_factory=dict)  # sm -> runs on a machine of that SM that gave cells or benchmarks
    integration: dict[str, IntegrationRecord] = field(default_factory=dict)
    # The results of other toolchains or GPUs that the records above replaced, by section and key, as stored (every
    # key: compare them with the plan's records, harness.decisions.toolchains)
    earlier: Earlier = field(default_factory=Earlier)
    _staleness: dict = field(default_factory=dict)  # id(record) -> (record, why it is stale)

    def source(self, rec) -> Provenance | None:
        return self.runs.get(rec.run)

    def source_sm(self, rec) -> str | None:
        prov = self.source(rec)
        return prov.sm if prov else None

    def status(self, cell: Cell) -> Status | None:
        rec = self.records.get(cell.id)
        return rec.status if rec else None

    def stale_checks(self, rec) -> str:
        """Why a record could now come out differently ("" where it could not: harness.results.stamps), e.g.
        "accumulation v1 → v2". Only results count: an exclusion is the plan's as it is now, another SM's machine
        saying "not run here" is no result for the cell, and a record of no known run is a results problem
        (collect), not a stale one."""
        prov = self.source(rec)
        if prov is None or prov.sm != rec.sm or getattr(rec, "status", None) is Status.EXCLUDED:
            return ""
        if id(rec) not in self._staleness:  # pages ask per section; fingerprints are taken once per record
            self._staleness[id(rec)] = (rec, staleness(self.plan, rec))
        return self._staleness[id(rec)][1]

    def not_checked(self, rec) -> list[str]:
        """The checks added since a current record was made that apply to it: "not checked for X yet"."""
        prov = self.source(rec)
        return [] if prov is None or prov.sm != rec.sm or self.stale_checks(rec) else unchecked(self.plan, rec)

    def record(self, section: str, key: str):
        """The merged record of a cell (by id), vLLM item (by name) or benchmark (by id); None where there is none."""
        if section == "benchmarks":
            return next((rec for bid, rec in self.benchmarks + self.untimed if bid == key), None)
        return (self.records if section == "cells" else self.integration).get(key)

    def needs_run(self, section: str, key: str, left_for_memory) -> bool:
        """Whether `--cells stale` runs an item: its record is missing on its SM (none, only another SM's machine
        saying "not run here", or `left_for_memory(reason)`: not run for memory other processes held), stale, or
        not checked yet by a check added since."""
        rec = self.record(section, key)
        if rec is None or self.source_sm(rec) != rec.sm:
            return True
        if getattr(rec, "status", None) is Status.NOT_RUN and left_for_memory(rec.reason):
            return True
        return bool(self.stale_checks(rec) or self.not_checked(rec))

    def stale_records(self) -> dict[str, list]:
        """The plan's stale records, by section ("cells", "benchmarks", "integration")."""
        return {"cells": [r for r in self.records.values() if self.stale_checks(r)],
                "benchmarks": [r for _, r in self.benchmarks + self.untimed if self.stale_checks(r)],
                "integration": [r for r in self.integration.values() if self.stale_checks(r)]}

    def stale_summary(self) -> str:
        """The run's and `report`'s closing line on stale records ("" where there are none)."""
        stale = self.stale_records()
        n = sum(map(len, stale.values()))
        if not n:
            return ""
        sms = [sm for sm in self.plan.matrix["sm"] if any(r.sm == sm for rs in stale.values() for r in rs)]
        where = f" on {', '.join(sms)}" if sms else ""
        return (f"{n} stale record{'s' if n > 1 else ''} (they could now come out differently): re-run them{where}: "
                f"pytest --plan {self.plan_display()} --cells stale")

    def provider_cells(self, provider: str) -> list:
        """A provider's cells (harness.cells.matrix), in plan order."""
        return expand(self.plan, provider)

    def provider_sms(self, provider: str) -> list[str]:
        """The SMs whose machines recorded a provider's cells (`covered`, for a provider)."""
        return [sm for sm in self.plan.matrix["sm"] if any(
            c.sm == sm and c.id in self.records and self.source_sm(self.records[c.id]) == sm
            for c in self.provider_cells(provider))]

    def cells_with(self, *statuses: Status) -> list:
        return [c for c in self.cells if self.status(c) in statuses]

    def missing(self) -> list:
        """Plan cells on covered SMs without a result."""
        return [c for c in self.cells if c.sm in self.covered and self.status(c) is None]

    def excluded_by_plan(self, cell: Cell) -> str | None:
        """The plan's reason when it excludes the cell (on every machine, with or without results)."""
        return excluded_by(self.plan, cell)

    def uncovered_cells(self) -> list:
        """Cells the plan requires on SMs that no results cover yet."""
        return [c for c in self.cells if c.sm not in self.covered and not self.excluded_by_plan(c)]

    def shown_problems(self) -> list[str]:
        """Problems with their files named relative to the op's folder, so the report does not depend on the cwd."""
        results_dir = self.op_dir / "results"
        prefixes = [str(results_dir.resolve()) + os.sep, str(results_dir) + os.sep]
        out = []
        for problem in self.problems:
            prefix = next((p for p in prefixes if problem.startswith(p)), None)
            out.append("results/" + problem[len(prefix):] if prefix else problem)
        return out

    def plan_display(self) -> str:
        """The plan's path as a user types it at the project root (reports/<op>/ lies in the root), else its name."""
        try:
            return Path(self.plan.path).resolve().relative_to(self.op_dir.resolve().parent.parent).as_posix()
        except ValueError:
            return Path(self.plan.path).name


def judged(plan: Plan, rec: BenchRecord) -> BenchRecord:
    """A benchmark record with the after-timing check's fraction of quantized elements one step off judged against
    each implementation's allowance now (records keep the observation; a changed allowance re-judges them): over
    it, the kernel's is an error, a baseline's a difference (its timing stands)."""
    impls = {}
    for name, impl in rec.impls.items():
        over = steps_over(impl.step_fraction, *step_allowance(plan, name))
        if over and name == "kernel":
            impl = dataclasses.replace(impl, error="; ".join(filter(None, [impl.error, over])))
        elif over:
            impl = dataclasses.replace(impl, differs="; ".join(filter(None, [impl.differs, over])))
        impls[name] = impl
    return dataclasses.replace(rec, impls=impls) if impls != rec.impls else rec


def collect(plan: Plan, op_dir: Path) -> Merged:
    """Every results file merged (per cell the latest wins), narrowed to the plan's cells and SMs."""
    results_dir = Path(op_dir) / "results"
    merged, problems = merge_dir(results_dir, plan.op.name)
    for path in sorted(results_dir.glob("*.unreadable")):
        problems.append(f"{path}: a results file a run could not read and set aside; inspect it, then delete it")
    cells = expand(plan)
    by_id = {c.id: c for c in every_cell(plan)}
    records, ignored = {}, 0
    for cid, rec in merged.cells.items():
        if cid not in by_id:
            ignored += 1
            continue
        if rec.status is Status.EXCLUDED:
            # An exclusion is the plan's, not the run's: its reason (and the line it names) comes from the plan as it
            # is now, and a cell the plan no longer excludes has no result yet.
            why = excluded_by(plan, by_id[cid])
            if why is None:
                ignored += 1
                continue
            rec = dataclasses.replace(rec, reason=why)
        records[cid] = rec
    benchmarks, untimed = [], []
    for bid, rec in sorted(merged.benchmarks.items()):
        rec = judged(plan, rec)
        if rec.sm not in plan.matrix["sm"] or not plan.benchmark.times(rec.sizes):
            ignored += 1  # another SM's, or sizes the plan no longer times
        elif any(t.timed for t in rec.impls.values()):
            benchmarks.append((bid, rec))
        else:
            untimed.append((bid, rec))
    # Integration items of a route the plan no longer takes (it moved from an IR provider to a CustomOp) are another
    # plan's results, as benchmarks of sizes it no longer times are.
    taken = integration_routes(plan)
    integration = {key: rec for key, rec in merged.integration.items()
                   if rec.route not in PLUGIN_ITEM_ROUTES or rec.route in taken}
    ignored += len(merged.integration) - len(integration)
    res = Merged(plan, merged.runs, records, cells, benchmarks, untimed, problems, Path(op_dir), ignored,
                 integration=integration, earlier=merged.earlier)
    unknown_runs = sorted({r.run for r in records.values() if r.run not in res.runs}
                          | {r.run for _, r in benchmarks if r.run not in res.runs}, key=str)
    for run in unknown_runs:
        problems.append(f"results name run {run!r}, which no results file describes (provenance unknown)")
    covered, sources = defaultdict(set), defaultdict(set)
    for cid, rec in records.items():
        sm = by_id[cid].sm
        if res.source_sm(rec) == sm and not by_id[cid].provider:  # the kernel's cells say what a machine covered
            covered[sm].add(rec.run)
            sources[sm].add(rec.run)
    for _, rec in benchmarks + untimed:
        if res.source_sm(rec) == rec.sm:
            sources[rec.sm].add(rec.run)
    res.covered = {sm: sorted(covered[sm]) for sm in plan.matrix["sm"] if sm in covered}
    res.sources = {sm: sorted(sources[sm]) for sm in plan.matrix["sm"] if sm in sources}
    return res
