"""Where does a plan's benchmark item time an in-place kernel slower than a bare timing of the same call?

On an H200 the fused add's item at 2048 x 4096 under graphs had the kernel (and vLLM's in-place kernel) at
18.5 us where `scripts/fused_add_variants.py` had 17.4 us on the same machine, while Inductor's out-of-place
reference moved by 0.15 us (docs/performance.md, "The fused add at 2048 tokens"; docs/changelog.md, fifteenth
round). This times the plan's kernel call
(harness.runtime.bench.implementations.kernel_call) with the harness's own timer step by step towards
`run_benchmark`: fresh sliced input sets, the item's check inputs held, after its bounds are measured, separately
allocated sets, the whole item, then fresh sets again; Inductor's compiled reference beside it.

    python scripts/inplace_timing_probe.py [SPEC_ID] [PLAN]
    (default: prefill-bf16-cuda_graph-sm90-t2048-hidden4096 of kernels/plans/fused_add_rms_norm.yaml)

On a CPU machine (TRITON_INTERPRET=1, a CPU spec id such as decode-bf16-eager-cpu-t1-hidden2048) it runs with the
host timer: a check of the script, not a measurement.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.runtime.bench.implementations import implementations, input_sets, kernel_call  # noqa: E402
from harness.runtime.bench.measure import CheckInputs, measure_bounds, run_benchmark  # noqa: E402
from harness.runtime.bench.records import base_record  # noqa: E402
from harness.runtime.bench.specs import bench_specs  # noqa: E402
from harness.runtime.tasks import BenchTask  # noqa: E402
from harness.runtime.timing import l2_cache_bytes, rotation_count, time_calls, working_set_bytes  # noqa: E402
from harness.runtime.implementations import load_implementation  # noqa: E402
from harness.plan.load import load_plan  # noqa: E402


def main() -> int:
    spec_id = sys.argv[1] if len(sys.argv) > 1 else "prefill-bf16-cuda_graph-sm90-t2048-hidden4096"
    plan = load_plan(sys.argv[2] if len(sys.argv) > 2 else "kernels/plans/fused_add_rms_norm.yaml")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = next((s for s in bench_specs(plan, spec_id.split("-")[3]) if s.id == spec_id), None)
    if spec is None:
        print(f"no benchmark item {spec_id} in {plan.path}")
        return 2
    graph = spec.graph_mode == "cuda_graph"
    kernel = kernel_call(plan, load_implementation(plan))
    compiled = implementations(plan, device, spec)["compiled"]

    def timed(what: str, call, sets: list[dict]) -> None:
        timing = time_calls(call, sets, device, graph)
        print(f"{what:44s} {timing.median_us:9.2f} us  ({len(sets)} sets)", flush=True)

    count = rotation_count(working_set_bytes(input_sets(plan, spec, device)[0]), l2_cache_bytes(device))
    sets = input_sets(plan, spec, device, max(count, 2))
    timed("kernel, fresh sliced sets", kernel, sets)
    timed("compiled, the same sets", compiled, sets)
    timed("kernel again", kernel, sets)
    held = CheckInputs.build(plan, spec, device)
    timed("kernel, the item's check inputs held", kernel, sets)
    rec = base_record(spec)
    rec.copy_bw_gbps = 1.0
    measure_bounds(rec, device, graph, 1, None)
    timed("kernel, after the item's bounds measured", kernel, sets)
    clones = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()} for s in sets]
    timed("kernel, separately allocated sets", kernel, clones)
    del held, sets, clones
    record = run_benchmark(BenchTask(plan, spec)).record
    print("the whole item (run_benchmark):", {k: v.median_us for k, v in record.impls.items()})
    sets = input_sets(plan, spec, device, max(count, 2))
    timed("kernel, fresh sets after the item", kernel, sets)
    timed("compiled, the same sets", compiled, sets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
