"""What to fix, run or benchmark next, from the merged results and the recommendations: each open item with what it
rests on (cells, records, benchmarks, a decision's question) and the command that does it, in the order the page
lists them. Plain text, no Markdown: harness.rendering.conclusions words them."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, get_args

from harness.decisions.bounds import broken_timing
from harness.decisions.reasons import by_reason, excluded_by_reason, first_line
from harness.decisions.recommendations import Recommendation, pairs_text, undecided, wanted
from harness.decisions.speedups import stale
from harness.results.merge import Merged
from harness.cells.matrix import Cell
from harness.cells.status import Status


# In the page's order.
OpenItemKind = Literal[
    "results file", "stale records", "failed", "unexpected pass", "SM without results", "not run",
    "no result", "expected failure", "excluded", "implementation error", "differs", "broken timing", "stale baseline",
    "check the baseline", "far from the limit", "no benchmarks", "undecided"]


@dataclass(frozen=True)
class OpenItem:
    """One thing to do next."""

    kind: OpenItemKind
    where: str = ""  # the SM, or the SM, dtype, regime (and profile) of a decision
    what: str = ""  # the results file, the implementation, or the dtypes and regimes without a decision
    why: str = ""  # one line: the records' reason, the plan's expectation, why decisions leave a figure out, ...
    command: str = ""  # what does it
    cells: tuple[Cell, ...] = ()
    records: tuple = ()  # stale records: what other checks made
    benchmarks: tuple[str, ...] = ()  # benchmark ids; where several, `why` is the first one's (the rest alike)


def open_items(res: Merged, recs: list[Recommendation]) -> list[OpenItem]:
    plan = res.plan
    run = f"pytest --plan {res.plan_display()}"
    failed = res.cells_with(Status.FAILED)
    items = [OpenItem("results file", what=problem) for problem in res.shown_problems()]
    other_checks = [r for rs in res.stale_records().values() for r in rs]
    for sm in plan.matrix["sm"]:  # what stale records say is not current: re-run them first
        mine = tuple(r for r in other_checks if r.sm == sm)
        if mine:
            items.append(OpenItem("stale records", where=sm, records=mine, command=f"{run} --cells stale"))
    for reason, cells in by_reason(res, failed):
        items.append(OpenItem("failed", why=reason, cells=tuple(cells)))
    for c in res.cells_with(Status.XPASS):
        items.append(OpenItem("unexpected pass", why=res.records[c.id].expectation or "", cells=(c,)))
    for sm in plan.matrix["sm"]:
        uncovered = tuple(c for c in res.uncovered_cells() if c.sm == sm)
        if uncovered:
            items.append(OpenItem("SM without results", where=sm, cells=uncovered, command=run))
    covered_not_run = [c for c in res.cells_with(Status.NOT_RUN) if c.sm in res.covered]
    for reason, cells in by_reason(res, covered_not_run):
        items.append(OpenItem("not run", why=reason, cells=tuple(cells)))
    if res.missing():
        items.append(OpenItem("no result", cells=tuple(res.missing())))
    for reason, cells in by_reason(res, res.cells_with(Status.XFAIL)):
        items.append(OpenItem("expected failure", why=reason, cells=tuple(cells)))
    for reason, cells in excluded_by_reason(res):
        items.append(OpenItem("excluded", why=reason, cells=tuple(cells)))
    stale_baselines = defaultdict(list)  # (implementation, why) -> the benchmarks that timed it on another function
    # (kind, implementation, the reason but its figures) -> [(benchmark, reason)]: one item for the shapes where an
    # implementation went wrong the same way, not one per shape (a baseline rounding differently at all 30)
    alike = defaultdict(list)
    for bid, rec in res.benchmarks:
        for impl, t in sorted(rec.impls.items()):
            broken = broken_timing(rec, t)
            for kind, text in (("implementation error", t.error), ("differs", t.differs), ("broken timing", broken)):
                if text:
                    why = first_line(text)
                    alike[(kind, impl, re.sub(r"\d+(\.\d+)?", "#", why))].append((bid, why))
            if impl != "kernel" and t.timed and stale(plan, rec, impl):
                stale_baselines[(impl, stale(plan, rec, impl))].append(bid)
    for (kind, impl, _), found in sorted(alike.items(), key=lambda kv: get_args(OpenItemKind).index(kv[0][0])):
        items.append(OpenItem(kind, what=impl, why=found[0][1], benchmarks=tuple(b for b, _ in found)))
    for (impl, why), bids in sorted(stale_baselines.items()):
        items.append(OpenItem("stale baseline", what=impl, why=why, benchmarks=tuple(bids), command=f"{run} --bench"))
    # Each question once, though both profiles' decisions ask it
    for where, why in dict.fromkeys((f"{r.sm} {r.dtype} {r.regime}", r.check_baseline) for r in recs
                                    if r.check_baseline):
        items.append(OpenItem("check the baseline", where=where, why=why))
    for where, why in dict.fromkeys((f"{r.sm} {r.dtype} {r.regime}, {r.profile}", r.far_from_limit) for r in recs
                                    if r.go and r.far_from_limit):
        items.append(OpenItem("far from the limit", where=where, why=why))
    if not res.benchmarks:
        return items + [OpenItem("no benchmarks", command=f"{run} --bench")]
    for sm in [s for s in plan.matrix["sm"] if s != "cpu"]:
        missing = undecided(res, sm, recs)
        if missing:
            what = "every dtype and regime" if len(missing) == len(wanted(res, sm)) else pairs_text(missing)
            items.append(OpenItem("undecided", where=sm, what=what, command=f"{run} --bench"))
    return items
