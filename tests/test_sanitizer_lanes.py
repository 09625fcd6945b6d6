"""compute-sanitizer's racecheck, initcheck and synccheck lanes after memcheck (harness.runtime.memcheck), on any
machine: their reports parsed, the filter that keeps torch's and cuBLAS's kernels from failing the kernel's cell, and
the lanes run with subprocess.run standing in for compute-sanitizer.

The outputs below follow the layouts of NVIDIA's Compute Sanitizer documentation and of reports seen in the wild:
the newer `at kernel+0x.. in file.py:57` (with `--strip-paths`, the default, a file's name alone), the older
`at 0x.. in /path/file.py:171:kernel`, racecheck's hazard and analysis reports and its `RACECHECK SUMMARY: N hazards
displayed (E errors, W warnings)`, and host frames on one line (`Host Frame: sym [0x..] in lib.so`) or two."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import kernels.rms_norm
import tests.broken.sanitizer_bugs as sanitizer_bugs
from harness.plan.load import load_plan
from harness.cells.matrix import Cell
from harness.cells.status import Status
from harness.results.checks import BY_NAME, Subject, applicable, not_checked, version_changes
from harness.results.store import CellRecord, to_json
from harness.runtime import memcheck
from harness.runtime.memcheck import (IDENTITY, LANE_ENV, LANES, _bare, judge_lane, kernel_errors, kernel_identity,
                                      parse_reports)
from tests.plans import rms_norm_plan

ROOT = Path(__file__).resolve().parents[1]

CELL = Cell("decode", "bf16", 1, "memcheck", "sm90")
EXAMPLES = ["num_tokens=1 hidden=64 x:contiguous scale=normal (N(0,1)) seed=0",
            "num_tokens=3 hidden=64 x:contiguous scale=large (100*N(0,1)) seed=1",
            "num_tokens=7 hidden=64 x:contiguous scale=tiny (0.001*N(0,1)) seed=2"]
RECORD = "harness-memcheck-record: " + json.dumps(to_json(CellRecord(**CELL.axes(), status=Status.PASSED,
                                                                        examples=3)))
MARKS = [memcheck.MARK + ex for ex in EXAMPLES]


def output(*reports: str, summary: str = "========= ERROR SUMMARY: 0 errors", identity: dict | None = None,
           record: bool = True) -> str:
    """A lane's output: the banner, the kernel's identity, each report after the next example's mark, the rest of the
    marks, the record and the tool's summary."""
    lines = ["========= COMPUTE-SANITIZER"]
    lines += [IDENTITY + json.dumps(identity)] if identity is not None else []
    marks = list(MARKS)
    for report in reports:
        lines += [marks.pop(0), report.rstrip("\n")]
    lines += marks + ([RECORD] if record else []) + [summary]
    return "\n".join(lines) + "\n"


# racecheck with --racecheck-report all on a Triton kernel: a hazard (its two threads, the launch's host frames),
# then the analysis naming both source lines
RACE_IN_TRITON = """\
========= Error: Potential RAW hazard detected at __shared__ 0x40 in block (2,0,0) :
=========     Write Thread (32,0,0) at _rms_norm_kernel+0x5b0 in rms_norm.py:57
=========     Read Thread (0,0,0) at _rms_norm_kernel+0x6a0 in rms_norm.py:58
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2d3e5f] in libcuda.so.1
=========         Host Frame: _launch [0x1f3a] in __triton_launcher.so
=========         Host Frame: _PyObject_MakeTpCall [0x1b2c3a] in python3.11
=========
========= Error: Race reported between Write access at _rms_norm_kernel+0x5b0 in rms_norm.py:57
=========     and Read access at _rms_norm_kernel+0x6a0 in rms_norm.py:58 [12 hazards]
=========
"""
RACE_SUMMARY = "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)"

