"""Benchmarks on a CPU machine: byte model, noise-aware verdicts, item ids, skip reasons, and a --bench run."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from harness.results.merge import collect
from harness.runtime.bench.implementations import CPU_KERNEL_REASON, implementations, input_sets
from harness.runtime.bench.measure import run_benchmark
from harness.runtime.bench.models import bytes_moved, check_models, flops_done
from harness.runtime.bench.precompile import _compile_key, precompile, precompile_plans
from harness.runtime.bench.records import not_run_record
from harness.runtime.bench.specs import IMPLS, BenchSpec, bench_specs, skip_reason
from harness.runtime import timing as timers

from harness.rendering import performance
from harness.cells.hardware import Hardware
from harness.plan.load import load_plan
from harness.plan.expressions import evaluate
from harness.plan.model import PlanError
from harness.decisions.speedups import NOISE_FLOOR, shape_speedup
from harness.results.store import BenchRecord, ImplFigures, to_json
from harness.runtime.tasks import BenchTask
from harness.runtime.vllm_compiled import vllm_missing

from tests.plans import VLLM_RMS_NORM, cpu_machine_only, rms_norm_plan, write_plan
from tests.test_report import bench as bench_record, passed_sm90

ROOT = Path(__file__).resolve().parents[1]
CPU = Hardware("cpu", "cpu", "test cpu", 0, 2)
H200 = Hardware("sm90", "cuda", "NVIDIA H200", 1, 16)
# Fields of a timed implementation on a CPU machine (None fields, launches among them, are not written).
FIGURE_KEYS = {"median_us", "q20_us", "q80_us", "samples"}
RECORD_KEYS = {"phase", "dtype", "sm", "graph_mode", "num_tokens", "sizes", "copy_bw_gbps", "bytes",
               "timed_functions", "l2_bytes", "working_set_bytes", "rotated_sets", "timer", "impls",
               "finished", "run"}


def timing(median, q20, q80) -> ImplFigures:
    return ImplFigures(median_us=median, q20_us=q20, q80_us=q80)


def speedup(baseline: ImplFigures, kernel: ImplFigures):
    """The kernel's speedup over one baseline at one shape, as decisions read it from a record."""
    rec = BenchRecord("decode", "bf16", "sm90", "eager", 4, impls={"kernel": kernel, "native": baseline})
    return shape_speedup(rec, "native")


# ---------------------------------------------------------------- byte and flop models


def _built(plan, dtype: str, tokens: int, hidden: int) -> dict:
    spec = BenchSpec("decode", dtype, "eager", "cpu", tokens, (("hidden", hidden),))
    return input_sets(plan, spec, "cpu")[0]


def test_default_byte_model_reads_inputs_once_and_writes_outputs_once():
    plan = load_plan(ROOT / "plan.yaml")  # out (output), x (input), weight (input)
    for dtype, size in (("bf16", 2), ("fp32", 4)):
        values = _built(plan, dtype, 64, 4096)
        assert bytes_moved(plan, dtype, 64, {"hidden": 4096}, values=values) == 2 * 64 * 4096 * size + 4096 * size
    values = _built(plan, "fp32", 1, 8)
    assert bytes_moved(plan, "fp32", 1, {"hidden": 8}, 100, values) == 2 * 8 * 4 + 8 * 4 + 100


def test_mutated_arguments_count_read_and_write():
    plan = load_plan(ROOT / "kernels" / "plans" / "fused_add_rms_norm.yaml")  # x, residual in place; weight read
    t, h = 8, 4096
    assert bytes_moved(plan, "bf16", t, {"hidden": h}, values=_built(plan, "bf16", t, h)) == \
        2 * (t * h * 2) * 2 + h * 2


def test_structured_plans_count_the_tensors_their_batch_built():
    """A paged KV cache's size follows the drawn batch, not a size symbol: the default model counts it as built."""
    plan = load_plan(ROOT / "kernels" / "plans" / "paged_attention.yaml")
    check_models(plan)  # no byte model: nothing to evaluate before the batch exists
    spec = BenchSpec("decode", "bf16", "eager", "cpu", 4,
                     (("num_heads", 8), ("num_kv_heads", 2), ("head_size", 64), ("block_size", 16)))
    values = input_sets(plan, spec, "cpu")[0]
    expected = sum(t.numel() * t.element_size() for t in values.values() if hasattr(t, "numel"))
    assert bytes_moved(plan, "bf16", 4, dict(spec.sizes), values=values) == expected


def test_plan_expressions_for_bytes_and_flops(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, benchmark={
        "decode": [4], "bytes": "(2 * num_tokens + 1) * hidden * act_bytes", "flops": "4 * num_tokens * hidden"}))
    assert bytes_moved(plan, "fp16", 4, {"hidden": 64}) == 9 * 64 * 2
    assert flops_done(plan, "fp16", 4, {"hidden": 64}) == 4 * 4 * 64
    assert flops_done(load_plan(ROOT / "plan.yaml"), "bf16", 4, {"hidden": 64}) is None


