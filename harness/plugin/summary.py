"""The run's cells in the terminal summary: statuses per graph mode and TP size, and why the others did not run."""

from __future__ import annotations

import re
from collections import Counter

from tabulate import tabulate

from harness.cells.matrix import Cell
from harness.plan.model import Plan

SAMPLED_OUT = "sampled_out"  # a cell's status in the summary only: sampled-out cells are not recorded


SUMMARY_STATUSES = {"passed": "passed", "failed": "failed", "xfail": "expected failure", "xpass": "unexpected pass",
                    SAMPLED_OUT: "sampled out", "not_run": "not run here", "excluded": "excluded"}
RAN = ("passed", "failed", "xfail", "xpass")  # the statuses of cells that ran
OTHER_SM = re.compile(r"needs (\w+); (this machine is .*)")


def cells_summary(plan: Plan, cells: list[tuple[Cell, str, str]]) -> list[str]:
    """The run's cells (cell, status, reason) as lines: a table of statuses per graph mode and TP size, how many
    were sampled out, and why the others did not run here, grouped (cells needing another SM in one group)."""
    statuses = [st for st in SUMMARY_STATUSES if any(status == st for _, status, _ in cells)]
    counts = Counter((c.graph_mode, c.tp, status) for c, status, _ in cells)
    rows = [[mode, f"tp{tp}", *(counts[mode, tp, st] or "" for st in statuses)]
            for mode in plan.matrix["graph_mode"] for tp in plan.matrix["tp"]
            if any(counts[mode, tp, st] for st in statuses)]
    lines = tabulate(rows, headers=["graph mode", "tp", *(SUMMARY_STATUSES[st] for st in statuses)],
                     disable_numparse=True).splitlines()
    sampled = sum(1 for _, status, _ in cells if status == SAMPLED_OUT)
    if sampled:
        ran = sum(1 for _, status, _ in cells if status in RAN)
        lines.append(f"pairwise sample: {ran} of {ran + sampled} runnable cells ran, every pair of axis values in one "
                     f"at least; --cells all runs all {ran + sampled}")
    groups: dict[tuple[str, str, bool], list[Cell]] = {}
    for c, status, reason in cells:
        if status in ("not_run", "excluded"):
            other = OTHER_SM.fullmatch(reason)  # "needs sm90; this machine is cpu": one group for every other SM
            groups.setdefault((status, other.group(2) if other else reason, bool(other)), []).append(c)
    shown = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for (status, reason, other_sm), group in shown[:6]:
        if other_sm:
            sms = [sm for sm in plan.matrix["sm"] if any(c.sm == sm for c in group)]
            reason = f"needs {' or '.join([', '.join(sms[:-1]), sms[-1]] if len(sms) > 1 else sms)}; {reason}"
        lines.append(f"{len(group)} {SUMMARY_STATUSES[status]}: {reason}")
    if len(shown) > 6:
        lines.append(f"… and {sum(len(g) for _, g in shown[6:])} more cells for {len(shown) - 6} other reasons "
                     "(the living plan lists them)")
    return lines


def provider_summary(plan: Plan, provider: str, tried: list[tuple[Cell, str, str]],
                     cells: list[tuple[Cell, str, str]]) -> str:
    """One line for a provider none of whose cells ran here, saying why, where its table would count only cells
    that did not run; "" where some ran (or it has no cell in the run). `tried`: its cells that were to run and
    found they cannot (vLLM's kernel not installed); `cells`: all of its cells in the run."""
    if not cells or any(status in RAN for _, status, _ in cells):
        return ""
    line = f"{plan.op.name}: {provider} through the same cells: none ran here"
    if tried:
        why = Counter(reason for _, _, reason in tried)
        line += ": " + "; ".join(reason if len(why) == 1 else f"{n}: {reason}" for reason, n in why.most_common())
    tried_cells = {c for c, _, _ in tried}
    rest = Counter(status for c, status, _ in cells if c not in tried_cells and status in SUMMARY_STATUSES)
    counts = ", ".join(f"{n} {SUMMARY_STATUSES[st]}" for st, n in sorted(rest.items(), key=lambda kv: -kv[1]))
    if tried:
        tried_words = f"{len(tried)} cell{'s' if len(tried) > 1 else ''} tried"
        return f"{line} ({tried_words}; the other {len(cells) - len(tried)}: {counts})" if counts else \
            f"{line} ({tried_words})"
    return f"{line}: of its {len(cells)} cells, {counts}"
