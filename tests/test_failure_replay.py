"""Failures a user can replay and see whole: every distinct failure of a kernel's cell reported apart, each with its
minimal example; the failing example (and its inputs, where small) saved under reports/<op>/failures/, replayed alone
by `pytest --plan P --replay <cell>`, which says whether it reproduced and how often the cell failed; NaN in an output
the kernel allocates told apart, never written or computed, by a second call with its allocations poisoned.

Cells run in this process (the `ci` profile, derandomized) through run_cell, as in tests/test_broken_kernels.py; the
replays as a user runs them, through pytest and the run's worker processes."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch

from harness.rendering import report
from harness.results.store import Status, lead_reason
from harness.runtime import shrink_clock
from harness.runtime.inputs import build_args
from harness.runtime.numerics import not_finite_reason
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from tests.broken.replay_kernels import COUNTED, FLAG
from tests.plans import cpu_machine_only, rms_norm_plan, small_plan
from tests.test_report import cell, machine, section, stamp_current, write_results

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

ROOT = Path(__file__).resolve().parents[1]
KERNELS = "tests.broken.replay_kernels"
CELL = "decode-fp32-tp1-eager-cpu"
CI = RunSettings(examples=40, profile="ci", database=None)


def _cell(tmp_path, kernel: str, cell_id: str = CELL, functional: bool = False, run: RunSettings = CI):
    phase, dtype, _, mode, _ = cell_id.split("-")
    plan = rms_norm_plan(tmp_path, f"{KERNELS}:{kernel}", functional=functional,
                         matrix={"phase": [phase], "dtype": [dtype], "graph_mode": [mode]})
    task = CellTask.load(plan, cell_id, run)
    return task, run_cell(task)


def _hidden(example: str) -> int:
    return int(re.search(r"\bhidden=(\d+)", example).group(1))


# ---------------------------------------------------------------- distinct failures


@cpu_machine_only
@pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom")
def test_a_kernel_cell_reports_each_distinct_failure_with_its_minimal_example(tmp_path):
    """NaN at hidden=1 and wrong values from hidden COUNTED + 1 on: both reported, each shrunk on its own; hypothesis
    reporting the simplest failure alone kept only one of them."""
    task, outcome = _cell(tmp_path, "two_bugs")
    rec = outcome.record
    assert rec.status == Status.FAILED and rec.more_failures and len(rec.more_failures) == 1, rec
    failures = [(lead_reason(rec), rec.minimal_example), *((f.reason, f.minimal_example) for f in rec.more_failures)]
    nan = [(r, ex) for r, ex in failures if "NaN/Inf where the reference is finite" in r]
    wrong = [(r, ex) for r, ex in failures if "max abs error" in r]
    assert len(nan) == 1 and len(wrong) == 1, failures
    assert _hidden(nan[0][1]) == 1, nan
    assert _hidden(wrong[0][1]) > COUNTED, wrong
    # The reason leads with one and goes on to the other, with its minimal example.
    other = rec.more_failures[0]
    assert rec.reason.startswith(lead_reason(rec))
    assert rec.reason.endswith(f"; and 1 more distinct failure: [2] {' '.join(other.reason.split())} "
                               f"(minimal example: {other.minimal_example})"), rec.reason
    # Each failure's example is kept for a replay, the leading one's inputs with it (small: torch.save's bytes).
    assert [ex.describe() for ex in outcome.failing] == [rec.minimal_example, other.minimal_example]
    saved = torch.load(io.BytesIO(outcome.inputs))
    built = build_args(task.plan, task.cell, outcome.failing[0], "cpu")
    assert set(saved) == {"x", "weight", "eps"} and torch.equal(saved["x"], built["x"]), saved
    assert torch.equal(saved["weight"], built["weight"]) and saved["eps"] == built["eps"]


@cpu_machine_only
@pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom")
def test_the_cpu_shrink_cap_still_ends_a_cell_of_distinct_failures(tmp_path, monkeypatch):
    """Every distinct failure is shrunk, so the cap on a CPU machine's shrinking must hold over all of them: spent at
    once, the cell ends after its first failure's few replays, failed, saying the example may not be minimal."""
    monkeypatch.setattr(shrink_clock, "SHRINK_CAP_CPU_S", 0.0)
    _, outcome = _cell(tmp_path, "two_bugs")
    rec = outcome.record
    assert rec.status == Status.FAILED, rec
    assert "shrinking stopped after 0 s on this CPU machine: the example may not be minimal" in rec.reason
    assert rec.examples < 10, rec.examples  # 25 examples with the cap unspent


def test_the_page_lists_every_distinct_failure_of_a_failed_cell(tmp_path):
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    more = [{"reason": "output 'out': 1 of 1 elements are NaN/Inf where the reference is finite",
             "minimal_example": "num_tokens=1 hidden=1"}]
    failed = cell("decode-bf16-tp1-eager-sm90", "failed", minimal_example="num_tokens=1 hidden=4096",
                  reason="output 'out': max abs error 0.5; and 1 more distinct failure: [2] output 'out': 1 of 1 "
                         "elements are NaN/Inf where the reference is finite (minimal example: num_tokens=1 hidden=1)",
                  more_failures=more, error={"max_abs": 0.5, "max_rel": 0.1, "output": "out"},
                  repro="pytest --plan small.yaml --replay decode-bf16-tp1-eager-sm90")
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run", machine("sm90", "h200"),
                  {"decode-bf16-tp1-eager-sm90": failed,
                   "prefill-bf16-tp1-eager-sm90": cell("prefill-bf16-tp1-eager-sm90", "passed")})
    stamp_current(plan, op_dir)
    text, _ = report.render(plan, op_dir)
    rows = [line for line in section(text, "Support matrix").splitlines()
            if line.startswith("| `decode-bf16-tp1-eager-sm90`")]
    assert len(rows) == 2, rows
    assert "(1 of 2 distinct failures)" in rows[0] and "max abs error 0.5 " in rows[0] and "more distinct" \
        not in rows[0] and "hidden=4096" in rows[0] and "--replay decode-bf16-tp1-eager-sm90" in rows[0], rows[0]
    assert "(2 of 2)" in rows[1] and "NaN/Inf" in rows[1] and "hidden=1" in rows[1], rows[1]


