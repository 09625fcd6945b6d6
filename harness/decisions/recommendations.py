"""The decision per SM × dtype × regime × vLLM profile (Inductor on / off): enable the custom op, leave the layer to
Inductor or to its native code, keep vLLM's kernel, or leave it to a named baseline a deployment can run, by the rules
of docs/report.md; for a plan naming what vLLM runs in the kernel's place in every profile (its `default`
implementation, vLLM's own attention backend), enable the kernel or keep that. Plain Python, no Markdown."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from harness.decisions.bounds import CHECK_SPEEDUP, FAR_PCT, WEAK_PCT, far_from_limit, weak_baseline
from harness.decisions.reasons import first_line
from harness.decisions.speedups import REGIMES, Interval, baselines, impl_order, interval, ratio, regime, spread, \
    usable, valid, why_untimed
from harness.results.merge import Merged
from harness.plan.implementations import COMPILED, KINDS, NATIVE as NATIVE_IMPL, VLLM, keep, title
from harness.cells.hardware import Hardware
from harness.cells.matrix import Cell, bench_graph_modes, decide
from harness.vllm_facts.names import ROUTE_KINDS, VLLM_DEFAULT, is_vllm_default, profile_setting

# The choices: the kernel, or what each built-in implementation's kind says where it stays (harness.plan.
# implementations.KINDS: "leave it to Inductor", "keep native", "keep vLLM's kernel").
ENABLE = "enable the custom op"
INDUCTOR, NATIVE, KEEP_VLLM = (keep(name) for name in (COMPILED, NATIVE_IMPL, VLLM))
# vLLM's two profiles and the baseline each compares with: Inductor compiles forward_native, or nothing does
# (`profiles`: a plan's `default` implementation in both instead).
VLLM_PROFILES = (("Inductor on", "compiled"), ("Inductor off", "native"))
FALLBACK = {"compiled": INDUCTOR, "native": NATIVE}  # the choice where neither kernel qualifies


@dataclass(frozen=True)
class Recommendation:
    """The decision for one SM × dtype × regime × vLLM profile."""

    sm: str
    dtype: str
    regime: str
    profile: str  # VLLM_PROFILES: "Inductor on" (against compiled) or "Inductor off" (against native)
    # ENABLE / INDUCTOR / NATIVE / KEEP_VLLM / "leave it to <named baseline>" / "keep <the plan's default>", or ""
    # when the runs cannot say
    choice: str
    why: str
    baseline: str = ""  # the profile's: compiled, native, or the plan's default implementation (`profiles`)
    speedup: Interval | None = None  # the kernel against the profile's baseline
    others: tuple = ()  # (name, Interval or None, why not timed) for vLLM's kernel and every named baseline
    setting: str = ""  # the vLLM setting that applies the choice
    default: bool = False  # the setting is what vLLM does in this profile anyway
    gpus: tuple[str, ...] = ()  # the GPUs whose timings it rests on
    sizes: tuple = ()  # the benchmarked sizes, each as sorted (symbol, value) pairs
    # A big win over a weak baseline: a question about the baseline before it is a result (harness.decisions.bounds)
    check_baseline: str = ""
    far_from_limit: str = ""  # an enabled kernel under half its bound somewhere: what is left to gain
    stale: str = ""  # benchmarks timed by other checks than the current code's and plan's (Merged.stale_checks)

    @property
    def go(self) -> bool:
        return self.choice == ENABLE


def _use(choice: str) -> str:
    return {ENABLE: "kernel", KEEP_VLLM: VLLM}.get(choice, NATIVE_IMPL)


def profiles(plan) -> tuple[tuple[str, str], ...]:
    """vLLM's profiles, each with the baseline its decisions weigh the kernel against: VLLM_PROFILES's, or, where the
    plan names what vLLM runs in the kernel's place whatever the profile (its default implementation), that in
    both."""
    name = plan.default_implementation
    return VLLM_PROFILES if name is None else tuple((profile, name) for profile, _ in VLLM_PROFILES)


def fallback(plan, baseline: str) -> tuple[str, str | None]:
    """The choice where neither the kernel nor another implementation qualifies: the profile's baseline kept; and its
    setting (None: the profile's own, harness.vllm_facts.names.profile_setting). The plan's default implementation
    is kept with its `setting`, else as vLLM's default (vLLM runs it in the kernel's place)."""
    if baseline in FALLBACK:
        return FALLBACK[baseline], None
    e = plan.implementation(baseline)
    return keep(baseline, e), e.setting or VLLM_DEFAULT


def choice_words(plan, choice: str) -> str:
    """A choice as a page says it: ENABLE in the words of the plan's route ("enable the custom backend" for an
    attention backend, which is selected, not a custom op); the choice compared stays ENABLE."""
    route = ROUTE_KINDS.get(plan.vllm.route) if plan.vllm.route else None
    return route.enable if choice == ENABLE and route is not None and route.enable else choice


def _groups(res: Merged) -> list[tuple[str, str, str, list]]:
    """The plan's usable benchmark records by (SM, dtype, regime), in plan order."""
    plan = res.plan
    dtypes = list(plan.matrix["dtype"])
    groups = defaultdict(list)
    for _, raw in res.benchmarks:
        rec = usable(plan, raw)  # stale baselines and timings faster than their bound left out, with why
        dtype_key = (dtypes.index(rec.dtype), "") if rec.dtype in dtypes else (len(dtypes), str(rec.dtype))
        groups[(plan.matrix["sm"].index(rec.sm), dtype_key, REGIMES.index(regime(rec.phase)))].append(rec)
    return [(plan.matrix["sm"][si], recs[0].dtype, REGIMES[ri], recs) for (si, _, ri), recs in sorted(groups.items())]


