"""vLLM's hazards on the page: what the cells that ran found of each (padding isolation, batch invariance,
determinism: harness.runtime.padding, batch_invariance, determinism), one line per check, each outcome with the
cells that reported it, from the records' facts."""

from __future__ import annotations

from collections import defaultdict

from harness.decisions.reasons import n_cells
from harness.rendering.markdown import code, md
from harness.rendering.plan_words import describe
from harness.results.merge import Merged
from harness.cells.status import RAN
from harness.plan.token_rows import rows_dependent, token_inputs

# The record facts each check writes, under its name, in the page's order.
HAZARDS = ("padding isolation", "batch invariance", "determinism")


def _setting(res: Merged, name: str) -> str:
    """The plan field that says what the check does with what it finds, where there is one."""
    numerics = res.plan.numerics
    if name == "batch invariance":
        return f" ({code(f'numerics.batch_invariance: {numerics.batch_invariance}')})"
    if name == "determinism":
        return f" ({code(f'numerics.determinism: {numerics.determinism}')})"
    return ""


def _not_checked(res: Merged, name: str) -> str:
    """Why the plan's cells never run the check, "" where they may."""
    plan = res.plan
    if name == "padding isolation" and not token_inputs(plan):
        return "no input has a num_tokens dimension"
    if name == "batch invariance":
        if plan.numerics.batch_invariance == "off":
            return "numerics.batch_invariance is off"
        return rows_dependent(plan)
    return ""


def hazard_lines(res: Merged) -> list[str]:
    """The page's lines on the hazards, [] where no cell has reported one yet."""
    found: dict[str, dict[str, list]] = {name: defaultdict(list) for name in HAZARDS}
    for c in res.cells:
        rec = res.records.get(c.id)
        if rec is None or res.status(c) not in RAN:
            continue
        for name in HAZARDS:
            said = (rec.facts or {}).get(name)
            if said:
                found[name][said].append(c)
    if not any(found.values()):
        return []
    lines = ["What vLLM would be bitten by and a value comparison cannot see (padding rows of a CUDA graph, the batch "
             "around a row, a second call):", ""]
    for name in HAZARDS:
        outcomes = found[name]
        head = f"- {name.capitalize()}{_setting(res, name)}: "
        if not outcomes:
            why = _not_checked(res, name)
            lines.append(head + (f"not checked: {md(why)}" if why else "no cell has checked it yet"))
            continue
        parts = [f"{md(said)} ({n_cells(len(cells))}: {md(describe(res.plan, cells))})"
                 for said, cells in sorted(outcomes.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
        lines.append(head + "; ".join(parts))
    return lines
