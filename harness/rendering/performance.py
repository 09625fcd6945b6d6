"""The Performance section: which function each baseline times, a table of timings per regime, SM and GPU (median
µs, GB/s, share of the copy bandwidth, share of the physical bound, the kernel's speedup against each baseline with
its interval), the plots beside the page, the shapes a machine did not time, and the table of recommendations per
SM, dtype, regime and vLLM profile."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from harness.decisions.bounds import BOUND_SLACK, bound, throughput
from harness.decisions.reasons import first_line
from harness.decisions.recommendations import Recommendation, choice_words
from harness.decisions.speedups import REGIMES, Unused, baselines, impl_order, median, not_used, regime, \
    shape_speedup, why_untimed
from harness.rendering.markdown import NO_RESULT, code, fmt, fmt_us, md, table
from harness.rendering.plan_words import implementation_title, timed_words
from harness.results.merge import Merged
from harness.results.store import BenchRecord, finite_number
from harness.plan.model import Plan
from harness.plan.vocabulary import PHASES
from harness.vllm_facts.names import VLLM_DEFAULT

# Eager figures are back-to-back device time; where an isolated, launch-inclusive call differs by more than
# this fraction, both are shown.
LAUNCH_GAP = 0.03


def plot_name(sm: str) -> str:
    """The file harness.rendering.plots draws for an SM, beside PLAN.md."""
    return f"perf-{re.sub(r'[^A-Za-z0-9_]+', '-', sm)}.png"


def performance(res: Merged, op_dir: Path, recs: list[Recommendation]) -> str:
    plan = res.plan
    lines = ["## Performance", ""]
    untimed = _grouped_untimed(res)
    if not res.benchmarks:
        lines.append(f"No benchmarks were run. Run them on a GPU machine: "
                     f"{code(f'pytest --plan {res.plan_display()} --bench')}.")
        return "\n".join(lines + (["", *untimed] if untimed else []))
    groups = defaultdict(list)
    for bid, rec in res.benchmarks:
        gpu = res.source(rec).gpu if res.source(rec) else "?"
        groups[(REGIMES.index(regime(rec.phase)), plan.matrix["sm"].index(rec.sm), str(gpu))].append((bid, rec))
    lines += [baselines_text(plan), ""]
    for (ri, si, gpu), items in sorted(groups.items()):
        lines += [f"### {REGIMES[ri]} on {plan.matrix['sm'][si]} ({md(gpu)})", "", *_bench_table(res, items), ""]
    lines += ["Cells: median µs · GB/s · % of the measured copy bandwidth · % of the call's physical bound (the "
              "largest of its bytes over the copy bandwidth, its flops over the dtype's measured matrix-multiply peak, "
              "and the launch floor, an empty kernel under the same timer, all measured in the same run; a figure "
              f"beyond its bound by more than {BOUND_SLACK:.0%} is a broken timing). Speedup: the kernel against each "
              "baseline, with its interval; \"no difference\" where the interval spans 1.", ""]
    for sm in [s for s in plan.matrix["sm"] if any(r.sm == s for _, r in res.benchmarks)]:
        if (Path(op_dir) / plot_name(sm)).exists():  # drawn by the run or `python -m harness plot`
            lines += [f"![GB/s against token count on {sm}]({plot_name(sm)})", ""]
    if untimed:
        lines += [*untimed, ""]
    lines += [f"Decisions per SM, dtype, regime and vLLM profile: {_compared_with(plan)} (rules: docs/report.md). "
              "Speedup: the median over the regime's shapes, with the lowest and highest bound of their intervals.",
              "", decision_table(plan, recs)]
    return "\n".join(lines)


def _compared_with(plan: Plan) -> str:
    """What the kernel is compared with in each vLLM profile, in words."""
    name = plan.default_implementation
    if name is None:
        return ("with Inductor the kernel is compared with the compiled reference, without it with the eager one, "
                "and in both with vLLM's kernel and every named baseline")
    return (f"in both profiles the kernel is compared with {implementation_title(name, plan.implementation(name))} "
            f"({md(name)}, the plan's default: what vLLM runs in the kernel's place whatever the profile), and with "
            "vLLM's kernel and every other named baseline")


def baselines_text(plan: Plan) -> str:
    """Which function each of the plan's baselines times."""
    parts = [f"{md(name)}: {timed_words(plan, name)}" for name in plan.baselines]
    accuracy = "" if plan.op.native else \
        " (the numerics oracle is also the speed baseline: the plan names no op.native)"
    return (f"Baselines: {'; '.join(parts) or 'none'}. Every figure is checked against the reference after "
            f"timing{accuracy}.")