def recommendations(res: Merged) -> list[Recommendation]:
    """One decision per SM × dtype × regime × profile with benchmarks, in plan order."""
    return [_decide(res, sm, dtype, reg, profile, baseline, recs)
            for sm, dtype, reg, recs in _groups(res) for profile, baseline in profiles(res.plan)]


def vllm_kernel_recommendations(res: Merged) -> list[Recommendation]:
    """vLLM's own kernel for the op (the plan's `vllm` baseline) decided as a kernel is, per SM × dtype × regime ×
    profile: enabled where it is faster than the profile's baseline at every shape both were timed, else the
    profile's fallback. Seed 002's question: should vLLM turn its kernel on by default there (harness.plan.
    vllm_defaults says whether it does)."""
    out = []
    for sm, dtype, reg, recs in _groups(res):
        if sm == "cpu":  # a CPU machine's timings are not a measure of speed
            continue
        gpus = tuple(sorted({str(res.source(r).gpu) for r in recs if res.source(r)}))
        for profile, baseline in profiles(res.plan):
            speed = _against(recs, baseline, VLLM)
            if speed is None:
                why = f"vllm and {baseline} not both timed: {first_line(why_untimed(recs[0].impls.get(VLLM)), 120)}"
                out.append(Recommendation(sm, dtype, reg, profile, "", why, baseline, gpus=gpus))
                continue
            at = f"at all {speed.shapes} shapes" if speed.shapes > 1 else "at the one shape"
            choice = ENABLE if speed.wholly_faster else fallback(res.plan, baseline)[0]
            why = f"faster than {baseline} {at}" if speed.wholly_faster else \
                f"not faster than {baseline} at {speed.shapes - speed.faster} of {speed.shapes} shapes"
            out.append(Recommendation(sm, dtype, reg, profile, choice, why, baseline, speed, gpus=gpus))
    return out


