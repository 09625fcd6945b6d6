"""Where the op works: the support matrix (a mark per cell, per SM and TP size), its failures, expected failures and
cells without a result by reason, and what the kernel accepted (the inputs of the examples that passed, and each
failure with its minimal input)."""

from __future__ import annotations

from collections import defaultdict

from harness.decisions.reasons import by_reason, excluded_by_reason, first_line, n_cells
from harness.rendering.markdown import LEGEND, MARKS, NO_RESULT, code, fmt, md, table
from harness.rendering.plan_words import axis_value, describe, implementation_title, provider_words
from harness.results.merge import Merged
from harness.results.store import ALIGNMENTS, CellRecord, InputsSeen, lead_reason
from harness.cells.matrix import Cell
from harness.cells.status import RAN, Status


def mark_status(res: Merged, cell: Cell) -> Status | None:
    """The cell's status where it has a mark, else None (no result)."""
    s = res.status(cell)
    return s if s in MARKS else None


def mark(res: Merged, cell: Cell) -> str:
    """The cell's mark, "stale" beside it where its record could now come out differently (the stale results below
    say why)."""
    rec = res.records.get(cell.id)
    return MARKS.get(mark_status(res, cell), NO_RESULT) + (" stale" if rec and res.stale_checks(rec) else "")


def support_matrix(res: Merged) -> str:
    plan = res.plan
    m = plan.matrix
    lines = ["## Support matrix", "", f"Legend: {LEGEND}.", ""]
    # Overview: one column per SM, in plan order.
    head = ["", *m["sm"]]
    source = ["source"]
    rows = [source]
    for sm in m["sm"]:
        if sm in res.covered:
            ps = [res.runs[r] for r in res.covered[sm]]
            source.append("; ".join(dict.fromkeys(f"{md(p.host)} ({md(p.gpu)}, {md(p.commit_words(prefix=''))})"
                                                  for p in ps)))
        else:
            source.append("no results from this SM yet")
    for status in (*MARKS, None):
        row = [f"{MARKS.get(status, NO_RESULT)} {status.replace('_', ' ') if status else 'no result'}"]
        for sm in m["sm"]:
            if sm not in res.covered:
                row.append(NO_RESULT)
                continue
            row.append(str(sum(1 for c in res.cells if c.sm == sm and mark_status(res, c) == status)))
        rows.append(row)
    lines += [table(rows, head), ""]
    for sm in m["sm"]:
        lines.append(f"### {sm}")
        lines.append("")
        if sm not in res.covered:
            lines += ["No results from this SM yet.", ""]
            continue
        for tp in m["tp"]:
            rows = []
            for phase in m["phase"]:
                for dtype in m["dtype"]:
                    row = [phase, dtype]
                    for mode in m["graph_mode"]:
                        row.append(mark(res, Cell(phase, dtype, tp, mode, sm)))
                    rows.append(row)
            lines += [f"tp{tp}:", "", table(rows, ["phase", "dtype", *m["graph_mode"]]), ""]
    lines += _stale(res)
    lines += _failures(res)
    lines += _not_run(res)
    if res.ignored:
        records = "1 stored record" if res.ignored == 1 else f"{res.ignored} stored records"
        lines += [f"Not shown: {records} for cells, benchmarks, vLLM routes or SMs this plan no longer has.", ""]
    return "\n".join(lines).rstrip()


# What a failure that no comparison measured was, by its reason's words (harness.runtime.runner, workers).
NOT_MEASURED = (("killed by", "crashed"), ("faulted on the device", "faulted"), ("did not return", "hung"),
                ("no example finished", "hung"), ("raised", "raised"))


def _error_fields(rec: CellRecord) -> tuple[str, str]:
    """The failed-cells table's error columns: the worst errors measured, or, where the kernel raised, crashed,
    faulted or hung before any output was compared, which (an error of 0 there would read as a near pass)."""
    err = rec.error
    if err is None or (not err.output and not err.max_abs):
        word = next((w for words, w in NOT_MEASURED if words in rec.reason), NO_RESULT)
        return word, word
    return fmt(err.max_abs), fmt(err.max_ulp)


