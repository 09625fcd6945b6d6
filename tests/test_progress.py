"""What a run says while and after it runs: elapsed time and an estimate for the numerics cells left, the cells that
did not run as one count and a line per reason (their statuses still recorded), and a failing cell's shrinking
capped in time on a CPU machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from harness.plugin import progress as progress_module
from harness.plugin.progress import Progress, duration
from harness.plugin.summary import provider_summary
from harness.runtime import shrink_clock
from harness.runtime.inputs import Example
from harness.runtime.runner import run_cell
from harness.runtime.shrink_clock import ShrinkClock
from harness.runtime.tasks import CellTask, RunSettings
from harness.results.store import Status
from harness.plan.load import load_plan
from harness.cells.matrix import Cell
from tests.plans import cpu_machine_only, hide_vllm, read_results, rms_norm_plan, write_plan
from tests.test_vllm_kernels import provider_plan

ROOT = Path(__file__).resolve().parents[1]


def cell(cell_id: str) -> Cell:
    return Cell.from_id(cell_id)


def test_the_estimate_takes_each_cell_from_finished_cells_like_it():
    progress = Progress(started=0.0)
    progress.expect(cell(c) for c in ("decode-fp32-tp1-eager-cpu", "prefill-fp32-tp1-eager-cpu",
                                      "decode-fp32-tp1-torch_compile-cpu", "decode-fp32-tp2-eager-cpu",
                                      "decode-fp32-tp1-eager-cpu-vllm"))
    assert progress.estimate() is None  # nothing finished: nothing to go by
    progress.finished(cell("decode-fp32-tp1-eager-cpu"), 10.0, now=10.0)
    said = progress.finished(cell("decode-fp32-tp1-torch_compile-cpu"), 40.0, now=50.0)
    # prefill eager tp1: as the eager tp1 cell (10 s); tp2: no tp2 cell finished, the kernel's mean (25 s); vLLM's:
    # none of its cells finished, the mean of all (25 s)
    assert progress.estimate() == pytest.approx(10 + 25 + 25)
    assert said == "40.0 s; 2 of 5 cells in 50.0 s, about 1m00s left"
    progress.parallel = 2  # xdist workers run the rest side by side
    assert progress.estimate() == pytest.approx(30)
    for c in ("prefill-fp32-tp1-eager-cpu", "decode-fp32-tp2-eager-cpu"):
        progress.finished(cell(c), 5.0, now=60.0)
    assert progress.finished(cell("decode-fp32-tp1-eager-cpu-vllm"), 1.0, now=61.0) == \
        "1.0 s; 5 of 5 cells in 1m01s"  # nothing left: no estimate


def test_durations_read_as_seconds_minutes_and_hours():
    assert [duration(s) for s in (0.04, 41.23, 125, 3720)] == ["0.0 s", "41.2 s", "2m05s", "1h02m"]


def test_the_default_verbositys_lines_come_at_most_every_period(monkeypatch):
    progress = Progress(started=0.0)
    assert not progress.line_due(now=10.0)
    assert progress.line_due(now=31.0)
    assert not progress.line_due(now=50.0)  # 19 s after the last line
    assert progress.line_due(now=61.5)


def test_a_provider_none_of_whose_cells_ran_is_one_line():
    plan = load_plan(ROOT / "plan.yaml")
    missing = "vllm not installed and no vLLM ops library named (HARNESS_VLLM_OPS_LIBRARY or --vllm-ops-library)"
    tried = [(cell("decode-fp32-tp1-eager-cpu-vllm"), "not_run", missing),
             (cell("prefill-bf16-tp2-eager-cpu-vllm"), "not_run", missing)]
    left = [(cell("decode-fp32-tp1-eager-sm90-vllm"), "not_run", "needs sm90; this machine is cpu"),
            (cell("decode-bf16-tp1-memcheck-cpu-vllm"), "excluded", "excluded by the plan"),
            (cell("decode-fp16-tp1-eager-cpu-vllm"), "sampled_out", "sampled out")]
    assert provider_summary(plan, "vllm", tried, tried + left) == (
        f"rms_norm: vllm through the same cells: none ran here: {missing} (2 cells tried; the other 3: 1 not run "
        "here, 1 excluded, 1 sampled out)")
    assert provider_summary(plan, "vllm", [], left) == ("rms_norm: vllm through the same cells: none ran here: of "
                                                        "its 3 cells, 1 not run here, 1 excluded, 1 sampled out")
    ran = [(cell("decode-fp16-tp1-eager-cpu-vllm"), "xfail", "output 'out': ...")]
    assert provider_summary(plan, "vllm", ran, ran + left) == ""  # a table, as for the kernel


# ---------------------------------------------------------------- a run end to end


@pytest.fixture
def run_plan(run_plan, faithful_interpreter):
    """conftest's run_plan, two examples a cell, in this process (its kernels too: --isolation none)."""
    return lambda plan, *args: run_plan(plan, "--examples", "2", "--isolation", "none", *args)


