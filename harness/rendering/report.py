"""The living plan: reports/<op>/PLAN.md regenerated from the plan and the merged results.

Sections follow a design document (problem, constraints, design, interfaces, critical path,
performance, trade-offs, decisions) filled with the plan's answers and what the runs found.
Same plan and results in, byte-identical report out: everything is sorted, and dates appear only
in the provenance line. Every piece of text that comes from a user or an exception is escaped
for the place it lands in (harness.rendering.markdown). The decision per SM × dtype × regime × vLLM
profile (Inductor on / off) and the per-SM verdict rules (harness.decisions) are documented in docs/report.md.
Plain Python: it reads records and the plan, never torch or pytest.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.decisions.open_items import open_items
from harness.decisions.recommendations import recommendations
from harness.decisions.tradeoffs import tradeoffs
from harness.decisions.verdicts import sm_verdicts, verdict
from harness.rendering.conclusions import decisions, open_items_section, tradeoffs_section
from harness.rendering.context import constraints, header, problem_breakdown
from harness.rendering.design import critical_path, design, interfaces
from harness.rendering.performance import performance
from harness.rendering.support import accepted_inputs, support_matrix
from harness.rendering.toolchains import toolchain_section
from harness.rendering.vllm_runs import engine_section, fusion_section
from harness.results.merge import collect
from harness.plan.model import Plan


def render(plan: Plan, op_dir: Path) -> tuple[str, list[str]]:
    """The page's text, and the results files that could not be merged."""
    res = collect(plan, op_dir)
    recs = recommendations(res)
    per_sm = sm_verdicts(res, recs)
    v = verdict(res, recs, per_sm)
    # What the kernel accepts, where the cells recorded it, then what each provider accepts (its cells' findings)
    accepted = [a for a in (accepted_inputs(res), *(accepted_inputs(res, p) for p in plan.providers)) if a]
    sections = [
        header(res, v, per_sm),
        problem_breakdown(plan),
        constraints(res),
        design(plan, res.integration),
        interfaces(plan, res.integration),
        critical_path(plan),
        support_matrix(res),
        *accepted,
        *[s for s in (fusion_section(res), engine_section(res)) if s],  # vLLM's fusion pass, a running engine
        performance(res, op_dir, recs),
        *[s for s in (toolchain_section(res),) if s],  # only where a GPU's results hold two toolchains
        tradeoffs_section(res.plan, tradeoffs(res)),
        open_items_section(res.plan, open_items(res, recs)),
        decisions(res, v, recs, per_sm),
    ]
    return "\n\n".join(s.rstrip() for s in sections) + "\n", res.problems


def write_report(plan: Plan, op_dir: Path) -> tuple[Path, list[str]]:
    """Regenerate reports/<op>/PLAN.md; returns its path and the results files that could not be merged."""
    op_dir = Path(op_dir)
    op_dir.mkdir(parents=True, exist_ok=True)
    text, problems = render(plan, op_dir)
    path = op_dir / "PLAN.md"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path, problems
