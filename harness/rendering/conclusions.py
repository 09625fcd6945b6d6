"""The page's closing sections, in words: the trade-offs of the chosen route (harness.decisions.tradeoffs), the open
items, what to fix, run or benchmark next (harness.decisions.open_items), and the decisions and verdict (the plan's
answers, every recommendation and the verdict per SM)."""

from __future__ import annotations

from collections import Counter

from harness.decisions.open_items import OpenItem
from harness.decisions.reasons import n_cells, n_records
from harness.decisions.recommendations import ENABLE, Recommendation, choice_words
from harness.decisions.tradeoffs import TradeOff
from harness.decisions.verdicts import SmVerdict, Verdict, grouped_verdicts
from harness.rendering.markdown import MARKS, NO_RESULT, code, md, table
from harness.rendering.performance import others_text, setting_text
from harness.rendering.plan_words import custom_op_name, describe, tp_answer, vllm_answer
from harness.rendering.support import mark_status
from harness.results.merge import Merged
from harness.plan.model import Plan
from harness.cells.status import Status
from harness.vllm_facts.names import ROUTE_KINDS, provider_name


def tradeoffs_section(plan: Plan, tradeoffs: list[TradeOff]) -> str:
    return "\n".join(["## Trade-offs", "", *(f"- {tradeoff_text(plan, t)}" for t in tradeoffs)])


def tradeoff_text(plan: Plan, t: TradeOff) -> str:
    match t.kind:
        case "opaque":
            return (f"Opaque custom op: torch.compile cannot fuse across {code(custom_op_name(plan))} (neighbouring "
                    "elementwise ops, a following quantization) as it fuses forward_native; the op must beat the "
                    "compiled reference on its own.")
        case "fusion":
            return ("Fusion fixed in the kernel: Inductor may already fuse the unfused native ops; the `compiled` "
                    "baseline says whether the hand fusion still wins.")
        case "graph padding":
            return (f"CUDA graph padding: decode batches are padded up to the next capture size (up to "
                    f"{t.padded_rows} padded rows of work per call); above {t.largest_capture} tokens the pass runs "
                    "without a full graph.")
        case "TP-trivial":
            return ("TP-trivial: every rank does the full op on replicated hidden states after the all-reduce; "
                    "tensor parallelism saves nothing here.")
        case "sharded":
            return "Sharded: each rank works on its shard; recombining the outputs costs a collective per call."
        case "ir":
            return ("vLLM IR: the provider is chosen by priority per platform and falls back to native where "
                    "`supports_args` rejects a call; a fallback is silent, so check the priority per platform.")
        case "custom_op":
            return ("CustomOp route: `register_oot` replaces the layer class for every model, and the op then "
                    "carries the layer's name in `custom_ops`.")
        case "quantization":
            return (f"Quantization method: a deployment chooses it for the whole model (`--quantization "
                    f"{provider_name(plan)}`), and every linear layer it serves runs the kernel; a linear method has "
                    "no per-call fallback, so a call outside the kernel's contract is an error, not vLLM's own path.")
        case "unproven route":
            return (f"Route {code(plan.vllm.route)}, {ROUTE_KINDS[plan.vllm.route].words}: the route this kind of op "
                    "takes into vLLM, not proven here; until an integration item proves it, the kernel's numerics "
                    "and speed are all this page shows.")
        case "CPU interpreter":
            return ("CPU results run the kernel in Triton's interpreter with capped token counts: they check "
                    "numerics, not speed, and not the largest shapes.")
    raise ValueError(f"no words for the trade-off {t.kind!r}")


def open_items_section(plan: Plan, items: list[OpenItem]) -> str:
    return "\n".join(["## Open items", "", *(f"- [ ] {open_item_text(plan, i)}" for i in items)] if items
                     else ["## Open items", "", "None."])


