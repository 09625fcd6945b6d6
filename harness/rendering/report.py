"""The living plan: reports/<op>/PLAN.md regenerated from the plan and the merged results.

Sections follow a design document (problem, constraints, design, interfaces, critical path,
performance, trade-offs, decisions) filled with the plan's answers and what the runs found.
Same plan and results in, byte-identical report out: everything is sorted, and dates appear only
in the provenance line. Every piece of text that comes from a user or an exception is escaped
for the place it lands in (a table cell, inline code, a Mermaid label). The decision per SM × dtype ×
regime × vLLM profile (Inductor on / off) and the per-SM verdict rules are documented in docs/report.md.
Plain Python: it reads records and the plan, never torch or pytest.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from harness.spec.hardware import Hardware
from harness.spec.matrix import Cell, bench_graph_modes, decide, excluded_by, expand
from harness.spec.plan import AXES, PHASES, Plan
from harness.spec.status import RAN
from harness.results.store import ALIGNMENTS, NOISE_FLOOR, BenchRecord, CellRecord, ImplFigures, InputsSeen, \
    IntegrationRecord, Provenance, Status, merge_dir
from harness.spec.tolerances import tolerance_source
from harness.spec.vllm_ops import VLLM_DEFAULT, enable_setting, is_vllm_default, plugin_entry_point, plugin_module_name, \
    plugin_route, profile_setting, provider_name, render_plugin, unsupported, vllm_op
from harness.spec.vllm_schemas import VLLM_KERNELS

MARKS = {Status.PASSED: "✅", Status.FAILED: "❌", Status.NOT_RUN: "⏭", Status.EXCLUDED: "🚫", Status.XFAIL: "⚠️",
         Status.XPASS: "❗"}
NO_RESULT = "—"
LEGEND = ("✅ passed · ❌ failed · ⏭ not run here · 🚫 excluded by the plan · ⚠️ expected failure (plan) · "
          "❗ unexpected pass · — no result recorded yet")
REGIMES = ("decode-sized", "prefill-sized")
IMPL_ORDER = ("kernel", "native", "compiled", "vllm")
ENABLE, INDUCTOR, NATIVE, KEEP_VLLM = ("enable the custom op", "leave it to Inductor", "keep native",
                                      "keep vLLM's kernel")
# vLLM's two profiles and the baseline each compares with: Inductor compiles forward_native, or nothing does.
VLLM_PROFILES = (("Inductor on", "compiled"), ("Inductor off", "native"))
FALLBACK = {"compiled": INDUCTOR, "native": NATIVE}  # the choice where neither kernel qualifies
INTENTS = {
    "drop-in": "drop-in replacement: the numerics of the op it replaces, faster",
    "fusion": "fusion: several existing ops in one kernel, fewer launches and memory round trips",
    "new-algorithm": "new algorithm for an existing op",
    "quantization": "new quantization scheme",
}


# ---------------------------------------------------------------- escaping


def md(value) -> str:
    """Text for a table cell or a line of prose: one line, no HTML, no Markdown syntax, no table breaks."""
    text = " ".join(str(value).split())
    text = text.replace("\\", "\\\\").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"([`*\[\]|#~])", r"\\\1", text)
    return re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", text)


def code(value) -> str:
    """Inline code (one line); a fence longer than any backtick run inside; pipes escaped for tables."""
    text = " ".join(str(value).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def mm(value) -> str:
    """Text for a Mermaid label or message: anything but plain characters becomes an entity code."""
    text = " ".join(str(value).split())
    return "".join(c if re.match(r"[A-Za-z0-9 _.,:/()=+\-*']", c) else f"#{ord(c)};" for c in text)


def table(rows, headers) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def py_str(value: str) -> str:
    return json.dumps(value)  # a Python string literal (JSON's escapes are valid Python)


def py_tuple(items) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


# ---------------------------------------------------------------- numbers


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def fmt(v, digits: int = 3) -> str:
    if not _is_num(v):
        return NO_RESULT if v is None else md(v)
    return f"{v:.{digits}g}"


def fmt_us(v) -> str:
    if not _is_num(v):
        return NO_RESULT
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


# ---------------------------------------------------------------- merged results


@dataclass
class Merged:
    """The plan's cells with their winning records, and where each record came from."""

    plan: Plan
    runs: dict[str, Provenance]
    records: dict[str, CellRecord]  # cell id -> record, plan cells only
    cells: list  # every plan cell, in plan order
    benchmarks: list[tuple[str, BenchRecord]]  # for the plan's SMs, with at least one implementation timed
    untimed: list[tuple[str, BenchRecord]]  # where nothing was timed (skipped on this machine)
    problems: list  # results that could not be used, as returned to the caller
    op_dir: Path = Path(".")
    ignored: int = 0  # stored results for cells or SMs the plan no longer has
    covered: dict = field(default_factory=dict)  # sm -> runs on a machine of that SM that gave cell results
    sources: dict = field(default_factory=dict)  # sm -> runs on a machine of that SM that gave cells or benchmarks
    integration: dict[str, IntegrationRecord] = field(default_factory=dict)

    def source(self, rec) -> Provenance | None:
        return self.runs.get(rec.run)

    def source_sm(self, rec) -> str | None:
        prov = self.source(rec)
        return prov.sm if prov else None

    def status(self, cell: Cell) -> Status | None:
        rec = self.records.get(cell.id)
        return rec.status if rec else None

    def cells_with(self, *statuses) -> list:
        return [c for c in self.cells if self.status(c) in statuses]

    def missing(self) -> list:
        """Plan cells on covered SMs without a result."""
        return [c for c in self.cells if c.sm in self.covered and self.status(c) is None]

    def excluded_by_plan(self, cell: Cell) -> str | None:
        """The plan's reason when it excludes the cell (on every machine, with or without results)."""
        return excluded_by(self.plan, cell)

    def uncovered_cells(self) -> list:
        """Cells the plan requires on SMs that no results cover yet."""
        return [c for c in self.cells if c.sm not in self.covered and not self.excluded_by_plan(c)]

    def shown_problems(self) -> list[str]:
        """Problems with their files named relative to the op's folder, so the report does not depend on the cwd."""
        results_dir = self.op_dir / "results"
        prefixes = [str(results_dir.resolve()) + os.sep, str(results_dir) + os.sep]
        out = []
        for problem in self.problems:
            prefix = next((p for p in prefixes if problem.startswith(p)), None)
            out.append("results/" + problem[len(prefix):] if prefix else problem)
        return out


def collect(plan: Plan, op_dir: Path) -> Merged:
    """Every results file merged (per cell the latest wins), narrowed to the plan's cells and SMs."""
    results_dir = Path(op_dir) / "results"
    merged, problems = merge_dir(results_dir, plan.name)
    for path in sorted(results_dir.glob("*.unreadable")):
        problems.append(f"{path}: a results file a run could not read and set aside; inspect it, then delete it")
    cells = expand(plan)
    by_id = {c.id: c for c in cells}
    records, ignored = {}, 0
    for cid, rec in merged.cells.items():
        if cid in by_id:
            records[cid] = rec
        else:
            ignored += 1
    benchmarks, untimed = [], []
    for bid, rec in sorted(merged.benchmarks.items()):
        if rec.sm not in plan.matrix["sm"]:
            ignored += 1
        elif any(t.timed for t in rec.impls.values()):
            benchmarks.append((bid, rec))
        else:
            untimed.append((bid, rec))
    res = Merged(plan, merged.runs, records, cells, benchmarks, untimed, problems, Path(op_dir), ignored,
                 integration=merged.integration)
    unknown_runs = sorted({r.run for r in records.values() if r.run not in res.runs}
                          | {r.run for _, r in benchmarks if r.run not in res.runs}, key=str)
    for run in unknown_runs:
        problems.append(f"results name run {run!r}, which no results file describes (provenance unknown)")
    covered, sources = defaultdict(set), defaultdict(set)
    for cid, rec in records.items():
        sm = by_id[cid].sm
        if res.source_sm(rec) == sm:
            covered[sm].add(rec.run)
            sources[sm].add(rec.run)
    for _, rec in benchmarks + untimed:
        if res.source_sm(rec) == rec.sm:
            sources[rec.sm].add(rec.run)
    res.covered = {sm: sorted(covered[sm]) for sm in plan.matrix["sm"] if sm in covered}
    res.sources = {sm: sorted(sources[sm]) for sm in plan.matrix["sm"] if sm in sources}
    return res


# ---------------------------------------------------------------- describing sets of cells


def describe(plan: Plan, cells: list[Cell]) -> str:
    """A set of cells as `phase · dtype · tp · graph mode · sm` (a product of axis values, with at most a few
    exceptions named), else their ids."""
    if not cells:
        return ""
    values = {axis: [v for v in plan.matrix[axis] if any(getattr(c, axis) == v for c in cells)] for axis in AXES}
    present = set(cells)
    absent = [c.id for c in (Cell(*vs) for vs in itertools.product(*values.values())) if c not in present]
    if len(absent) > 8:
        ids = [c.id for c in cells]
        return ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
    parts = []
    for axis in AXES:
        vs = values[axis]
        if len(vs) == len(plan.matrix[axis]) and len(vs) > 1:
            parts.append(f"every {axis.replace('_', ' ')}")
        else:
            parts.append(", ".join(f"tp{v}" if axis == "tp" else str(v) for v in vs))
    return " · ".join(parts) + (f" except {', '.join(absent)}" if absent else "")


