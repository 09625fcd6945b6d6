"""Can the harness's GPU timings be trusted? Time the bundled Triton RMSNorm (bf16) with the harness's timing
function and, in the same process, with triton.testing.do_bench / do_bench_cudagraph, and print both.

    python scripts/bench_trust_check.py [--repeats 3] [--out FILE]

Pairs compared like for like:
- eager, cold L2: the harness rotates input sets (total > 2x L2); do_bench flushes L2 before each call.
- graph, cold L2 (64x4096): both capture calls rotating over the same input sets and time replays.
- graph, hot L2 (64x4096): one input set in both (do_bench_cudagraph's own setting; the harness never
  times this way, shown for reference).
- eager after counting launches: the harness counts launches between timings; later timings should not move
  (compare with the first eager row: the difference is this run's drift over the process's life).
Each figure is the median over `--repeats` independent measurements ("runs" lists them); the spread
column is (max - min) / median over those repeats, i.e. the run-to-run drift. Target: within 3%.
Last, the launch counts the harness records are checked against torch.profiler (run last: once it has
run, CUPTI stays attached in this process and eager timings grow).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = ((32768, 8192), (64, 4096))  # (num_tokens, hidden): bandwidth bound; launch/latency bound


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("bench_trust_check: needs a CUDA GPU (timings of Triton's CPU interpreter mean nothing)")
        return 2
    import triton.testing
    from tabulate import tabulate

    from harness.runtime.bench.implementations import input_sets, kernel_call, reference_call
    from harness.runtime.bench.models import bytes_moved
    from harness.runtime.bench.specs import BenchSpec
    from harness.runtime.timing import (copy_bandwidth_gbps, count_launches, l2_cache_bytes, rotation_count,
                                        time_calls, working_set_bytes)
    from harness.runtime.device import detect
    from harness.runtime.resolve import resolve
    from harness.plan.load import load_plan

    plan = load_plan(ROOT / "plan.yaml")
    kernel, sm = resolve(plan).kernel, detect().sm
    call = kernel_call(plan, kernel)
    l2, copy_bw = l2_cache_bytes("cuda"), copy_bandwidth_gbps("cuda")

    def repeated(measure) -> list[float]:
        return [measure() for _ in range(args.repeats)]

    rows = []

    def add(shape, mode, sets_used, harness_us, ref_name, ref_us, nbytes):
        h = statistics.median(harness_us)
        row = [shape, mode, sets_used, f"{h:.2f}", " ".join(f"{x:.2f}" for x in harness_us),
               f"{(max(harness_us) - min(harness_us)) / h:.1%}"]
        if ref_us:
            r = statistics.median(ref_us)
            row += [ref_name, f"{r:.2f}", " ".join(f"{x:.2f}" for x in ref_us),
                    f"{(max(ref_us) - min(ref_us)) / r:.1%}", f"{(h - r) / r:+.1%}"]
        else:
            row += ["-"] * 5
        rows.append(row + [f"{nbytes / (h * 1e-6) / 1e9:.0f}", f"{100 * nbytes / (h * 1e-6) / 1e9 / copy_bw:.0f}%"])

    probes = {}
    for tokens, hidden in SHAPES:
        spec = BenchSpec("prefill" if tokens > 256 else "decode", "bf16", "eager", sm, tokens, (("hidden", hidden),))
        one = input_sets(plan, spec, "cuda", 1)[0]
        sets = input_sets(plan, spec, "cuda", rotation_count(working_set_bytes(one), l2))
        nbytes = bytes_moved(plan, "bf16", tokens, {"hidden": hidden})
        shape = f"{tokens}x{hidden}"
        rotation = itertools.cycle(sets)

        def bare():
            kernel(**one)

        def rotating():  # do_bench_cudagraph captures one call per set, in turn, as the harness does
            kernel(**next(rotation))

        eager = repeated(lambda: time_calls(call, sets, "cuda").median_us)
        add(shape, "eager, cold L2", len(sets), eager,
            "do_bench", repeated(lambda: triton.testing.do_bench(bare, return_mode="median") * 1e3), nbytes)
        if tokens <= 256:
            graph_cold = repeated(lambda: time_calls(call, sets, "cuda", graph=True).median_us)
            add(shape, "graph, cold L2", len(sets), graph_cold, "do_bench_cudagraph",
                repeated(lambda: triton.testing.do_bench_cudagraph(rotating, return_mode="median") * 1e3), nbytes)
            add(shape, "graph, hot L2", 1, repeated(lambda: time_calls(call, [one], "cuda", graph=True).median_us),
                "do_bench_cudagraph",
                repeated(lambda: triton.testing.do_bench_cudagraph(bare, return_mode="median") * 1e3), nbytes)
            for impl, fn in (("kernel", call), ("native", reference_call(plan, resolve(plan).native)),
                             ("compiled", reference_call(plan, torch.compile(resolve(plan).native)))):
                fn(one)  # compile outside the capture
                torch.cuda.synchronize()
                probes[impl] = (fn, one, count_launches(fn, one))
            add(shape, "eager, cold L2, after counting launches", len(sets),
                repeated(lambda: time_calls(call, sets, "cuda").median_us), "harness before", eager, nbytes)
        sets = one = None  # the input sets freed before the next shape's
        torch.cuda.empty_cache()

    checks = []
    for impl, (fn, values, counted) in probes.items():
        fn(values)
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            fn(values)
            torch.cuda.synchronize()
        profiled = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        checks.append(f"{impl} {counted} (profiler {profiled})")

    text = (f"{torch.cuda.get_device_name(0)} ({sm}), L2 {l2 / 2**20:.0f} MiB, copy bandwidth {copy_bw:.0f} GB/s, "
            f"rms_norm bf16, medians over {args.repeats} repeats\n"
            + tabulate(rows, headers=["shape", "mode", "sets", "harness µs", "runs", "spread", "reference", "ref µs",
                                      "runs", "spread", "harness vs ref", "GB/s", "% copy"])
            + "\nlaunches per call at 64x4096 (graph nodes): " + ", ".join(checks))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
