"""Every figure beside its physical bound: what one call at a shape cannot beat on the machine that timed it, the
share of it each implementation reaches, a timing faster than it (broken), a big win over a weak baseline ("check
the baseline") and a kernel far from the hardware limit. The rules of docs/report.md. Plain Python, no Markdown.

The bound of one call is the largest of: its bytes (the plan's byte model) over the copy bandwidth, its flops (the
plan's flop model) over the dtype's dense matrix-multiply peak, and the launch floor (an empty kernel under the
same timer), each measured in the same run (harness.runtime.timing). A timing is broken only beyond the bytes at
the read bandwidth, where that is the higher: a call that mostly reads can beat a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.results.store import BenchRecord, ImplFigures, finite_number

# A figure may beat its bound by this much before its timing counts as broken: the timer's run-to-run noise.
BOUND_SLACK = 0.03
# "check the baseline": the kernel over CHECK_SPEEDUP times faster than the best baseline, which reaches under
# WEAK_PCT % of its bound.
CHECK_SPEEDUP, WEAK_PCT = 3.0, 50.0
# "far from the hardware limit": an enabled kernel under FAR_PCT % of its bound.
FAR_PCT = 50.0
COPY, PEAK, LAUNCH = "copy bandwidth", "matrix-multiply peak", "launch floor"


def physical_bound(nbytes: float | None, bandwidth_gbps: float | None, flops: float | None,
                   peak_tflops: float | None, launch_floor_us: float | None) -> tuple[float | None, str | None]:
    """(µs, which limit) of one call: the largest of bytes / the bandwidth, flops / peak, the launch floor; (None,
    None) where none of them was measured."""
    terms = []
    if finite_number(nbytes) and finite_number(bandwidth_gbps) and bandwidth_gbps > 0:
        terms.append((nbytes / (bandwidth_gbps * 1e9) * 1e6, COPY))
    if finite_number(flops) and finite_number(peak_tflops) and peak_tflops > 0:
        terms.append((flops / (peak_tflops * 1e12) * 1e6, PEAK))
    if finite_number(launch_floor_us) and launch_floor_us > 0:
        terms.append((launch_floor_us, LAUNCH))
    if not terms:
        return None, None
    us, which = max(terms)
    return us, which


def bound(rec: BenchRecord) -> tuple[float | None, str | None]:
    """(µs, which limit) of the record's call, from what its run measured. (None, None) where the run measured no
    launch floor: a CPU machine, whose host clock times only native against compiled, measures no bound."""
    if not finite_number(rec.launch_floor_us):
        return None, None
    return physical_bound(rec.bytes, rec.copy_bw_gbps, rec.flops, rec.peak_tflops, rec.launch_floor_us)


@dataclass(frozen=True)
class Throughput:
    """What one timing reaches: bytes per second (the plan's byte model), its share of the copy bandwidth, flops per
    second (where the plan has a flop model) and its share of the call's bound (100: as fast as the hardware
    allows; None where a term was not measured)."""

    gbps: float | None = None
    pct_copy_bw: float | None = None
    tflops: float | None = None
    pct_of_bound: float | None = None


def throughput(rec: BenchRecord, impl: ImplFigures | None) -> Throughput:
    if impl is None or not impl.timed or impl.median_us <= 0:
        return Throughput()
    seconds = impl.median_us * 1e-6
    gbps = rec.bytes / seconds / 1e9 if finite_number(rec.bytes) else None
    ok_bw = gbps is not None and finite_number(rec.copy_bw_gbps) and rec.copy_bw_gbps > 0
    us = bound(rec)[0]
    return Throughput(gbps, 100 * gbps / rec.copy_bw_gbps if ok_bw else None,
                      rec.flops / seconds / 1e12 if finite_number(rec.flops) else None,
                      100 * us / impl.median_us if us is not None else None)


def fastest_possible_us(rec: BenchRecord) -> float | None:
    """The time no correct timing of this record's call beats: its bound, with the bytes at the measured read
    bandwidth where that is above the copy bandwidth. A copy reads and writes alike; a call that mostly reads (SiLU
    and mul quantizing fp32 to fp8 reads 8 bytes per byte written) moves its bytes faster than a copy does, and is
    shown above 100% of its bound rather than failed."""
    us = bound(rec)[0]
    if us is None or not (finite_number(rec.read_bw_gbps) and finite_number(rec.copy_bw_gbps)
                          and rec.read_bw_gbps > rec.copy_bw_gbps):
        return us
    # The same bound with the bytes at the read bandwidth: still no faster than the flops or the launch floor allow.
    return physical_bound(rec.bytes, rec.read_bw_gbps, rec.flops, rec.peak_tflops, rec.launch_floor_us)[0]


def faster_than_bound(rec: BenchRecord, impl: ImplFigures | None) -> bool:
    """A timing beyond what the call can reach by more than the timer's slack: the timing, not the implementation,
    is wrong."""
    floor = fastest_possible_us(rec)
    return (impl is not None and finite_number(floor) and finite_number(impl.median_us)
            and impl.median_us * (1 + BOUND_SLACK) < floor)


def broken_timing(rec: BenchRecord, impl: ImplFigures | None) -> str:
    """Why an implementation's figure is a broken timing ("" where it is not)."""
    if not faster_than_bound(rec, impl):
        return ""
    return (f"broken timing: {impl.median_us:.4g} µs is faster than its bound of {fastest_possible_us(rec):.4g} µs "
            f"({bound(rec)[1]}) by more than {BOUND_SLACK:.0%}: {limit_words(rec)}")