# A race inside one warp: racecheck's WARNING level (warp-synchronous code), never counted
WARP_RACE = """\
========= Warning: Race reported between Write access at _rms_norm_kernel+0x5b0 in rms_norm.py:57
=========     and Read access at _rms_norm_kernel+0x6a0 in rms_norm.py:58 [3 hazards]
=========
"""

# initcheck in torch's own kernels: a reduction over a buffer torch left partly unwritten, and cuBLAS's GEMM
INIT_IN_TORCH = """\
========= Uninitialized __global__ memory read of size 4 bytes
=========     at void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MaxOps<float>, \
unsigned int, float, 4>>(T3)+0x1c60
=========     by thread (96,0,0) in block (0,0,0)
=========     Address 0x7f1e5c000a00
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2d3e5f] in libcuda.so.1
=========         Host Frame:  [0x15a3c] in libcudart.so.12
=========         Host Frame: at::native::gpu_reduce_kernel<float, float, 4>(at::TensorIterator&) [0x1c8a2e1] in \
libtorch_cuda.so
=========
========= Uninitialized __global__ memory read of size 16 bytes
=========     at sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_kernel__5x_cublas+0x1a40
=========     by thread (0,0,0) in block (1,0,0)
=========     Address 0x7f1e5c200000
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2d3e5f] in libcuda.so.1
=========         Host Frame:  [0x7a10c2] in libcublasLt.so.12
=========
"""

# initcheck in the older layout: the offset first, the full path and the kernel after the line; host frames on two
# lines
INIT_OLDER = """\
========= Uninitialized __global__ memory read of size 4 bytes
=========     at 0x1f0 in /work/tests/broken/sanitizer_bugs.py:171:_rms_norm_from_slots_kernel
=========     by thread (1,0,0) in block (3,0,0)
=========     Address 0x7f3c7ec000fc
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: [0x2f26f0]
=========                in /usr/lib/x86_64-linux-gnu/libcuda.so.1
=========     Host Frame: [0x2800]
=========                in /root/.triton/cache/3f0c/__triton_launcher.so
"""

# synccheck in a CUDA kernel built with load_inline (its source is the build folder's cuda.cu)
BARRIER_IN_CUDA = """\
========= Barrier error detected. Divergent thread(s) in block
=========     at void rms_norm_split_barrier_kernel<c10::BFloat16>(T1 *, const T1 *, const T1 *, long, long, int, \
float)+0x3d0 in cuda.cu:92
=========     by thread (32,0,0) in block (0,0,0)
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2d3e5f] in libcuda.so.1
=========         Host Frame: launch(bool, at::Tensor, at::Tensor, at::Tensor, double) [0x1e2a4] in \
harness_sanitizer_bugs.so
=========
"""

