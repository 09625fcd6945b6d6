"""Why cells did not pass or run, each reason in one line, and the cells that share one: the facts verdicts, open
items and pages are stated in. Plain text, no Markdown."""

from __future__ import annotations

from collections import Counter, defaultdict

from harness.results.merge import Merged
from harness.results.store import BenchRecord, IntegrationRecord
from harness.cells.matrix import Cell
from harness.cells.status import Status


def first_line(text, limit: int = 240) -> str:
    """`text` on one line, cut to `limit` characters (an ellipsis where it was cut)."""
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def n_cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def n_records(recs: list) -> str:
    """Records counted by kind: "2 cells, 1 benchmark, 1 vLLM integration item"."""
    kinds = Counter("benchmark" if isinstance(r, BenchRecord) else "vLLM integration item"
                    if isinstance(r, IntegrationRecord) else "cell" for r in recs)
    return ", ".join(f"{kinds[k]} {k}{'s' if kinds[k] > 1 else ''}" for k in ("cell", "benchmark",
                                                                             "vLLM integration item") if kinds[k])


def by_reason(res: Merged, cells: list[Cell]) -> list[tuple[str, list[Cell]]]:
    """Cells with a record grouped by the first line of its reason, the largest group first."""
    groups = defaultdict(list)
    for c in cells:
        groups[first_line(res.records[c.id].reason or "no reason given")].append(c)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def excluded_by_reason(res: Merged) -> list[tuple[str, list[Cell]]]:
    """Excluded cells by reason: the record's on SMs with results, the plan's elsewhere."""
    groups = defaultdict(list)
    for c in res.cells:
        reason = (res.records[c.id].reason if c.sm in res.covered and res.status(c) == Status.EXCLUDED
                  else res.excluded_by_plan(c) if c.sm not in res.covered else None)
        if reason is not None:
            groups[first_line(reason or "no reason given")].append(c)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