@pytest.mark.parametrize("expr, words", [
    ("__import__('os').system('true')", "is not allowed"),
    ("hidden.bit_length()", "is not allowed"),
    ("[hidden][0]", "is not allowed"),
    ("hidden * heads", "unknown name 'heads'"),
    ("2 ** 1000", "too large"),
    ("hidden / (num_tokens - num_tokens)", "division by zero"),
    ("hidden *", "not an arithmetic expression"),
])
def test_unsafe_or_wrong_expressions_are_rejected(expr, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("*", r"\*")):
        evaluate(expr, {"hidden": 64, "num_tokens": 4, "act_bytes": 2})


def test_a_bad_byte_model_is_a_plan_error_naming_the_field_and_line(tmp_path):
    path = rms_norm_plan(tmp_path, benchmark={"decode": [4], "bytes": "hidden * heads"})
    with pytest.raises(PlanError) as exc:  # found when the plan loads, not when --bench collects
        load_plan(path)
    err = exc.value
    assert err.field == "benchmark.bytes" and err.line == path.read_text().splitlines().index(
        "  bytes: hidden * heads") + 1
    assert "unknown name 'heads'" in str(err) and "num_tokens" in str(err)


# ---------------------------------------------------------------- verdicts


def test_speedup_inside_the_spread_is_no_difference():
    s = speedup(timing(10.0, 9.0, 11.0), timing(9.5, 9.0, 10.0))
    assert s.value == pytest.approx(10 / 9.5, abs=1e-3)
    assert s.low < 1 < s.high and s.verdict == "no difference"


def test_clear_wins_and_losses():
    assert speedup(timing(20.0, 19.8, 20.2), timing(10.0, 9.9, 10.1)).verdict == "faster"
    slower = speedup(timing(10.0, 9.9, 10.1), timing(20.0, 19.8, 20.2))
    assert slower.verdict == "slower" and slower.high < 1


def test_noise_floor_widens_tight_intervals():
    tight = 1 + NOISE_FLOOR / 2  # a 1% win with no spread at all is still within run-to-run drift
    assert speedup(timing(tight, tight, tight), timing(1.0, 1.0, 1.0)).verdict == "no difference"
    clear = 1 + 3 * NOISE_FLOOR
    assert speedup(timing(clear, clear, clear), timing(1.0, 1.0, 1.0)).verdict == "faster"


# ---------------------------------------------------------------- items, ids, skip reasons


def test_specs_cover_every_shape_dtype_and_graph_mode_on_this_sm():
    plan = load_plan(ROOT / "plan.yaml")
    specs = bench_specs(plan, "sm90")
    shapes = len(plan.benchmark.decode) + len(plan.benchmark.prefill) + len(plan.benchmark.chunked_prefill)
    assert len(specs) == shapes * len(plan.sizes["hidden"]) * len(plan.matrix["dtype"]) * 2
    ids = {s.id for s in specs}
    assert len(ids) == len(specs) and "decode-bf16-eager-sm90-t64-hidden4096" in ids
    assert "prefill-fp32-cuda_graph-sm90-t32768-hidden8192" in ids
    assert {s.sm for s in specs} == {"sm90"}


def test_graph_modes_follow_the_plan(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"graph_mode": ["eager", "torch_compile"]},
                                   benchmark={"decode": [4]}))
    assert [s.id for s in bench_specs(plan, "cpu")] == ["decode-fp32-eager-cpu-t4-hidden64",
                                                         "decode-fp32-eager-cpu-t4-hidden128"]


def test_benchmark_sizes_list_the_sizes_timed_and_stored_records_of_others_are_not_shown(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"sm": ["cpu", "sm90"]}, hidden=[64, 128, 4096],
                                   benchmark={"decode": [4], "sizes": [{"hidden": 128}, {"hidden": 4096}]}))
    assert [s.id for s in bench_specs(plan, "cpu")] == ["decode-fp32-eager-cpu-t4-hidden128",
                                                         "decode-fp32-eager-cpu-t4-hidden4096"]
    stale = {**bench_record("decode", 4, 1.0, 2.0, 1.5), "sizes": {"hidden": 64}}
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"listed": bench_record("decode", 4, 1.0, 2.0, 1.5), "stale": stale})
    res = collect(plan, op_dir)
    assert [bid for bid, _ in res.benchmarks] == ["listed"] and res.ignored >= 1


def test_skip_reasons(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"dtype": ["fp32", "fp16"], "graph_mode": ["eager", "cuda_graph"],
                                                     "sm": ["cpu", "sm90"]},
                                   benchmark={"decode": [4]}, exclude=[{"dtype": "fp16", "why": "no fp16 here"}]))
    spec = {s.id: s for s in bench_specs(plan, "cpu")}
    assert skip_reason(plan, spec["decode-fp32-eager-cpu-t4-hidden64"], CPU) == ""
    assert "cuda_graph needs a CUDA device" in skip_reason(plan, spec["decode-fp32-cuda_graph-cpu-t4-hidden64"], CPU)
    assert "no fp16 here" in skip_reason(plan, spec["decode-fp16-eager-cpu-t4-hidden64"], CPU)
    sm89 = bench_specs(plan, "sm89")[0]
    assert "does not list sm89" in skip_reason(plan, sm89, Hardware("sm89", "cuda", "L4", 1, 8))


