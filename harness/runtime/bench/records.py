"""Benchmark records: an item's record before anything is measured (base_record), and the record of an item this
machine does not run, every implementation and speedup saying why (not_run_record).
"""

from __future__ import annotations

from harness.results.store import BenchRecord, ImplFigures, Speedup
from harness.runtime.bench.specs import BenchSpec


def base_record(spec: BenchSpec) -> BenchRecord:
    return BenchRecord(spec.phase, spec.dtype, spec.sm, spec.graph_mode, spec.num_tokens, spec.sizes_dict)


def not_run_record(spec: BenchSpec, reason: str) -> BenchRecord:
    """The record of an item this machine does not run: every implementation and speedup says why."""
    rec = base_record(spec)
    rec.impls = {name: ImplFigures(not_run=reason) for name in spec.impls}
    rec.speedup = {name: Speedup(not_run=reason) for name in spec.impls[1:]}
    return rec