MEMORY_ERROR = """\
========= Invalid __global__ read of size 2 bytes
=========     at _rms_norm_kernel+0x2f0 in rms_norm.py:49
=========     by thread (63,0,0) in block (2,0,0)
=========     Address 0x7f1e5c0007d0 is out of bounds
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return load_plan(rms_norm_plan(tmp_path_factory.mktemp("plan"), hidden=[64]))


@pytest.fixture(scope="module")
def rms_norm_identity(plan):
    return kernel_identity(plan, CELL, kernels.rms_norm.rms_norm)


# ---------------------------------------------------------------- reports parsed


def test_the_newer_layout_gives_kernel_file_line_and_host_libraries():
    hazard, analysis = parse_reports("racecheck", output(RACE_IN_TRITON, summary=RACE_SUMMARY))
    assert hazard.severity == analysis.severity == "error"
    assert hazard.kernels == ["_rms_norm_kernel", "_rms_norm_kernel"]  # not "kernel launch time"
    assert hazard.places == [("rms_norm.py", 57), ("rms_norm.py", 58)]
    assert hazard.libraries == ["libcuda.so.1", "__triton_launcher.so", "python3.11"]
    assert analysis.places == [("rms_norm.py", 57), ("rms_norm.py", 58)] and analysis.libraries == []


def test_the_older_layout_and_two_line_host_frames():
    [report] = parse_reports("initcheck", output(INIT_OLDER, summary="========= ERROR SUMMARY: 1 error"))
    assert report.kernels == ["_rms_norm_from_slots_kernel"]
    assert report.places == [("/work/tests/broken/sanitizer_bugs.py", 171)]
    assert report.libraries == ["libcuda.so.1", "__triton_launcher.so"]
    assert report.describe() == ("Uninitialized __global__ memory read of size 4 bytes; at 0x1f0 in "
                                 "/work/tests/broken/sanitizer_bugs.py:171:_rms_norm_from_slots_kernel; by thread "
                                 "(1,0,0) in block (3,0,0)")


def test_a_cuda_kernels_name_is_read_bare_with_its_namespace():
    reports = parse_reports("initcheck", output(INIT_IN_TORCH, summary="========= ERROR SUMMARY: 2 errors"))
    assert [_bare(r.kernels[0]) for r in reports] == [
        ("reduce_kernel", "at"),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_kernel__5x_cublas", "")]
    assert reports[0].libraries == ["libcuda.so.1", "libcudart.so.12", "libtorch_cuda.so"]
    assert _bare("void vllm::rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16 *, const c10::BFloat16 *)") == \
        ("rms_norm_kernel", "vllm")
    [barrier] = parse_reports("synccheck", output(BARRIER_IN_CUDA))
    assert _bare(barrier.kernels[0]) == ("rms_norm_split_barrier_kernel", "")
    assert barrier.places == [("cuda.cu", 92)]


def test_the_processes_own_lines_and_the_summaries_are_no_reports():
    text = output(summary="========= ERROR SUMMARY: 0 errors")
    assert parse_reports("initcheck", text) == parse_reports("synccheck", text) == []


# ---------------------------------------------------------------- the filter: only the kernel's own code counts


def test_the_filter_keeps_the_kernels_reports_by_name_file_namespace_or_library(rms_norm_identity):
    assert "_rms_norm_kernel" in rms_norm_identity["names"] and "rms_norm.py" in rms_norm_identity["files"]
    race = parse_reports("racecheck", output(RACE_IN_TRITON, summary=RACE_SUMMARY))
    assert kernel_errors(race, rms_norm_identity) == (race, [])
    by_file = {"names": [], "namespaces": [], "files": ["sanitizer_bugs.py"], "libraries": []}
    older = parse_reports("initcheck", output(INIT_OLDER))
    assert kernel_errors(older, by_file) == (older, [])
    vllm = parse_reports("synccheck", output(BARRIER_IN_CUDA.replace(
        "void rms_norm_split_barrier_kernel", "void vllm::rms_norm_kernel")))
    by_namespace = {"names": [], "namespaces": ["vllm"], "files": [], "libraries": []}
    assert kernel_errors(vllm, by_namespace) == (vllm, [])
    by_library = {"names": [], "namespaces": [], "files": [], "libraries": ["harness_sanitizer_bugs.so"]}
    barrier = parse_reports("synccheck", output(BARRIER_IN_CUDA))
    assert kernel_errors(barrier, by_library) == (barrier, [])


def test_the_filter_leaves_torchs_and_cublass_reports_out(rms_norm_identity):
    torch_reports = parse_reports("initcheck", output(INIT_IN_TORCH))
    assert kernel_errors(torch_reports, rms_norm_identity) == ([], torch_reports)
    # a kernel of the user's named as one of torch's is not torch's at::native::reduce_kernel
    same_name = {**rms_norm_identity, "names": ["reduce_kernel"], "namespaces": []}
    assert kernel_errors(torch_reports, same_name) == ([], torch_reports)
    # the process ended before saying what its kernel is: nothing can be the kernel's
    race = parse_reports("racecheck", output(RACE_IN_TRITON))
    assert kernel_errors(race, None) == ([], race)


def test_the_kernels_identity_names_its_triton_and_cuda_kernels(plan):
    identity = kernel_identity(plan, CELL, sanitizer_bugs.split_barrier)
    assert {"rms_norm_shared_race_kernel", "rms_norm_split_barrier_kernel", "_chunk_sums_kernel",
            "_rms_norm_from_slots_kernel"} <= set(identity["names"])
    assert not {"warp_sum", "write_row", "launch"} & set(identity["names"])  # device and host functions, no kernels
    assert "sanitizer_bugs.py" in identity["files"] and identity["namespaces"] == []
    bundled = load_plan(ROOT / "plan.yaml")
    vllm = kernel_identity(bundled, Cell("decode", "bf16", 1, "memcheck", "sm90", "vllm"), None)
    assert vllm == {"names": [], "namespaces": ["vllm"], "files": [], "libraries": []}
    native = kernel_identity(bundled, Cell("decode", "bf16", 1, "memcheck", "sm90", "native"), None)
    assert native == {"names": [], "namespaces": [], "files": [], "libraries": []}  # torch's code: never the kernel's


# ---------------------------------------------------------------- a lane's verdict


def test_a_lane_names_its_tool_the_kernels_line_and_the_example(rms_norm_identity):
    lane = judge_lane("racecheck", output(RACE_IN_TRITON, summary=RACE_SUMMARY, identity=rms_norm_identity), 0)
    assert lane.reason == ("racecheck: 2 hazard(s); first: Race reported between Write access at _rms_norm_kernel"
                           "+0x5b0 in rms_norm.py:57; and Read access at _rms_norm_kernel+0x6a0 in rms_norm.py:58 "
                           "[12 hazards]")
    assert lane.example == EXAMPLES[0] and lane.ran and lane.fact == "failed: 2 hazard(s) in the kernel"


def test_a_cuda_kernels_barrier_error_fails_its_cell(plan):
    identity = kernel_identity(plan, CELL, sanitizer_bugs.split_barrier)
    lane = judge_lane("synccheck", output(BARRIER_IN_CUDA, summary="========= ERROR SUMMARY: 8 errors",
                                          identity=identity), 0)
    assert lane.reason.startswith("synccheck: 8 barrier error(s); first: Barrier error detected. Divergent thread(s) "
                                  "in block; at void rms_norm_split_barrier_kernel<c10::BFloat16>"), lane.reason
    assert "cuda.cu:92" in lane.reason


def test_warnings_and_reports_the_output_does_not_place_are_facts(rms_norm_identity):
    warned = judge_lane("racecheck", output(WARP_RACE, summary="========= RACECHECK SUMMARY: 1 hazard displayed "
                                                              "(0 errors, 1 warning)", identity=rms_norm_identity), 0)
    assert not warned.reason and warned.fact.startswith("1 warning(s), not counted (first: Race reported between")
    unplaced = judge_lane("initcheck", output(summary="========= ERROR SUMMARY: 3 errors", identity=rms_norm_identity),
                          0)
    assert not unplaced.reason and unplaced.fact == "3 error(s) its output does not place, not counted"


def test_a_tool_that_cannot_check_the_process_is_not_run():
    # the wording of a tool's refusal is this test's own: any line of the tool's starting "Error:" that is no report
    refused = judge_lane("racecheck", output(summary="========= Error: Racecheck is not supported on this device\n"
                                                     + RACE_SUMMARY), 0)
    assert refused.fact == "not run: Error: Racecheck is not supported on this device" and not refused.ran
    # a sanitizer that prints its banner and a clean summary without running the process checked nothing
    nothing = judge_lane("synccheck", "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n", 0)
    assert nothing.fact.startswith("not run: the process under synccheck gave no result") and not nothing.ran
    # a report headed by its severity word is a report, not the tool refusing
    headed = judge_lane("synccheck", output(BARRIER_IN_CUDA.replace("========= Barrier", "========= Error: Barrier"),
                                            summary="========= ERROR SUMMARY: 1 error",
                                            identity={"names": ["rms_norm_split_barrier_kernel"]}), 0)
    assert headed.reason.startswith("synccheck: 1 barrier error(s); first: Barrier error detected."), headed
    crashed = judge_lane("initcheck", "Traceback (most recent call last):\nImportError: libcuda.so.1\n", 1)
    assert crashed.fact.startswith("not run: compute-sanitizer initcheck did not finish (exit 1)")


# ---------------------------------------------------------------- the lanes after memcheck, the tool stood in for


@pytest.fixture
def sanitizer_run(monkeypatch):
    """compute-sanitizer stood in for: each tool's output as the test sets it (an exception: raised), and the calls
    made (tool, timeout, environment)."""
    outputs, calls = {}, []

    def run(cmd, **kwargs):
        tool = cmd[cmd.index("--tool") + 1]
        calls.append((tool, kwargs["timeout"], kwargs["env"]))
        found = outputs[tool]
        if isinstance(found, BaseException):
            raise found
        return subprocess.CompletedProcess(cmd, 0, found, "")

    monkeypatch.setattr(memcheck, "sanitizer", lambda: "/usr/local/cuda/bin/compute-sanitizer")
    monkeypatch.setattr(subprocess, "run", run)
    return outputs, calls


def test_a_racecheck_hazard_after_a_clean_memcheck_fails_the_cell(plan, rms_norm_identity, sanitizer_run):
    outputs, calls = sanitizer_run
    clean = output(identity=rms_norm_identity)
    outputs.update(memcheck=output(), racecheck=output(RACE_IN_TRITON, summary=RACE_SUMMARY,
                                                       identity=rms_norm_identity), initcheck=clean, synccheck=clean)
    rec = memcheck.run_memcheck(plan, CELL, timeout_s=600).record
    assert rec.status == Status.FAILED and rec.reason.startswith("racecheck: 2 hazard(s); first: Race reported"), rec
    assert "rms_norm.py:57" in rec.reason and rec.minimal_example == EXAMPLES[0]
    assert rec.facts["sanitizer"] == "memcheck, racecheck, initcheck, synccheck"
    assert (rec.facts["racecheck"], rec.facts["initcheck"]) == ("failed: 2 hazard(s) in the kernel", "clean")
    assert [tool for tool, _, _ in calls] == ["memcheck", *LANES]
    assert LANE_ENV not in calls[0][2]  # memcheck's process prints what it always did
    assert all(env[LANE_ENV] == tool and env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1" for tool, _, env in calls[1:])
    # each lane an equal share of what is left of the cell's time (a lane's unused time passes to the next)
    assert [limit for _, limit, _ in calls[1:]] == pytest.approx([200, 300, 600], abs=1)


def test_a_tool_missing_or_refusing_is_not_run_and_the_cell_passes(plan, rms_norm_identity, sanitizer_run):
    outputs, _ = sanitizer_run
    outputs.update(memcheck=output(),
                   racecheck=output(summary="========= Error: Racecheck is not supported on this device"),
                   initcheck=subprocess.TimeoutExpired(["compute-sanitizer"], 200),
                   synccheck=FileNotFoundError(2, "No such file or directory", "compute-sanitizer"))
    rec = memcheck.run_memcheck(plan, CELL, timeout_s=600).record
    assert rec.status == Status.PASSED and rec.reason == "", rec
    assert rec.facts["sanitizer"] == "memcheck"
    assert rec.facts["racecheck"] == "not run: Error: Racecheck is not supported on this device"
    assert rec.facts["initcheck"].startswith("not run: did not finish in ")
    assert rec.facts["synccheck"].startswith("not run: compute-sanitizer could not start")


def test_errors_in_torchs_kernels_alone_are_facts_and_the_cell_passes(plan, rms_norm_identity, sanitizer_run):
    outputs, _ = sanitizer_run
    clean = output(identity=rms_norm_identity)
    outputs.update(memcheck=output(), racecheck=output(summary=RACE_SUMMARY.replace("2", "0"),
                                                       identity=rms_norm_identity),
                   initcheck=output(INIT_IN_TORCH, summary="========= ERROR SUMMARY: 2 errors",
                                    identity=rms_norm_identity), synccheck=clean)
    rec = memcheck.run_memcheck(plan, CELL, timeout_s=600).record
    assert rec.status == Status.PASSED, rec
    assert rec.facts["sanitizer"] == "memcheck, racecheck, initcheck, synccheck"
    assert rec.facts["initcheck"] == ("2 uninitialised read(s) outside the kernel, not counted (first in void "
                                      "at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
                                      "at::native::MaxOps<float>, unsigned int, float, 4>>)")


def test_the_lanes_wait_for_a_clean_memcheck(plan, sanitizer_run):
    outputs, calls = sanitizer_run
    outputs["memcheck"] = output(MEMORY_ERROR, summary="========= ERROR SUMMARY: 1 error")
    rec = memcheck.run_memcheck(plan, CELL, timeout_s=600).record
    assert rec.status == Status.FAILED and rec.reason.startswith("memcheck: 1 memory error(s)"), rec
    assert [tool for tool, _, _ in calls] == ["memcheck"] and rec.facts["sanitizer"] == "memcheck"


def test_a_lane_without_time_left_is_not_started(plan, rms_norm_identity, sanitizer_run):
    outputs, calls = sanitizer_run
    clean = output(identity=rms_norm_identity)
    outputs.update(memcheck=output(), racecheck=clean, initcheck=clean, synccheck=clean)
    rec = memcheck.run_memcheck(plan, CELL, timeout_s=4).record  # less than a sanitizer needs to start
    assert rec.status == Status.PASSED and [tool for tool, _, _ in calls] == ["memcheck"]
    assert all(rec.facts[lane].startswith("not run: ") and "of the cell's time limit left for it" in rec.facts[lane]
               for lane in LANES), rec.facts


# ---------------------------------------------------------------- each lane a check of its own


def test_the_lanes_are_checks_of_their_own_on_a_gpus_memcheck_cells():
    for lane in LANES:
        check = BY_NAME[lane]
        assert check.module == "runtime/memcheck.py" and check.version == memcheck.CHECK_VERSIONS[lane]
        assert check.applies(Subject("cells", "sm90", "bf16", graph_mode="memcheck"))
        assert not check.applies(Subject("cells", "cpu", "bf16", graph_mode="memcheck"))
        assert not check.applies(Subject("cells", "sm90", "bf16", graph_mode="eager"))
        assert not check.applies(Subject("benchmarks", "sm90", "bf16", graph_mode="memcheck"))


def test_a_memcheck_record_made_before_the_lanes_is_not_stale_but_not_checked_for_them():
    subject = Subject("cells", "sm90", "bf16", graph_mode="memcheck")
    before = {name: v for name, v in applicable(subject).items() if name not in LANES}
    assert before["memcheck"] == 1
    assert version_changes(before, subject) == []
    assert [name for name in not_checked(before, subject)] == list(LANES)


def test_the_lanes_options_are_the_tools_documented_ones():
    """racecheck reports hazards and its analysis; initcheck never tracks unused memory (an op may leave part of a
    buffer unused); each lane's command has memcheck's shape (the tool, two options, the print limit), which
    tests/test_tasks.py's stand-in for compute-sanitizer counts on."""
    assert LANES["racecheck"] == ["--racecheck-report", "all"]
    assert not any("--track-unused-memory" in opts for opts in LANES.values())
    assert all(len(opts) == 2 for opts in LANES.values())