@cpu_machine_only
def test_on_a_cpu_machine_the_kernel_is_not_timed_and_vllm_says_why(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, benchmark={"decode": [4]},
                                   implementations={"native": {}, "vllm": VLLM_RMS_NORM}))
    impls = implementations(plan, "cpu")
    assert impls["kernel"] == CPU_KERNEL_REASON and "interpreter" in impls["kernel"]
    assert callable(impls["native"])
    assert impls["compiled"] == "not in the plan's implementations as a baseline"
    if vllm_missing():
        assert isinstance(impls["vllm"], str) and "not installed" in impls["vllm"]
    else:  # vLLM's CPU build has the in-tree kernel: it is timed like the references
        assert callable(impls["vllm"]) or isinstance(impls["vllm"], str) and impls["vllm"]


NAMED = {"native": {}, "compiled": {}, "ref_into": {"path": "tests.baselines:rms_norm_into"},
         "liger": {"path": "liger_kernel_not_here.ops:rms_norm"}}


def test_named_baselines_are_kernel_style_calls_and_a_missing_package_is_not_run(tmp_path):
    # the missing package does not stop the plan loading
    plan = load_plan(rms_norm_plan(tmp_path, benchmark={"decode": [4]}, implementations=NAMED))
    assert plan.baselines == ("native", "compiled", "ref_into", "liger")
    assert [(plan.implementation(n).kind, plan.implementation(n).path) for n in ("ref_into", "liger")] == [
        ("import", "tests.baselines:rms_norm_into"), ("import", "liger_kernel_not_here.ops:rms_norm")]
    impls = implementations(plan, "cpu")
    assert list(impls) == ["kernel", "native", "compiled", "vllm", "ref_into", "liger"]
    assert callable(impls["ref_into"])
    assert "liger_kernel_not_here.ops:rms_norm cannot be imported here: ModuleNotFoundError" in impls["liger"]
    spec = bench_specs(plan, "cpu")[0]
    assert spec.impls == ("kernel", "native", "compiled", "vllm", "ref_into", "liger")
    assert spec.id == "decode-fp32-eager-cpu-t4-hidden64"  # named baselines do not change item ids
    rec = not_run_record(spec, "cuda_graph needs a CUDA device")
    assert set(rec.impls) == set(spec.impls) and not any(shape_speedup(rec, name) for name in spec.impls[1:])


@cpu_machine_only
def test_a_named_baseline_is_timed_and_checked_on_cpu(tmp_path):
    """The reference wrapped in kernel style: timed with the host clock and checked against the reference, like
    native and compiled; the missing one is recorded as not run; the kernel itself is not timed on a CPU."""
    path = rms_norm_plan(tmp_path, hidden=[64], benchmark={"decode": [4]}, implementations=NAMED)
    plan = load_plan(path)
    rec = run_benchmark(BenchTask(plan, bench_specs(plan, "cpu")[0])).record
    assert set(rec.impls) == {"kernel", "native", "compiled", "vllm", "ref_into", "liger"}
    assert rec.impls["kernel"].not_run == CPU_KERNEL_REASON
    for name in ("native", "compiled", "ref_into"):
        figs = rec.impls[name]
        assert figs.timed and figs.error is None and 0 < figs.q20_us <= figs.median_us <= figs.q80_us, name
    assert "cannot be imported here" in rec.impls["liger"].not_run and not rec.impls["liger"].timed
    assert shape_speedup(rec, "ref_into") is None  # no kernel timing to compare with


def test_a_baseline_that_raises_is_not_run_and_the_item_goes_on(tmp_path):
    path = rms_norm_plan(tmp_path, hidden=[64], benchmark={"decode": [4]}, implementations={
        "native": {}, "wrong": {"path": "tests.broken.rms_norm_bugs:raises"}})
    plan = load_plan(path)
    outcome = run_benchmark(BenchTask(plan, bench_specs(plan, "cpu")[0]))
    rec = outcome.record
    # a baseline taking the kernel's arguments that raises: only its entry says so
    assert rec.impls["wrong"].not_run.startswith("raised ValueError") and not rec.impls["wrong"].timed
    assert rec.impls["native"].timed and not outcome.failures


def test_a_baseline_whose_outputs_differ_keeps_its_timing_and_says_so(tmp_path):
    path = rms_norm_plan(tmp_path, hidden=[64], benchmark={"decode": [4]}, implementations={
        "native": {}, "scaled": {"path": "tests.baselines:rms_norm_off_by_a_tenth"}})
    plan = load_plan(path)
    outcome = run_benchmark(BenchTask(plan, bench_specs(plan, "cpu")[0]))
    off = outcome.record.impls["scaled"]
    assert off.timed and off.error is None and "wrong result after timing" in off.differs
    assert outcome.record.impls["native"].differs is None and not outcome.failures
    assert "differs from the reference" in performance.impl_cell(outcome.record, "scaled")