def n_cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def _first_line(text, limit: int = 240) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------- plan-derived names


def custom_op_name(plan: Plan) -> str:
    return f"torch.ops.{plan.op_namespace}.{plan.name}"


def layer_path(plan: Plan) -> str | None:
    return plan.vllm.layer or plan.replaces


def layer_class(plan: Plan) -> str:
    path = layer_path(plan)
    return path.split(":")[-1].split(".")[-1] if path else "the model layer"


def ir_op(plan: Plan) -> str:
    return plan.vllm.ir_op or plan.name


def capture_sizes(plan: Plan) -> list[int]:
    return plan.cuda_graph_sizes()


# ---------------------------------------------------------------- benchmarks


def regime(phase: str) -> str:
    return "decode-sized" if phase == "decode" else "prefill-sized"


def _median(impl: ImplFigures | None) -> float | None:
    return impl.median_us if impl is not None and impl.timed else None


def _valid(impl: ImplFigures | None) -> bool:
    """Timed, with a positive median, and right after timing."""
    return _median(impl) is not None and impl.median_us > 0 and not impl.error


def _impl_order(name: str) -> tuple:
    return (IMPL_ORDER.index(name) if name in IMPL_ORDER else len(IMPL_ORDER), name)


def _baselines(rec: BenchRecord) -> list[str]:
    names = set(rec.impls) | set(rec.speedup)
    names.discard("kernel")
    return sorted(names, key=_impl_order)


def speedup_verdict(rec: BenchRecord, baseline: str) -> str | None:
    """faster | slower | no difference for the kernel against one measured baseline (None: not measured)."""
    kernel, base = _median(rec.impls.get("kernel")), _median(rec.impls.get(baseline))
    if kernel is None or base is None or kernel <= 0:
        return None
    s = rec.speedup.get(baseline)
    if s is not None and _is_num(s.low) and _is_num(s.high):
        return "faster" if s.low > 1 else "slower" if s.high < 1 else "no difference"
    if s is not None and s.verdict in ("faster", "slower", "no difference"):
        return s.verdict
    return "faster" if base > kernel else "slower" if base < kernel else "no difference"


def _why_untimed(impl: ImplFigures | None) -> str:
    if impl is None:
        return "no figures recorded"
    return str(impl.not_run or impl.error or "no figures recorded")


def _spread(slow: ImplFigures, fast: ImplFigures) -> tuple[float, float, float]:
    """slow's time over fast's (> 1: `fast` is faster), with an interval from both q20/q80 spreads widened by
    the noise floor, as the benchmarks compute the kernel's speedups."""
    value = slow.median_us / fast.median_us
    low = slow.q20_us / fast.q80_us if _is_num(slow.q20_us) and _is_num(fast.q80_us) and fast.q80_us > 0 else value
    high = slow.q80_us / fast.q20_us if _is_num(slow.q80_us) and _is_num(fast.q20_us) and fast.q20_us > 0 else value
    return value, min(low, value / (1 + NOISE_FLOOR)), max(high, value * (1 + NOISE_FLOOR))


def _ratio(rec: BenchRecord, baseline: str) -> tuple[float, float, float] | None:
    """The kernel's speedup over one baseline at one shape, (value, low, high), as the run recorded it (its
    interval includes the run-to-run noise floor); None where either has no valid timing."""
    kernel, base = rec.impls.get("kernel"), rec.impls.get(baseline)
    if not (_valid(kernel) and _valid(base)):
        return None
    s = rec.speedup.get(baseline)
    if s is not None and _is_num(s.value) and _is_num(s.low) and _is_num(s.high):
        return s.value, s.low, s.high
    return _spread(base, kernel)


@dataclass(frozen=True)
class Interval:
    """One implementation against another over a regime's shapes: the median ratio, the lowest low and the
    highest high of the per-shape intervals, and at how many shapes it is wholly faster or wholly slower."""

    median: float
    low: float
    high: float
    shapes: int
    faster: int
    slower: int

    @property
    def wholly_faster(self) -> bool:
        return self.faster == self.shapes

    def text(self) -> str:
        return f"{self.median:.2f}× ({self.low:.2f}–{self.high:.2f})"


def interval(ratios) -> Interval | None:
    ratios = [r for r in ratios if r is not None]
    if not ratios:
        return None
    return Interval(statistics.median(r[0] for r in ratios), min(r[1] for r in ratios), max(r[2] for r in ratios),
                    len(ratios), sum(r[1] > 1 for r in ratios), sum(r[2] < 1 for r in ratios))


@dataclass(frozen=True)
class Recommendation:
    """The decision for one SM × dtype × regime × vLLM profile."""

    sm: str
    dtype: str
    regime: str
    profile: str  # VLLM_PROFILES: "Inductor on" (against compiled) or "Inductor off" (against native)
    choice: str  # ENABLE / INDUCTOR / NATIVE / KEEP_VLLM, or "" when the runs cannot say
    why: str
    baseline: str = ""
    speedup: Interval | None = None  # the kernel against the profile's baseline
    others: tuple = ()  # (name, Interval or None, why not timed) for vLLM's kernel and every named baseline
    setting: str = ""  # the vLLM setting that applies the choice
    default: bool = False  # the setting is what vLLM does in this profile anyway
    gpu: str = ""
    sizes: tuple = ()  # the benchmarked sizes, each as sorted (symbol, value) pairs

    @property
    def go(self) -> bool:
        return self.choice == ENABLE

    def others_text(self) -> str:
        parts = [f"{md(name)} {iv.text()}" if iv else f"{md(name)}: not timed ({md(_first_line(why, 80))})"
                 for name, iv, why in self.others]
        return "; ".join(parts) or NO_RESULT

    def setting_text(self) -> str:
        if not self.setting:
            return NO_RESULT
        shown = self.setting if self.setting == VLLM_DEFAULT else code(self.setting)
        return shown + (" (vLLM's default)" if self.default and self.setting != VLLM_DEFAULT else "")


def _use(choice: str) -> str:
    return {ENABLE: "kernel", KEEP_VLLM: "vllm"}.get(choice, "native")


def recommendations(res: Merged) -> list[Recommendation]:
    """One decision per SM × dtype × regime × profile with benchmarks, in plan order."""
    plan = res.plan
    dtypes = list(plan.matrix["dtype"])
    groups = defaultdict(list)
    for _, rec in res.benchmarks:
        dtype_key = (dtypes.index(rec.dtype), "") if rec.dtype in dtypes else (len(dtypes), str(rec.dtype))
        groups[(plan.matrix["sm"].index(rec.sm), dtype_key, REGIMES.index(regime(rec.phase)))].append(rec)
    out = []
    for (si, _, ri), recs in sorted(groups.items()):
        for profile, baseline in VLLM_PROFILES:
            out.append(_decide(res, plan.matrix["sm"][si], recs[0].dtype, REGIMES[ri], profile, baseline, recs))
    return out


def _decide(res: Merged, sm: str, dtype: str, reg: str, profile: str, baseline: str, recs: list) -> Recommendation:
    plan = res.plan
    inductor = profile == VLLM_PROFILES[0][0]
    gpus = sorted({str(res.source(r).gpu) for r in recs if res.source(r)})
    sizes = tuple(sorted({tuple(sorted((str(k), v) for k, v in r.sizes.items())) for r in recs}, key=str))

    def made(choice: str, why: str, speedup=None, others=()) -> Recommendation:
        setting = profile_setting(plan, inductor, _use(choice)) if choice else ""
        return Recommendation(sm, dtype, reg, profile, choice, why, baseline, speedup, tuple(others), setting,
                              bool(choice) and is_vllm_default(inductor, _use(choice)), ", ".join(gpus), sizes)

    if sm == "cpu" or any(res.source(r) and res.source(r).triton_interpreter for r in recs):
        return made("", "timed on a CPU machine, where the kernel runs in Triton's interpreter: not a measure of speed")
    failed = [r for r in recs if r.impls.get("kernel") is not None and r.impls["kernel"].error]
    if failed:
        return made("", f"the kernel failed at {len(failed)} of {len(recs)} shapes: "
                        f"{_first_line(failed[0].impls['kernel'].error, 160)}")
    valid = [r for r in recs if _valid(r.impls.get("kernel"))]
    if not valid:
        why = _first_line(_why_untimed(recs[0].impls.get("kernel")), 160)
        return made("", f"the kernel has no valid timing: {why}")
    speed = interval(_ratio(r, baseline) for r in valid)
    if speed is None:
        return made("", f"{baseline} was not timed: {_first_line(_why_untimed(valid[0].impls.get(baseline)), 160)}")
    names = sorted({n for r in valid for n in _baselines(r)} - {"native", "compiled"}, key=_impl_order)
    others = []
    for name in names:
        iv = interval(_ratio(r, name) for r in valid)
        why = "" if iv else next((_why_untimed(r.impls.get(name)) for r in valid), "no figures recorded")
        others.append((name, iv, why))
    untimed = [f"{name} ({_first_line(why, 80)})" for name, iv, why in others if iv is None]
    slower_than = [(name, iv) for name, iv, _ in others if iv is not None and iv.slower]
    at = f"at all {speed.shapes} shapes" if speed.shapes > 1 else "at the one shape"
    if speed.wholly_faster and not slower_than:
        timed = [name for name, iv, _ in others if iv is not None]
        why = f"faster than {baseline} {at}"
        if timed:
            why += f"; not slower than {', '.join(timed)} at any shape"
        if untimed:
            why += f"; not timed: {', '.join(untimed)}"
        return made(ENABLE, why, speed, others)
    reasons = []
    if not speed.wholly_faster:
        reasons.append(f"not faster than {baseline} at {speed.shapes - speed.faster} of {speed.shapes} shapes")
    reasons += [f"slower than {name} at {iv.slower} of {iv.shapes} shapes" for name, iv in slower_than]
    # vLLM's kernel against the profile's baseline, at the shapes where the kernel and the baseline were timed
    pairs = [(r.impls.get(baseline), r.impls.get("vllm")) for r in valid if _valid(r.impls.get(baseline))]
    vllm_vs = interval(_spread(b, v) for b, v in pairs if _valid(v))
    if vllm_vs is not None and vllm_vs.shapes == len(pairs) and vllm_vs.wholly_faster:
        return made(KEEP_VLLM, "; ".join(reasons) + f"; vLLM's kernel is faster than {baseline} {at} "
                               f"({vllm_vs.text()})", speed, others)
    return made(FALLBACK[baseline], "; ".join(reasons), speed, others)