# ---------------------------------------------------------------- NaN in an output the kernel allocates


@pytest.fixture
def fresh_memory_is_nan():
    """torch fills fresh memory with NaN under deterministic algorithms (torch.utils.deterministic), as a GPU's
    caching allocator may hand back memory holding NaN: an output the kernel allocates and never writes is NaN."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@cpu_machine_only
@pytest.mark.parametrize("kernel, words", [
    ("half_written_returned", "64 of 128 elements are NaN/Inf where the reference is finite, never written (the memory "
                              "the kernel allocated was poisoned for a second call and 64 elements still hold it), "
                              "first at index (1, 0)"),
    ("nan_rows_returned", "64 of 128 elements are NaN/Inf where the reference is finite, computed by the kernel"),
])
def test_nan_in_an_output_the_kernel_allocates_says_whether_it_was_written(tmp_path, fresh_memory_is_nan, kernel,
                                                                          words):
    _, outcome = _cell(tmp_path, kernel, functional=True, run=RunSettings(20, "ci", None))
    rec = outcome.record
    assert rec.status == Status.FAILED and rec.reason.startswith("output 'y': "), rec
    assert words in rec.reason, rec.reason
    assert rec.minimal_example.startswith("num_tokens=2 hidden=64 "), rec.minimal_example
    if kernel == "half_written_returned":
        assert "computed" not in rec.reason, rec.reason


def test_nan_in_an_allocated_fp8_output_is_written_or_left_unwritten():
    """fp8 has one NaN and no payload: a second call with the allocations poisoned cannot tell the two apart."""
    y = torch.zeros(2, 4).to(torch.float8_e4m3fn)
    y[1] = float("nan")
    bad = ~torch.isfinite(y.float())
    words = not_finite_reason("y", y, bad, allocated=True)
    assert "4 of 8 elements are NaN/Inf where the reference is finite, written or left unwritten" in words, words
    assert "never written" not in words and "computed by the kernel" not in words, words


# ---------------------------------------------------------------- a saved failure, replayed


@cpu_machine_only
def test_a_saved_failure_replays_and_a_flaky_one_says_it_did_not_reproduce(pytester, run_plan, monkeypatch):
    """A failing cell saves its example and inputs, and prints the --replay command; the replay reproduces it and
    records nothing. Once the failure is gone (here: the environment that made it), the cell passes, counted, and
    its replay says it did not reproduce and how often the cell failed."""
    plan = rms_norm_plan(pytester.path, f"{KERNELS}:broken_while_flagged", numerics={"examples": 10})
    folder = pytester.path / "reports" / "rms_norm" / "failures"
    results = pytester.path / "reports" / "rms_norm" / "results" / "cpu.json"
    monkeypatch.setenv(FLAG, "1")
    first = run_plan(plan)
    first.assert_outcomes(failed=1)
    out = first.stdout.str()
    printed = re.search(r"reproduce: (pytest .*)", out).group(1)
    assert printed.endswith(f" --replay {CELL}") and " --reports-dir " in printed, printed
    saved = json.loads((folder / f"{CELL}.json").read_text())
    recorded = json.loads(results.read_text())["cells"][CELL]
    assert saved["minimal_example"] == recorded["minimal_example"] and recorded["repro"] == printed, saved
    assert (saved["runs"], saved["failed"], saved["inputs"]) == (1, 1, f"{CELL}.pt"), saved
    inputs = torch.load(folder / f"{CELL}.pt")
    assert inputs["x"].shape[-1] == saved["example"]["sizes"]["hidden"], inputs

    again = run_plan(plan, "--replay", CELL)
    again.assert_outcomes(failed=1)
    assert f"the saved example {saved['minimal_example']} failed again: reproduced" in again.stdout.str()
    assert json.loads(results.read_text())["cells"][CELL] == recorded  # a replay records nothing

    monkeypatch.delenv(FLAG)
    run_plan(plan).assert_outcomes(passed=1)  # the failure is gone: a pass, counted beside the saved failure
    assert json.loads((folder / f"{CELL}.json").read_text())["runs"] == 2
    gone = run_plan(plan, "--replay", CELL)
    gone.assert_outcomes(passed=1)
    said = gone.stdout.str()
    assert f"the saved example {saved['minimal_example']} passed: did not reproduce (the cell failed in 1 of the 2 " \
           "runs recorded since this failure was saved; 1 of its 1 earlier replays reproduced it)" in said, said

    unsaved = run_plan(plan, "--replay", "decode-fp32-tp1-eager-cpu-nope")
    assert unsaved.ret == pytest.ExitCode.USAGE_ERROR and "has no cell" in unsaved.stderr.str()
