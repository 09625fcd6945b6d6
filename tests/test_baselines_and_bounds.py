"""Speed baselines apart from the numerics oracle (op.native, prepared named baselines), the upcasting-reference
warning, and every figure beside its physical bound: the arithmetic, a too-fast timing failing the item, "check the
baseline", "far from the hardware limit" and results from before either existed. On a CPU machine."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from harness.decisions import bounds
from harness.decisions.speedups import not_used, ratio, usable
from harness.results.store import BenchRecord, ImplFigures
from harness.runtime.bench import measure
from harness.runtime.bench.measure import run_benchmark
from harness.runtime.bench.specs import bench_specs
from harness.runtime.check_code import plan_code_warnings
from harness.runtime.resolve import resolve
from harness.runtime.tasks import BenchTask
from harness.plan.load import load_plan
from harness.plan.model import PlanError
from tests.plans import cpu_machine_only, rms_norm_plan, small_plan, write_plan
from tests.test_report import bench as bench_record, decision_rows, passed_sm90, render, section

ROOT = Path(__file__).resolve().parents[1]
INT8 = ROOT / "kernels" / "plans" / "int8_linear_column.yaml"


def int8_plan_without_native(tmp_path: Path) -> Path:
    return write_plan(tmp_path / "int8.yaml", INT8, op={"native": None})


# ---------------------------------------------------------------- op.native and the upcast warning


def test_an_upcasting_reference_without_a_native_is_warned_at_its_line(tmp_path):
    path = int8_plan_without_native(tmp_path)
    warned = [w for w in plan_code_warnings(load_plan(path)) if "op.reference" in w]
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if s.startswith("  reference:"))
    assert len(warned) == 1 and warned[0].startswith(f"{path}:{line}: op.reference: the reference computes in "
                                                     "float32 on fp16 activations (aten.mm in float32)"), warned
    assert "name op.native (what vLLM runs without the custom op" in warned[0]


@pytest.mark.parametrize("plan", ["plan.yaml", *sorted(p.name for p in (ROOT / "kernels/plans").glob("*.yaml"))])
def test_every_bundled_plans_native_computes_in_the_activation_dtype(plan):
    path = ROOT / plan if plan == "plan.yaml" else ROOT / "kernels" / "plans" / plan
    assert plan_code_warnings(load_plan(path)) == []


def test_an_fp32_variance_is_what_vllm_does_and_is_not_warned(tmp_path):
    """RMSNorm's reference reduces in fp32 as vLLM's forward_native does: only fp32 matrix products count."""
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"dtype": ["bf16", "fp16"]}))
    assert plan_code_warnings(plan) == []


def test_native_is_resolved_and_checked_like_the_reference(tmp_path):
    plan = load_plan(INT8)
    assert plan.op.native == "kernels.int8_linear:int8_weight_only_linear_native"
    assert resolve(plan).native.__name__ == "int8_weight_only_linear_native"
    assert load_plan(rms_norm_plan(tmp_path)).native_path == "kernels.rms_norm:rms_norm_ref"  # none: the reference
    for new, field, words in (("kernels.int8_linear:int8_weight_only_linear_natve", "op.native",
                               "an importable object"),
                              ("kernels.int8_linear:int8_weight_only_linear", "op.native",
                               "taking the plan's arguments by name"),
                              ("not a path", "op.native", "an import path")):
        path = write_plan(tmp_path / "bad.yaml", INT8, op={"native": new})
        with pytest.raises(PlanError) as info:
            resolve(load_plan(path))
        assert info.value.field == field and words in str(info.value), str(info.value)


def test_a_named_baselines_prepare_is_validated(tmp_path):
    def implementations(prepare: str) -> dict:
        return {"native": {}, "into": {"path": "tests.baselines:rms_norm_into", "prepare": prepare}}

    with pytest.raises(PlanError) as info:
        resolve(load_plan(rms_norm_plan(tmp_path, benchmark={"decode": [4]},
                                        implementations=implementations("tests.baselines:no_such_prepare"))))
    assert info.value.field == "implementations.into.prepare" and "a callable prepare" in str(info.value)
    plan = load_plan(rms_norm_plan(tmp_path, benchmark={"decode": [4]},
                                   implementations=implementations("tests.baselines:slow_prepare")))
    assert plan.implementation("into").prepare == "tests.baselines:slow_prepare"
    assert plan.implementation("native").prepare is None


def test_prepare_runs_once_per_input_set_outside_the_timed_region(tmp_path):
    """slow_prepare sleeps 50 ms: a timing that included it would be at least that long."""
    plan = load_plan(rms_norm_plan(tmp_path, hidden=[64], benchmark={"decode": [4]}, implementations={
        "native": {}, "into": {"path": "tests.baselines:rms_norm_into", "prepare": "tests.baselines:slow_prepare"}}))
    rec = run_benchmark(BenchTask(plan, bench_specs(plan, "cpu")[0])).record
    into = rec.impls["into"]
    assert into.timed and into.differs is None and into.median_us < 20_000, into  # checked against the reference
    assert rec.timed_functions == {"native": "kernels.rms_norm:rms_norm_ref",
                                   "into": "tests.baselines:rms_norm_into; prepared by tests.baselines:slow_prepare"}


def test_the_int8_plans_time_native_and_cublas_in_the_activation_dtype_and_say_why_machete_is_absent(tmp_path):
    sixty_four = {"values": [64], "multiple_of": 8}
    plan = load_plan(write_plan(tmp_path / "int8.yaml", INT8,
                                op={"sizes": {"in_features": sixty_four, "out_features": sixty_four}},
                                # the timed sizes are 64 here: no benchmark.sizes, nor their models
                                benchmark={"decode": [2], "prefill": [], "sizes": None, "models": None}))
    spec = next(s for s in bench_specs(plan, "cpu") if s.dtype == "bf16" and s.graph_mode == "eager")
    rec = run_benchmark(BenchTask(plan, spec)).record
    for name in ("native", "cublas"):
        assert rec.impls[name].timed and rec.impls[name].differs is None, (name, rec.impls[name])
    assert rec.timed_functions["native"] == plan.op.native
    if torch.cuda.is_available():  # machete packs weights of 128-multiples only: these 64s are refused, and why
        assert rec.impls["machete"].not_run.startswith("raised RuntimeError: "), rec.impls["machete"]
    else:
        assert rec.impls["machete"].not_run == ("raised RuntimeError: vLLM's machete_prepack_B runs on a CUDA GPU; "
                                                "this machine has none")


def test_machete_gets_the_weights_as_a_gptq_8bit_checkpoint_packs_them():
    import torch

    from kernels.int8_linear_vllm import gptq_uint8b128

    weight = torch.randint(-128, 128, (6, 16), dtype=torch.int8)
    packed = gptq_uint8b128(weight)
    assert packed.shape == (4, 6) and packed.dtype == torch.int32 and packed.stride() == (1, 4)
    for i in range(4):  # input feature 4j + i in bits 8i of word j, stored as value + 128
        assert torch.equal((packed >> (8 * i)) & 0xFF, (weight[:, i::4].to(torch.int32) + 128).t())


def test_the_uint8b128_id_is_vllms():
    scalar_type = pytest.importorskip("vllm.scalar_type")
    from kernels.int8_linear_vllm import UINT8B128

    assert UINT8B128 == scalar_type.scalar_types.uint8b128.id


# ---------------------------------------------------------------- bounds


def test_the_bound_is_the_largest_of_bytes_flops_and_the_launch_floor():
    # 58.7 MB at 4251 GB/s is 13.8 µs; 0.117 GFLOP at 690 TFLOP/s is 0.17 µs; the floor 2 µs
    us, which = bounds.physical_bound(58.7e6, 4251.0, 1.17e8, 690.0, 2.0)
    assert which == bounds.COPY and us == pytest.approx(13.81, abs=0.01)
    us, which = bounds.physical_bound(117e6, 4251.0, 2 * 2048 * 4096 * 4096, 690.0, 2.0)
    assert which == bounds.PEAK and us == pytest.approx(99.6, abs=0.1)
    assert bounds.physical_bound(64.0, 4251.0, None, None, 2.0) == (2.0, bounds.LAUNCH)
    assert bounds.physical_bound(None, None, None, None, None) == (None, None)
    rec = BenchRecord("decode", "bf16", "sm90", "eager", 1, bytes=int(58.7e6), copy_bw_gbps=4251.0,
                      launch_floor_us=2.0)
    assert bounds.bound(rec) == (pytest.approx(13.81, abs=0.01), bounds.COPY)
    slow = bounds.throughput(rec, ImplFigures(median_us=96.6))
    assert slow.pct_of_bound == pytest.approx(14.29, abs=0.01) and slow.gbps == pytest.approx(607.7, abs=0.1)
    assert slow.pct_copy_bw == pytest.approx(14.29, abs=0.01) and slow.tflops is None  # no flop model
    assert not bounds.faster_than_bound(rec, ImplFigures(median_us=13.5))  # 102.3% of its bound: inside the slack
    assert bounds.faster_than_bound(rec, ImplFigures(median_us=13.0))
    # a CPU machine measures no launch floor: its host-clock timings have no bound to be set against
    assert bounds.bound(dataclasses.replace(rec, launch_floor_us=None)) == (None, None)


def test_a_call_that_mostly_reads_may_beat_the_copy_bandwidth_but_not_the_read_bandwidth():
    """SiLU-and-mul quantizing fp32 to fp8 on an H200: 604 MB, 537 of them read, in 137.8 µs, 3.5% faster than a
    copy at 4232 GB/s allows; a read runs faster than a copy. Beyond the read bandwidth the timing is broken."""
    rec = BenchRecord("prefill", "fp32", "sm90", "cuda_graph", 8192, bytes=604_000_000, copy_bw_gbps=4232.0,
                      read_bw_gbps=4560.0, launch_floor_us=1.1)
    assert bounds.throughput(rec, ImplFigures(median_us=137.8)).pct_of_bound == pytest.approx(103.6, abs=0.1)
    assert not bounds.broken_timing(rec, ImplFigures(median_us=137.8))
    assert bounds.fastest_possible_us(rec) == pytest.approx(132.4, abs=0.1)
    why = bounds.broken_timing(rec, ImplFigures(median_us=125.0))
    assert why.startswith("broken timing: 125 µs is faster than its bound of 132.5 µs") and "read bandwidth 4560" in why
    small = BenchRecord("decode", "fp32", "sm90", "cuda_graph", 1, bytes=4_400_000, copy_bw_gbps=4232.0,
                        read_bw_gbps=4560.0, launch_floor_us=1.0)
    assert bounds.fastest_possible_us(small) == 1.0  # at the read bandwidth the launch floor is the larger
    rec.read_bw_gbps = None  # older results: the copy bandwidth alone
    assert bounds.broken_timing(rec, ImplFigures(median_us=137.8))



@cpu_machine_only
@pytest.mark.usefixtures("faithful_interpreter")  # runs kernels in this process, as a worker does
def test_the_read_probe_reads_every_element_once_and_a_cpu_machine_measures_none():
    """The read-bandwidth probe's kernel (run here in Triton's interpreter): every element read once, a ragged last
    block masked; on a CPU machine no read bandwidth is measured and bounds rest on the copy bandwidth."""
    import torch

    from harness.runtime import timing

    n, block, steps = 3 * 256 * 4 + 77, 256, 4
    sums = torch.empty(-(-n // (block * steps)))
    timing._read_kernel()[(sums.numel(),)](torch.ones(n), sums, n, BLOCK=block, STEPS=steps)
    assert float(sums.sum()) == n and sums.numel() == 4
    assert timing.read_bandwidth_gbps("cpu") is None


def test_a_cpu_machine_measures_no_peak_and_no_launch_floor():
    import torch

    from harness.runtime import timing

    assert timing.tensor_peak_tflops("cpu", torch.bfloat16) is None and timing.launch_floor_us("cpu", False) is None


def test_a_timing_faster_than_its_bound_is_broken_and_decisions_leave_it_out(tmp_path, monkeypatch):
    """A bound of one second: every host-clock timing is faster. The kernel is the reference in kernel style."""
    plan = load_plan(rms_norm_plan(tmp_path, hidden=[64], benchmark={"decode": [4]}, implementations={
        "native": {}, "into": {"path": "tests.baselines:rms_norm_into"}}))
    real = measure.implementations

    def with_a_kernel(plan, device, spec=None):
        impls = real(plan, device, spec)
        return {**impls, "kernel": impls["into"]}

    def one_second(rec, device, graph, nbytes, flops):
        rec.bytes, rec.flops, rec.launch_floor_us = nbytes, flops, 1e6

    monkeypatch.setattr(measure, "implementations", with_a_kernel)
    monkeypatch.setattr(measure, "measure_bounds", one_second)
    rec = run_benchmark(BenchTask(plan, bench_specs(plan, "cpu")[0])).record  # the figures as measured
    why = bounds.broken_timing(rec, rec.impls["kernel"])
    assert why.startswith("broken timing: ") and "faster than its bound of 1e+06 µs (launch floor)" in why
    native = rec.impls["native"]
    assert native.timed and bounds.throughput(rec, native).pct_of_bound > 100
    assert not_used(plan, rec, "native").short == "broken timing (faster than its bound)"
    used = usable(plan, rec)  # what decisions see: no speedup over a baseline timed faster than its bound
    assert not used.impls["native"].timed and used.impls["kernel"].error == why and ratio(used, "native") is None


DECODE_64 = {"benchmark": {"decode": [64]}, "implementations": {"native": {}, "compiled": {}}}


def _bounded(rec: dict, bound_us: float) -> dict:
    """A benchmark record whose bytes at its copy bandwidth (4250 GB/s) take `bound_us`, above its launch floor."""
    rec.update(bytes=int(bound_us * 4250e3), launch_floor_us=2.0)
    return rec


def test_a_big_win_over_a_weak_baseline_is_questioned_and_a_slow_kernel_is_far_from_the_limit(tmp_path):
    plan = small_plan(tmp_path, matrix={"phase": ["decode"]}, **DECODE_64)
    op_dir = tmp_path / "reports" / "rms_norm"
    # bound 10 µs: kernel 40 µs (25%), native 400 µs, compiled 200 µs (5%): 5x over the best baseline
    passed_sm90(op_dir, benchmarks={"decode-64": _bounded(bench_record("decode", 64, 40.0, 400.0, 200.0), 10.0)})
    text = render(plan, op_dir)
    on = decision_rows(text)[("sm90", "bf16", "decode-sized", "Inductor on")]
    assert on["recommendation"] == "**enable the custom op**"
    assert "check the baseline: at 1 of 1 shapes the kernel is over 3× faster (up to 5.0×) than the fastest " \
           "baseline timed there (compiled), which reaches under 50% of its bound (at most 5%)" in on["why"]
    assert "far from the hardware limit: the kernel reaches 25–25% of its bound" in on["why"]
    items = section(text, "Open items")
    assert "Check the baseline, sm90 bf16 decode-sized: check the baseline" in items
    assert "Enabled though far from the hardware limit (sm90 bf16 decode-sized, Inductor on: far from" in items
    assert "40.0 µs · " in section(text, "Performance") and "25% of bound" in section(text, "Performance")

    # a strong baseline (compiled at 80% of its bound) and a kernel at its bound: neither flag
    passed_sm90(op_dir, benchmarks={"decode-64": _bounded(bench_record("decode", 64, 10.0, 40.0, 12.5), 10.0)})
    text = render(plan, op_dir)
    assert "check the baseline" not in text and "far from the hardware limit" not in text


def test_a_synthetic_timing_faster_than_its_bound_decides_nothing(tmp_path):
    plan = small_plan(tmp_path, matrix={"phase": ["decode"]}, **DECODE_64)
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": _bounded(bench_record("decode", 64, 5.0, 20.0, 15.0), 10.0)})
    text = render(plan, op_dir)
    row = decision_rows(text)[("sm90", "bf16", "decode-sized", "Inductor on")]
    assert row["recommendation"] == "none" and "the kernel failed at 1 of 1 shapes: broken timing: 5 µs is " \
        "faster than its bound of 10 µs (copy bandwidth)" in row["why"]
    # a baseline's figure beyond its bound: its cell says why decisions leave it out, its speedup is not used
    passed_sm90(op_dir, benchmarks={"decode-64": _bounded(bench_record("decode", 64, 12.0, 20.0, 5.0), 10.0)})
    perf = section(render(plan, op_dir), "Performance")
    assert "5.00 µs" in perf and "⚠️ not used for decisions: broken timing (faster than its bound)" in perf
    assert re.search(r"\| not used +\|", perf)


def test_results_without_bounds_or_timed_functions_still_read(tmp_path):
    plan = small_plan(tmp_path, matrix={"phase": ["decode"]}, **DECODE_64)
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench_record("decode", 64, 5.0, 9.0, 8.0)})
    text = render(plan, op_dir)
    assert "no bound recorded for 1 of 1 items" in section(text, "Performance")
    assert decision_rows(text)[("sm90", "bf16", "decode-sized", "Inductor on")]["recommendation"] == \
        "**enable the custom op**"  # no op.native: native and compiled were the reference, as the plan says


def test_a_baseline_timed_on_the_reference_before_the_plan_named_its_native_is_left_out(tmp_path):
    plan = small_plan(tmp_path, matrix={"phase": ["decode"]}, **DECODE_64,
                      op={"native": "tests.baselines:rms_norm_native"})
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench_record("decode", 64, 5.0, 9.0, 8.0)})
    text = render(plan, op_dir)
    row = decision_rows(text)[("sm90", "bf16", "decode-sized", "Inductor on")]
    assert row["recommendation"] == "none" and "compiled was not timed: timed on the reference (the accuracy " \
        "oracle), not on op.native (tests.baselines:rms_norm_native)" in row["why"]
    assert "native: `tests.baselines:rms_norm_native` (op.native: what vLLM runs without the custom op)" in text
    assert "Re-run the benchmarks" in section(text, "Open items")
    assert "⚠️ not used for decisions: timed on the reference (the accuracy oracle) |" in section(text, "Performance")
    # the same record, timed on the native the plan names: used
    rec = bench_record("decode", 64, 5.0, 9.0, 8.0)
    rec["timed_functions"] = {"native": "tests.baselines:rms_norm_native",
                              "compiled": "tests.baselines:rms_norm_native"}
    passed_sm90(op_dir, benchmarks={"decode-64": rec})
    assert decision_rows(render(plan, op_dir))[("sm90", "bf16", "decode-sized", "Inductor on")]["recommendation"] \
        == "**enable the custom op**"