def _wanted(res: Merged, sm: str) -> list[tuple[str, str]]:
    """(dtype, regime) pairs the plan's benchmarks time on an SM: not excluded, not expected to fail, runnable on
    one GPU of that SM."""
    plan = res.plan
    hw = Hardware(sm, "cpu" if sm == "cpu" else "cuda", sm, 0 if sm == "cpu" else 1, 1)
    out = []
    for dtype in plan.matrix["dtype"]:
        for reg in REGIMES:
            cells = [Cell(p, dtype, 1, m, sm) for p in plan.benchmark.shapes() if regime(p) == reg
                     for m in bench_graph_modes(plan)]
            if any(decide(plan, c, hw, 1).kind == "run" for c in cells):
                out.append((dtype, reg))
    return out


def go_phrase(recs: list[Recommendation]) -> str:
    """go / no-go per regime from the decided recommendations of one SM, naming the profiles (and dtypes) that
    enable the op where not all of them do: "go for decode-sized (Inductor off); no-go for prefill-sized"."""
    per_regime = []  # (regime, "go" | "no-go", qualifier)
    for reg in REGIMES:
        decided = [r for r in recs if r.regime == reg and r.choice]
        if not decided:
            continue
        if not any(r.go for r in decided):
            per_regime.append((reg, "no-go", ""))
            continue
        quals = []
        for profile, _ in VLLM_PROFILES:
            mine = [r for r in decided if r.profile == profile]
            on = [r.dtype for r in mine if r.go]
            if on:
                quals.append(profile if len(on) == len(mine) else f"{profile}: {', '.join(on)}")
        everywhere = all(r.go for r in decided)
        per_regime.append((reg, "go", "" if everywhere else f" ({'; '.join(quals)})"))
    if not per_regime:
        return ""
    if len({(word, qual) for _, word, qual in per_regime}) == 1:
        return per_regime[0][1] + per_regime[0][2]
    parts = []
    for (word, qual), items in itertools.groupby(per_regime, key=lambda t: (t[1], t[2])):
        parts.append(f"{word} for {', '.join(reg for reg, _, _ in items)}{qual}")
    return "; ".join(parts)


# ---------------------------------------------------------------- verdict


@dataclass(frozen=True)
class Verdict:
    word: str  # blocked | incomplete | go | no-go | go for ... (mixed) | numerics only | no results | excluded
    rule: str


@dataclass(frozen=True)
class SmVerdict:
    sm: str
    word: str
    rule: str


def sm_verdicts(res: Merged, recs: list[Recommendation] | None = None) -> list[SmVerdict]:
    """One verdict per SM of the plan, by the rules in docs/report.md."""
    recs = recommendations(res) if recs is None else recs
    plan = res.plan
    out = []
    for sm in plan.matrix["sm"]:
        cells = [c for c in res.cells if c.sm == sm]
        failed = [c for c in cells if res.status(c) == Status.FAILED]
        xpass = [c for c in cells if res.status(c) == Status.XPASS]
        if failed or xpass:
            out.append(SmVerdict(sm, "blocked", f"{len(failed)} failed, {len(xpass)} unexpectedly passing; any failed "
                                                "or unexpected-pass cell blocks the integration on this SM"))
            continue
        mine = [r for r in recs if r.sm == sm]
        required = [c for c in cells if not res.excluded_by_plan(c)]
        if sm not in res.covered:
            if not required:
                out.append(SmVerdict(sm, "excluded", "the plan excludes every cell of this SM"))
                continue
            if not any(r.choice for r in mine):
                out.append(SmVerdict(sm, "no results", f"no results from a machine of this SM yet "
                                                       f"({n_cells(len(required))}): run pytest --plan "
                                                       f"{plan_display(res)} on one"))
                continue
        not_run = [c for c in cells if res.status(c) == Status.NOT_RUN or
                   (sm in res.covered and res.status(c) is None) or
                   (sm not in res.covered and c in required)]
        reasons = _grouped_reasons(res, [c for c in not_run if c.id in res.records])
        unrecorded = [c for c in not_run if c.id not in res.records]
        if unrecorded:
            reasons.append(("no result recorded" if sm in res.covered else "no cell results from this SM",
                            unrecorded))
        not_run_text = f"{n_cells(len(not_run))} not run" + (
            f" ({'; '.join(f'{len(cs)}: {reason}' for reason, cs in reasons[:3])}"
            f"{'; …' if len(reasons) > 3 else ''})" if reasons else "")
        if sm == "cpu":
            passed = sum(1 for c in cells if res.status(c) == Status.PASSED)
            xfail = sum(1 for c in cells if res.status(c) == Status.XFAIL)
            parts = [f"{passed} of {n_cells(len(cells))} passed"] + ([f"{xfail} failed as expected"] if xfail else [])
            if not_run:
                parts.append(not_run_text)
            out.append(SmVerdict(sm, "numerics only", "; ".join(parts) + "; a CPU machine runs the kernel in "
                                                                         "Triton's interpreter, so its results never "
                                                                         "give a speed verdict"))
            continue
        decided = [r for r in mine if r.choice]
        have = {(r.dtype, r.regime) for r in decided}
        undecided = [pair for pair in _wanted(res, sm) if pair not in have]
        if not_run or undecided:
            parts = [not_run_text] if not_run else []
            if undecided:
                by_regime = defaultdict(list)
                for dtype, reg in undecided:
                    by_regime[reg].append(dtype)
                parts.append("no benchmark decision yet for " + "; ".join(
                    f"{reg} {', '.join(by_regime[reg])}" for reg in REGIMES if reg in by_regime))
            if decided:
                parts.append(f"benchmarks so far: {go_phrase(decided)}")
            out.append(SmVerdict(sm, "incomplete", "; ".join(parts)))
            continue
        if not decided:  # every cell ran, and the plan times nothing on this SM
            why = ("the plan has no benchmark shapes (benchmark.decode, benchmark.prefill)" if
                   not plan.benchmark.shapes() else "the plan's benchmarks do not run on this SM (excluded or "
                                                    "expected to fail)")
            out.append(SmVerdict(sm, "incomplete", f"{why}: nothing decides go or no-go"))
            continue
        out.append(SmVerdict(sm, go_phrase(decided), "go where a decision is to enable the custom op (in either "
                                                     "vLLM profile), no-go elsewhere"))
    return out


def verdict(res: Merged, recs: list[Recommendation] | None = None,
            per_sm: list[SmVerdict] | None = None) -> Verdict:
    """The plan's verdict: the per-SM verdicts, SMs with the same verdict named together."""
    per_sm = sm_verdicts(res, recs) if per_sm is None else per_sm
    groups: dict[str, list[str]] = {}
    for v in sorted(per_sm, key=_verdict_rank):
        groups.setdefault(v.word, []).append(v.sm)
    word = " · ".join(f"{', '.join(sms)}: {w}" for w, sms in groups.items())
    return Verdict(word, "per SM: blocked, then no results, then numerics only on a CPU machine, then incomplete, "
                         "then go or no-go per regime (docs/report.md)")


# ---------------------------------------------------------------- sections


def plan_display(res: Merged) -> str:
    """The plan's path as a user types it at the project root (reports/<op>/ lies in the root), else its name."""
    try:
        return Path(res.plan.path).resolve().relative_to(res.op_dir.resolve().parent.parent).as_posix()
    except ValueError:
        return Path(res.plan.path).name