def limit_words(rec: BenchRecord) -> str:
    """The bound's terms in words: "58.7 MB at 4251 GB/s = 13.8 µs; 0.12 GFLOP at 690 TFLOP/s = 0.2 µs; launch
    floor 2.1 µs"."""
    parts = []
    if finite_number(rec.bytes) and finite_number(rec.copy_bw_gbps) and rec.copy_bw_gbps > 0:
        parts.append(f"{rec.bytes / 1e6:.4g} MB at {rec.copy_bw_gbps:.4g} GB/s = "
                     f"{rec.bytes / (rec.copy_bw_gbps * 1e3):.3g} µs")
        if finite_number(rec.read_bw_gbps) and rec.read_bw_gbps > rec.copy_bw_gbps:
            parts[-1] += (f" (read bandwidth {rec.read_bw_gbps:.4g} GB/s: "
                          f"{rec.bytes / (rec.read_bw_gbps * 1e3):.3g} µs)")
    if finite_number(rec.flops) and finite_number(rec.peak_tflops) and rec.peak_tflops > 0:
        parts.append(f"{rec.flops / 1e9:.4g} GFLOP at {rec.peak_tflops:.4g} TFLOP/s = "
                     f"{rec.flops / (rec.peak_tflops * 1e6):.3g} µs")
    if finite_number(rec.launch_floor_us):
        parts.append(f"launch floor {rec.launch_floor_us:.3g} µs")
    return "; ".join(parts) or "no bound recorded"


def weak_baseline(rec: BenchRecord, speedup: float | None, best: str | None) -> float | None:
    """The best baseline's % of its bound where the kernel is over CHECK_SPEEDUP x faster than it at a shape and it
    reaches under WEAK_PCT % of its bound (a question about the baseline before it is a result about the kernel);
    None where not."""
    pct = throughput(rec, rec.impls.get(best)).pct_of_bound if best else None
    weak = finite_number(speedup) and speedup > CHECK_SPEEDUP and pct is not None and pct < WEAK_PCT
    return pct if weak else None


def far_from_limit(recs: list[BenchRecord]) -> tuple[int, float, float] | None:
    """(shapes under FAR_PCT % of the bound, the lowest %, the highest %) over the kernel's timings; None where it
    reaches FAR_PCT % everywhere its bound was measured, or no bound was measured."""
    pcts = [p for p in (throughput(r, r.impls.get("kernel")).pct_of_bound for r in recs) if p is not None]
    low = [p for p in pcts if p < FAR_PCT]
    return (len(low), min(pcts), max(pcts)) if low else None
