"""The living plan: reports/<op>/PLAN.md regenerated from the plan and the merged results."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from .plan import Plan
from .results import merge_dir, write_atomic  # noqa: F401


def write_report(plan: Plan, op_dir: Path) -> tuple[Path, list[str]]:
    results, problems = merge_dir(op_dir / "results", plan.name)
    rows = [[cid, rec["status"], rec.get("reason", "")] for cid, rec in sorted(results["cells"].items())]
    text = f"# {plan.name}\n\n" + tabulate(rows, headers=["cell", "status", "reason"], tablefmt="github") + "\n"
    path = op_dir / "PLAN.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path, problems
