"""What a toolchain change changed, in words: the page's section (only where some GPU's results hold two toolchains)
and `python -m harness diff`'s lines, from harness.decisions.toolchains. The page's words are escaped for Markdown,
the command's are plain text."""

from __future__ import annotations

from typing import Callable

from tabulate import tabulate

from harness.decisions.reasons import first_line
from harness.decisions.speedups import impl_order
from harness.decisions.toolchains import Toolchain, ToolchainChange, toolchain_changes
from harness.rendering.markdown import code, fmt, fmt_us, md
from harness.results.merge import Merged
from harness.results.store import CellRecord, finite_number, lead_reason
from harness.cells.status import Status

PACKAGES = ("torch", "Triton", "vLLM")
LISTED = 5  # status changes the page names in full; the command lists every one


def _plain(text) -> str:
    return " ".join(str(text).split())


def toolchain_words(old: Toolchain, new: Toolchain, esc: Callable = _plain) -> str:
    """The packages that changed: `torch 2.11.0 → 2.12.0, Triton 3.6.0 → 3.7.0`."""
    return ", ".join(f"{name} {esc(a or 'not installed')} → {esc(b or 'not installed')}"
                     for name, a, b in zip(PACKAGES, old, new) if a != b)


def time_change(old: float, new: float) -> str:
    return f"{fmt_us(old)} → {fmt_us(new)} µs ({new / old - 1:+.1%})"


def status_change(cid: str, old: CellRecord, new: CellRecord, esc: Callable = _plain, limit: int = 240) -> str:
    """`decode-bf16-tp1-eager-sm90: passed → failed: <the newer record's reason>` (or the older's, `was: ...`, where
    only that one failed), with the max abs error of both where both hold one."""
    text = f"{esc(cid)}: {old.status.value} → {new.status.value}"
    if new.status is not Status.PASSED and lead_reason(new):
        text += f": {esc(first_line(lead_reason(new), limit))}"
    elif lead_reason(old):
        text += f" (was: {esc(first_line(lead_reason(old), limit))})"
    errors = [rec.error.max_abs if rec.error else None for rec in (old, new)]
    if all(finite_number(e) for e in errors) and errors[0] != errors[1]:
        text += f"; max abs error {fmt(errors[0])} → {fmt(errors[1])}"
    return text


def numerics_words(change: ToolchainChange, esc: Callable = _plain) -> str:
    """`numerics unchanged (N cells)`, or how many cells changed status; and the cell whose max abs error grew the
    most, where one grew."""
    n, changed = len(change.cells), change.status_changes()
    if not n:
        return "no cell holds results of both"
    text = f"{len(changed)} of {_count(n, 'cell')} changed status" if changed else \
        f"numerics unchanged ({_count(n, 'cell')} of the same status)"
    grown = [(new.error.max_abs / old.error.max_abs, cid, old.error.max_abs, new.error.max_abs)
             for cid, old, new in change.cells if old.error and new.error
             and finite_number(old.error.max_abs) and finite_number(new.error.max_abs)
             and 0 < old.error.max_abs < new.error.max_abs]
    if grown:
        _, cid, before, after = max(grown)
        text += f"; the max abs error grew most at {esc(cid)}: {fmt(before)} → {fmt(after)}"
    return text


def _title(change: ToolchainChange, esc: Callable = _plain) -> str:
    return f"{esc(change.sm)} ({esc(change.gpu)}), {toolchain_words(change.old, change.new, esc)}"


def _under_both(change: ToolchainChange) -> str:
    return f"{_count(len(change.cells), 'cell')} and {_count(len(change.benchmarks), 'benchmark')} under both"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _other_checks(change: ToolchainChange) -> str:
    n = change.other_checks
    return (f"{n} of these record pair{'s were' if n > 1 else ' was'} also made by other checks, plan fields or "
            "implementations: what differs there need not be the toolchain's") if n else ""


def toolchain_section(res: Merged) -> str:
    """The page's section, "" where no GPU's results hold two toolchains (the page is then as it always was)."""
    changes = toolchain_changes(res)
    if not changes:
        return ""
    lines = ["## Toolchain changes", "",
             "Where a GPU's results hold two toolchains (torch, Triton, vLLM), what the latest two say, per cell and "
             f"per benchmark ({code('python -m harness diff ' + res.plan_display())} lists each):", ""]
    for change in changes:
        lines.append(f"- **{_title(change, md)}** ({_under_both(change)}):")
        lines.append(f"  - {numerics_words(change, md)}")
        shown = change.status_changes()
        lines += [f"  - {status_change(cid, old, new, md, 160)}" for cid, old, new in shown[:LISTED]]
        if len(shown) > LISTED:
            lines.append(f"  - and {len(shown) - LISTED} more")
        for (phase, dtype, graph_mode), n, old, new in change.kernel_times():
            lines.append(f"  - {md(dtype)} {md(phase)}, {md(graph_mode)}: the kernel {time_change(old, new)}, the "
                         f"median over {_count(n, 'shape')}")
        if change.other_checks:
            lines.append(f"  - {_other_checks(change)}")
    return "\n".join(lines)


def diff_text(res: Merged, sm: str | None = None) -> str:
    """`python -m harness diff`'s lines: per SM, GPU and toolchain change, a header, a line per cell whose status
    changed, the numerics in one line, and a table of each benchmark's median times, old → new."""
    changes = toolchain_changes(res, sm)
    where = f" on {sm}" if sm else ""
    if not changes:
        return f"{res.plan.op.name}{where}: the stored results hold one toolchain per GPU: nothing to compare"
    out = []
    for change in changes:
        out.append(f"{res.plan.op.name}: {_title(change)} ({_under_both(change)})")
        out += [f"  {status_change(cid, old, new)}" for cid, old, new in change.status_changes()]
        out.append(f"  {numerics_words(change)}")
        if change.other_checks:
            out.append(f"  {_other_checks(change)}")
        if change.benchmarks:
            names = sorted({n for _, o, nw in change.benchmarks for n, *_ in change.times(o, nw)},
                           key=impl_order)
            rows = []
            for bid, old, new in change.benchmarks:
                times = {n: time_change(a, b) for n, a, b in change.times(old, new)}
                rows.append([bid, *(times.get(n, "—") for n in names)])
            table = tabulate(rows, headers=["benchmark", *names], tablefmt="simple", disable_numparse=True)
            out += [f"  {line}" for line in table.splitlines()]
        out.append("")
    return "\n".join(out).rstrip()