def _failures(res: Merged) -> list[str]:
    out = []
    failed = res.cells_with(Status.FAILED)
    if failed:
        rows = []
        for c in failed:
            rec = res.records[c.id]
            max_abs, ulp = _error_fields(rec)
            more = rec.more_failures or ()
            shown = f"{code(c.id)} (1 of {len(more) + 1} distinct failures)" if more else code(c.id)
            rows.append([shown, md(first_line(lead_reason(rec), 400)), max_abs, ulp,
                         md(rec.minimal_example or "—"), code(rec.repro) if rec.repro else "—"])
            for i, f in enumerate(more, start=2):  # each distinct failure on a row of its own, with its input
                rows.append([f"{code(c.id)} ({i} of {len(more) + 1})", md(first_line(f.reason, 400)), "—", "—",
                             md(f.minimal_example or "—"), "—"])
        out += ["Failed cells:", "", table(rows, ["cell", "reason", "max abs error", "ULP", "minimal input",
                                                  "reproduce"]), ""]
    xpass = res.cells_with(Status.XPASS)
    if xpass:
        rows = [[code(c.id), md(res.records[c.id].expectation or "—")] for c in xpass]
        out += ["Unexpected passes (the plan expects these to fail):", "",
                table(rows, ["cell", "the plan's expectation"]), ""]
    xfail = res.cells_with(Status.XFAIL)
    if xfail:
        rows = []
        for c in xfail:
            rec = res.records[c.id]
            rows.append([code(c.id), md(rec.expectation or "—"), md(first_line(rec.reason, 400)),
                         code(rec.repro) if rec.repro else "—"])
        out += ["Expected failures:", "", table(rows, ["cell", "the plan's expectation", "failure", "reproduce"]), ""]
    return out


def _stale(res: Merged) -> list[str]:
    """The cells and vLLM integration items whose records could now come out differently, by why; then the current
    ones that checks added since did not check yet."""
    groups = defaultdict(lambda: ([], []))  # reason -> (cells, integration item keys)
    for c in res.cells:
        rec = res.records.get(c.id)
        if rec and res.stale_checks(rec):
            groups[res.stale_checks(rec)][0].append(c)
    for key, rec in sorted(res.integration.items()):
        if res.stale_checks(rec):
            groups[res.stale_checks(rec)][1].append(key)
    rows = []
    for reason, (cells, items) in sorted(groups.items()):
        if cells:
            rows.append([f"stale: {md(reason)}", str(len(cells)), md(describe(res.plan, cells))])
        if items:
            shown = ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")
            rows.append([f"stale: {md(reason)}", str(len(items)), f"vLLM integration items: {md(shown)}"])
    out = ["Stale results, marked \"stale\" above: they could now come out differently (a check they ran has a "
           "higher version now, the plan fields they rest on or the implementation they ran changed), so not "
           f"current; re-run them with {code(f'pytest --plan {res.plan_display()} --cells stale')} on a machine of "
           "their SM:", "", table(rows, ["why", "records", "which"]), ""] if rows else []
    unchecked = defaultdict(list)  # check -> the current records it would apply to
    for c in res.cells:
        for check in res.not_checked(res.records[c.id]) if c.id in res.records else ():
            unchecked[check].append(c)
    if unchecked:
        rows = [[f"not checked for {md(check)} yet", str(len(cells)), md(describe(res.plan, cells))]
                for check, cells in sorted(unchecked.items())]
        out += ["Checks added since these results were made, so not run on them yet (the verdicts rest on the checks "
                f"that did run; {code(f'pytest --plan {res.plan_display()} --cells stale')} runs them):", "",
                table(rows, ["check", "records", "which"]), ""]
    return out


def _not_run(res: Merged) -> list[str]:
    rows = []
    covered_not_run = [c for c in res.cells_with(Status.NOT_RUN) if c.sm in res.covered]
    for reason, cells in by_reason(res, covered_not_run):
        rows.append([md(reason), str(len(cells)), md(describe(res.plan, cells))])
    missing = res.missing()
    if missing:
        rows.append(["no result recorded (sampled out, deselected with -k or -m, or the run stopped)",
                     str(len(missing)), md(describe(res.plan, missing))])
    uncovered = res.uncovered_cells()
    if uncovered:
        rows.append(["no results from this SM yet", str(len(uncovered)), md(describe(res.plan, uncovered))])
    for reason, cells in excluded_by_reason(res):
        rows.append([md(reason), str(len(cells)), md(describe(res.plan, cells))])
    if not rows:
        return []
    return ["Cells without a pass or fail, by reason:", "", table(rows, ["reason", "cells", "which"]), ""]


# ---------------------------------------------------------------- what the kernel accepts


def _range(low_high) -> str:
    low, high = low_high
    return str(low) if low == high else f"{low} … {high}"


