"""Checks that see what value comparisons cannot: memory safety under compute-sanitizer (memcheck, then its racecheck,
initcheck and synccheck lanes) and layouts kept under CUDA graphs. On a CPU machine the GPU checks are reported not
run, with the reason; on a GPU they must catch the bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.runtime.memcheck import sanitizer
from tests.plans import read_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "gpu_checks_plan.yaml"
BUGS = "tests.broken.rms_norm_bugs"
SANITIZER_BUGS = "tests.broken.sanitizer_bugs"  # right values, a bug only one sanitizer lane sees
LANES = ("racecheck", "initcheck", "synccheck")
on_gpu = pytest.mark.skipif(not torch.cuda.is_available() or sanitizer() is None,
                            reason="needs a CUDA device and compute-sanitizer")


def run_plan(tmp_path: Path, kernel: str, layouts: str = "contiguous", *args: str) -> dict:
    op_args = read_plan(FIXTURE)["op"]["args"]
    op_args["x"]["layout"] = [layout.strip() for layout in layouts.split(",")]
    plan = write_plan(tmp_path / "plan.yaml", FIXTURE, op={"kernel": kernel, "args": op_args})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "--plan", str(plan), "--plan-profile",
                    "ci", "--reports-dir", str(tmp_path / "reports"), "-p", "no:cacheprovider", "-q", *args],
                   cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    results = next((tmp_path / "reports" / "rms_norm" / "results").glob("*.json"))
    return json.loads(results.read_text())["cells"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's answer")
def test_gpu_checks_are_not_run_on_a_cpu_machine(tmp_path):
    cells = run_plan(tmp_path, f"{BUGS}:unmasked_load", "contiguous", "--examples", "2")  # the interpreter's pace
    assert cells["decode-bf16-tp1-memcheck-cpu"]["status"] == "not_run"
    assert cells["decode-bf16-tp1-memcheck-cpu"]["reason"] == "memcheck needs a CUDA device; this machine has none"
    # Its values are right; the interpreter reports its reads past the end of weight, at the kernel's line.
    eager = cells["decode-bf16-tp1-eager-cpu"]
    assert eager["status"] == "failed", eager
    assert "OutOfBounds: load at " in eager["reason"] and "tests/broken/rms_norm_bugs.py:" in eager["reason"], \
        eager["reason"]
    assert "in _unmasked_load_kernel" in eager["reason"] and "past its end" in eager["reason"], eager["reason"]


@on_gpu
def test_memcheck_catches_reads_past_the_end_that_values_do_not(tmp_path):
    cells = run_plan(tmp_path, f"{BUGS}:unmasked_load")
    assert cells["decode-bf16-tp1-eager-sm90"]["status"] == "passed"
    assert cells["decode-bf16-tp1-cuda_graph-sm90"]["status"] == "passed"
    memcheck = cells["decode-bf16-tp1-memcheck-sm90"]
    assert memcheck["status"] == "failed" and "memcheck:" in memcheck["reason"], memcheck
    assert "_unmasked_load_kernel" in memcheck["reason"] and memcheck["minimal_example"], memcheck


@on_gpu
def test_a_correct_kernel_passes_memcheck(tmp_path):
    cells = run_plan(tmp_path, "kernels.rms_norm:rms_norm", "contiguous, strided")
    assert {c["status"] for k, c in cells.items() if k.endswith("sm90")} == {"passed"}, cells
    facts = cells["decode-bf16-tp1-memcheck-sm90"]["facts"]
    assert facts["sanitizer"] == "memcheck, racecheck, initcheck, synccheck", facts  # every lane ran to its summary
    assert not any(facts[lane].startswith("failed") for lane in LANES), facts


@on_gpu
@pytest.mark.parametrize("kernel, lane, kernel_name", [
    ("shared_race", "racecheck", "rms_norm_shared_race_kernel"),  # CUDA: a Triton kernel cannot race in shared memory
    ("uninitialised_slots", "initcheck", "_rms_norm_from_slots_kernel"),
    ("split_barrier", "synccheck", "rms_norm_split_barrier_kernel"),  # CUDA: nor place a barrier per thread
])
def test_each_sanitizer_lane_catches_the_bug_values_and_memcheck_miss(tmp_path, kernel, lane, kernel_name):
    cells = run_plan(tmp_path, f"{SANITIZER_BUGS}:{kernel}")
    assert cells["decode-bf16-tp1-eager-sm90"]["status"] == "passed", cells  # its values are right
    cell = cells["decode-bf16-tp1-memcheck-sm90"]
    assert cell["status"] == "failed" and cell["reason"].startswith(f"{lane}: "), cell  # memcheck found nothing
    assert kernel_name in cell["reason"] and cell["minimal_example"], cell
    assert cell["facts"][lane].startswith("failed: "), cell["facts"]


@on_gpu
def test_cuda_graph_cells_keep_the_drawn_layout(tmp_path):
    cells = run_plan(tmp_path, f"{BUGS}:row_stride_ignored", "strided")
    assert cells["decode-bf16-tp1-eager-sm90"]["status"] == "failed"
    assert cells["decode-bf16-tp1-cuda_graph-sm90"]["status"] == "failed", cells["decode-bf16-tp1-cuda_graph-sm90"]


@on_gpu
def test_a_host_sync_fails_cuda_graph_capture_and_nothing_else(tmp_path):
    cells = run_plan(tmp_path, f"{BUGS}:host_sync")
    assert cells["decode-bf16-tp1-eager-sm90"]["status"] == "passed"
    graph = cells["decode-bf16-tp1-cuda_graph-sm90"]
    assert graph["status"] == "failed" and "synchronizes with the host" in graph["reason"], graph
