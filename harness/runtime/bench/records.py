"""Benchmark records: an item's record before anything is measured (base_record), and the record of an item this
machine does not run, every implementation saying why (not_run_record).
"""

from __future__ import annotations

from harness.results.store import BenchRecord, ImplFigures
from harness.runtime.bench.specs import BenchSpec


def base_record(spec: BenchSpec) -> BenchRecord:
    return BenchRecord(spec.phase, spec.dtype, spec.sm, spec.graph_mode, spec.num_tokens, spec.sizes_dict)


def not_run_record(spec: BenchSpec, reason: str) -> BenchRecord:
    """The record of an item this machine does not run: every implementation says why."""
    rec = base_record(spec)
    rec.impls = {name: ImplFigures(not_run=reason) for name in spec.impls}
    return rec