def _seen_sizes(seen: InputsSeen) -> str:
    return "; ".join(f"{md(sym)} {_range(seen.sizes[sym])} (alignment {', '.join(map(str, seen.alignments[sym]))})"
                     for sym in sorted(seen.sizes)) or NO_RESULT


def _seen_layouts(seen: InputsSeen) -> str:
    parts = []
    for name in sorted(seen.layouts):
        text = f"{md(name)}: {', '.join(seen.layouts[name])}"
        if seen.row_strides.get(name):
            text += f" (row stride alignment {', '.join(map(str, seen.row_strides[name]))})"
        parts.append(text)
    return "; ".join(parts) or NO_RESULT


def accepted_inputs(res: Merged, provider: str = "") -> str:
    """What the kernel, or a provider of the plan (`providers`), accepted, per SM: the inputs of the examples that
    passed (each cell records them), the dtypes, graph modes and TP sizes of the cells that passed, then each failure
    with its minimal input. A provider's section says what a replacement must accept too; the kernel's is "" until a
    cell has recorded its inputs."""
    plan = res.plan
    cells = res.provider_cells(provider) if provider else res.cells
    ran = [c for c in cells if res.status(c) in RAN]
    if not provider and not any(res.records[c.id].passing for c in ran):
        return ""
    lines = ["## Inputs seen passing", ""]
    if provider:
        words = provider_words(plan, provider)
        title = implementation_title(provider, plan.implementation(provider))
        lines = [f"## What {title} accepts", "",
                 f"Run through the plan's cells as the kernel is: {words}. Its failures are findings about it, not "
                 "the kernel's: the inputs it computed right are what a replacement must accept too; where it fails, "
                 "a replacement may refuse the input (state it in `op.contract`) or do better.", ""]
    alignments = ", ".join(map(str, ALIGNMENTS))
    lines += [f"From the examples that passed in each cell (drawn by hypothesis; alignment: the largest of "
              f"{alignments} dividing a size, or a row stride in elements). Dtypes, graph modes and TP sizes: of the "
              "cells that passed.", ""]
    rows = []
    for sm in plan.matrix["sm"]:
        mine = [c for c in ran if c.sm == sm]
        if not mine:
            continue
        passed = [c for c in mine if res.status(c) in (Status.PASSED, Status.XPASS)]
        seen = InputsSeen()
        for c in mine:
            if res.records[c.id].passing:
                seen = seen.merge(res.records[c.id].passing)

        def values(axis):
            return ", ".join(axis_value(axis, v) for v in plan.matrix[axis]
                             if any(getattr(c, axis) == v for c in passed)) or NO_RESULT

        rows.append([sm, f"{len(passed)} of {len(mine)}", values("dtype"), values("graph_mode"), values("tp"),
                     _range(seen.num_tokens) if seen.num_tokens else NO_RESULT, _seen_sizes(seen),
                     _seen_layouts(seen), str(seen.examples)])
    if rows:
        lines += [table(rows, ["SM", "cells passed of run", "dtypes", "graph modes", "tp", "num_tokens",
                               "sizes (alignments)", "layouts", "passing examples"]), ""]
    else:
        lines += ["No cell has run yet.", ""]
    failed = [c for c in ran if res.status(c) in (Status.FAILED, Status.XFAIL)]
    if failed:
        groups = defaultdict(list)  # (reason, minimal input) -> the cells that failed so
        for c in failed:  # every distinct failure of a cell, each with its minimal input
            rec = res.records[c.id]
            for reason, example in [(lead_reason(rec), rec.minimal_example),
                                    *((f.reason, f.minimal_example) for f in rec.more_failures or ())]:
                groups[(first_line(reason, 300), example or NO_RESULT)].append(c)
        rows = [[md(describe(plan, cells)), str(len(cells)), md(reason), md(example)]
                for (reason, example), cells in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
        lines += ["Where it failed (each distinct failure of a cell, with its minimal input):", "",
                  table(rows, ["cells", "count", "reason", "minimal input"]), ""]
    covered = res.provider_sms(provider) if provider else res.covered
    not_run = [c for c in cells if res.status(c) == Status.NOT_RUN and c.sm in covered]
    if not_run:
        lines += ["Not run on machines of the cells' SM:", ""]
        lines += [f"- {n_cells(len(cells))}: {md(reason)}" for reason, cells in by_reason(res, not_run)]
    return "\n".join(lines).rstrip()