def two_sm_provider_plan(path: Path) -> Path:
    """The RMSNorm with vLLM's kernel as a provider, on a CPU and an sm90: on this machine the kernel's CPU cell
    runs, vLLM's finds its kernel missing (vLLM hidden), and both sm90 cells cannot run."""
    return write_plan(path / "plan.yaml", provider_plan(path), matrix={"sm": ["cpu", "sm90"]})


@cpu_machine_only
def test_cells_that_cannot_run_here_are_one_count_and_still_recorded(pytester, run_plan, monkeypatch):
    hide_vllm(monkeypatch)
    result = run_plan(two_sm_provider_plan(pytester.path), "-q")
    # The sm90 cells: deselected, once; vLLM's CPU cell found its kernel missing only when it ran: skipped.
    result.assert_outcomes(passed=1, skipped=1, deselected=2)
    out = result.stdout.str()
    assert "1 not run here: needs sm90; this machine is cpu" in out
    assert "rms_norm: vllm through the same cells: none ran here: vllm not installed and no vLLM ops library " \
           "named (HARNESS_VLLM_OPS_LIBRARY or --vllm-ops-library) (1 cell tried; the other 1: 1 not run here)" in out
    assert "vllm through the same cells ---" not in out  # no table of nothing
    assert "cells in" not in out  # -q: no progress
    cells = read_results(pytester.path / "reports" / "rms_norm" / "results" / "cpu.json")["cells"]
    assert {cid: (rec["status"], rec["reason"][:31]) for cid, rec in cells.items()} == {
        "decode-fp32-tp1-eager-cpu": ("passed", ""),
        "decode-fp32-tp1-eager-cpu-vllm": ("not_run", "vllm not installed and no vLLM "),
        "decode-fp32-tp1-eager-sm90": ("not_run", "needs sm90; this machine is cpu"),
        "decode-fp32-tp1-eager-sm90-vllm": ("not_run", "needs sm90; this machine is cpu")}


@cpu_machine_only
def test_a_run_whose_every_cell_cannot_run_here_records_them_and_succeeds(pytester, run_plan):
    result = run_plan(rms_norm_plan(pytester.path, matrix={"sm": ["sm90"]}), "-q")
    assert result.ret == 0, result.stdout.str()  # not pytest's "no tests collected" (5): the cell was decided
    result.assert_outcomes(deselected=1)
    cells = read_results(pytester.path / "reports" / "rms_norm" / "results" / "cpu.json")["cells"]
    assert cells["decode-fp32-tp1-eager-sm90"]["status"] == "not_run"
    assert run_plan(pytester.path / "plan.yaml", "-q", "-k", "no_such_cell").ret == 5  # a selection of nothing