@pytest.mark.parametrize("entry, field, words", [
    ({"liger": {"path": "not a path"}}, "implementations.liger.path", "an import path 'package.module:attribute'"),
    ({"Liger": {"path": "a.b:c"}}, "implementations.Liger",
     "an implementation name of lowercase letters, digits and _ other than kernel"),
    ({False: {"path": "a.b:c"}}, "implementations.False",  # `off:`
     "YAML reads off/on/yes/no/true/false as a boolean"),
    ({"kernel": {"path": "a.b:c"}}, "implementations.kernel",
     "an implementation name of lowercase letters, digits and _ other than kernel"),
    ({"native": {"path": "a.b:c"}}, "implementations.native.path",
     "a field of a native implementation (role, kind, contract, setting, title, max_step_fraction)"),
    ({"inductor": {}}, "implementations.inductor", "path for a import implementation"),
])
def test_bad_baselines_are_plan_errors(tmp_path, entry, field, words):
    with pytest.raises(PlanError) as exc:
        load_plan(rms_norm_plan(tmp_path, benchmark={"decode": [4]}, implementations=entry))
    assert exc.value.field == field and words in str(exc.value) and exc.value.line is not None, str(exc.value)


def test_duplicate_named_baselines_are_plan_errors(tmp_path):
    path = rms_norm_plan(tmp_path, benchmark={"decode": [4]}, implementations={"a": {"path": "x.y:z"}})
    text = path.read_text()
    path.write_text(text.replace("  a: {path: 'x.y:z'}\n", "  a: {path: 'x.y:z'}\n  a: {path: 'x.y:w'}\n"))
    assert path.read_text() != text
    with pytest.raises(PlanError, match="the key 'a' given twice"):
        load_plan(path)


def test_benchmark_models_name_the_model_of_each_size(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, benchmark={"decode": [4],
                                                        "models": {"hidden=64": "Tiny-1", "hidden=128": "Tiny-2"}}))
    assert plan.benchmark.models == (("hidden=64", "Tiny-1"), ("hidden=128", "Tiny-2"))
    assert plan.benchmark.model({"hidden": 128}) == "Tiny-2" and plan.benchmark.model({"hidden": 96}) is None
    for key, model, found in (("hidden=96", "Tiny", "hidden=96"), ("heads=2", "Tiny", "heads=2"),
                              ("hidden", "Tiny", "hidden"), ("hidden=64", "", "")):
        path = rms_norm_plan(tmp_path, benchmark={"decode": [4], "models": {key: model}})
        with pytest.raises(PlanError) as exc:
            load_plan(path)
        err = exc.value
        assert err.field.startswith("benchmark.models.") and err.found == found
        written = model or "''"  # an empty name, quoted
        assert err.line == path.read_text().splitlines().index(f"  models: {{{key}: {written}}}") + 1


def test_not_run_record_keeps_the_schema():
    spec = BenchSpec("decode", "bf16", "cuda_graph", "cpu", 8, (("hidden", 64),))
    rec = to_json(not_run_record(spec, "cuda_graph needs a CUDA device"))
    assert set(rec) <= RECORD_KEYS and set(rec["impls"]) == set(IMPLS)
    assert rec["impls"]["native"] == {"not_run": "cuda_graph needs a CUDA device"}
    assert rec["sizes"] == {"hidden": 64} and rec["num_tokens"] == 8


def test_launches_are_the_device_nodes_of_a_printed_cuda_graph():
    # The format of cudaGraphDebugDotPrint (CUDAGraph.debug_dump), verbose flags: node type first in each label.
    dot = """digraph dot {
subgraph cluster_1 {
label="graph_1" graph[style="dashed"];
"graph_1_node_0"[style="bold" shape="record" label="{KERNEL
| {ID | 0 (topoId: 3) | _ZN2at6native29vectorized_elementwise_kernel}
}"];
"graph_1_node_1"[style="solid" shape="record" label="{
MEMSET
| {{ID | node handle} | {1 | 0x1}}
}"];
"graph_1_node_2"[style="solid" shape="record" label="{EMPTY_NODE
| {ID | 2}
}"];
"graph_1_node_3"[style="bold" shape="record" label="{KERNEL
| {ID | 3 (topoId: 0) | _rms_norm_kernel}
}"];
"graph_1_node_0" -> "graph_1_node_1" [headlabel=0];
}
}"""
    assert timers.graph_launches(dot) == 3
    assert timers.graph_launches("") == 0


# ---------------------------------------------------------------- inputs and host timing