# ---------------------------------------------------------------- recommendations


def others_text(r: Recommendation) -> str:
    """vLLM's kernel and every named baseline against the kernel, or why each was not timed."""
    parts = [f"{md(name)} {iv.text()}" if iv else f"{md(name)}: not timed ({md(first_line(why, 80))})"
             for name, iv, why in r.others]
    return "; ".join(parts) or NO_RESULT


def setting_text(r: Recommendation) -> str:
    """The vLLM setting that applies the recommendation, saying where it is vLLM's default."""
    if not r.setting:
        return NO_RESULT
    shown = code(r.setting) if r.setting.startswith("--") else r.setting  # a flag, or words (VLLM_DEFAULT, ...)
    return shown + (" (vLLM's default)" if r.default and r.setting != VLLM_DEFAULT else "")


def speedup_text(r: Recommendation) -> str:
    return f"{r.speedup.text()} vs {r.baseline}" if r.speedup else NO_RESULT


def why_text(r: Recommendation) -> str:
    """A recommendation's why, after whether its benchmarks are stale, with the questions its figures raise ("check
    the baseline", far from the limit)."""
    return "; ".join(filter(None, [r.stale, r.why, r.check_baseline, r.far_from_limit]))


def decision_table(plan: Plan, recs: list[Recommendation]) -> str:
    rows = [[r.sm, md(r.dtype), r.regime, r.profile, f"**{md(choice_words(plan, r.choice))}**" if r.choice else "none",
             speedup_text(r),
             others_text(r), setting_text(r), md(why_text(r))] for r in recs]
    return table(rows, ["SM", "dtype", "regime", "vLLM profile", "recommendation", "kernel speedup",
                        "vs vLLM's kernel and named baselines", "vLLM setting", "why"])


# ---------------------------------------------------------------- timings


