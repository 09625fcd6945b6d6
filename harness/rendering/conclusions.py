"""The page's closing sections: the trade-offs of the chosen route, the open items (what to fix, run or benchmark
next), and the decisions and verdict (the plan's answers, every recommendation and the verdict per SM)."""

from __future__ import annotations

from collections import Counter

from harness.decisions.reasons import by_reason, excluded_by_reason, first_line, n_cells, n_records
from harness.decisions.recommendations import Recommendation, undecided, wanted
from harness.decisions.speedups import REGIMES, stale
from harness.decisions.verdicts import SmVerdict, Verdict, grouped_verdicts
from harness.rendering.markdown import MARKS, code, md, table
from harness.rendering.performance import others_text, setting_text
from harness.rendering.plan_words import capture_sizes, custom_op_name, describe, tp_answer, vllm_answer
from harness.rendering.support import mark_status
from harness.results.merge import Merged
from harness.results.store import BenchRecord
from harness.spec.status import Status
from harness.spec.vllm_ops import ROUTE_KINDS, plugin_route, provider_name
from harness.spec.vllm_schemas import VLLM_KERNELS


def tradeoffs(res: Merged, recs: list[Recommendation]) -> str:
    plan = res.plan
    cs = capture_sizes(plan)
    pad = max((b - a - 1 for a, b in zip(cs, cs[1:])), default=0)
    opaque = VLLM_KERNELS[plan.vllm_kernel].call if plan.vllm_kernel else custom_op_name(plan)
    items = [f"Opaque custom op: torch.compile cannot fuse across {code(opaque)} (neighbouring "
             "elementwise ops, a following quantization) as it fuses forward_native; the op must beat the "
             "compiled reference on its own."]
    if plan.intent == "fusion":
        items.append("Fusion fixed in the kernel: Inductor may already fuse the unfused native ops; the "
                     "`compiled` baseline says whether the hand fusion still wins.")
    if "cuda_graph" in plan.matrix["graph_mode"]:
        items.append(f"CUDA graph padding: decode batches are padded up to the next capture size (up to {pad} "
                     f"padded rows of work per call); above {cs[-1]} tokens the pass runs without a full graph.")
    if max(plan.matrix["tp"]) > 1:
        if plan.tp.kind == "trivial":
            items.append("TP-trivial: every rank does the full op on replicated hidden states after the all-reduce; "
                         "tensor parallelism saves nothing here.")
        else:
            items.append("Sharded: each rank works on its shard; recombining the outputs costs a collective per call.")
    if plan.vllm_kernel:
        pass  # vLLM's own kernel: no route into vLLM to weigh
    elif plugin_route(plan) == "ir":
        items.append("vLLM IR: the provider is chosen by priority per platform and falls back to native where "
                     "`supports_args` rejects a call; a fallback is silent, so check the priority per platform.")
    elif plugin_route(plan) == "custom_op":
        items.append("CustomOp route: `register_oot` replaces the layer class for every model, and the op then "
                     "carries the layer's name in `custom_ops`.")
    elif plugin_route(plan) == "quantization":
        items.append(f"Quantization method: a deployment chooses it for the whole model (`--quantization "
                     f"{provider_name(plan)}`), and every linear layer it serves runs the kernel; a linear method has "
                     "no per-call fallback, so a call outside the kernel's contract is an error, not vLLM's own path.")
    elif plan.vllm.route:
        items.append(f"Route {code(plan.vllm.route)}, {ROUTE_KINDS[plan.vllm.route].words}: the route this kind of "
                     "op takes into vLLM, not proven here; until an integration item proves it, the kernel's numerics "
                     "and speed are all this page shows.")
    caps = [c for c in res.cells if c.sm == "cpu" and c.id in res.records
            and res.records[c.id].facts.get("token_cap")]
    if caps and plan.vllm_kernel:
        items.append("CPU results run vLLM's CPU build of the kernel, with capped token counts: they say what that "
                     "build accepts, not what its GPU build does, and not at the largest shapes.")
    elif caps:
        items.append("CPU results run the kernel in Triton's interpreter with capped token counts: they check "
                     "numerics, not speed, and not the largest shapes.")
    return "\n".join(["## Trade-offs", "", *(f"- {i}" for i in items)])