def test_rotated_input_sets_are_distinct_aligned_and_exceed_twice_l2(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, benchmark={"decode": [3]}))
    spec = BenchSpec("decode", "fp32", "eager", "cpu", 3, (("hidden", 50),))
    one = timers.working_set_bytes(input_sets(plan, spec, "cpu")[0])
    assert one == (3 * 50 * 2 + 50) * 4
    count = timers.rotation_count(one, l2_bytes=4096)
    assert count * one > 2 * 4096 >= (count - 1) * one
    sets = input_sets(plan, spec, "cpu", count)
    assert len(sets) == count and len({s["x"].data_ptr() for s in sets}) == count
    # every set starts 256 bytes after the last (a CUDA allocation itself is 512-byte aligned)
    assert all((s[n].data_ptr() - sets[0][n].data_ptr()) % 256 == 0 for s in sets for n in ("out", "x", "weight"))
    assert all(torch.isnan(s["out"]).all() for s in sets)
    assert not torch.equal(sets[0]["x"], sets[1]["x"])
    assert 0.5 < float(sets[1]["weight"].mean()) < 1.5  # init: around_one
    assert timers.rotation_count(one, None) == 1
    # a call far smaller than the cache rotates over MAX_ROTATED_SETS sets, not tens of thousands
    assert timers.rotation_count(one, l2_bytes=1 << 30) == timers.MAX_ROTATED_SETS


def test_host_timing_on_cpu():
    x = torch.randn(64, 64)
    t = timers.time_calls(lambda v: v["x"].sum(), [{"x": x}], "cpu")
    assert t.timer == "host" and timers.CPU_SAMPLES[0] <= len(t.samples_us) <= timers.CPU_SAMPLES[1]
    assert 0 < t.q20_us <= t.median_us <= t.q80_us


# ---------------------------------------------------------------- a --bench run on a CPU machine


def _waiting_for(lock: Path) -> bool:
    """Whether a process is blocked on an flock of `lock` (Linux lists waiters in /proc/locks, marked "->")."""
    inode = f":{lock.stat().st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


class TurnHolder(threading.Thread):
    """Holds the GPU turn (HARNESS_GPU_TURN) as another plan's run would, until a run waits for it: what it saw of
    `results` while that run waited."""

    def __init__(self, lock: Path, results: Path):
        super().__init__(daemon=True)
        self.lock, self.results, self.waited, self.results_while_waiting = lock, results, False, None
        self.run_ended = threading.Event()  # set by the test: a run that never waits ends with the turn still held
        self.file = open(lock, "a")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def run(self):
        while not self.waited and not self.run_ended.is_set():
            self.waited = _waiting_for(self.lock)
            time.sleep(0.05)
        self.results_while_waiting = self.results.exists() and json.loads(self.results.read_text())["benchmarks"]
        self.file.close()


@cpu_machine_only
def test_bench_run_on_cpu_records_native_vs_compiled(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)  # the run below is not an xdist worker, whatever runs this test
    plan = rms_norm_plan(pytester.path, matrix={"graph_mode": ["eager", "cuda_graph"]}, hidden=[64],
                         benchmark={"decode": [4]},
                         implementations={"native": {}, "compiled": {}, "vllm": VLLM_RMS_NORM})
    reports = pytester.path / "reports"
    # Another plan's run holds the GPU turn (scripts/gpu_run.sh bench): this run times nothing until it is given up.
    turn = pytester.path / "gpu-turn"
    monkeypatch.setenv("HARNESS_GPU_TURN", str(turn))
    holder = TurnHolder(turn, reports / "rms_norm" / "results" / "cpu.json")
    holder.start()
    result = pytester.runpytest_inprocess(
        "-p", "harness.plugin", "--plan", str(plan), "--bench", "-m", "bench", "-rs", "--no-report",
        "--reports-dir", str(reports), "--benchmark-json", str(pytester.path / "pb.json"), "-p", "no:cacheprovider")
    holder.run_ended.set()
    holder.join()
    assert holder.waited and not holder.results_while_waiting, "the run timed without waiting for its GPU turn"
    with open(turn, "a") as after:  # the run gave the turn up: the next plan's run may time
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines([
        "*SKIPPED*kernel not timed on a CPU machine*native vs compiled recorded (host timer)*",
        "*SKIPPED*cuda_graph needs a CUDA device*",
    ])

    results = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())
    assert set(results["benchmarks"]) == {"decode-fp32-eager-cpu-t4-hidden64", "decode-fp32-cuda_graph-cpu-t4-hidden64"}
    rec = results["benchmarks"]["decode-fp32-eager-cpu-t4-hidden64"]
    # no L2 size on a CPU machine and rec["copy_bw_gbps"] > 0
    assert RECORD_KEYS - {"l2_bytes"} <= set(rec) and rec["timer"] == "host"
    assert (rec["phase"], rec["dtype"], rec["sm"], rec["graph_mode"], rec["num_tokens"], rec["sizes"]) == \
        ("decode", "fp32", "cpu", "eager", 4, {"hidden": 64})
    assert "interpreter" in rec["impls"]["kernel"]["not_run"]
    assert ("not_run" in rec["impls"]["vllm"]) == bool(vllm_missing())
    nbytes = (4 * 64 * 2 + 64) * 4
    for name in ("native", "compiled"):
        figs = rec["impls"][name]
        assert set(figs) == FIGURE_KEYS  # no launch count on a CPU machine
        assert 0 < figs["q20_us"] <= figs["median_us"] <= figs["q80_us"]
    assert rec["bytes"] == nbytes and rec["copy_bw_gbps"] > 0 and "median_us" not in rec["impls"]["kernel"]

    # pytest-benchmark gets the kernel's samples only: on a CPU machine, which does not time the kernel, none at all
    # (and no warning that an item left its `benchmark` fixture unused).
    assert not (pytester.path / "pb.json").exists()
    result.stdout.no_fnmatch_line("*fixture was not used*")


