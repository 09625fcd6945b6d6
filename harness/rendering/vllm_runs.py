"""vLLM in the loop beyond the routes: vLLM's fusion pass per profile (plans of fused ops) and a running engine
(plans whose kernel replaces a vLLM layer), from the integration records of routes "fusion" and "engine"."""

from __future__ import annotations

from harness.rendering.markdown import MARKS, NO_RESULT, code, md, table
from harness.results.merge import Merged
from harness.results.store import IntegrationRecord
from harness.cells.status import Status
from harness.vllm_facts.fusion_cases import fusion_case, fusion_profiles
from harness.vllm_facts.names import enable_setting, unsupported

FUSION, ENGINE = "fusion", "engine"


def _records(res: Merged, route: str) -> list[tuple[str, IntegrationRecord]]:
    return [(k, r) for k, r in sorted(res.integration.items()) if r.route == route and r.sm in res.plan.matrix["sm"]]


def _mark(rec: IntegrationRecord) -> str:
    return MARKS.get(rec.status, NO_RESULT)


def _reasons_below(recs: list[IntegrationRecord]) -> tuple[dict[str, int], list[str]]:
    """Each distinct reason of the records not run here, numbered once, and the lines that list them."""
    numbers: dict[str, int] = {}
    for rec in recs:
        if rec.status == Status.NOT_RUN and rec.reason not in numbers:
            numbers[rec.reason] = len(numbers) + 1
    return numbers, [f"{n}. Not run here: {md(reason)}" for reason, n in numbers.items()]


def fusion_section(res: Merged) -> str:
    """Per profile and SM: did vLLM's pass match vLLM's layer sequence, and which kernel the fused node calls."""
    case = fusion_case(res.plan)
    if case is None:
        return ""
    lines = ["## vLLM's fusion pass", "",
             f"vLLM's {code(case.pass_class)} (pass config {code(case.pass_flag)}) rewrites {md(case.layers)} in the "
             f"compiled graph into one call of {code('torch.ops.' + case.fused_kernel)}, vLLM's own kernel for this "
             "op: the pass rewrites into the kernels of its own table only, so this plan's kernel would replace that "
             "call only as a layer of its own. "
             "Whether the pattern still matches depends on the profile: which custom ops are on, and the IR "
             "priority. Checked as vLLM's fusion tests check it: vLLM's layers compiled by Inductor with the pass, "
             "its matched count, the ops new in the graph after it, the output against the same layers compiled "
             "without it.", ""]
    recs = {(r.fusion.profile, r.sm): r for _, r in _records(res, FUSION) if r.fusion}
    if not recs:
        return "\n".join(lines + ["No fusion item has run on any machine yet.", ""])
    numbers, notes = _reasons_below(list(recs.values()))
    rows = []
    for profile in fusion_profiles(case):
        for sm in [sm for sm in res.plan.matrix["sm"] if (profile.id, sm) in recs]:
            rec = recs[profile.id, sm]
            if rec.status == Status.NOT_RUN:
                outcome = f"not run here ({numbers[rec.reason]})"
            elif rec.status == Status.FAILED:
                outcome = md(rec.reason)
            elif rec.fusion.matched:
                outcome = (f"matched {rec.fusion.matched}; the fused node calls "
                           f"{', '.join(code(k) for k in rec.fusion.fused_kernels) or 'no new op'}")
            else:
                kept = ", ".join(code(k) for k in rec.fusion.ops_after or []) or "torch ops only"
                outcome = f"no match: the graph keeps {kept}"
            ir = "; ".join(f"{op}: {', '.join(p)}" for op, p in profile.ir_priorities(case).items()) or "—"
            rows.append([md(profile.description), code(", ".join(profile.custom_ops)), md(ir), sm,
                         f"{_mark(rec)} {outcome}", md(rec.vllm or NO_RESULT)])
    lines += [table(rows, ["profile", "custom_ops", "IR priority", "SM", "pass", "vLLM"]), "", *notes, ""]
    return "\n".join(lines)


def engine_section(res: Merged) -> str:
    """Per SM: the plan's plugin in a running engine, its kernel's calls by step kind, the greedy tokens."""
    recs = [r for _, r in _records(res, ENGINE)]
    if not recs or unsupported(res.plan):
        return ""
    lines = ["## A running engine", "",
             "vLLM's engine serving concurrent requests of different lengths (prefill-only, mixed and decode-only "
             "steps) with the plan's plugin loaded through vLLM's plugin mechanism (a `vllm.general_plugins` entry "
             f"point, named in `VLLM_PLUGINS`) and selected with {code(enable_setting(res.plan))}; the kernel's calls "
             "inside the model's forward are counted by step kind, and the greedy tokens compared with the same "
             "engine without the plugin (vLLM's own method: equal up to the first difference, where each run's "
             "token must be among the other's top candidates).", ""]
    numbers, notes = _reasons_below(recs)
    rows = []
    for rec in recs:
        e = rec.engine
        if rec.status == Status.NOT_RUN:
            rows.append([rec.sm, f"{_mark(rec)} not run here ({numbers[rec.reason]})", NO_RESULT, NO_RESULT,
                         NO_RESULT, NO_RESULT, md(rec.vllm or NO_RESULT)])
            continue
        calls = " / ".join(str(e.calls.get(k, 0)) for k in ("prefill", "mixed", "decode")) if e else NO_RESULT
        tokens = NO_RESULT if e is None else (
            f"{e.tokens_compared} compared, equal" if not e.first_difference and rec.status == Status.PASSED
            else md(e.first_difference or "") or "differ")
        status = _mark(rec) + ("" if rec.status == Status.PASSED else f" {md(rec.reason)}")
        graphs = NO_RESULT if e is None else ("CUDA graphs" if e.cuda_graphs else "eager") + (
            f", {e.profile}" if e.profile else "") + (", calls from GPU traces" if e.counted_by else "")
        rows.append([rec.sm, status, md(e.model) if e else NO_RESULT, calls, tokens, graphs,
                     md(rec.vllm or NO_RESULT)])
    lines += [table(rows, ["SM", "result", "model", "kernel calls (prefill / mixed / decode steps)", "greedy tokens",
                           "graphs", "vLLM"]), "", *notes, ""]
    return "\n".join(lines)