def open_item_text(plan: Plan, item: OpenItem) -> str:
    cells, n = md(describe(plan, list(item.cells))), n_cells(len(item.cells))
    what, why, command = md(item.what), md(item.why), code(item.command)
    benchmark = code(item.benchmarks[0]) if item.benchmarks else ""
    if len(item.benchmarks) > 1 and item.kind != "stale baseline":  # the same fault at several shapes: the first's
        benchmark += f" and {len(item.benchmarks) - 1} more alike, marked in the tables above"
    match item.kind:
        case "results file":
            return f"Fix or remove a results file: {what}"
        case "stale records":
            return f"Re-run on {item.where} what could now come out differently ({n_records(item.records)}, " \
                f"stale): {command}"
        case "failed":
            return f"Fix {cells}: {why}"
        case "unexpected pass":
            return (f"{code(item.cells[0].id)} passes although the plan expects a failure: drop or narrow the "
                    f"expectation ({md(item.why or NO_RESULT)})")
        case "SM without results":
            where = " and vLLM's kernels (an installed vLLM, or --vllm-ops-library)" if plan.providers else ""
            return f"Run on {item.where}: {command} on a machine with {item.where}{where} ({n})"
        case "not run":
            return f"Run {cells} ({n}): not run because {why}"
        case "no result":
            return f"Run {cells}: no result recorded yet"
        case "expected failure":
            return f"Fix the expected failure of {cells}: {why}"
        case "excluded":
            return f"State as unsupported, or support, {cells}: {why}"
        case "implementation error":
            return f"Fix {what} in benchmark {benchmark}: {why}"
        case "differs":
            return f"Check that {what}'s outputs are acceptable (benchmark {benchmark}; timings used): {why}"
        case "broken timing":
            return f"Fix the timing of {what} in benchmark {benchmark} (not used for decisions): {why}"
        case "stale baseline":
            n = len(item.benchmarks)
            return (f"Re-run the benchmarks ({command}): {what} at {n} benchmark{'s' if n > 1 else ''} was {why}, so "
                    "decisions leave it out")
        case "check the baseline":
            return f"Check the baseline, {md(f'{item.where}: {item.why}')}"
        case "far from the limit":
            return (f"Enabled though far from the hardware limit ({md(f'{item.where}: {item.why}')}): find what holds "
                    "the kernel back before relying on the speedup")
        case "no benchmarks":
            return f"Benchmark on a GPU machine: {command}"
        case "undecided":
            return f"Benchmark on {item.where} ({item.what}): {command}"
    raise ValueError(f"no words for the open item {item.kind!r}")


def decisions(res: Merged, v: Verdict, recs: list[Recommendation], per_sm: list[SmVerdict]) -> str:
    plan = res.plan

    def tally(**axis) -> str:
        cells = [c for c in res.cells if all(getattr(c, k) == val for k, val in axis.items())]
        counts = Counter(mark_status(res, c) if c.sm in res.covered else  # elsewhere, the plan's exclusions
                         Status.EXCLUDED if res.excluded_by_plan(c) else "uncovered" for c in cells)
        parts = [f"{counts[s]} {s.replace('_', ' ')}" for s in MARKS if counts[s]]
        if counts[None]:
            parts.append(f"{counts[None]} without a result")
        if counts["uncovered"]:
            parts.append(f"{counts['uncovered']} on SMs without results")
        return f"{len(cells)} cells: " + ", ".join(parts)

    rows = [["integration route", vllm_answer(plan, res.integration), "plan: vllm"]]
    if "torch_compile" in plan.matrix["graph_mode"]:
        rows.append(["torch.compile", f"opaque {code(custom_op_name(plan))} with a fake implementation",
                     md("torch_compile " + tally(graph_mode="torch_compile"))])
    if "cuda_graph" in plan.matrix["graph_mode"]:
        rows.append(["CUDA graphs", "launch captured with the model; batches padded to capture sizes",
                     md("cuda_graph " + tally(graph_mode="cuda_graph"))])
    rows.append(["tensor parallelism", tp_answer(plan), "; ".join(f"tp{t} " + tally(tp=t) for t in plan.matrix["tp"])])
    for r in recs:
        basis = [md(r.stale)] if r.stale else []  # first: the figures below are other checks'
        basis += [f"{r.speedup.text()} vs {r.baseline}"] if r.speedup else []
        if r.others:
            basis.append(f"vs vLLM's kernel and named baselines: {others_text(r)}")
        if r.setting:
            basis.append(f"setting: {setting_text(r)}")
        basis.append(md(r.why))
        rows.append([f"{r.regime} {md(r.dtype)} on {r.sm}, {r.profile}",
                     f"**{md(choice_words(plan, r.choice))}**" if r.choice else "none", "; ".join(basis)])
    for where, sv in grouped_verdicts(per_sm):
        rows.append([f"verdict on {where}", f"**{md(sv.word)}**", md(sv.rule)])
    return "\n".join(["## Decisions and verdict", "", table(rows, ["decision", "choice", "basis"]), "",
                      f"**Verdict: {md(v.word)}.** The rules, per SM and TP size and in order: blocked (a failed or "
                      "unexpected-pass cell there), no results (no machine of that SM has run the plan), numerics "
                      "only (a CPU machine: the kernel runs in Triton's interpreter, so no speed verdict), not run "
                      "here (no cell of that TP size could run on that SM's machines, e.g. too few GPUs), incomplete "
                      "(a cell not run, or a dtype and regime without a benchmark decision), then go or no-go per "
                      f"regime: go where a decision, with Inductor or without it, is to {choice_words(plan, ENABLE)}; "
                      "an SM whose TP sizes agree gets one verdict (docs/report.md)."])