def test_the_kernels_device_samples_reach_pytest_benchmark_through_its_fixture(pytester, monkeypatch):
    """What a benchmark item does with the kernel's timing on a GPU, with a stand-in timing: pytest-benchmark's
    `benchmark` fixture replays the device samples through the marker's timer, so its statistics are device time."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)  # pytest-benchmark turns itself off in an xdist worker
    pytester.makepyfile(test_item="""
        import pytest
        from harness.plugin.items import DeviceClock, store_in_pytest_benchmark
        from harness.results.store import BenchRecord, ImplFigures
        from harness.runtime.timing import Timing

        CLOCK = DeviceClock()

        @pytest.mark.benchmark(timer=CLOCK, group="decode-bf16-eager-sm90")
        def test_item(benchmark):
            rec = BenchRecord("decode", "bf16", "sm90", "eager", 4, {"hidden": 64}, bytes=7500, rotated_sets=8)
            rec.impls = {"kernel": ImplFigures(median_us=2.5, q20_us=2.5, q80_us=2.5, launches=1),
                         "native": ImplFigures(median_us=3.75, q20_us=3.7, q80_us=3.8),
                         "vllm": ImplFigures(not_run="vllm not installed")}
            store_in_pytest_benchmark(benchmark, CLOCK, Timing([1.0, 2.0, 3.0, 4.0], "cuda_events"), rec)
        """)
    result = pytester.runpytest_inprocess("--benchmark-json", str(pytester.path / "pb.json"), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    [stored] = json.loads((pytester.path / "pb.json").read_text())["benchmarks"]
    assert stored["name"] == "test_item" and stored["group"] == "decode-bf16-eager-sm90"
    assert stored["options"]["timer"] == "cuda_events"
    assert stored["stats"]["rounds"] == 4 and stored["stats"]["data"] == pytest.approx([1e-6, 2e-6, 3e-6, 4e-6])
    assert stored["stats"]["median"] == pytest.approx(2.5e-6)
    assert stored["extra_info"]["gbps"] == pytest.approx(3.0)
    assert stored["extra_info"] == {"impl": "kernel", "timer": "cuda_events", "calls_per_sample": 1,
                                    "gbps": stored["extra_info"]["gbps"],
                                    "pct_copy_bw": None, "launches": 1, "rotated_sets": 8, "speedup": {"native": 1.5},
                                    "bound_us": None, "pct_of_bound": None}


@cpu_machine_only
def test_benchmark_only_runs_the_bench_items_and_skips_the_cells_unrecorded(pytester, monkeypatch):
    """pytest-benchmark's --benchmark-only (and --benchmark-skip) select by the `benchmark` fixture a bench item
    requests; a cell skipped that way is not run and not recorded."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    plan = rms_norm_plan(pytester.path, hidden=[64], benchmark={"decode": [4]}, implementations={"native": {}})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess("-p", "harness.plugin", "--plan", str(plan), "--bench", "--benchmark-only",
                                          "-rs", "--no-report", "--reports-dir", str(reports), "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*Skipping non-benchmark (--benchmark-only active)*",
                                 "*SKIPPED*kernel not timed on a CPU machine*"])
    results = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())
    assert not results.get("cells") and set(results["benchmarks"]) == {"decode-fp32-eager-cpu-t4-hidden64"}