def _decide(res: Merged, sm: str, dtype: str, reg: str, profile: str, baseline: str, recs: list) -> Recommendation:
    plan = res.plan
    inductor = profile == VLLM_PROFILES[0][0]
    gpus = tuple(sorted({str(res.source(r).gpu) for r in recs if res.source(r)}))
    sizes = tuple(sorted({tuple(sorted((str(k), v) for k, v in r.sizes.items())) for r in recs}, key=str))
    stale = sorted({res.stale_checks(r) for r in recs} - {""})
    stale_text = (f"stale: {sum(1 for r in recs if res.stale_checks(r))} of {len(recs)} benchmarks "
                  f"{'; '.join(stale)}: re-run them" if stale else "")

    def made(choice: str, why: str, speedup=None, others=(), timed=(), setting=None) -> Recommendation:
        # a named baseline's setting is the plan's words for a deployment, not one of vLLM's layer settings
        default = bool(choice) and setting is None and is_vllm_default(inductor, _use(choice))
        if setting is None:
            setting = profile_setting(plan, inductor, _use(choice)) if choice else ""
        far = _far_from_limit(timed) if choice == ENABLE else ""
        return Recommendation(sm, dtype, reg, profile, choice, why, baseline, speedup, tuple(others), setting,
                              default, gpus, sizes, _check_baseline(timed), far, stale_text)

    if sm == "cpu" or any(res.source(r) and res.source(r).triton_interpreter for r in recs):
        return made("", "timed on a CPU machine, where the kernel runs in Triton's interpreter: not a measure of "
                        "speed")
    failed = [r for r in recs if r.impls.get("kernel") is not None and r.impls["kernel"].error]
    if failed:
        return made("", f"the kernel failed at {len(failed)} of {len(recs)} shapes: "
                        f"{first_line(failed[0].impls['kernel'].error, 160)}")
    timed = [r for r in recs if valid(r.impls.get("kernel"))]
    if not timed:
        why = first_line(why_untimed(recs[0].impls.get("kernel")), 160)
        return made("", f"the kernel has no valid timing: {why}")
    speed = interval(ratio(r, baseline) for r in timed)
    if speed is None:
        return made("", f"{baseline} was not timed: {first_line(why_untimed(timed[0].impls.get(baseline)), 160)}")
    names = sorted({n for r in timed for n in baselines(r)} - {NATIVE_IMPL, COMPILED, baseline}, key=impl_order)
    others = []
    for name in names:
        iv = interval(ratio(r, name) for r in timed)
        why = "" if iv else next((why_untimed(r.impls.get(name)) for r in timed), "no figures recorded")
        others.append((name, iv, why))
    untimed = [f"{name} ({first_line(why, 80)})" for name, iv, why in others if iv is None]
    slower_than = [(name, iv) for name, iv, _ in others if iv is not None and iv.slower]
    at = f"at all {speed.shapes} shapes" if speed.shapes > 1 else "at the one shape"
    if speed.wholly_faster and not slower_than:
        compared = [name for name, iv, _ in others if iv is not None]
        why = f"faster than {baseline} {at}"
        if compared:
            why += f"; not slower than {', '.join(compared)} at any shape"
        if untimed:
            why += f"; not timed: {', '.join(untimed)}"
        return made(ENABLE, why, speed, others, timed)
    reasons = []
    if not speed.wholly_faster:
        reasons.append(f"not faster than {baseline} at {speed.shapes - speed.faster} of {speed.shapes} shapes")
    reasons += [f"slower than {name} at {iv.slower} of {iv.shapes} shapes" for name, iv in slower_than]
    # What a deployment can run instead: vLLM's kernel, or a named baseline whose setting the plan states, where
    # it is faster than the profile's baseline at every shape the kernel and that baseline were timed; the fastest.
    pairs = [r for r in timed if valid(r.impls.get(baseline))]
    better = []
    for name in sorted(deployable(plan), key=impl_order):
        vs = _against(pairs, baseline, name)
        if vs is not None and vs.shapes == len(pairs) and vs.wholly_faster:
            better.append((vs.median, name, vs))
    if better:
        _, name, vs = max(better)
        e = plan.implementation(name)
        return made(keep(name, e), "; ".join(reasons) + f"; {title(name, e)} is faster than {baseline} {at} "
                    f"({vs.text()})", speed, others, timed, setting=e.setting)
    choice, setting = fallback(plan, baseline)
    return made(choice, "; ".join(reasons), speed, others, timed, setting=setting)


def deployable(plan) -> list[str]:
    """The implementations a deployment can run in the kernel's place, other than the profiles' baselines: one vLLM
    switches on itself, or one whose setting the plan states."""
    return [name for name in plan.baselines if name not in (*FALLBACK, plan.default_implementation)
            and (KINDS[plan.implementation(name).kind].switched_by_vllm or plan.implementation(name).setting)]


