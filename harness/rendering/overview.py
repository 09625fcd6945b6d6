"""One page across ops: reports/README.md, the decisions per op × SM × vLLM profile, read at a glance.

Built from the same plans, merged results and decisions as each op's PLAN.md (harness.results.merge,
harness.decisions), so the two cannot disagree: every row holds the decisions an op's page shows for one SM and
profile, per regime and dtype with the speedup interval, and the vLLM setting that applies them; the models the
benchmarked sizes come from (the plan's `benchmark.models`) are stated once per op, and vLLM's own kernel for an op
(its `vllm` baseline, its `vllm` provider) gets its default decided and what it accepts summed up
(harness.rendering.defaults). The same plans and results give a byte-identical
page: ops are sorted by name, and the page carries no dates.
Plain Python, like the report: no torch, no pytest.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.decisions.reasons import by_reason, first_line
from harness.decisions.recommendations import VLLM_PROFILES, Recommendation, choice_words, recommendations, \
    vllm_kernel_recommendations
from harness.decisions.speedups import REGIMES
from harness.decisions.verdicts import sm_verdicts, verdict
from harness.rendering.defaults import defaults_rows, defaults_section, has_switch, regime_summary, switch_rows
from harness.rendering.markdown import NO_RESULT, code, md, table
from harness.rendering.performance import setting_text
from harness.rendering.plan_words import implementation_title
from harness.results.merge import collect
from harness.plan.implementations import VLLM
from harness.plan.model import Plan
from harness.cells.status import Status

PAGE = "README.md"


def _models(plan: Plan, sizes) -> str:
    """The models a plan's benchmarked sizes come from; sizes the plan names no model for, as they are."""
    names = []
    for pairs in sizes:
        values = dict(pairs)
        shown = ", ".join(f"{k}={v}" for k, v in pairs)
        model = plan.benchmark.model(values)
        names.append(f"{model} ({shown})" if model else shown)
    return "; ".join(dict.fromkeys(names)) or NO_RESULT


def _settings_text(plan: Plan, recs: list[Recommendation]) -> str:
    """The settings of a row's decisions, each once; named by its choice where the row's decisions differ."""
    by_choice = {r.choice: r for r in recs if r.choice and r.setting}
    if not by_choice:
        return NO_RESULT
    if len(by_choice) == 1:
        return setting_text(next(iter(by_choice.values())))
    return "; ".join(f"{md(choice_words(plan, choice))}: {setting_text(r)}" for choice, r in by_choice.items())


def _in_place(plans: list[Plan]) -> str:
    """The ops whose decisions weigh the kernel against what vLLM runs in its place in both profiles (a plan's
    default implementation), each with it; "" where none does."""
    named = [f"{code(p.op.name)} against {implementation_title(d, p.implementation(d))}" for p in plans
             if (d := p.default_implementation)]
    return (f"; except where a plan names what vLLM runs in the kernel's place whatever the profile, the kernel "
            f"against that in both: {', '.join(named)}") if named else ""


def _decision_rows(plan: Plan, recs: list[Recommendation]) -> list[list[str]]:
    """One row per SM × vLLM profile with decisions, the regimes side by side."""
    def words(r: Recommendation) -> str:
        return md(choice_words(plan, r.choice))

    rows = []
    for sm in plan.matrix["sm"]:
        for profile, _ in VLLM_PROFILES:
            mine = [r for r in recs if r.sm == sm and r.profile == profile and r.choice]
            if not mine:
                continue
            gpus = ", ".join(sorted({g for r in mine for g in r.gpus})) or NO_RESULT
            rows.append([code(plan.op.name), sm, md(gpus), profile,
                         *(regime_summary(mine, reg, words) for reg in REGIMES), _settings_text(plan, mine)])
    return rows


