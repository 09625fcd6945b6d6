"""Compile every benchmark shape of several plans in one pool of processes, before a nightly times them plan by
plan (scripts/gpu_run.sh bench runs it first): each plan's own run then finds its stamp in Inductor's cache and
skips its precompile step. One pool for all plans starts its processes and imports torch once, and keeps every
core busy where one plan's few shapes would not.

    python scripts/precompile.py [--processes N] PLAN...

N defaults to the machine's cores, at most MAX_PROCESSES: each process holds a CUDA context and its largest shape's
tensors on the GPU. A plan that does not load is left to its own run, which reports the error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.runtime.bench.precompile import precompile_plans  # noqa: E402
from harness.runtime.bench.specs import bench_specs, skip_reason  # noqa: E402
from harness.runtime.device import detect  # noqa: E402
from harness.plan.load import load_plan  # noqa: E402
from harness.plan.model import PlanError  # noqa: E402

MAX_PROCESSES = 16


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=min(os.cpu_count() or 1, MAX_PROCESSES))
    parser.add_argument("plan", nargs="+")
    args = parser.parse_args(argv)
    hw = detect()
    work = []
    for path in args.plan:
        try:
            plan = load_plan(path)
        except PlanError as exc:
            print(f"precompile: {path} left to its own run: {exc}", file=sys.stderr)
            continue
        # The shapes the plan's own run times (BenchItem's skip), so that its stamp matches.
        work.append((plan, [spec for spec in bench_specs(plan, hw.sm) if not skip_reason(plan, spec, hw)]))
    if hw.device != "cuda":
        print("precompile: nothing to do on a CPU machine (the kernel is not timed there)")
        return 0
    start = time.time()
    for (plan, _), line in zip(work, precompile_plans(work, hw.device, args.processes)):
        print(f"{plan.path}: {line}")
    print(f"precompile: {len(work)} plans in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
