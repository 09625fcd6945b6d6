"""The kernel against its baselines, from the benchmark records: valid timings, the speedup at one shape with its
interval (both q20/q80 spreads, widened by the run-to-run noise floor), and the interval over a regime's shapes.
Plain Python."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from harness.decisions.bounds import broken_timing
from harness.results.store import BenchRecord, ImplFigures, finite_number
from harness.plan.implementations import BUILTIN, COMPILED, NATIVE, function_of
from harness.plan.model import Plan

REGIMES = ("decode-sized", "prefill-sized")
# Run-to-run drift seen on one GPU beyond a single run's q20/q80 spread; speedups inside it are noise: every
# speedup interval is widened by it.
NOISE_FLOOR = 0.02
IMPL_ORDER = ("kernel", *BUILTIN)


def regime(phase: str) -> str:
    return "decode-sized" if phase == "decode" else "prefill-sized"


def impl_order(name: str) -> tuple:
    """The kernel, then the plan's references, then vLLM's kernel, then named baselines by name."""
    return (IMPL_ORDER.index(name) if name in IMPL_ORDER else len(IMPL_ORDER), name)


def median(impl: ImplFigures | None) -> float | None:
    return impl.median_us if impl is not None and impl.timed else None


def valid(impl: ImplFigures | None) -> bool:
    """Timed, with a positive median, and right after timing."""
    return median(impl) is not None and impl.median_us > 0 and not impl.error


def timed_function(plan: Plan, rec: BenchRecord, name: str) -> str | None:
    """The import path a record's baseline timed: as recorded, else (results from before baselines recorded it) the
    reference for native and compiled; None for other baselines of such results."""
    recorded = (rec.timed_functions or {}).get(name)
    if recorded is None and name in (NATIVE, COMPILED):
        return plan.op.reference
    return recorded


def plan_function(plan: Plan, name: str) -> str | None:
    """What the plan says a baseline times now (None: not a baseline with an import path)."""
    return plan.native_path if name in (NATIVE, COMPILED) else function_of(plan, name)


def stale(plan: Plan, rec: BenchRecord, name: str) -> str:
    """Why a baseline's figure is not the plan's baseline now ("" where it is): it timed another function, e.g. the
    reference (the accuracy oracle) where the plan now names op.native, what vLLM runs."""
    timed, wanted = timed_function(plan, rec, name), plan_function(plan, name)
    if timed is None or wanted is None or timed == wanted:
        return ""
    now = f"op.native ({wanted})" if plan.op.native and wanted == plan.op.native else wanted
    return f"{_timed_on(plan, timed)}, not on {now}"


def _timed_on(plan: Plan, timed: str) -> str:
    return f"timed on {'the reference (the accuracy oracle)' if timed == plan.op.reference else timed}"


@dataclass(frozen=True)
class Unused:
    """Why decisions leave one implementation's figure at a shape out: in full (decisions and open items give it)
    and in the few words a table cell holds."""

    why: str
    short: str


def not_used(plan: Plan, rec: BenchRecord, name: str) -> Unused | None:
    """Why decisions leave one implementation's figure at a shape out (None where they use it): timed faster than its
    bound, a timing the run found broken, or (a baseline) timed on another function than the plan's (`stale`)."""
    impl = rec.impls.get(name)
    if impl is None or median(impl) is None:
        return None
    broken = broken_timing(rec, impl)
    if broken:
        return Unused(broken, "broken timing (faster than its bound)")
    why = "" if name == "kernel" else stale(plan, rec, name)
    return Unused(why, _timed_on(plan, timed_function(plan, rec, name))) if why else None


def usable(plan: Plan, rec: BenchRecord) -> BenchRecord:
    """The record as decisions may use it: a figure they leave out (`not_used`) is not timed there, with why; a
    kernel's has an error."""
    impls = dict(rec.impls)
    for name, impl in rec.impls.items():
        unused = not_used(plan, rec, name)
        if unused is None or impl.error:
            continue
        why = unused.why
        if name == "kernel":
            impls[name] = dataclasses.replace(impl, error=why)
        else:
            impls[name] = ImplFigures(not_run=why)
    return dataclasses.replace(rec, impls=impls)


def baselines(rec: BenchRecord) -> list[str]:
    """What the kernel was compared with at one shape, in IMPL_ORDER."""
    return sorted((n for n in rec.impls if n != "kernel"), key=impl_order)


def why_untimed(impl: ImplFigures | None) -> str:
    if impl is None:
        return "no figures recorded"
    return str(impl.not_run or impl.error or "no figures recorded")


@dataclass(frozen=True)
class ShapeSpeedup:
    """The kernel against one baseline at one shape: faster, slower or no difference (its interval spans 1), the
    ratio of the medians and its interval."""

    verdict: str
    value: float
    low: float
    high: float


def spread(slow: ImplFigures, fast: ImplFigures) -> tuple[float, float, float]:
    """slow's time over fast's (> 1: `fast` is faster), with an interval from both q20/q80 spreads, at least
    +-NOISE_FLOOR around the value."""
    value = slow.median_us / fast.median_us
    ok = finite_number
    low = slow.q20_us / fast.q80_us if ok(slow.q20_us) and ok(fast.q80_us) and fast.q80_us > 0 else value
    high = slow.q80_us / fast.q20_us if ok(slow.q80_us) and ok(fast.q20_us) and fast.q20_us > 0 else value
    return value, min(low, value / (1 + NOISE_FLOOR)), max(high, value * (1 + NOISE_FLOOR))


def shape_speedup(rec: BenchRecord, baseline: str) -> ShapeSpeedup | None:
    """The kernel's speedup over one baseline at one shape (None: either was not timed)."""
    kernel, base = rec.impls.get("kernel"), rec.impls.get(baseline)
    if median(kernel) is None or median(base) is None or kernel.median_us <= 0 or base.median_us <= 0:
        return None
    value, low, high = spread(base, kernel)
    return ShapeSpeedup("faster" if low > 1 else "slower" if high < 1 else "no difference", value, low, high)


def ratio(rec: BenchRecord, baseline: str) -> tuple[float, float, float] | None:
    """The kernel's speedup over one baseline at one shape, (value, low, high); None where either has no valid
    timing."""
    kernel, base = rec.impls.get("kernel"), rec.impls.get(baseline)
    return spread(base, kernel) if valid(kernel) and valid(base) else None


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