def _against(recs: list, baseline: str, name: str) -> Interval | None:
    """One implementation's speedup over the profile's baseline, over the shapes where both were timed."""
    return interval(spread(r.impls[baseline], r.impls[name]) for r in recs
                    if valid(r.impls.get(name)) and valid(r.impls.get(baseline)))


def _check_baseline(timed: list) -> str:
    """"check the baseline" where, at some shape, the kernel is over CHECK_SPEEDUP x faster than the fastest baseline
    timed there and that baseline reaches under WEAK_PCT % of its bound ("" where nowhere)."""
    flagged = []
    for rec in timed:
        kernel = rec.impls["kernel"]
        timed_baselines = [n for n in baselines(rec) if valid(rec.impls.get(n))]
        if not timed_baselines:
            continue
        best = min(timed_baselines, key=lambda n: (rec.impls[n].median_us, impl_order(n)))
        speedup = rec.impls[best].median_us / kernel.median_us
        pct = weak_baseline(rec, speedup, best)
        if pct is not None:
            flagged.append((best, speedup, pct))
    if not flagged:
        return ""
    names = ", ".join(sorted({name for name, _, _ in flagged}, key=impl_order))
    return (f"check the baseline: at {len(flagged)} of {len(timed)} shapes the kernel is over {CHECK_SPEEDUP:g}× "
            f"faster (up to {max(s for _, s, _ in flagged):.1f}×) than the fastest baseline timed there ({names}), "
            f"which reaches under {WEAK_PCT:.0f}% of its bound (at most {max(p for _, _, p in flagged):.0f}%): a "
            "baseline that slow is a question before it is a result")


def _far_from_limit(timed: list) -> str:
    """"far from the hardware limit" where the kernel reaches under FAR_PCT % of its bound at some shape."""
    far = far_from_limit(timed)
    if far is None:
        return ""
    n, low, high = far
    return (f"far from the hardware limit: the kernel reaches {low:.0f}–{high:.0f}% of its bound, under "
            f"{FAR_PCT:.0f}% at {n} of {len(timed)} shapes")


def wanted(res: Merged, sm: str) -> list[tuple[str, str]]:
    """(dtype, regime) pairs the plan's benchmarks time on an SM: not excluded, not expected to fail, runnable on
    one GPU of that SM."""
    plan = res.plan
    hw = Hardware(sm, "cpu" if sm == "cpu" else "cuda", sm, 0 if sm == "cpu" else 1, 1)
    out = []
    for dtype in plan.matrix["dtype"]:
        for reg in REGIMES:
            cells = [Cell(p, dtype, 1, m, sm) for p in plan.benchmark.shapes() if regime(p) == reg
                     for m in bench_graph_modes(plan)]
            if any(decide(plan, c, hw, 1).status is None for c in cells):  # runs, not expected to fail
                out.append((dtype, reg))
    return out


def undecided(res: Merged, sm: str, recs: list[Recommendation]) -> list[tuple[str, str]]:
    """The (dtype, regime) pairs an SM's benchmarks should time (`wanted`) that no recommendation decides yet."""
    have = {(r.dtype, r.regime) for r in recs if r.sm == sm and r.choice}
    return [pair for pair in wanted(res, sm) if pair not in have]


def pairs_text(pairs: list[tuple[str, str]]) -> str:
    """(dtype, regime) pairs by regime: "decode-sized bf16, fp16; prefill-sized bf16"."""
    return "; ".join(f"{reg} {', '.join(d for d, g in pairs if g == reg)}" for reg in REGIMES
                     if any(g == reg for _, g in pairs))


def against_default(default_on: bool, decided: list[Recommendation]) -> list[Recommendation]:
    """The decisions that turn vLLM's own kernel the other way than vLLM's default does (on where it is off, or
    off where it is on): seed 002's question, whether vLLM's default is right on this platform and profile."""
    return [r for r in decided if (r.choice == ENABLE) != default_on]
