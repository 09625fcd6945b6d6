"""The cross-op page's table "vLLM's defaults, as measured here": per op whose plan times vLLM's own kernel (its
`vllm` baseline), per SM and vLLM profile, what vLLM does with its kernel by default on that platform
(harness.vllm_facts.defaults, with the file and symbol it comes from) beside what the benchmarks decide for it
(harness.decisions.recommendations.vllm_kernel_recommendations), and where the two disagree. Seed 002's question:
should vLLM's own custom op be on by default, per platform and profile.

Also the per-regime summary of a row of decisions that the page's main table shares (`regime_summary`)."""

from __future__ import annotations

from harness.decisions.recommendations import ENABLE, VLLM_PROFILES, Recommendation, against_default
from harness.decisions.speedups import REGIMES
from harness.rendering.markdown import NO_RESULT, code, md, table
from harness.results.merge import Merged
from harness.vllm_facts.defaults import default_value, switch_setting, vllm_default
from harness.plan.implementations import VLLM
from harness.plan.model import Plan

ON, OFF = "on", "off"  # vLLM's kernel turned on or off, the words of this table


def regime_summary(recs: list[Recommendation], reg: str, words=None) -> str:
    """The decisions of one row (op, SM, profile) for one regime, dtypes with the same choice together: the choice
    (through `words`, e.g. on/off), the kernel's speedup over the profile's baseline per dtype, then vLLM's kernel and
    the named baselines against the kernel. "**leave it to Inductor**: bf16 1.13× (0.89–1.62) vs compiled · vllm
    1.15× (0.96–1.41)"."""
    mine = [r for r in recs if r.regime == reg]
    groups: dict[str, list[Recommendation]] = {}
    for r in mine:
        groups.setdefault((words(r) if words else r.choice) if r.choice else "", []).append(r)
    parts = []
    for choice, group in groups.items():
        if not choice:
            parts += [f"{md(r.dtype)}: none ({md(r.why)})" for r in group]
            continue
        label = (lambda r: f"{md(r.dtype)} ") if len(group) > 1 else (lambda r: "")  # the dtype, said once
        speedups = ", ".join(f"{md(r.dtype)} {r.speedup.text()}" for r in group if r.speedup)
        text = f"**{choice}**" + (f": {speedups} vs {group[0].baseline}" if speedups else "")
        names = dict.fromkeys(name for r in group for name, iv, _ in r.others if iv)
        for name in names:
            shown = ", ".join(f"{label(r)}{iv.text()}" for r in group for n, iv, _ in r.others if n == name and iv)
            text += f" · {md(name)} {shown}"
        parts.append(text)
    return "; ".join(parts) or NO_RESULT


def _on_off(r: Recommendation) -> str:
    return ON if r.choice == ENABLE else OFF


def has_switch(plan: Plan) -> bool:
    """Whether the plan times vLLM's own kernel for the op, and names the switch that turns it on."""
    kernel = plan.vllm_kernel
    return VLLM in plan.baselines and kernel is not None and kernel.switch is not None


def defaults_rows(res: Merged, recs: list[Recommendation]) -> list[list[str]]:
    """One row per SM with results × profile of a plan timing vLLM's own kernel; `recs`: the decisions for that
    kernel."""
    plan = res.plan
    kernel = plan.vllm_kernel
    rows = []
    for sm in res.sources:
        for profile, _ in VLLM_PROFILES:
            default = vllm_default(kernel.switch, sm, profile)
            mine = [r for r in recs if r.sm == sm and r.profile == profile]
            if default is None:
                shown_default, source = "not in harness.vllm.defaults", NO_RESULT
            else:
                shown_default = f"**{ON if default.on else OFF}** ({md(default_value(kernel.switch, default))})"
                source = code(default.source)
            if not mine and sm == "cpu":  # harness.runtime.bench times no kernel on a CPU machine
                measured = "not measured: a CPU machine's timings are not a measure of speed"
            elif not mine:
                measured = f"no benchmarks from this SM yet: {code(f'pytest --plan {res.plan_display()} --bench')}"
            else:
                measured = " · ".join(f"{reg}: {regime_summary(mine, reg, _on_off)}" for reg in REGIMES
                                      if any(r.regime == reg for r in mine))
            rows.append([code(kernel.call), sm, profile, shown_default, source, measured,
                         _agreement(default, [r for r in mine if r.choice])])
    return rows


def switch_rows(res: Merged) -> list[list[str]]:
    """The kernel's switch, stated once per plan: what vLLM runs it for, the settings that turn it on and off,
    and what else turns it on."""
    plan = res.plan
    kernel = plan.vllm_kernel
    switch = kernel.switch
    on, off = (code(switch_setting(switch, state, inductor=True)) for state in (True, False))
    without_inductor = switch_setting(switch, True, inductor=False)
    if not without_inductor.startswith("--"):  # a fusion pass: nothing turns it on without Inductor
        on += f" with Inductor; without it {md(without_inductor)}"
    return [[code(kernel.call), md(switch.runs_for), on, off, md(switch.note or NO_RESULT),
             f"[{md(plan.op.name)}/PLAN.md]({plan.op.name}/PLAN.md)"]]


def _agreement(default, decided: list[Recommendation]) -> str:
    """agrees / **disagrees** (where) / not decided yet."""
    if default is None or not decided:
        return "not decided yet"
    against = against_default(default.on, decided)
    if not against:
        return "agrees"
    where = ", ".join(f"{r.regime} {md(r.dtype)}" for r in against)
    return f"**disagrees**: measured {_on_off(against[0])} for {where}"


def defaults_section(rows: list[list[str]], switches: list[list[str]]) -> list[str]:
    """The section's lines ([] without rows)."""
    if not rows:
        return []
    return ["", "## vLLM's defaults, as measured here", "",
            "Per op whose plan times vLLM's own kernel (its `vllm` baseline), SM and vLLM profile: whether vLLM "
            "turns its kernel on by default on that platform (what the default amounts to, and the file and symbol of "
            "vLLM 0.32 it comes from: harness.vllm.defaults), beside the decision its benchmarks give (on: faster "
            "than the profile's baseline, Inductor's code or native eager, at every shape of the regime; rules: "
            "docs/report.md), and whether they agree.", "",
            *table(rows, ["vLLM's kernel", "SM", "vLLM profile", "vLLM's default", "from", "measured here",
                          "default vs measured"]).splitlines(),
            "", "How a deployment turns each kernel on or off (a `custom_ops` list without a base mode gets the "
                "profile's, `none` with Inductor and `all` without it):", "",
            *table(switches, ["vLLM's kernel", "runs for", "on", "off", "also on where", "page"]).splitlines()]
