"""Text for the pages, escaped for the place it lands in: a table cell or a line of prose (`md`), inline code
(`code`), a Mermaid label (`mm`); GitHub tables (`table`); numbers (`fmt`, `fmt_us`); and the marks of the
statuses. Every piece of text from a user or an exception goes through one of these (a Python literal in generated
source through harness.vllm.op_source's)."""

from __future__ import annotations

import re

from tabulate import tabulate

from harness.results.store import finite_number
from harness.cells.status import Status

MARKS = {Status.PASSED: "✅", Status.FAILED: "❌", Status.NOT_RUN: "⏭", Status.EXCLUDED: "🚫", Status.XFAIL: "⚠️",
         Status.XPASS: "❗"}
NO_RESULT = "—"
LEGEND = ("✅ passed · ❌ failed · ⏭ not run here · 🚫 excluded by the plan · ⚠️ expected failure (plan) · "
          "❗ unexpected pass · — no result recorded yet")


def md(value) -> str:
    """Text for a table cell or a line of prose: one line, no HTML, no Markdown syntax, no table breaks."""
    text = " ".join(str(value).split())
    text = text.replace("\\", "\\\\").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"([`*\[\]|#~])", r"\\\1", text)
    return re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", text)


def code(value) -> str:
    """Inline code (one line); a fence longer than any backtick run inside; pipes escaped for tables."""
    text = " ".join(str(value).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def mm(value) -> str:
    """Text for a Mermaid label or message: anything but plain characters becomes an entity code."""
    text = " ".join(str(value).split())
    return "".join(c if re.match(r"[A-Za-z0-9 _.,:/()=+\-*']", c) else f"#{ord(c)};" for c in text)


def table(rows, headers) -> str:
    """A GitHub table; cells as given (already escaped), numbers never reformatted."""
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def fmt(v, digits: int = 3) -> str:
    if not finite_number(v):
        return NO_RESULT if v is None else md(v)
    return f"{v:.{digits}g}"


def fmt_us(v) -> str:
    if not finite_number(v):
        return NO_RESULT
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"