@cpu_machine_only
def test_bench_items_are_selected_with_k_and_m(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = rms_norm_plan(pytester.path, matrix={"phase": ["decode", "prefill"], "graph_mode": ["eager", "cuda_graph"]},
                         benchmark={"decode": [4], "prefill": [512]})
    common = ("-p", "harness.plugin", "--plan", str(plan), "--bench", "--collect-only", "-q", "--no-report",
              "--reports-dir", str(pytester.path / "reports"), "-p", "no:cacheprovider")
    by_marker = pytester.runpytest_inprocess(*common, "-m", "bench and decode and eager")
    by_marker.stdout.fnmatch_lines(["*::bench[[]decode-fp32-eager-cpu-t4-hidden64[]]",
                                    "*::bench[[]decode-fp32-eager-cpu-t4-hidden128[]]",
                                    "2/* tests collected*"])
    without = pytester.runpytest_inprocess(*common[:4], *common[5:], "-k", "bench")
    without.stdout.fnmatch_lines(["*no tests collected*"])


def test_a_baselines_wrong_result_recorded_as_an_error_is_read_as_differing():
    """Results written before `differs` existed kept it in `error`: read as differing, the kernel's stays an error."""
    data = {"phase": "prefill", "dtype": "bf16", "sm": "sm90", "graph_mode": "eager", "num_tokens": 8,
            "impls": {"kernel": {"median_us": 2.0, "q20_us": 1.9, "q80_us": 2.1,
                                 "error": "wrong result after timing: out differs"},
                      "compiled": {"median_us": 2.0, "q20_us": 1.9, "q80_us": 2.1,
                                   "error": "wrong result after timing: 2% one step off"},
                      "native": {"error": "RuntimeError: boom"}}}
    from harness.results.store import BenchRecord, from_json

    rec = from_json(BenchRecord, data, "test")
    assert rec.impls["compiled"].differs.endswith("2% one step off") and rec.impls["compiled"].error is None
    assert rec.impls["kernel"].error and not rec.impls["kernel"].differs
    assert rec.impls["native"].error == "RuntimeError: boom"  # untimed: still an error


def test_bench_shapes_leave_out_sizes_their_constraints_rule_out():
    """kernels/plans/rotary_embedding.yaml: rotary_dim at_most head_size, num_kv_heads divides num_heads."""
    plan = load_plan(ROOT / "kernels" / "plans" / "rotary_embedding.yaml")
    specs = bench_specs(plan, "sm90")
    sizes = [s.sizes_dict for s in specs]
    assert sizes and all(s["rotary_dim"] <= s["head_size"] and s["num_heads"] % s["num_kv_heads"] == 0 for s in sizes)
    assert any(s["rotary_dim"] < s["head_size"] for s in sizes)  # partial rotary dims are still benchmarked


def test_precompile_fills_inductors_cache_and_drops_the_autotune_choices_it_made(tmp_path, monkeypatch):
    """The shapes are compiled in other processes; launch configurations chosen there (files newer than the
    step's start) are deleted, so each item's own first call autotunes alone on the GPU; older ones stay."""
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    (cache / "aa").mkdir(parents=True)
    old, new = cache / "aa" / "old.best_config", cache / "aa" / "new.best_config"
    for path, when in ((old, 0), (new, time.time() + 3600)):  # before the step / written during it
        path.write_text("{}")
        os.utime(path, (when, when))
    # Without the compiled baseline: Inductor's C++ compile on a CPU machine would cost the suite 15 s.
    plan = load_plan(rms_norm_plan(tmp_path, benchmark={"decode": [4]}, implementations={"native": {}}))
    spec = BenchSpec("decode", "fp32", "eager", "cpu", 4, (("hidden", 64),))
    line = precompile(plan, [spec, dataclasses.replace(spec, graph_mode="cuda_graph")], "cpu", processes=1)
    assert line.startswith("precompiled 1 of 1 shapes"), line  # one shape: its two graph modes share the compile
    assert old.exists() and not new.exists()
    again = precompile(plan, [spec], "cpu", processes=1)
    assert again.startswith("precompile skipped: an earlier run compiled these 1 shapes"), again
    other = precompile(plan, [dataclasses.replace(spec, num_tokens=8)], "cpu", processes=1)
    assert other.startswith("precompiled 1 of 1 shapes"), other  # another shape is not in the cache yet



def test_one_precompile_pool_serves_several_plans_and_stamps_only_those_that_compiled(tmp_path, monkeypatch):
    """scripts/precompile.py's step: the shapes of several plans compile in one pool; a plan already stamped is
    skipped, a plan all of whose shapes compiled is stamped, and one whose reference raises is left to its items."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "raising_ref.py").write_text("def rms_norm_ref(x, weight, eps):\n    raise ValueError('boom')\n")
    native = {"benchmark": {"decode": [4]}, "implementations": {"native": {}}}
    # The third's compiled baseline is traced in the pool, and raises there (the others' C++ compiles would cost the
    # suite).
    plans = [rms_norm_plan(tmp_path, name="done.yaml", **native),
             rms_norm_plan(tmp_path, name="fresh.yaml", hidden=[32], **native),
             rms_norm_plan(tmp_path, name="raises.yaml", op={"reference": "raising_ref:rms_norm_ref"},
                           benchmark={"decode": [4]}, implementations={"native": {}, "compiled": {}})]
    loaded = [load_plan(path) for path in plans]
    spec = BenchSpec("decode", "fp32", "eager", "cpu", 4, (("hidden", 64),))
    work = [(loaded[0], [spec]), (loaded[1], [dataclasses.replace(spec, sizes=(("hidden", 32),))]),
            (loaded[2], [spec])]
    stamp = precompile(*work[0], "cpu", processes=1)
    assert stamp.startswith("precompiled 1 of 1 shapes"), stamp
    # One process for two plans' shapes (each spawned process imports torch: seconds of a 2-core machine's CPU).
    lines = precompile_plans(work, "cpu", processes=1)
    assert lines[0].startswith("precompile skipped"), lines
    assert lines[1].startswith("precompiled 1 of 1 shapes") and lines[2].startswith("precompiled 0 of 1 shapes"), lines
    assert "left to their items, the first failing with Unsupported" in lines[2], lines[2]  # Dynamo met the raise
    stamps = tmp_path / "inductor" / "harness-precompiled"
    assert (stamps / _compile_key(loaded[1], [work[1][1][0].shape])).exists()  # the next run skips it
    assert not (stamps / _compile_key(loaded[2], [spec.shape])).exists()  # the next run compiles it again


def test_a_long_call_is_sized_from_one_run_and_warmed_up_by_it(monkeypatch):
    """The timing loop's sizing: a call of LONG_CALL_MS or more is estimated from one run (five more of a 140 ms
    paged-attention baseline cost 0.7 s a timing), a shorter one from ESTIMATE_RUNS; a call as long as WARMUP_MS
    needs no warm-up runs after that, a shorter one WARMUP_MS worth of them."""
    asked = []

    def estimate(run, n):
        asked.append(n)
        return call_ms, 1e-5

    monkeypatch.setattr(timers, "_estimate", estimate)
    runs = []
    for call_ms, expected in ((140.0, [1]), (2.0, [1]), (0.01, [1, timers.ESTIMATE_RUNS])):
        asked.clear()
        assert timers._sized(lambda: None) == (call_ms, 1e-5) and asked == expected, (call_ms, asked)
    for call_ms, warm_ups in ((140.0, 0), (timers.WARMUP_MS, 0), (2.0, 5), (0.01, 1000)):
        runs.clear()
        timers._warm_up(lambda: runs.append(1), call_ms, 10_000)
        assert len(runs) == warm_ups, (call_ms, len(runs))


def test_a_batch_the_host_queued_slower_than_the_gpu_slept_is_timed_again(monkeypatch):
    """Host-ahead timing: the GPU sleeps while the host queues a batch of calls. Where queueing took longer than the
    sleep (the events' own recording, a stall), the GPU may have run dry and timed launch gaps: that batch's
    samples are dropped and it is queued again behind a sleep sized to what the host took."""
    sleeps, recorded = [], []

    class Event:
        def __init__(self, enable_timing=False):
            self.at = 0.0

        def record(self):
            self.at = len(recorded)
            recorded.append(self)

        def elapsed_time(self, end):
            return 0.001 * (2 if slow["batch"] else 1)  # ms: 2 µs while the host falls behind, else 1 µs

    slow = {"batch": True}

    def run():
        if slow["batch"]:
            time.sleep(0.002)  # the host falls far behind a sleep sized for 1 µs a call

    def sleep(cycles):
        if sleeps:  # every batch after the first is queued by a host that keeps up
            slow["batch"] = False
        sleeps.append(cycles)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", sleep)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timers, "_sleep_cycles_per_second", lambda: 1e9)
    samples = timers._events_host_ahead(run, 8, host_s_per_run=1e-6)
    assert samples == [1.0] * 8  # the first batch's 2 µs samples were dropped
    assert len(sleeps) == 2 and sleeps[1] > 100 * sleeps[0]  # queued again behind a sleep the host's pace needs
    # Calls that keep the GPU busy longer than the host takes to queue them (5 ms each, 2 ms of host time) never
    # leave it idle, however short the sleep: their batch stands.
    sleeps.clear()
    slow["batch"] = True
    monkeypatch.setattr(Event, "elapsed_time", lambda self, end: 5.0)
    assert timers._events_host_ahead(run, 8, host_s_per_run=1e-6) == [5000.0] * 8 and len(sleeps) == 1


def test_the_nightlys_precompile_step_names_a_plan_it_cannot_load_and_goes_on(tmp_path):
    """scripts/precompile.py, gpu_run.sh's first step: a malformed plan is reported with its file and line and left
    to its own run; the others still load (on a CPU machine nothing is compiled: the kernel is not timed there)."""
    import subprocess
    import sys

    bad = write_plan(tmp_path / "bad.yaml", op={"name": ["not", "a", "name"]})
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "precompile.py"), str(bad), str(ROOT / "plan.yaml")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert f"precompile: {bad} left to its own run: {bad}:" in out.stderr, out.stderr
    assert "plan.yaml" not in out.stderr
    if not torch.cuda.is_available():
        assert "nothing to do on a CPU machine" in out.stdout, out.stdout


def test_memory_other_processes_hold_is_not_run_even_inside_a_comparison(tmp_path, monkeypatch):
    """torch.testing wraps an out-of-memory raised while comparing in "RuntimeError: Comparing ...": its cause
    still says whose fault it is, so the implementation is not run here rather than failed."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # the message alone, not this machine's GPU
    path = rms_norm_plan(tmp_path, hidden=[64], benchmark={"decode": [4]}, implementations={
        "native": {}, "denied": {"path": "tests.broken.rms_norm_bugs:oom_inside_a_comparison"}})
    plan = load_plan(path)
    outcome = run_benchmark(BenchTask(plan, bench_specs(plan, "cpu")[0]))
    denied = outcome.record.impls["denied"]
    assert denied.not_run == "the GPU ran out of memory (39.3 GiB held by other processes)", denied
    assert not denied.timed and denied.error is None and not outcome.failures
