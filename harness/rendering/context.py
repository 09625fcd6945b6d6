"""The page's opening sections: the header (verdict per SM, provenance, results problems), the problem breakdown,
and the constraints and assumptions (the plan's answers, the machines that ran it, what the runs detected)."""

from __future__ import annotations

import json
from collections import Counter

from harness.decisions.reasons import n_cells
from harness.decisions.verdicts import SmVerdict, Verdict, grouped_verdicts
from harness.rendering.hazards import HAZARDS, hazard_lines
from harness.rendering.markdown import code, fmt, md, table
from harness.rendering.plan_words import INTENTS, capture_sizes, contract_text, implementation_title, \
    quantization_text, provider_words, rule_text, tp_answer, vllm_answer
from harness.results.merge import Merged
from harness.cells.matrix import contract_line
from harness.plan.model import Plan
from harness.cells.status import RAN
from harness.plan.tolerances import tolerance_source


def header(res: Merged, v: Verdict, per_sm: list[SmVerdict]) -> str:
    plan = res.plan
    lines = [f"# Integration plan: {md(plan.op.name)}", ""]
    lines.append(f"- **Op:** {code(plan.op.name)}, kernel {code(plan.op.kernel)}")
    lines.append(f"- **Intent:** {md(INTENTS[plan.op.intent])}")
    lines.append(f"- **Verdict:** {md(v.word)}")
    for where, sv in grouped_verdicts(per_sm):
        lines.append(f"  - {where}: **{md(sv.word)}** ({md(sv.rule)})")
    lines.append(f"- **Provenance:** {provenance_line(res)}")
    lines.append("")
    lines.append(f"Generated from {code(res.plan_display())} and the results files beside this page by every "
                 f"`pytest --plan` run and by {code('python -m harness report ' + res.plan_display())}; "
                 "do not edit by hand. How to read it: docs/report.md.")
    if res.problems:
        lines += ["", "> **Results problems:**"]
        lines += [f"> - {md(p)}" for p in res.shown_problems()]
    return "\n".join(lines)


def provenance_line(res: Merged) -> str:
    """The one place dates appear: which machine, GPU, commit and date each SM's results came from."""
    parts = []
    for sm in res.plan.matrix["sm"]:
        runs = res.sources.get(sm)
        if not runs:
            continue
        descr = []
        for run in runs:
            p = res.runs[run]
            descr.append(f"{md(p.host)} ({md(p.gpu)}), {md(p.commit_words())}, {md(p.date)}"
                         + (f", ran {md(p.cells)}" if p.cells else ""))
        parts.append(f"{sm}: " + "; ".join(dict.fromkeys(descr)))  # xdist workers of one run read alike
    missing = [sm for sm in res.plan.matrix["sm"] if sm not in res.sources]
    if missing:
        parts.append(f"{', '.join(missing)}: no results yet")
    return " · ".join(parts)


def problem_breakdown(plan: Plan) -> str:
    phases = ", ".join(plan.matrix["phase"])
    signature = f"{plan.op.kernel.split(':')[-1]}({', '.join(a.name for a in plan.args)})"
    writes = plan.written_args
    returns = plan.returned_outputs
    effect = []
    if writes:
        effect.append("writes " + ", ".join(code(w) for w in writes))
    if returns:
        effect.append("returns " + ", ".join(code(r) for r in returns))
    lines = ["## Problem breakdown", ""]
    if plan.op.description:
        lines += [md(plan.op.description), ""]
    lines.append(f"- **Kernel:** {code(signature)} from {code(plan.op.kernel)}; {'; '.join(effect) or 'no outputs'}.")
    lines.append(f"- **Reference:** {code(plan.op.reference)} (PyTorch eager; the numerics every cell is checked "
                 "against).")
    if plan.op.replaces:
        lines.append(f"- **Replaces:** {code(plan.op.replaces)} ({md(INTENTS[plan.op.intent])}).")
    else:
        lines.append(f"- **Replaces:** nothing in vLLM ({md(INTENTS[plan.op.intent])}).")
    lines.append(f"- **Target phases:** {md(phases)}.")
    for provider in plan.providers:  # what else runs through the cells (harness.rendering.support: what it accepts)
        lines.append(f"- **Through the same cells:** {provider_words(plan, provider)}: its page section says what it "
                     "accepts, which the kernel is read against.")
    return "\n".join(lines)