def render_overview(plans: list[Plan], reports_dir: Path) -> tuple[str, list[str]]:
    """The page's text, and the results problems of every op (each named with its op)."""
    reports_dir = Path(reports_dir)
    plans = sorted(plans, key=lambda p: (p.op.name, str(p.path)))
    verdict_rows, decision_rows, model_rows, problems, undecided = [], [], [], [], []
    shown_plans, vllm_rows, default_rows, switches = [], [], [], []
    for plan in plans:
        res = collect(plan, reports_dir / plan.op.name)
        shown_plans.append(res.plan_display())
        problems += [f"{plan.op.name}: {p}" for p in res.shown_problems()]
        recs = recommendations(res)
        if VLLM in plan.providers:  # vLLM's own kernel through the op's cells: what it accepts
            vllm_rows += _accepts_rows(plan, res)
        if has_switch(plan):  # vLLM's own kernel timed as the op's vllm baseline: its measured default
            default_rows += defaults_rows(res, vllm_kernel_recommendations(res))
            switches += switch_rows(res)
        per_sm = sm_verdicts(res, recs)
        link = f"[{md(plan.op.name)}/PLAN.md]({plan.op.name}/PLAN.md)"
        verdict_rows.append([code(plan.op.name), md(plan.op.intent), md(verdict(res, recs, per_sm).word),
                             code(res.plan_display()), link])
        rows = _decision_rows(plan, recs)
        if not rows:
            undecided.append(plan.op.name)
        decision_rows += rows
        sizes = sorted({s for r in recs if r.choice for s in r.sizes}, key=str)
        if sizes:
            model_rows.append([code(plan.op.name), md(_models(plan, sizes))])
    command = "python -m harness overview " + " ".join(shown_plans)
    lines = ["# Custom ops in vLLM: decisions across ops, platforms and profiles", "",
             f"Generated from the plans and the results beside each op's page by {code(command)}; do not edit by "
             "hand. Each op's page, `<op>/PLAN.md`, holds the evidence behind every row; how to read both: "
             "docs/report.md.", ""]
    if problems:
        lines += ["> **Results problems:**", *(f"> - {md(p)}" for p in problems), ""]
    lines += ["## Verdicts", "", "Per SM and TP size, by the rules in docs/report.md (blocked, no results, numerics "
              "only on a CPU machine, not run here, incomplete, then go or no-go per regime).", "",
              table(verdict_rows, ["op", "intent", "verdict per SM", "plan", "page"]), ""]
    lines += ["## Decisions", "",
              "One row per op, SM and vLLM profile that has benchmarks; per regime, the decision per dtype. Inductor "
              "on: the kernel against the reference compiled by Inductor (vLLM's default, custom ops off); Inductor "
              "off: against the eager reference (the startup-time profile, where vLLM runs its own kernels)"
              f"{_in_place(plans)}. In both, against vLLM's kernel and every named baseline (after the kernel's own "
              "speedup). Speedup: the median over the regime's shapes, with the lowest and highest bound of their "
              "intervals; the setting applies the recommendation. The models each op's sizes come from are listed "
              "once per op below.", ""]
    if decision_rows:
        lines.append(table(decision_rows, ["op", "SM", "GPU", "vLLM profile", *REGIMES, "vLLM setting"]))
    else:
        lines.append("No decisions yet: benchmark on a GPU machine (`pytest --plan PLAN --bench`).")
    if undecided and decision_rows:
        lines += ["", f"Without benchmark decisions yet: {', '.join(code(n) for n in undecided)}."]
    if model_rows:
        lines += ["", "### The models the benchmarked sizes come from", "",
                  "The plan's `benchmark.models`, e.g. `{\"hidden=4096\": Llama-3-8B}`; sizes it names no model "
                  "for, as they are.", "", table(model_rows, ["op", "models (sizes)"])]
    lines += defaults_section(default_rows, switches)
    if vllm_rows:
        lines += ["", "## vLLM's kernels: what they accept", "",
                  "vLLM's own kernel for an op, run through the op's cells (`implementations.vllm`, role audited): "
                  "the contract a replacement must match or beat. Each op's page, \"What vLLM's kernel accepts\", has "
                  "the inputs that passed and every failure with its minimal input.", "",
                  table(vllm_rows, ["op", "vLLM's kernel", "SM", "cells passed", "failed", "not run",
                                    "most common failure", "page"])]
    return "\n".join(lines) + "\n", problems


def _accepts_rows(plan: Plan, res) -> list[list[str]]:
    """One row per SM with results (one row saying so where none has any) for vLLM's own kernel through the op's
    cells."""
    kernel, link = plan.vllm_kernel, f"[{md(plan.op.name)}/PLAN.md]({plan.op.name}/PLAN.md)"
    rows = []
    for sm in res.provider_sms(VLLM):
        cells = [c for c in res.provider_cells(VLLM) if c.sm == sm]
        count = {s: sum(1 for c in cells if res.status(c) in s) for s in
                 ((Status.PASSED, Status.XPASS), (Status.FAILED, Status.XFAIL), (Status.NOT_RUN,))}
        failed = [c for c in cells if res.status(c) in (Status.FAILED, Status.XFAIL)]
        reasons = by_reason(res, failed)
        worst = f"{md(first_line(reasons[0][0], 160))} ({len(reasons[0][1])})" if reasons else NO_RESULT
        rows.append([code(plan.op.name), code(kernel.call), sm, *(str(n) for n in count.values()), worst, link])
    return rows or [[code(plan.op.name), code(kernel.call), NO_RESULT, "no results yet", NO_RESULT, NO_RESULT,
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