@cpu_machine_only
def test_each_finished_cell_says_the_time_so_far_and_an_estimate_for_the_rest(pytester, run_plan, monkeypatch):
    hide_vllm(monkeypatch)
    plan = two_sm_provider_plan(pytester.path)
    verbose = run_plan(plan, "-v").stdout.str()
    assert re.search(r"numerics\[decode-fp32-tp1-eager-cpu\] PASSED \(\d+\.\d s; 1 of 2 cells in \d+\.\d s, "
                     r"about \d+\.\d s left\)", verbose), verbose
    assert re.search(r"numerics\[decode-fp32-tp1-eager-cpu-vllm\] SKIPPED \(\d+\.\d s; 2 of 2 cells in \d+\.\d s\)",
                     verbose), verbose
    # The default verbosity: a line of its own, at most every PROGRESS_EVERY_S seconds (here after every cell).
    monkeypatch.setattr(progress_module, "PROGRESS_EVERY_S", 0.0)
    lines = run_plan(plan).stdout.str().splitlines()
    said = [line for line in lines if line.startswith("numerics[")]
    assert len(said) == 2, lines
    assert re.fullmatch(r"numerics\[decode-fp32-tp1-eager-cpu\] passed in \d+\.\d s; 1 of 2 cells in \d+\.\d s, "
                        r"about \d+\.\d s left", said[0]), said
    assert re.fullmatch(r"numerics\[decode-fp32-tp1-eager-cpu-vllm\] not run here in \d+\.\d s; 2 of 2 cells in "
                        r"\d+\.\d s", said[1]), said
    monkeypatch.setattr(progress_module, "PROGRESS_EVERY_S", 3600.0)
    assert not any(line.startswith("numerics[") for line in run_plan(plan).stdout.str().splitlines())


@cpu_machine_only
def test_under_xdist_the_controller_estimates_from_its_workers_cells(pytester, run_plan, monkeypatch):
    plan = rms_norm_plan(pytester.path, matrix={"dtype": ["fp32", "fp16"], "sm": ["cpu", "sm90"]})
    result = run_plan(plan, "--cells", "all", "-v", "-p", "xdist", "-n", "2")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert re.search(r"PASSED \(\d+\.\d s; 1 of 2 cells in [^,)]+, about \d+\.\d s left\)", out), out
    assert "2 not run here: needs sm90; this machine is cpu" in out  # the workers' deselection, told the controller


# ---------------------------------------------------------------- shrinking capped in time on a CPU machine


def shrunk_with(clock: ShrinkClock) -> int:
    """What hypothesis reports as the minimal failure of `num_tokens >= 3` under `clock`."""
    @settings(database=None, derandomize=True, max_examples=50, deadline=None,
              phases=[p for p in Phase if p != Phase.explain])
    @given(st.builds(Example, num_tokens=st.integers(0, 10**6)))
    def test(ex):
        clock.admit(ex)
        if ex.num_tokens >= 3:
            clock.failed(ex)
            raise AssertionError(ex.num_tokens)

    with pytest.raises(AssertionError) as failure:
        test()
    return int(str(failure.value))


def test_past_the_cap_a_cpu_cell_keeps_the_failure_it_has():
    gpu = ShrinkClock("cuda", cap_s=0.0)  # a GPU's shrinking is not capped
    assert shrunk_with(gpu) == 3 and not gpu.stopped
    cpu = ShrinkClock("cpu", cap_s=0.0)  # every candidate after the first failure is past the cap
    first = shrunk_with(cpu)
    assert first > 3 and cpu.stopped and len(cpu.failed_on) == 1  # the first failure, replayed to raise it
    patient = ShrinkClock("cpu")
    assert shrunk_with(patient) == 3 and not patient.stopped  # a quick shrink is within the cap


@cpu_machine_only
def test_a_cell_whose_shrinking_was_stopped_says_its_example_may_not_be_minimal(tmp_path, monkeypatch):
    (tmp_path / "wrong.py").write_text(
        "import torch\n\n\ndef rms_norm(out, x, weight, eps):  # wrong from three tokens on\n"
        "    y = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(out.dtype)\n"
        "    out.copy_(y if x.shape[0] < 3 else x)\n")
    plan = rms_norm_plan(tmp_path, "wrong:rms_norm")
    run = RunSettings(examples=20, profile="ci", database=None)
    rec = run_cell(CellTask.load(plan, "decode-fp32-tp1-eager-cpu", run)).record
    assert rec.status == Status.FAILED and "shrinking stopped" not in rec.reason, rec.reason
    assert rec.minimal_example.startswith("num_tokens=3 "), rec.minimal_example  # shrunk all the way
    monkeypatch.setattr(shrink_clock, "SHRINK_CAP_CPU_S", 0.0)
    rec = run_cell(CellTask.load(plan, "decode-fp32-tp1-eager-cpu", run)).record
    assert rec.status == Status.FAILED and not rec.minimal_example.startswith("num_tokens=3 "), rec
    assert rec.reason.endswith("; shrinking stopped after 0 s on this CPU machine: the example may not be minimal"), \
        rec.reason