def _grouped_untimed(res: Merged) -> list[str]:
    """Benchmark shapes a machine skipped, by reason (the kernel's, else the first implementation's)."""
    groups = defaultdict(list)
    for bid, rec in res.untimed:
        first = rec.impls.get("kernel") or next(iter(rec.impls.values()), None)
        groups[first_line(why_untimed(first))].append(bid)
    if not groups:
        return []
    rows = [[md(reason), str(len(ids)), md(", ".join(ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else ""))]
            for reason, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    return ["Benchmark shapes not timed:", "", table(rows, ["reason", "shapes", "which"])]


def _bench_table(res: Merged, items: list) -> list[str]:
    plan = res.plan
    recs = [r for _, r in items]
    # Benchmarks timed by other checks say so in a column of their own, there only where some are.
    other_checks = {id(r): res.stale_checks(r) for r in recs}
    symbols = sorted({k for r in recs for k in r.sizes},
                     key=lambda k: (list(plan.sizes).index(k) if k in plan.sizes else len(plan.sizes), k))
    varying = [axis for axis in ("phase", "dtype", "graph_mode") if len({str(getattr(r, axis)) for r in recs}) > 1]
    fixed = [f"{axis.replace('_', ' ')} {md(getattr(recs[0], axis))}" for axis in ("phase", "dtype", "graph_mode")
             if axis not in varying]
    impls = sorted({k for r in recs for k in r.impls}, key=impl_order)
    compared = sorted({b for r in recs for b in baselines(r)}, key=impl_order)

    def order(item):
        bid, r = item
        return (PHASES.index(r.phase) if r.phase in PHASES else 9,
                plan.matrix["dtype"].index(r.dtype) if r.dtype in plan.matrix["dtype"] else 99,
                str(r.graph_mode), r.num_tokens if finite_number(r.num_tokens) else 0,
                [(k, str(v)) for k, v in sorted(r.sizes.items())], bid)

    rows = []
    for _, r in sorted(items, key=order):
        row = [fmt(r.num_tokens, 12), *(fmt(r.sizes.get(k), 12) for k in symbols),
               *(md(getattr(r, a)) for a in varying)]
        for name in impls:
            row.append(impl_cell(r, name, not_used(plan, r, name)))
        for b in compared:
            row.append(speedup_cell(r, b, not_used(plan, r, b)))
        if any(other_checks.values()):
            row.append(f"stale: {md(other_checks[id(r)])}" if other_checks[id(r)] else "current")
        rows.append(row)
    copy = sorted({fmt(r.copy_bw_gbps, 6) for r in recs})
    read = sorted({fmt(r.read_bw_gbps, 6) for r in recs if finite_number(r.read_bw_gbps)})
    timers = sorted({md(r.timer) for r in recs if r.timer})
    note = (f"{'; '.join(fixed)}; copy bandwidth measured: {', '.join(copy)} GB/s"
            + (f" (read bandwidth: {', '.join(read)} GB/s)" if read else "")
            + bound_note(recs) + (f"; timer: {', '.join(timers)}" if timers else "") + l2_note(recs))
    headers = ["tokens", *symbols, *[a.replace("_", " ") for a in varying], *impls, *(f"vs {b}" for b in compared),
               *(["checks"] if any(other_checks.values()) else [])]
    return [note, "", table(rows, headers)]


def bound_note(recs: list[BenchRecord]) -> str:
    """The measured peak and launch floor the bounds come from, or that these results have no bound."""
    bounded = [r for r in recs if bound(r)[0] is not None]
    peaks = sorted({fmt(r.peak_tflops, 4) for r in bounded if finite_number(r.peak_tflops)})
    floors = sorted({fmt(r.launch_floor_us, 3) for r in bounded if finite_number(r.launch_floor_us)})
    text = (f"; matrix-multiply peak measured: {', '.join(peaks)} TFLOP/s" if peaks else "") + \
        (f"; launch floor measured: {', '.join(floors)} µs" if floors else "")
    if len(bounded) < len(recs):
        text += (f"; no bound recorded for {len(recs) - len(bounded)} of {len(recs)} items (timed before bounds were "
                 "measured, or on a CPU machine, which measures none): their % of bound is unknown")
    return text


def l2_note(recs: list[BenchRecord]) -> str:
    """Whether the timed calls started with their data out of L2: their rotated input sets together exceed twice
    the L2 size, or (decode-sized calls, whose sets the harness caps) fit in it."""
    known = [r for r in recs if r.l2_bytes and r.working_set_bytes and r.rotated_sets]
    warm = [r for r in known if r.working_set_bytes * r.rotated_sets <= 2 * r.l2_bytes]
    if not warm:
        return "; L2 cold" if known else ""
    return (f"; L2 cold except at {len(warm)} of {len(known)} items, whose rotated input sets fit in twice the L2 "
            f"size (up to {max(r.num_tokens for r in warm)} tokens): those calls find part of their data in L2")


def impl_cell(rec: BenchRecord, name: str, unused: Unused | None = None) -> str:
    """One implementation at one shape: median µs · GB/s · % of the copy bandwidth · % of its bound, what went
    wrong, and (`unused`) why decisions leave the figure out."""
    impl = rec.impls.get(name)
    if impl is None:
        return NO_RESULT
    if median(impl) is None:
        return f"not run: {md(why_untimed(impl))}"
    reached = throughput(rec, impl)
    gbps = f"{reached.gbps:.0f}" if finite_number(reached.gbps) else NO_RESULT
    text = f"{fmt_us(impl.median_us)} µs · {gbps} GB/s · {fmt(reached.pct_copy_bw, 3)}%"
    if finite_number(impl.launch_us) and abs(impl.launch_us / impl.median_us - 1) > LAUNCH_GAP:
        # The two measure different things; where they differ, one figure would mislead (docs/report.md).
        text = (f"{fmt_us(impl.median_us)} µs back-to-back · {fmt_us(impl.launch_us)} µs launch-inclusive · "
                f"{gbps} GB/s · {fmt(reached.pct_copy_bw, 3)}%")
    if finite_number(reached.tflops):
        text += f" · {fmt(reached.tflops, 3)} TFLOP/s"
    if finite_number(reached.pct_of_bound):
        text += f" · {fmt(reached.pct_of_bound, 3)}% of bound"
    if unused and not impl.error:  # the whole reason is in the decisions and open items
        text += f" · ⚠️ not used for decisions: {md(unused.short)}"
    if impl.error:
        text += f" · ❌ {md(first_line(impl.error, 160))}"
    if impl.differs:
        text += f" · ⚠️ differs from the reference: {md(first_line(impl.differs, 160))}"
    return text


def speedup_cell(rec: BenchRecord, baseline: str, unused: Unused | None = None) -> str:
    """The kernel's speedup over one baseline at one shape, with its interval ("not used" where decisions leave the
    baseline's figure out: `unused` says why, in its own cell)."""
    s = shape_speedup(rec, baseline)
    if s is None:
        return NO_RESULT
    if unused:
        return "not used"
    text = f"{s.value:.2f}× ({s.low:.2f}–{s.high:.2f})"
    return f"no difference: {text}" if s.verdict == "no difference" else text