def constraints(res: Merged) -> str:
    plan = res.plan
    sizes = "; ".join(f"{md(k)} ∈ {{{', '.join(map(str, v))}}}" for k, v in plan.sizes.items()) or "none"
    n = plan.numerics
    cs = capture_sizes(plan)
    tol = ", ".join(f"{dt} atol {t.atol:g} rtol {t.rtol:g}" for dt, t in plan.tolerance.items())
    rules = [f"excluded: {md(rule_text(r))}: {md(r.why)}" for r in plan.exclude]
    rules += [f"expected to fail: {md(rule_text(r))}: {md(r.why)}" for r in plan.expect]
    quant = quantization_text(plan.quantization)
    answers = [
        ["Phases", md(", ".join(plan.matrix["phase"]))],
        ["Dtypes and accumulation",
         md(", ".join(plan.matrix["dtype"])) + f"; accumulation in {md(plan.op.accumulation)}"],
        ["Quantization", md(quant)],
        ["Tensor parallelism", tp_answer(plan)],
        ["Graph modes", md(", ".join(plan.matrix["graph_mode"])) + f"; CUDA graph capture sizes "
         f"{'from the plan' if plan.cuda_graph and plan.cuda_graph.capture_sizes else 'as vLLM'}: "
         f"{cs[0]} … {cs[-1]} ({len(cs)} sizes)"],
        ["vLLM target and route", vllm_answer(plan, res.integration)],
        ["Hardware (SMs)", md(", ".join(plan.matrix["sm"]))],
        ["Reference", code(plan.op.reference)],
        ["Shapes", f"{sizes}; decode 1 … {n.max_num_seqs} tokens; prefill {n.prefill_tokens[0]} … "
                   f"{n.prefill_tokens[1]}; chunked prefill up to {n.max_num_batched_tokens}"],
        *([["Models the sizes come from", md("; ".join(f"{k}: {m}" for k, m in plan.benchmark.models))]]
          if plan.benchmark.models else []),
        # what is drawn, timed and dispatched to the kernel (and timed for each named baseline)
        *([["Kernel contract", contract_text(plan.contract, contract_line(plan, ""))]]
          if not plan.contract.empty else []),
        *[[f"Contract of {implementation_title(name, e)}", contract_text(e.contract, contract_line(plan, name))]
          for name, e in plan.implementations.items() if e.contract is not None and not e.contract.empty],
        ["Tolerances", (md(tol) + " (plan); " if tol else "") + "other dtypes: vLLM's defaults"],
        ["Exclusions and expected failures", "; ".join(rules) or "none"],
    ]
    lines = ["## Constraints and assumptions", "", "The plan's answers to the integration questions:", "",
             table(answers, ["question", "answer"]), "", "What the runs detected:", ""]
    lines.append(machines_table(res))
    lines += ["", detected_facts(res)]
    return "\n".join(lines)


def machines_table(res: Merged) -> str:
    runs = [run for sm in res.sources for run in res.sources[sm]]
    if not runs:
        return "No results yet: run `pytest --plan " + res.plan_display() + "` on each target machine."
    rows = []
    for run in runs:
        p = res.runs[run]
        rows.append([md(p.sm), md(p.host), md(p.gpu), fmt(p.device_count), fmt(p.cpu_count), md(p.torch or "—"),
                     md(p.triton or "—"), md(p.cuda or "—"), md(p.vllm or "not installed"), md(p.python or "—"),
                     "yes" if p.triton_interpreter else "no", md(p.commit_words(prefix="", unknown="—"))])
    return table(rows, ["SM", "machine", "GPU / CPU", "GPUs", "CPUs", "torch", "triton", "CUDA", "vLLM", "python",
                        "Triton interpreter", "commit"])


def detected_facts(res: Merged) -> str:
    """Tolerances used, CPU token caps and graph-mode facts, aggregated over the cells that ran."""
    plan = res.plan
    ran = [c for c in res.cells if res.status(c) in RAN]
    tols, caps, facts = Counter(), Counter(), Counter()
    for c in ran:
        rec = res.records[c.id]
        if rec.tolerance is not None:
            tols[(plan.matrix["dtype"].index(c.dtype), fmt(rec.tolerance.atol), fmt(rec.tolerance.rtol))] += 1
        f = rec.facts
        if f.get("token_cap") is not None:
            caps[(plan.matrix["sm"].index(c.sm), json.dumps(f["token_cap"]))] += 1
        for key, value in f.items():
            if key != "token_cap" and key not in HAZARDS:  # the hazards have lines of their own
                shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
                facts[(plan.matrix["graph_mode"].index(c.graph_mode), key, shown)] += 1
    if not ran:
        return "No cell has run yet."
    lines = []
    rows = [[plan.matrix["dtype"][d], atol, rtol, tolerance_source(plan, plan.matrix["dtype"][d]), str(n)]
            for (d, atol, rtol), n in sorted(tols.items())]
    lines += ["Tolerances used:", "", table(rows, ["dtype", "atol", "rtol", "source", "cells"]), ""]
    if caps:
        per = "; ".join(f"{plan.matrix['sm'][s]}: at most {md(cap)} tokens per call ({n_cells(n)})"
                        for (s, cap), n in sorted(caps.items()))
        lines += [f"Token caps (Triton interpreter, {plan.numerics.cpu_element_budget} elements per activation): "
                  f"{per}.", ""]
    if facts:
        rows = [[plan.matrix["graph_mode"][g], md(key), md(value), str(n)]
                for (g, key, value), n in sorted(facts.items())]
        lines += ["Facts the cells reported (graph-mode runners, the examples past each `op.paths` path, "
                  "int32-overflow examples):", "", table(rows, ["graph mode", "fact", "value", "cells"]), ""]
    hazards = hazard_lines(res)
    lines += [*hazards, ""] if hazards else []
    return "\n".join(lines).rstrip()