def grouped_verdicts(per_sm: list[SmVerdict]) -> list[tuple[list[str], SmVerdict]]:
    """SMs with the same verdict and reason together, in plan order of their first SM."""
    groups: dict[tuple[str, str], list[str]] = {}
    for v in sorted(per_sm, key=_verdict_rank):  # stable: plan order within a rank
        groups.setdefault((v.word, v.rule), []).append(v.sm)
    return [(sms, SmVerdict(sms[0], word, rule)) for (word, rule), sms in groups.items()]


def _verdict_rank(v: SmVerdict) -> int:
    """SMs with a speed verdict first, then those still short of one, then those that cannot give one."""
    order = ("blocked", None, "incomplete", "numerics only", "no results", "excluded")
    return order.index(v.word) if v.word in order else 1


def header(res: Merged, v: Verdict, per_sm: list[SmVerdict]) -> str:
    plan = res.plan
    lines = [f"# Integration plan: {md(plan.name)}", ""]
    lines.append(f"- **Op:** {code(plan.name)}, kernel {code(plan.kernel)}")
    lines.append(f"- **Intent:** {md(INTENTS[plan.intent])}")
    lines.append(f"- **Verdict:** {md(v.word)}")
    for sms, sv in grouped_verdicts(per_sm):
        lines.append(f"  - {', '.join(sms)}: **{md(sv.word)}** ({md(sv.rule)})")
    lines.append(f"- **Provenance:** {provenance_line(res)}")
    lines.append("")
    lines.append(f"Generated from {code(plan_display(res))} and the results files beside this page by every "
                 f"`pytest --plan` run and by {code('python -m harness report ' + plan_display(res))}; "
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
            descr.append(f"{md(p.host)} ({md(p.gpu)}), commit {md(p.commit or '?')}, {md(p.date)}"
                         + (f", ran {md(p.cells)}" if p.cells else ""))
        parts.append(f"{sm}: " + "; ".join(dict.fromkeys(descr)))  # xdist workers of one run read alike
    missing = [sm for sm in res.plan.matrix["sm"] if sm not in res.sources]
    if missing:
        parts.append(f"{', '.join(missing)}: no results yet")
    return " · ".join(parts)


def problem_breakdown(plan: Plan) -> str:
    phases = ", ".join(plan.matrix["phase"])
    signature = f"{plan.kernel.split(':')[-1]}({', '.join(a.name for a in plan.args)})"
    writes = plan.written_args
    returns = plan.returned_outputs
    effect = []
    if writes:
        effect.append("writes " + ", ".join(code(w) for w in writes))
    if returns:
        effect.append("returns " + ", ".join(code(r) for r in returns))
    lines = ["## Problem breakdown", ""]
    if plan.description:
        lines += [md(plan.description), ""]
    lines.append(f"- **Kernel:** {code(signature)} from {code(plan.kernel)}; {'; '.join(effect) or 'no outputs'}.")
    lines.append(f"- **Reference:** {code(plan.reference)} (PyTorch eager; the numerics every cell is checked against).")
    if plan.vllm_kernel:
        kernel = VLLM_KERNELS[plan.vllm_kernel]
        lines.append(f"- **vLLM's own kernel:** {code(kernel.call)}, {code(kernel.schema)} (as vLLM 0.26.0 registers "
                     "it), called with the plan's arguments in order: the contract a replacement must match or beat.")
    elif plan.replaces:
        lines.append(f"- **Replaces:** {code(plan.replaces)} ({md(INTENTS[plan.intent])}).")
    else:
        lines.append(f"- **Replaces:** nothing in vLLM ({md(INTENTS[plan.intent])}).")
    lines.append(f"- **Target phases:** {md(phases)}.")
    return "\n".join(lines)


def _tp_answer(plan: Plan) -> str:
    sizes = ", ".join(str(t) for t in plan.matrix["tp"])
    tp = plan.tp
    if tp.kind == "trivial":
        text = "TP-trivial: every rank runs on the full, replicated inputs"
    else:
        shards = [f"{code(n)} sharded on dim {d}" + (f" ({m} merged parts)" if m > 1 else "") for n, d, m in tp.shard]
        combines = [f"{code(n)} " + (f"all-gathered on dim {d}" if how == "gather" else
                                     "all-reduced (sum)" if how == "sum" else "replicated")
                    for n, how, d in tp.combine]
        text = "sharded: " + ", ".join(shards) + ("; outputs: " + ", ".join(combines) if combines else "")
    if tp.sequence_parallel:
        text += "; sequence parallel (tokens split across ranks)"
    return f"{text}; sizes {sizes}"


def _vllm_answer(plan: Plan) -> str:
    if plan.vllm_kernel:
        return f"none: the kernel is vLLM's own {code(VLLM_KERNELS[plan.vllm_kernel].call)}, in vLLM already"
    op = vllm_op(plan)
    if plugin_route(plan) == "ir":
        how = (f"vLLM IR provider {code(provider_name(plan))} for {code('vllm.ir.ops.' + ir_op(plan))} "
               "(`register_impl`)")
    else:
        how = f"CustomOp out-of-tree subclass of {code(layer_path(plan) or '?')} (`register_oot`)"
        if op:
            how += f", enabled by {code(op.oot_flag)} in `custom_ops`"
    return f"{md(plan.vllm.target)}; {how}"


def constraints(res: Merged) -> str:
    plan = res.plan
    sizes = "; ".join(f"{md(k)} ∈ {{{', '.join(map(str, v))}}}" for k, v in plan.sizes.items()) or "none"
    n = plan.numerics
    cs = capture_sizes(plan)
    tol = ", ".join(f"{dt} atol {t.atol:g} rtol {t.rtol:g}" for dt, t in plan.tolerance.items())
    rules = [f"excluded: {md(_rule_text(r))}: {md(r.why)}" for r in plan.excludes]
    rules += [f"expected to fail: {md(_rule_text(r))}: {md(r.why)}" for r in plan.expects]
    quant = _quantization_text(plan.quantization)
    answers = [
        ["Phases", md(", ".join(plan.matrix["phase"]))],
        ["Dtypes and accumulation", md(", ".join(plan.matrix["dtype"])) + f"; accumulation in {md(plan.accumulation)}"],
        ["Quantization", md(quant)],
        ["Tensor parallelism", _tp_answer(plan)],
        ["Graph modes", md(", ".join(plan.matrix["graph_mode"])) + f"; CUDA graph capture sizes "
                        f"{'from the plan' if plan.capture_sizes else 'as vLLM'}: {cs[0]} … {cs[-1]} ({len(cs)} sizes)"],
        ["vLLM target and route", _vllm_answer(plan)],
        ["Hardware (SMs)", md(", ".join(plan.matrix["sm"]))],
        ["Reference", code(plan.reference)],
        ["Shapes", f"{sizes}; decode 1 … {n.max_num_seqs} tokens; prefill {n.prefill_tokens[0]} … "
                   f"{n.prefill_tokens[1]}; chunked prefill up to {n.max_num_batched_tokens}"],
        *([["Models the sizes come from", md("; ".join(f"{k}: {m}" for k, m in plan.benchmark.models))]]
          if plan.benchmark.models else []),
        # what is drawn, timed and dispatched to the kernel (and timed for each named baseline)
        *([["Kernel contract", _contract_text(plan.contract)]] if not plan.contract.empty else []),
        *[[f"Contract of the baseline {md(name)}", _contract_text(c)] for name, c in plan.benchmark.contracts
          if not c.empty],
        ["Tolerances", (md(tol) + " (plan); " if tol else "") + "other dtypes: vLLM's defaults"],
        ["Exclusions and expected failures", "; ".join(rules) or "none"],
    ]
    lines = ["## Constraints and assumptions", "", "The plan's answers to the integration questions:", "",
             table(answers, ["question", "answer"]), "", "What the runs detected:", ""]
    lines.append(_machines_table(res))
    lines += ["", _detected_facts(res)]
    return "\n".join(lines)


def _contract_text(contract) -> str:
    """A contract in words, with its reason and where the plan states it."""
    why = f": {contract.why}" if contract.why else ""
    return md(f"{contract.describe()}{why} (plan line {contract.line})")


def _quantization_text(q) -> str:
    """The plan's quantization in words: "none", or each quantized output with its scales and granularity."""
    outputs = getattr(q, "outputs", None)
    if outputs is None:  # plain data
        return "none" if q in ("none", None) else json.dumps(q, sort_keys=True)
    if not outputs:
        return "none"
    parts = [f"{o.output}: {o.granularity.replace('_', ' ')} scales in {o.scale}" for o in outputs]
    return "; ".join(parts) + f"; at most {q.max_step_fraction:g} of elements one quantization step off"


def _rule_text(rule) -> str:
    return " · ".join(", ".join(f"tp{v}" if axis == "tp" else str(v) for v in values) for axis, values in rule.match)


def _machines_table(res: Merged) -> str:
    runs = [run for sm in res.sources for run in res.sources[sm]]
    if not runs:
        return "No results yet: run `pytest --plan " + plan_display(res) + "` on each target machine."
    rows = []
    for run in runs:
        p = res.runs[run]
        rows.append([md(p.sm), md(p.host), md(p.gpu), fmt(p.device_count), fmt(p.cpu_count), md(p.torch or "—"),
                     md(p.triton or "—"), md(p.cuda or "—"), md(p.vllm or "not installed"), md(p.python or "—"),
                     "yes" if p.triton_interpreter else "no", md(p.commit or "—")])
    return table(rows, ["SM", "machine", "GPU / CPU", "GPUs", "CPUs", "torch", "triton", "CUDA", "vLLM", "python",
                        "Triton interpreter", "commit"])


def _detected_facts(res: Merged) -> str:
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
            if key != "token_cap":
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
        rows = [[plan.matrix["graph_mode"][g], md(key), md(value), str(n)] for (g, key, value), n in sorted(facts.items())]
        lines += ["Facts the graph-mode runners reported:", "", table(rows, ["graph mode", "fact", "value", "cells"]), ""]
    return "\n".join(lines).rstrip()


def design(plan: Plan) -> str:
    if plan.vllm_kernel:
        return "\n".join(["## High-level design", "",
                          f"Nothing plugs into vLLM: {code(VLLM_KERNELS[plan.vllm_kernel].call)} is the kernel vLLM's "
                          "own layer calls (forward_cuda, or forward_cpu on a CPU). This plan measures it the way a "
                          "replacement is measured, so a replacement's plan can be read against this page."])
    op = custom_op_name(plan)
    layer = layer_path(plan)
    layer_label = f"{layer_class(plan)} layer ({layer})" if layer else f"model layer calling {plan.name}"
    op_desc = vllm_op(plan)
    provider = provider_name(plan)
    flag = op_desc.oot_flag if op_desc else f"+{plan.vllm.custom_op or plan.name}"
    g = ["flowchart TD", f'    caller["{mm("decoder layer in the model file")}"]',
         f'    layer["{mm(layer_label)}"]']
    if plugin_route(plan) == "ir":
        g += [f'    dispatch{{"{mm("vLLM IR dispatch: vllm.ir.ops." + ir_op(plan) + ", priority per platform")}"}}',
              f'    provider["{mm("provider " + provider + " (register_impl)")}"]',
              f'    native["{mm("native provider: forward_native")}"]']
        edges = ["    caller --> layer --> dispatch",
                 f'    dispatch -->|"{mm("priority: " + provider)}"| provider --> customop',
                 f'    dispatch -->|"{mm("fallback: native")}"| native --> inductor']
    else:
        g += [f'    dispatch{{"{mm("CustomOp dispatch: custom_ops " + flag)}"}}',
              f'    provider["{mm("forward_cuda of the register_oot subclass")}"]',
              f'    native["{mm("forward_native")}"]']
        edges = ["    caller --> layer --> dispatch",
                 f'    dispatch -->|"{mm("enabled")}"| provider --> customop',
                 f'    dispatch -->|"{mm("disabled (default)")}"| native --> inductor']
    g += [f'    customop[["{mm(op + ": opaque torch.library custom op + fake")}"]]',
          f'    kernel["{mm("kernel " + plan.kernel)}"]',
          f'    inductor["{mm("Inductor: traces and fuses the native code")}"]',
          f'    dynamo["{mm("torch.compile (Dynamo): one opaque node, shapes from the fake")}"]',
          f'    cudagraph["{mm("CUDA graph: captured at the capture sizes, replayed (full for decode, piecewise for prefill)")}"]']
    g += edges + ["    customop --> kernel", "    dynamo -.-> customop", "    dynamo -.-> inductor", "    cudagraph -.-> kernel"]
    return "\n".join(["## High-level design", "",
                      f"Where {code(plan.name)} plugs into vLLM ({md(plan.vllm.target)}, route {code(plan.vllm.route)}):",
                      "", "```mermaid", *g, "```"])


def _tensor_type(plan: Plan, name: str) -> str:
    a = plan.arg(name)
    return "torch.Tensor" if a.is_tensor else type(a.value).__name__


def interfaces(plan: Plan, integration: dict) -> str:
    ns, name = plan.op_namespace, plan.name
    module, _, attr = plan.kernel.partition(":")
    kernel_fn = f"{name}_kernel"
    params = ", ".join(f"{a.name}: {_tensor_type(plan, a.name)}" for a in plan.args)
    names = [a.name for a in plan.args]
    call = ", ".join(f"{n}={n}" for n in names)
    returns = plan.returned_outputs
    ret_type = "None" if not returns else "torch.Tensor" if len(returns) == 1 else \
        f"tuple[{', '.join(['torch.Tensor'] * len(returns))}]"
    imp = f"from {module} import {attr} as {kernel_fn}" if "." not in attr else \
        f"import {module}\n{kernel_fn} = {module}.{attr}"
    if plan.vllm_kernel:  # vLLM's compiled kernel (harness.runtime.vllm_kernels loads it), called with the plan's order
        plain = ", ".join(a.name for a in plan.args)
        imp = f"def {kernel_fn}({plain}):  # vLLM's own kernel\n    torch.ops._C.{plan.vllm_kernel}({plain})"
    op_code = [
        "import torch", "", imp, "", "",
        "@torch.library.custom_op(",
        f"    {py_str(f'{ns}::{name}')},",
        f"    mutates_args={py_tuple(py_str(n) for n in plan.written_args)},",
        f"    schema={py_str(plan.schema())},",
        ")",
        f"def {name}({params}) -> {ret_type}:",
        f"    {'return ' if returns else ''}{kernel_fn}({call})",
        "", "",
    ]
    if plan.fake:
        fmod, _, fattr = plan.fake.partition(":")
        op_code += [f"from {fmod} import {fattr.split('.')[0]}", f"{name}.register_fake({fattr})"]
    elif not returns:
        op_code += [f"@{name}.register_fake", f"def _({', '.join(names)}) -> None:",
                    "    return None  # writes its arguments only: nothing to allocate"]
    else:
        rmod, _, rattr = plan.reference.partition(":")
        ref_inputs = ", ".join(f"{a.name}={a.name}" for a in plan.args if a.role != "output")
        idx = [plan.outputs.index(r) for r in returns]
        outs = ", ".join(f"torch.empty_like(ref[{i}])" for i in idx)
        op_code += [f"from {rmod} import {rattr.split('.')[0]}", "", "",
                    f"@{name}.register_fake", f"def _({', '.join(names)}):",
                    f"    ref = {rattr}({ref_inputs})  # on fake tensors: shapes and dtypes only",
                    "    ref = ref if isinstance(ref, tuple) else (ref,)",
                    f"    return {outs}"]
    lines = ["## Key interfaces", "",
             f"The kernel as an opaque {code('torch.library')} custom op, so torch.compile keeps it as one node and "
             "CUDA graphs capture its launch (schema from the plan; outputs and mutated inputs declared):", "",
             "```python", *op_code, "```", ""]
    # The vLLM registration: the plugin module the integration items load through vLLM's own plugin loader.
    lines += ["", plugin_markdown(plan, integration)]
    return "\n".join(lines)


def plugin_markdown(plan: Plan, integration: dict[str, IntegrationRecord] | None = None) -> str:
    """The plugin as the report shows it: entry point, module, how to select it, and whether it was verified."""
    why = unsupported(plan)
    if why:
        return f"No vLLM plugin: {why}.\n"
    op = vllm_op(plan)
    route = plugin_route(plan)
    lines = [f"vLLM general plugin ({'IR provider' if route == 'ir' else 'out-of-tree CustomOp'} route). "
             "Entry point, in the pyproject.toml of the package that ships the kernel:", "",
             "```toml", plugin_entry_point(plan).rstrip(), "```", "",
             f"Module `{plugin_module_name(plan)}.py`:", "", "```python", render_plugin(plan).rstrip(), "```", "",
             f"Select it in a deployment: `{enable_setting(plan)}`. (`{op.in_tree_flag}` in `custom_ops` turns on "
             f"vLLM's own kernel, `torch.ops._C.{op.in_tree}`, instead.)", ""]
    if integration is not None:
        plugin_items = {k: v for k, v in sorted(integration.items()) if k.startswith("vllm-plugin[")}
        passed = [k for k, v in plugin_items.items() if v.status == Status.PASSED]
        failed = [k for k, v in plugin_items.items() if v.status in (Status.FAILED, Status.XFAIL)]
        if failed:
            lines.append(f"Loading it through vLLM's plugin loader FAILED in {len(failed)} of {len(plugin_items)} "
                         f"items: {plugin_items[failed[0]].reason}")
        elif passed:
            lines.append(f"Verified: loaded through vLLM's plugin loader, vLLM's layer called the kernel and matched "
                         f"the reference in {len(passed)} items ({', '.join(passed)}).")
        else:
            lines.append("Not verified on any machine yet (vLLM not installed where the plan ran).")
        lines.append("")
    return "\n".join(lines)


def critical_path(plan: Plan) -> str:
    op = custom_op_name(plan)
    cs = capture_sizes(plan)
    call = f"{op}({', '.join(a.name for a in plan.args)})"
    sharded = max(plan.matrix["tp"]) > 1
    s = ["sequenceDiagram",
         f"    participant R as {mm('model runner')}",
         f"    participant G as {mm('CUDA graph / compiled model')}",
         *([f"    participant T as {mm('TP group (NCCL)')}"] if sharded else []),
         f"    participant L as {mm(layer_class(plan))}",
         f"    participant K as {mm(op)}"]

    def collectives_before():
        if not sharded:
            return []
        if plan.tp.sequence_parallel:
            return [f"    G->>T: {mm('reduce-scatter of the previous layer output (tokens split over ranks)')}"]
        if plan.tp.kind == "trivial":
            return [f"    G->>T: {mm('all-reduce of the row-parallel linear output, before the op')}",
                    f"    T-->>G: {mm('full hidden states, replicated on every rank')}"]
        shards = ", ".join(f"{n} dim {d}" for n, d, _ in plan.tp.shard)
        return [f"    Note over G,K: {mm('each rank holds its shard: ' + shards)}"]

    def collectives_after():
        if not sharded:
            return []
        out = []
        for name, how, dim in plan.tp.combine:
            if how == "gather":
                out.append(f"    G->>T: {mm(f'all-gather {name} on dim {dim}')}")
            elif how == "sum":
                out.append(f"    G->>T: {mm(f'all-reduce (sum) {name}')}")
        if plan.tp.sequence_parallel:
            out.append(f"    G->>T: {mm('all-gather of the tokens')}")
        return out

    def forward(how: str):
        return [*collectives_before(),
                f"    G->>L: {mm('forward(hidden states)')}",
                f"    L->>K: {mm(how + ': ' + call)}",
                f"    K-->>L: {mm(', '.join(plan.outputs) + ' written')}",
                f"    L-->>G: {mm('hidden states')}",
                *collectives_after()]

    s += [f"    Note over R,K: {mm(f'decode, up to {cs[-1]} tokens: full CUDA graph replay')}",
          f"    R->>G: {mm('copy inputs into static buffers, pad to the next capture size')}",
          f"    R->>G: {mm('replay')}",
          *forward("captured launch"),
          f"    G-->>R: {mm('outputs (the first num_tokens rows)')}",
          f"    Note over R,K: {mm('prefill and chunked prefill: piecewise torch.compile')}",
          f"    R->>G: {mm('run the compiled pieces (num_tokens dynamic)')}",
          *forward("opaque op call"),
          f"    G-->>R: {mm('outputs')}"]
    if not sharded:
        s.insert(len(s) - 1, f"    Note over G,K: {mm('TP 1 only: no collective')}")
    return "\n".join(["## Critical path", "", "One forward pass through the op:", "", "```mermaid", *s, "```"])


def support_matrix(res: Merged) -> str:
    plan = res.plan
    m = plan.matrix
    lines = ["## Support matrix", "", f"Legend: {LEGEND}.", ""]
    # Overview: one column per SM, in plan order.
    head = ["", *m["sm"]]
    source = ["source"]
    rows = [source]
    for sm in m["sm"]:
        if sm in res.covered:
            ps = [res.runs[r] for r in res.covered[sm]]
            source.append("; ".join(dict.fromkeys(f"{md(p.host)} ({md(p.gpu)}, {md(p.commit or '?')})" for p in ps)))
        else:
            source.append("no results from this SM yet")
    for status in (*MARKS, None):
        row = [f"{MARKS.get(status, NO_RESULT)} {status.replace('_', ' ') if status else 'no result'}"]
        for sm in m["sm"]:
            if sm not in res.covered:
                row.append(NO_RESULT)
                continue
            row.append(str(sum(1 for c in res.cells if c.sm == sm and _mark_status(res, c) == status)))
        rows.append(row)
    lines += [table(rows, head), ""]
    for sm in m["sm"]:
        lines.append(f"### {sm}")
        lines.append("")
        if sm not in res.covered:
            lines += ["No results from this SM yet.", ""]
            continue
        for tp in m["tp"]:
            rows = []
            for phase in m["phase"]:
                for dtype in m["dtype"]:
                    row = [phase, dtype]
                    for mode in m["graph_mode"]:
                        row.append(_mark(res, Cell(phase, dtype, tp, mode, sm)))
                    rows.append(row)
            lines += [f"tp{tp}:", "", table(rows, ["phase", "dtype", *m["graph_mode"]]), ""]
    lines += _failures(res)
    lines += _not_run(res)
    if res.ignored:
        records = "1 stored record" if res.ignored == 1 else f"{res.ignored} stored records"
        lines += [f"Not shown: {records} for cells, benchmarks or SMs this plan no longer has.", ""]
    return "\n".join(lines).rstrip()


def _mark_status(res: Merged, cell: Cell) -> str | None:
    s = res.status(cell)
    return s if s in MARKS else None


def _mark(res: Merged, cell: Cell) -> str:
    return MARKS.get(_mark_status(res, cell), NO_RESULT)


def _error_fields(rec: CellRecord) -> tuple[str, str]:
    err = rec.error
    return (fmt(err.max_abs), fmt(err.max_ulp)) if err else (NO_RESULT, NO_RESULT)


def _failures(res: Merged) -> list[str]:
    out = []
    failed = res.cells_with("failed")
    if failed:
        rows = []
        for c in failed:
            rec = res.records[c.id]
            max_abs, ulp = _error_fields(rec)
            rows.append([code(c.id), md(_first_line(rec.reason, 400)), max_abs, ulp,
                         md(rec.minimal_example or "—"), code(rec.repro) if rec.repro else "—"])
        out += ["Failed cells:", "", table(rows, ["cell", "reason", "max abs error", "ULP", "minimal input",
                                                  "reproduce"]), ""]
    xpass = res.cells_with("xpass")
    if xpass:
        rows = [[code(c.id), md(res.records[c.id].expectation or "—")] for c in xpass]
        out += ["Unexpected passes (the plan expects these to fail):", "",
                table(rows, ["cell", "the plan's expectation"]), ""]
    xfail = res.cells_with("xfail")
    if xfail:
        rows = []
        for c in xfail:
            rec = res.records[c.id]
            rows.append([code(c.id), md(rec.expectation or "—"), md(_first_line(rec.reason, 400)),
                         code(rec.repro) if rec.repro else "—"])
        out += ["Expected failures:", "", table(rows, ["cell", "the plan's expectation", "failure", "reproduce"]), ""]
    return out


def _grouped_reasons(res: Merged, cells: list[Cell]) -> list[tuple[str, list[Cell]]]:
    groups = defaultdict(list)
    for c in cells:
        groups[_first_line(res.records[c.id].reason or "no reason given")].append(c)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _excluded(res: Merged) -> list[tuple[str, list[Cell]]]:
    """Excluded cells by reason: the record's on SMs with results, the plan's elsewhere."""
    groups = defaultdict(list)
    for c in res.cells:
        reason = (res.records[c.id].reason if c.sm in res.covered and res.status(c) == Status.EXCLUDED
                  else res.excluded_by_plan(c) if c.sm not in res.covered else None)
        if reason is not None:
            groups[_first_line(reason or "no reason given")].append(c)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _not_run(res: Merged) -> list[str]:
    rows = []
    covered_not_run = [c for c in res.cells_with("not_run") if c.sm in res.covered]
    for reason, cells in _grouped_reasons(res, covered_not_run):
        rows.append([md(reason), str(len(cells)), md(describe(res.plan, cells))])
    missing = res.missing()
    if missing:
        rows.append(["no result recorded (sampled out, deselected with -k or -m, or the run stopped)", str(len(missing)),
                     md(describe(res.plan, missing))])
    uncovered = res.uncovered_cells()
    if uncovered:
        rows.append(["no results from this SM yet", str(len(uncovered)), md(describe(res.plan, uncovered))])
    for reason, cells in _excluded(res):
        rows.append([md(reason), str(len(cells)), md(describe(res.plan, cells))])
    if not rows:
        return []
    return ["Cells without a pass or fail, by reason:", "", table(rows, ["reason", "cells", "which"]), ""]


# ---------------------------------------------------------------- what the kernel accepts


def _range(low_high) -> str:
    low, high = low_high
    return str(low) if low == high else f"{low} … {high}"


def _seen_sizes(seen: InputsSeen) -> str:
    return "; ".join(f"{md(sym)} {_range(seen.sizes[sym])} (alignment {', '.join(map(str, seen.alignments[sym]))})"
                     for sym in sorted(seen.sizes)) or NO_RESULT


def _seen_layouts(seen: InputsSeen) -> str:
    parts = []
    for name in sorted(seen.layouts):
        text = f"{md(name)}: {', '.join(seen.layouts[name])}"
        if seen.row_strides.get(name):
            text += f" (row stride alignment {', '.join(map(str, seen.row_strides[name]))})"
        parts.append(text)
    return "; ".join(parts) or NO_RESULT


def accepted_inputs(res: Merged) -> str:
    """What the kernel accepted, per SM: the inputs of the examples that passed (each cell records them), the dtypes,
    graph modes and TP sizes of the cells that passed, then each failure with its minimal input. Titled for vLLM's own
    kernel (`op.kernel: vllm:<name>`), whose acceptances a replacement must match; "" for other kernels until a cell
    has recorded its inputs."""
    plan = res.plan
    kernel = VLLM_KERNELS[plan.vllm_kernel] if plan.vllm_kernel else None
    ran = [c for c in res.cells if res.status(c) in RAN]
    if kernel is None and not any(res.records[c.id].passing for c in ran):
        return ""
    lines = ["## What vLLM's kernel accepts" if kernel else "## Inputs seen passing", ""]
    if kernel:
        lines += [f"{code(kernel.call)} under the matrix: the inputs it computed right are what a replacement must "
                  "accept too; where it fails, a replacement may refuse the input (state it in `op.contract`) or do "
                  "better.", ""]
    alignments = ", ".join(map(str, ALIGNMENTS))
    lines += [f"From the examples that passed in each cell (drawn by hypothesis; alignment: the largest of "
              f"{alignments} dividing a size, or a row stride in elements). Dtypes, graph modes and TP sizes: of the "
              "cells that passed.", ""]
    rows = []
    for sm in plan.matrix["sm"]:
        mine = [c for c in ran if c.sm == sm]
        if not mine:
            continue
        passed = [c for c in mine if res.status(c) in (Status.PASSED, Status.XPASS)]
        seen = InputsSeen()
        for c in mine:
            if res.records[c.id].passing:
                seen = seen.merge(res.records[c.id].passing)

        def values(axis):
            return ", ".join(f"tp{v}" if axis == "tp" else str(v) for v in plan.matrix[axis]
                             if any(getattr(c, axis) == v for c in passed)) or NO_RESULT

        rows.append([sm, f"{len(passed)} of {len(mine)}", values("dtype"), values("graph_mode"), values("tp"),
                     _range(seen.num_tokens) if seen.num_tokens else NO_RESULT, _seen_sizes(seen),
                     _seen_layouts(seen), str(seen.examples)])
    if rows:
        lines += [table(rows, ["SM", "cells passed of run", "dtypes", "graph modes", "tp", "num_tokens",
                               "sizes (alignments)", "layouts", "passing examples"]), ""]
    else:
        lines += ["No cell has run yet.", ""]
    failed = [c for c in ran if res.status(c) in (Status.FAILED, Status.XFAIL)]
    if failed:
        groups = defaultdict(list)  # (reason, minimal input) -> the cells that failed so
        for c in failed:  # every distinct failure of a cell, each with its minimal input
            rec = res.records[c.id]
            for reason, example in [(rec.reason, rec.minimal_example),
                                    *((f.reason, f.minimal_example) for f in rec.more_failures or ())]:
                groups[(_first_line(reason, 300), example or NO_RESULT)].append(c)
        rows = [[md(describe(plan, cells)), str(len(cells)), md(reason), md(example)]
                for (reason, example), cells in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
        lines += ["Where it failed (each distinct failure of a cell, with its minimal input):", "",
                  table(rows, ["cells", "count", "reason", "minimal input"]), ""]
    not_run = [c for c in res.cells_with("not_run") if c.sm in res.covered]
    if not_run:
        lines += ["Not run on machines of the cells' SM:", ""]
        lines += [f"- {n_cells(len(cells))}: {md(reason)}" for reason, cells in _grouped_reasons(res, not_run)]
    return "\n".join(lines).rstrip()


# ---------------------------------------------------------------- performance


def performance(res: Merged, op_dir: Path, recs: list[Recommendation]) -> str:
    plan = res.plan
    lines = ["## Performance", ""]
    untimed = _grouped_untimed(res)
    if not res.benchmarks:
        lines.append(f"No benchmarks were run. Run them on a GPU machine: {code(f'pytest --plan {plan_display(res)} --bench')}.")
        return "\n".join(lines + (["", *untimed] if untimed else []))
    groups = defaultdict(list)
    for bid, rec in res.benchmarks:
        gpu = res.source(rec).gpu if res.source(rec) else "?"
        groups[(REGIMES.index(regime(rec.phase)), plan.matrix["sm"].index(rec.sm), str(gpu))].append((bid, rec))
    for (ri, si, gpu), items in sorted(groups.items()):
        lines += [f"### {REGIMES[ri]} on {plan.matrix['sm'][si]} ({md(gpu)})", "", *_bench_table(plan, items), ""]
    lines += ["Cells: median µs · GB/s · % of the measured copy bandwidth. Speedup: the kernel against each baseline, "
              "with its interval; \"no difference\" where the interval spans 1.", ""]
    for sm in [s for s in plan.matrix["sm"] if any(r.sm == s for _, r in res.benchmarks)]:
        if (Path(op_dir) / plot_name(sm)).exists():  # drawn by the run or `python -m harness plot`
            lines += [f"![GB/s against token count on {sm}]({plot_name(sm)})", ""]
    if untimed:
        lines += [*untimed, ""]
    lines += ["Decisions per SM, dtype, regime and vLLM profile: with Inductor the kernel is compared with the "
              "compiled reference, without it with the eager one, and in both with vLLM's kernel and every named "
              "baseline (rules: docs/report.md). Speedup: the median over the regime's shapes, with the lowest and "
              "highest bound of their intervals.", "", decision_table(recs)]
    return "\n".join(lines)


def decision_table(recs: list[Recommendation]) -> str:
    rows = [[r.sm, md(r.dtype), r.regime, r.profile, f"**{r.choice}**" if r.choice else "none",
             f"{r.speedup.text()} vs {r.baseline}" if r.speedup else NO_RESULT, r.others_text(), r.setting_text(),
             md(r.why)] for r in recs]
    return table(rows, ["SM", "dtype", "regime", "vLLM profile", "recommendation", "kernel speedup",
                        "vs vLLM's kernel and named baselines", "vLLM setting", "why"])


def _grouped_untimed(res: Merged) -> list[str]:
    """Benchmark shapes a machine skipped, by reason (the kernel's, else the first implementation's)."""
    groups = defaultdict(list)
    for bid, rec in res.untimed:
        first = rec.impls.get("kernel") or next(iter(rec.impls.values()), None)
        groups[_first_line(_why_untimed(first))].append(bid)
    if not groups:
        return []
    rows = [[md(reason), str(len(ids)), md(", ".join(ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else ""))]
            for reason, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    return ["Benchmark shapes not timed:", "", table(rows, ["reason", "shapes", "which"])]


def _bench_table(plan: Plan, items: list) -> list[str]:
    recs = [r for _, r in items]
    symbols = sorted({k for r in recs for k in r.sizes},
                     key=lambda k: (list(plan.sizes).index(k) if k in plan.sizes else len(plan.sizes), k))
    varying = [axis for axis in ("phase", "dtype", "graph_mode") if len({str(getattr(r, axis)) for r in recs}) > 1]
    fixed = [f"{axis.replace('_', ' ')} {md(getattr(recs[0], axis))}" for axis in ("phase", "dtype", "graph_mode")
             if axis not in varying]
    impls = sorted({k for r in recs for k in r.impls},
                   key=lambda n: (IMPL_ORDER.index(n) if n in IMPL_ORDER else len(IMPL_ORDER), n))
    baselines = sorted({b for r in recs for b in _baselines(r)},
                       key=lambda n: (IMPL_ORDER.index(n) if n in IMPL_ORDER else len(IMPL_ORDER), n))

    def order(item):
        bid, r = item
        return (PHASES.index(r.phase) if r.phase in PHASES else 9,
                plan.matrix["dtype"].index(r.dtype) if r.dtype in plan.matrix["dtype"] else 99,
                str(r.graph_mode), r.num_tokens if _is_num(r.num_tokens) else 0,
                [(k, str(v)) for k, v in sorted(r.sizes.items())], bid)

    rows = []
    for bid, r in sorted(items, key=order):
        row = [fmt(r.num_tokens, 12), *(fmt(r.sizes.get(k), 12) for k in symbols),
               *(md(getattr(r, a)) for a in varying)]
        for name in impls:
            row.append(_impl_cell(r.impls.get(name)))
        for b in baselines:
            row.append(_speedup_cell(r, b))
        rows.append(row)
    copy = sorted({fmt(r.copy_bw_gbps, 6) for r in recs})
    timers = sorted({md(r.timer) for r in recs if r.timer})
    note = (f"{'; '.join(fixed)}; copy bandwidth measured: {', '.join(copy)} GB/s"
            + (f"; timer: {', '.join(timers)}" if timers else "") + _l2_note(recs))
    headers = ["tokens", *symbols, *[a.replace("_", " ") for a in varying], *impls, *(f"vs {b}" for b in baselines)]
    return [note, "", table(rows, headers)]


# Eager figures are back-to-back device time; where an isolated, launch-inclusive call differs by more than
# this fraction, both are shown.
LAUNCH_GAP = 0.03


def _l2_note(recs: list[BenchRecord]) -> str:
    """Whether the timed calls started with their data out of L2: their rotated input sets together exceed twice
    the L2 size, or (decode-sized calls, whose sets the harness caps) fit in it."""
    known = [r for r in recs if r.l2_bytes and r.working_set_bytes and r.rotated_sets]
    warm = [r for r in known if r.working_set_bytes * r.rotated_sets <= 2 * r.l2_bytes]
    if not warm:
        return "; L2 cold" if known else ""
    return (f"; L2 cold except at {len(warm)} of {len(known)} items, whose rotated input sets fit in twice the L2 "
            f"size (up to {max(r.num_tokens for r in warm)} tokens): those calls find part of their data in L2")


def _impl_cell(impl: ImplFigures | None) -> str:
    if impl is None:
        return NO_RESULT
    if _median(impl) is None:
        return f"not run: {md(_why_untimed(impl))}"
    gbps = f"{impl.gbps:.0f}" if _is_num(impl.gbps) else NO_RESULT
    text = f"{fmt_us(impl.median_us)} µs · {gbps} GB/s · {fmt(impl.pct_copy_bw, 3)}%"
    if _is_num(impl.launch_us) and abs(impl.launch_us / impl.median_us - 1) > LAUNCH_GAP:
        # The two measure different things; where they differ, one figure would mislead (docs/report.md).
        text = (f"{fmt_us(impl.median_us)} µs back-to-back · {fmt_us(impl.launch_us)} µs launch-inclusive · "
                f"{gbps} GB/s · {fmt(impl.pct_copy_bw, 3)}%")
    if _is_num(impl.tflops):
        text += f" · {fmt(impl.tflops, 3)} TFLOP/s"
    if impl.error:
        text += f" · ❌ {md(_first_line(impl.error, 160))}"
    if impl.differs:
        text += f" · ⚠️ differs from the reference: {md(_first_line(impl.differs, 160))}"
    return text


def _speedup_cell(rec: dict, baseline: str) -> str:
    verdict_ = speedup_verdict(rec, baseline)
    if verdict_ is None:
        return NO_RESULT
    s = rec.speedup.get(baseline)
    impls = rec.impls
    ratio = s.value if s is not None and _is_num(s.value) else _median(impls[baseline]) / _median(impls["kernel"])
    value = f"{ratio:.2f}×"
    interval = f" ({s.low:.2f}–{s.high:.2f})" if s is not None and _is_num(s.low) and _is_num(s.high) else ""
    return f"no difference: {value}{interval}" if verdict_ == "no difference" else f"{value}{interval}"


def plot_name(sm: str) -> str:
    """The file harness.rendering.plots draws for an SM, beside PLAN.md."""
    return f"perf-{re.sub(r'[^A-Za-z0-9_]+', '-', sm)}.png"


# ---------------------------------------------------------------- trade-offs, open items, decisions


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
    else:
        items.append("CustomOp route: `register_oot` replaces the layer class for every model, and the op then "
                     "carries the layer's name in `custom_ops`.")
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
    pd = plan_display(res)
    items = []
    for problem in res.shown_problems():
        items.append(f"Fix or remove a results file: {md(problem)}")
    if plan.vllm_kernel and res.cells_with("failed"):  # vLLM's kernel is not ours to fix: its failures are findings
        items.append(f"For a replacement: accept or refuse (`op.contract`) the inputs vLLM's kernel fails on in "
                     f"{n_cells(len(res.cells_with('failed')))} (What vLLM's kernel accepts)")
    for reason, cells in [] if plan.vllm_kernel else _grouped_reasons(res, res.cells_with("failed")):
        items.append(f"Fix {md(describe(plan, cells))}: {md(reason)}")
    for c in res.cells_with("xpass"):
        items.append(f"{code(c.id)} passes although the plan expects a failure: drop or narrow the expectation "
                     f"({md(res.records[c.id].expectation or '—')})")
    for sm in plan.matrix["sm"]:
        n = sum(1 for c in res.uncovered_cells() if c.sm == sm)
        if n:
            where = " and vLLM's kernels (an installed vLLM, or --vllm-ops-library)" if plan.vllm_kernel else ""
            items.append(f"Run on {sm}: {code(f'pytest --plan {pd}')} on a machine with {sm}{where} ({n_cells(n)})")
    covered_not_run = [c for c in res.cells_with("not_run") if c.sm in res.covered]
    for reason, cells in _grouped_reasons(res, covered_not_run):
        items.append(f"Run {md(describe(plan, cells))} ({n_cells(len(cells))}): not run because {md(reason)}")
    if res.missing():
        items.append(f"Run {md(describe(plan, res.missing()))}: no result recorded yet")
    for reason, cells in _grouped_reasons(res, res.cells_with("xfail")):
        items.append(f"Fix the expected failure of {md(describe(plan, cells))}: {md(reason)}")
    for reason, cells in _excluded(res):
        items.append(f"State as unsupported, or support, {md(describe(plan, cells))}: {md(reason)}")
    for bid, rec in res.benchmarks:
        for impl, t in sorted(rec.impls.items()):
            if t.error:
                items.append(f"Fix {md(impl)} in benchmark {code(bid)}: {md(_first_line(t.error))}")
            if t.differs:
                items.append(f"Check that {md(impl)}'s outputs are acceptable (benchmark {code(bid)}; its timing is "
                             f"used): {md(_first_line(t.differs))}")
    if not res.benchmarks:
        items.append(f"Benchmark on a GPU machine: {code(f'pytest --plan {pd} --bench')}")
    else:
        have = {(r.sm, r.dtype, r.regime) for r in recs if r.choice}
        for sm in [s for s in plan.matrix["sm"] if s != "cpu"]:
            wanted = _wanted(res, sm)
            missing = [(d, reg) for d, reg in wanted if (sm, d, reg) not in have]
            if not missing:
                continue
            if len(missing) == len(wanted):
                what = "every dtype and regime"
            else:
                what = "; ".join(f"{reg} {', '.join(d for d, g in missing if g == reg)}"
                                 for reg in REGIMES if any(g == reg for _, g in missing))
            items.append(f"Benchmark on {sm} ({what}): {code(f'pytest --plan {pd} --bench')}")
    return items


def decisions(res: Merged, v: Verdict, recs: list[Recommendation], per_sm: list[SmVerdict]) -> str:
    plan = res.plan

    def tally(**axis) -> str:
        cells = [c for c in res.cells if all(getattr(c, k) == val for k, val in axis.items())]
        counts = Counter(_mark_status(res, c) if c.sm in res.covered else
                         "excluded" if res.excluded_by_plan(c) else "uncovered" for c in cells)
        parts = [f"{counts[s]} {s.replace('_', ' ')}" for s in MARKS if counts[s]]
        if counts[None]:
            parts.append(f"{counts[None]} without a result")
        if counts["uncovered"]:
            parts.append(f"{counts['uncovered']} on SMs without results")
        return f"{len(cells)} cells: " + ", ".join(parts)

    rows = [["integration route", _vllm_answer(plan), "plan: vllm"]]
    if "torch_compile" in plan.matrix["graph_mode"]:
        rows.append(["torch.compile", f"opaque {code(custom_op_name(plan))} with a fake implementation",
                     md("torch_compile " + tally(graph_mode="torch_compile"))])
    if "cuda_graph" in plan.matrix["graph_mode"]:
        rows.append(["CUDA graphs", "launch captured with the model; batches padded to capture sizes",
                     md("cuda_graph " + tally(graph_mode="cuda_graph"))])
    rows.append(["tensor parallelism", _tp_answer(plan), "; ".join(f"tp{t} " + tally(tp=t) for t in plan.matrix["tp"])])
    for r in recs:
        basis = [f"{r.speedup.text()} vs {r.baseline}"] if r.speedup else []
        if r.others:
            basis.append(f"vs vLLM's kernel and named baselines: {r.others_text()}")
        if r.setting:
            basis.append(f"setting: {r.setting_text()}")
        basis.append(md(r.why))
        rows.append([f"{r.regime} {md(r.dtype)} on {r.sm}, {r.profile}", f"**{r.choice}**" if r.choice else "none",
                     "; ".join(basis)])
    for sms, sv in grouped_verdicts(per_sm):
        rows.append([f"verdict on {', '.join(sms)}", f"**{md(sv.word)}**", md(sv.rule)])
    return "\n".join(["## Decisions and verdict", "", table(rows, ["decision", "choice", "basis"]), "",
                      f"**Verdict: {md(v.word)}.** The rules, per SM and in order: blocked (a failed or "
                      "unexpected-pass cell on that SM), no results (no machine of that SM has run the plan), numerics "
                      "only (a CPU machine: the kernel runs in Triton's interpreter, so no speed verdict), incomplete "
                      "(a cell of that SM not run, or a dtype and regime without a benchmark decision), then go or "
                      "no-go per regime: go where a decision, with Inductor or without it, is to enable the custom op "
                      "(docs/report.md)."])


# ---------------------------------------------------------------- the document


def render(plan: Plan, op_dir: Path) -> tuple[str, list[str]]:
    res = collect(plan, op_dir)
    recs = recommendations(res)
    per_sm = sm_verdicts(res, recs)
    v = verdict(res, recs, per_sm)
    items = open_items(res, recs)
    accepted = accepted_inputs(res)
    sections = [
        header(res, v, per_sm),
        problem_breakdown(plan),
        constraints(res),
        design(plan),
        interfaces(plan, res.integration),
        critical_path(plan),
        support_matrix(res),
        *([accepted] if accepted else []),  # what the kernel accepts, where the cells recorded it
        performance(res, op_dir, recs),
        tradeoffs(res, recs),
        "\n".join(["## Open items", "", *(f"- [ ] {i}" for i in items)] if items else ["## Open items", "", "None."]),
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
