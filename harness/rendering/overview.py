"""One page across ops: reports/README.md, the decision per op × SM × dtype × regime × vLLM profile.

Built from the same plans, merged results and decisions as each op's PLAN.md (harness.results.merge,
harness.decisions), so the two cannot disagree: every row is one of the decisions an op's page shows, with its
speedup interval, the vLLM setting that applies it, and the models the benchmarked sizes come from (the plan's
`benchmark.models`). The same plans and results give a byte-identical page: ops are sorted by name, and the page
carries no dates.
Plain Python, like the report: no torch, no pytest.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.decisions.reasons import by_reason, first_line
from harness.decisions.recommendations import recommendations
from harness.decisions.verdicts import sm_verdicts, verdict
from harness.rendering.markdown import NO_RESULT, code, md, table
from harness.rendering.performance import others_text, setting_text, speedup_text
from harness.results.merge import collect
from harness.spec.plan import Plan
from harness.spec.status import Status
from harness.spec.vllm_schemas import VLLM_KERNELS

PAGE = "README.md"


def _models(plan: Plan, sizes: tuple) -> str:
    """The models a decision's benchmarked sizes come from; sizes the plan names no model for, as they are."""
    names = []
    for pairs in sizes:
        values = dict(pairs)
        shown = ", ".join(f"{k}={v}" for k, v in pairs)
        model = plan.benchmark.model(values)
        names.append(f"{model} ({shown})" if model else shown)
    return "; ".join(dict.fromkeys(names)) or NO_RESULT


def render_overview(plans: list[Plan], reports_dir: Path) -> tuple[str, list[str]]:
    """The page's text, and the results problems of every op (each named with its op)."""
    reports_dir = Path(reports_dir)
    plans = sorted(plans, key=lambda p: (p.name, str(p.path)))
    verdict_rows, decision_rows, problems, undecided = [], [], [], []
    shown_plans, vllm_rows = [], []
    for plan in plans:
        res = collect(plan, reports_dir / plan.name)
        if plan.vllm_kernel:  # vLLM's own kernel: what it accepts, no decision to make
            shown_plans.append(res.plan_display())
            problems += [f"{plan.name}: {p}" for p in res.shown_problems()]
            vllm_rows += _accepts_rows(plan, res)
            continue
        recs = recommendations(res)
        per_sm = sm_verdicts(res, recs)
        shown_plans.append(res.plan_display())
        problems += [f"{plan.name}: {p}" for p in res.shown_problems()]
        link = f"[{md(plan.name)}/PLAN.md]({plan.name}/PLAN.md)"
        verdict_rows.append([code(plan.name), md(plan.intent), md(verdict(res, recs, per_sm).word),
                             code(res.plan_display()), link])
        rows = [r for r in recs if r.choice]
        if not rows:
            undecided.append(plan.name)
        for r in rows:
            decision_rows.append([code(plan.name), r.sm, md(r.gpu or NO_RESULT), md(r.dtype), r.regime, r.profile,
                                  f"**{r.choice}**", speedup_text(r), others_text(r), setting_text(r),
                                  md(_models(plan, r.sizes))])
    command = "python -m harness overview " + " ".join(shown_plans)
    lines = ["# Custom ops in vLLM: decisions across ops, platforms and profiles", "",
             f"Generated from the plans and the results beside each op's page by {code(command)}; do not edit by "
             "hand. Each op's page, `<op>/PLAN.md`, holds the evidence behind every row; how to read both: "
             "docs/report.md.", ""]
    if problems:
        lines += ["> **Results problems:**", *(f"> - {md(p)}" for p in problems), ""]
    lines += ["## Verdicts", "", "Per SM, by the rules in docs/report.md (blocked, no results, numerics only on a CPU "
              "machine, incomplete, then go or no-go per regime).", "",
              table(verdict_rows, ["op", "intent", "verdict per SM", "plan", "page"]), ""]
    lines += ["## Decisions", "",
              "One row per op, SM, dtype, regime and vLLM profile that has benchmarks. Inductor on: the kernel against "
              "the reference compiled by Inductor (vLLM's default, custom ops off); Inductor off: against the eager "
              "reference (the startup-time profile, where vLLM runs its own kernels). In both, against vLLM's kernel "
              "and every named baseline. Speedup: the median over the regime's shapes, with the lowest and highest "
              "bound of their intervals; the setting applies the recommendation.", ""]
    if decision_rows:
        lines.append(table(decision_rows, ["op", "SM", "GPU", "dtype", "regime", "vLLM profile", "recommendation",
                                           "kernel speedup", "vs vLLM's kernel and named baselines", "vLLM setting",
                                           "models (sizes)"]))
    else:
        lines.append("No decisions yet: benchmark on a GPU machine (`pytest --plan PLAN --bench`).")
    if undecided and decision_rows:
        lines += ["", f"Without benchmark decisions yet: {', '.join(code(n) for n in undecided)}."]
    if vllm_rows:
        lines += ["", "## vLLM's kernels: what they accept", "",
                  "Plans whose kernel is vLLM's own (`op.kernel: vllm:<name>`): the contract a replacement must match "
                  "or beat. They carry no decision; each page's \"What vLLM's kernel accepts\" has the inputs that "
                  "passed and every failure with its minimal input.", "",
                  table(vllm_rows, ["plan", "vLLM's kernel", "SM", "cells passed", "failed", "not run",
                                    "most common failure", "page"])]
    return "\n".join(lines) + "\n", problems


def _accepts_rows(plan: Plan, res) -> list[list[str]]:
    """One row per SM with results (one row saying so where none has any) for a plan testing vLLM's own kernel."""
    kernel, link = VLLM_KERNELS[plan.vllm_kernel], f"[{md(plan.name)}/PLAN.md]({plan.name}/PLAN.md)"
    rows = []
    for sm in res.covered:
        cells = [c for c in res.cells if c.sm == sm]
        count = {s: sum(1 for c in cells if res.status(c) in s) for s in
                 ((Status.PASSED, Status.XPASS), (Status.FAILED, Status.XFAIL), (Status.NOT_RUN,))}
        failed = [c for c in cells if res.status(c) in (Status.FAILED, Status.XFAIL)]
        reasons = by_reason(res, failed)
        worst = f"{md(first_line(reasons[0][0], 160))} ({len(reasons[0][1])})" if reasons else NO_RESULT
        rows.append([code(plan.name), code(kernel.call), sm, *(str(n) for n in count.values()), worst, link])
    return rows or [[code(plan.name), code(kernel.call), NO_RESULT, "no results yet", NO_RESULT, NO_RESULT,
                     NO_RESULT, link]]


def write_overview(plans: list[Plan], reports_dir: Path) -> tuple[Path, list[str]]:
    """Regenerate reports/README.md; returns its path and the results problems met."""
    reports_dir = Path(reports_dir)
    reports_dir.mkdir(parents=True, exist_ok=True)
    text, problems = render_overview(plans, reports_dir)
    path = reports_dir / PAGE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path, problems