def open_items(res: Merged, recs: list[Recommendation]) -> list[str]:
    plan = res.plan
    pd = res.plan_display()
    failed = res.cells_with(Status.FAILED)
    items = []
    for problem in res.shown_problems():
        items.append(f"Fix or remove a results file: {md(problem)}")
    other_checks = [r for rs in res.stale_records().values() for r in rs]
    for sm in plan.matrix["sm"]:  # what stale records say is not current: re-run them first
        mine = [r for r in other_checks if r.sm == sm]
        if mine:
            bench = " --bench" if any(isinstance(r, BenchRecord) for r in mine) else ""
            items.append(f"Re-run on {sm} what other checks made ({n_records(mine)}, stale): "
                         f"{code(f'pytest --plan {pd} --cells all{bench}')}")
    if plan.vllm_kernel and failed:  # vLLM's kernel is not ours to fix: its failures are findings
        items.append(f"For a replacement: accept or refuse (`op.contract`) the inputs vLLM's kernel fails on in "
                     f"{n_cells(len(failed))} (What vLLM's kernel accepts)")
    for reason, cells in [] if plan.vllm_kernel else by_reason(res, failed):
        items.append(f"Fix {md(describe(plan, cells))}: {md(reason)}")
    for c in res.cells_with(Status.XPASS):
        items.append(f"{code(c.id)} passes although the plan expects a failure: drop or narrow the expectation "
                     f"({md(res.records[c.id].expectation or '—')})")
    for sm in plan.matrix["sm"]:
        n = sum(1 for c in res.uncovered_cells() if c.sm == sm)
        if n:
            where = " and vLLM's kernels (an installed vLLM, or --vllm-ops-library)" if plan.vllm_kernel else ""
            items.append(f"Run on {sm}: {code(f'pytest --plan {pd}')} on a machine with {sm}{where} ({n_cells(n)})")
    covered_not_run = [c for c in res.cells_with(Status.NOT_RUN) if c.sm in res.covered]
    for reason, cells in by_reason(res, covered_not_run):
        items.append(f"Run {md(describe(plan, cells))} ({n_cells(len(cells))}): not run because {md(reason)}")
    if res.missing():
        items.append(f"Run {md(describe(plan, res.missing()))}: no result recorded yet")
    for reason, cells in by_reason(res, res.cells_with(Status.XFAIL)):
        items.append(f"Fix the expected failure of {md(describe(plan, cells))}: {md(reason)}")
    for reason, cells in excluded_by_reason(res):
        items.append(f"State as unsupported, or support, {md(describe(plan, cells))}: {md(reason)}")
    stale_baselines = Counter()
    for bid, rec in res.benchmarks:
        for impl, t in sorted(rec.impls.items()):
            if t.error:
                items.append(f"Fix {md(impl)} in benchmark {code(bid)}: {md(first_line(t.error))}")
            if t.differs:
                items.append(f"Check that {md(impl)}'s outputs are acceptable (benchmark {code(bid)}; its timing is "
                             f"used): {md(first_line(t.differs))}")
            if t.broken:
                items.append(f"Fix the timing of {md(impl)} in benchmark {code(bid)} (not used for decisions): "
                             f"{md(first_line(t.broken))}")
            if impl != "kernel" and t.timed and stale(plan, rec, impl):
                stale_baselines[(impl, stale(plan, rec, impl))] += 1
    for (impl, why), n in sorted(stale_baselines.items()):
        items.append(f"Re-run the benchmarks ({code(f'pytest --plan {pd} --bench')}): {md(impl)} at {n} "
                     f"benchmark{'s' if n > 1 else ''} was {md(why)}, so decisions leave it out")
    for text in dict.fromkeys(f"{r.sm} {r.dtype} {r.regime}: {r.check_baseline}" for r in recs if r.check_baseline):
        items.append(f"Check the baseline, {md(text)}")
    for text in dict.fromkeys(f"{r.sm} {r.dtype} {r.regime}, {r.profile}: {r.far_from_limit}" for r in recs
                              if r.go and r.far_from_limit):
        items.append(f"Enabled though far from the hardware limit ({md(text)}): find what holds the kernel back "
                     "before relying on the speedup")
    if not res.benchmarks:
        items.append(f"Benchmark on a GPU machine: {code(f'pytest --plan {pd} --bench')}")
    else:
        for sm in [s for s in plan.matrix["sm"] if s != "cpu"]:
            missing = undecided(res, sm, recs)
            if not missing:
                continue
            if len(missing) == len(wanted(res, sm)):
                what = "every dtype and regime"
            else:
                what = "; ".join(f"{reg} {', '.join(d for d, g in missing if g == reg)}"
                                 for reg in REGIMES if any(g == reg for _, g in missing))
            items.append(f"Benchmark on {sm} ({what}): {code(f'pytest --plan {pd} --bench')}")
    return items


def open_items_section(items: list[str]) -> str:
    return "\n".join(["## Open items", "", *(f"- [ ] {i}" for i in items)] if items else ["## Open items", "", "None."])


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
        rows.append([f"{r.regime} {md(r.dtype)} on {r.sm}, {r.profile}", f"**{r.choice}**" if r.choice else "none",
                     "; ".join(basis)])
    for where, sv in grouped_verdicts(per_sm):
        rows.append([f"verdict on {where}", f"**{md(sv.word)}**", md(sv.rule)])
    return "\n".join(["## Decisions and verdict", "", table(rows, ["decision", "choice", "basis"]), "",
                      f"**Verdict: {md(v.word)}.** The rules, per SM and TP size and in order: blocked (a failed or "
                      "unexpected-pass cell there), no results (no machine of that SM has run the plan), numerics "
                      "only (a CPU machine: the kernel runs in Triton's interpreter, so no speed verdict), not run "
                      "here (no cell of that TP size could run on that SM's machines, e.g. too few GPUs), incomplete "
                      "(a cell not run, or a dtype and regime without a benchmark decision), then go or no-go per "
                      "regime: go where a decision, with Inductor or without it, is to enable the custom op; an SM "
                      "whose TP sizes agree gets one verdict (docs/report.md)."])
