"""A quick default run: the pairwise sample of the runnable cells, what a sampled run records, the terminal summary,
and compiled graphs kept across the cells of a worker."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cells.hardware import Hardware
from harness.cells.matrix import Cell, decide, expand, pairwise_sample
from harness.plan.load import load_plan
from harness.plan.vocabulary import AXES
from harness.rendering.report import write_report
from harness.results.store import CellRecord, Provenance, Recorder, Status, write_atomic
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from harness.plugin.summary import cells_summary
from tests.plans import SMALL_BATCHES, cpu_machine_only, read_results, rms_norm_plan
from tests.test_report import cell, machine, write_results

ROOT = Path(__file__).resolve().parents[1]
CPU = Hardware("cpu", "cpu", "x86_64", 0, 2)


def value_pairs(cells) -> set:
    """Every pair of axis values found together in one of `cells`."""
    return {pair for c in cells for pair in itertools.combinations(c.axes().items(), 2)}


def runnable(plan, hw=CPU) -> list[Cell]:
    return [c for c in expand(plan) if decide(plan, c, hw, 4).runs]


# ---------------------------------------------------------------- the sample


def test_the_default_plans_sample_meets_every_pair_in_nine_of_54_cells():
    plan = load_plan(ROOT / "plan.yaml")
    cells = runnable(plan)
    assert len(cells) == 54  # 3 phases x 3 dtypes x tp1/2/4 x eager/torch_compile on a CPU machine
    sample = pairwise_sample(cells, plan.op.name)
    assert value_pairs(sample) == value_pairs(cells)
    for axis in AXES:
        assert {getattr(c, axis) for c in sample} == {getattr(c, axis) for c in cells}, axis
    assert len(sample) == 9  # no sample can be smaller: 3 phases x 3 dtypes must each meet once
    # the cheapest of those: one torch_compile cell per TP size (the fewest compiles on the most ranks)
    assert sorted(c.tp for c in sample if c.graph_mode == "torch_compile") == [1, 2, 4]
    assert sample == [c for c in cells if c in sample]  # in plan order


def test_the_sample_is_the_same_for_the_same_cells_and_seed():
    cells = runnable(load_plan(ROOT / "plan.yaml"))
    first = pairwise_sample(cells, "rms_norm")
    shuffled = random.Random(1).sample(cells, len(cells))
    assert set(pairwise_sample(shuffled, "rms_norm")) == set(first)
    assert pairwise_sample(cells, "rms_norm") == first
    assert any(set(pairwise_sample(cells, f"op{i}")) != set(first) for i in range(5))  # the seed matters


AXIS_VALUES = {"phase": ["prefill", "decode", "chunked_prefill"], "dtype": ["fp16", "bf16", "fp32", "fp8"],
               "tp": [1, 2, 4, 8], "graph_mode": ["eager", "torch_compile", "cuda_graph"], "sm": ["cpu", "sm90"]}
EVERY_CELL = [Cell(*values) for values in itertools.product(*AXIS_VALUES.values())]


@settings(max_examples=60, deadline=None, database=None)
@given(st.sets(st.sampled_from(EVERY_CELL), min_size=1, max_size=80), st.text(max_size=5))
def test_any_set_of_cells_keeps_every_pair_and_value_it_has(cells, seed):
    cells = sorted(cells)
    sample = pairwise_sample(cells, seed)
    assert sample and set(sample) <= set(cells)
    assert value_pairs(sample) == value_pairs(cells)
    assert len(sample) <= len(cells)


def test_small_sets_are_kept_whole_where_every_cell_is_needed():
    one_axis = [Cell("decode", d, 1, "eager", "cpu") for d in ("fp32", "fp16", "bf16")]
    assert pairwise_sample(one_axis, "x") == one_axis  # every value of the only axis that varies
    assert len(pairwise_sample([one_axis[0]], "x")) == 1
    assert pairwise_sample([], "x") == []
    two_axes = [Cell(p, d, 1, "eager", "cpu") for p in ("decode", "prefill") for d in ("fp32", "fp16")]
    assert pairwise_sample(two_axes, "x") == two_axes


# ---------------------------------------------------------------- costs paid once


@pytest.mark.usefixtures("faithful_interpreter")  # runs kernels in this process, as a worker does
def test_a_later_torch_compile_cell_reuses_the_graphs_earlier_cells_compiled(tmp_path):
    plan = rms_norm_plan(tmp_path, matrix={"graph_mode": ["torch_compile"]}, hidden=[64])
    run = RunSettings(examples=4, profile="ci", database=None)  # derandomized: the same examples again
    first = run_cell(CellTask.load(plan, "decode-fp32-tp1-torch_compile-cpu", run)).record
    again = run_cell(CellTask.load(plan, "decode-fp32-tp1-torch_compile-cpu", run)).record
    assert first.status == again.status == "passed", (first.reason, again.reason)
    assert again.facts["compiles"] == 0 and again.facts["shapes"] == first.facts["shapes"] >= 1, again.facts
    assert again.facts["opcheck"] == "passed"  # each cell still checks its registration


def test_records_of_cells_not_run_here_wait_for_the_next_write(tmp_path):
    plan = load_plan(ROOT / "plan.yaml")
    recorder = Recorder(tmp_path, plan.op.name, Provenance("cpu", "cpu", "x86_64", 0, 2), "run")
    skipped = CellRecord("decode", "fp32", 1, "eager", "sm90", Status.NOT_RUN, "needs sm90; this machine is cpu")
    recorder.record("cells", "decode-fp32-tp1-eager-sm90", skipped, defer=True)
    assert not recorder.path.exists()  # not rewritten for a record that costs nothing to make again
    ran = CellRecord("decode", "fp32", 1, "eager", "cpu", Status.PASSED)
    recorder.record("cells", "decode-fp32-tp1-eager-cpu", ran)
    assert set(read_results(recorder.path)["cells"]) == {"decode-fp32-tp1-eager-sm90", "decode-fp32-tp1-eager-cpu"}
    recorder.record("cells", "decode-fp16-tp1-eager-sm90", skipped, defer=True)
    recorder.flush()  # the end of the run
    assert "decode-fp16-tp1-eager-sm90" in read_results(recorder.path)["cells"]


def test_a_rewrite_converts_only_new_records_and_writes_what_a_full_conversion_writes(tmp_path):
    recorder = Recorder(tmp_path, "rms_norm", Provenance("cpu", "cpu", "x86_64", 0, 2), "run")
    for n in range(3):
        recorder.record("cells", f"decode-fp32-tp1-eager-cpu-{n}", CellRecord("decode", "fp32", 1, "eager", "cpu",
                                                                               Status.PASSED))
    again = CellRecord("decode", "fp16", 1, "eager", "cpu", Status.PASSED)
    recorder.record("cells", "decode-fp16-tp1-eager-cpu", again)
    again.status, again.reason = Status.FAILED, "output 'out': max abs error 1"  # changed, then recorded again
    recorder.record("cells", "decode-fp16-tp1-eager-cpu", again)
    assert read_results(recorder.path)["cells"]["decode-fp16-tp1-eager-cpu"]["status"] == "failed"
    write_atomic(tmp_path / "whole.json", recorder.results)  # every record converted afresh
    assert recorder.path.read_text() == (tmp_path / "whole.json").read_text()


# ---------------------------------------------------------------- the report


def test_the_report_says_what_the_latest_run_sampled(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"phase": ["decode", "prefill"], "dtype": ["fp32", "fp16"]}))
    op_dir = tmp_path / "reports" / "rms_norm"
    write_results(op_dir, "cpu.json", "rms_norm", "r2", {**machine("cpu"), "cells": "a pairwise sample of 3 of 4 "
                                                                                    "runnable cells"},
                  {cid: cell(cid, "passed") for cid in ("decode-fp32-tp1-eager-cpu", "decode-fp16-tp1-eager-cpu",
                                                        "prefill-fp32-tp1-eager-cpu")})
    text = write_report(plan, op_dir)[0].read_text()
    provenance = next(line for line in text.splitlines() if line.startswith("- **Provenance:**"))
    assert "ran a pairwise sample of 3 of 4 runnable cells" in provenance
    assert "| no result recorded (sampled out, deselected with -k or -m, or the run stopped) | 1 " in text


# ---------------------------------------------------------------- the terminal summary


def summary_table(lines: list[str]) -> dict:
    """The summary's table: (graph mode, tp) -> {status: count}, blanks left out."""
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]  # tabulate's rule under the headers
    headers = [lines[0][a:b].strip() for a, b in spans]
    rows = {}
    for line in lines[2:]:
        if not line[:1].isalpha() or ":" in line:
            break
        values = [line[a:b].strip() for a, b in spans[:-1]] + [line[spans[-1][0]:].strip()]
        rows[values[0], values[1]] = {h: int(v) for h, v in zip(headers[2:], values[2:]) if v}
    return rows


def test_the_summary_counts_cells_by_mode_and_tp_and_groups_the_reasons():
    plan = load_plan(ROOT / "plan.yaml")
    cells = []
    for c in expand(plan):
        d = decide(plan, c, CPU, 4)
        status = "passed" if d.status is None and c.tp == 1 else "sampled_out" if d.status is None else d.status
        cells.append((c, status, d.reason))
    lines = cells_summary(plan, cells)
    table = summary_table(lines)
    assert table["eager", "tp1"] == {"passed": 9, "not run here": 36}
    assert table["torch_compile", "tp2"] == {"sampled out": 9, "not run here": 36}
    assert table["memcheck", "tp1"] == {"not run here": 15, "excluded": 30}
    assert sum(sum(row.values()) for row in table.values()) == len(expand(plan))
    assert "pairwise sample: 18 of 54 runnable cells ran, every pair of axis values in one at least; " \
           "--cells all runs all 54" in lines
    assert "480 not run here: needs sm80, sm89, sm90 or sm100; this machine is cpu" in lines
    assert "36 not run here: cuda_graph needs a CUDA device; this machine has none" in lines
    assert any(x.startswith("120 excluded: excluded by the plan") for x in lines)


# ---------------------------------------------------------------- a sampled run end to end


@pytest.fixture
def run_plan(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("CI", raising=False)

    def run(plan: Path, *args: str, in_process: bool = False):
        # In this process where a run needs no process of its own (the cells run in the run's worker processes either
        # way): a fresh pytest process imports torch and the harness again, about 8 s on a 2-core CPU machine.
        runpytest = pytester.runpytest_inprocess if in_process else pytester.runpytest_subprocess
        return runpytest("-p", "harness.plugin", "--plan", str(plan), "--reports-dir", str(pytester.path / "reports"),
                         "-p", "no:cacheprovider", *args)
    return run


def summary_rows(out: str) -> dict:
    """The summary table in a run's output."""
    return summary_table(out.split(" rms_norm: numerics cells ")[1].splitlines()[1:])


@cpu_machine_only
def test_a_sampled_run_keeps_earlier_results_and_all_runs_every_cell(pytester, run_plan):
    # Three axes of two values, the third tp rather than graph mode: a torch_compile cell's Inductor build cost this
    # test 6 compiles over its three runs (the sampling is the same over any axis; compiled cells have their tests).
    plan = rms_norm_plan(pytester.path, matrix={"phase": ["decode", "prefill"], "dtype": ["fp32", "fp16"],
                                                "tp": [1, 2], "sm": ["cpu", "sm90"]},
                         hidden=[64], numerics={"examples": 2, **SMALL_BATCHES}, tp={"kind": "trivial"})
    results = pytester.path / "reports" / "rms_norm" / "results" / "cpu.json"

    full = run_plan(plan, "--cells", "all", "--plan-profile", "ci", in_process=True)
    full.assert_outcomes(passed=8, deselected=8)  # the sm90 cells: deselected, counted once, recorded
    out = full.stdout.str()
    assert summary_rows(out) == {("eager", "tp1"): {"passed": 4, "not run here": 4},
                                 ("eager", "tp2"): {"passed": 4, "not run here": 4}}
    assert "8 not run here: needs sm90; this machine is cpu" in out
    assert "verdict: cpu: numerics only · sm90: no results" in out
    progress = next(line for line in out.splitlines() if line.startswith("plan.yaml "))
    assert "s" not in progress.split()[1], progress  # cells of another SM print no `s` each
    first = read_results(results)
    assert sorted(s["status"] for s in first["cells"].values()) == ["not_run"] * 8 + ["passed"] * 8
    assert [r["cells"] for r in first["runs"].values()] == ["every runnable cell (8)"]

    sampled = run_plan(plan, "--plan-profile", "ci", "-p", "xdist", "-n", "2", in_process=True)
    sampled.assert_outcomes(passed=4)  # both xdist workers pick the same sample, and deselect the rest
    assert sorted(p.name for p in results.parent.glob("*.json")) == ["cpu.json"]  # the workers' files folded in
    out = sampled.stdout.str()
    # xdist's controller learns of the cells its workers deselected from the first worker's output
    assert summary_rows(out) == {("eager", "tp1"): {"passed": 2, "sampled out": 2, "not run here": 4},
                                 ("eager", "tp2"): {"passed": 2, "sampled out": 2, "not run here": 4}}
    assert "pairwise sample: 4 of 8 runnable cells ran" in out
    second = read_results(results)
    assert len(second["cells"]) == 16  # the four cells left out keep the first run's results
    new_runs = {run for run, prov in second["runs"].items() if prov.get("cells", "").startswith("a pairwise sample")}
    assert {prov["cells"] for run, prov in second["runs"].items() if run in new_runs} == \
        {"a pairwise sample of 4 of 8 runnable cells"}
    ours = {cid: rec for cid, rec in second["cells"].items() if cid.endswith("-cpu")}
    rerun = {cid for cid, rec in ours.items() if rec["run"] in new_runs}
    kept = set(ours) - rerun
    assert len(rerun) == 4 and len(kept) == 4
    # the sm90 cells' "not run here", recorded when collection ended, by the first worker
    assert {rec["run"] in new_runs for cid, rec in second["cells"].items() if cid.endswith("-sm90")} == {True}
    assert all(second["cells"][cid] == first["cells"][cid] for cid in kept)
    assert value_pairs([Cell.from_id(cid) for cid in rerun]) == value_pairs(
        [Cell.from_id(cid) for cid in first["cells"] if cid.endswith("-cpu")])

    # A selection runs what it selects, sampled out or not; the summary says why the rest did not run.
    left_out = sorted(kept)[0]
    chosen = run_plan(plan, "-k", left_out.removesuffix("-cpu"), "-v", in_process=True)
    chosen.assert_outcomes(passed=1, deselected=15)  # 14 by -k, and its sm90 cell
    assert "1 not run here: needs sm90; this machine is cpu" in chosen.stdout.str()
    assert read_results(results)["cells"][left_out]["run"] not in new_runs


@cpu_machine_only
def test_the_profile_sets_the_default_and_cells_overrides_it(pytester, run_plan, monkeypatch):
    plan = rms_norm_plan(pytester.path, matrix={"phase": ["decode", "prefill"], "dtype": ["fp32", "fp16"],
                                                "graph_mode": ["eager", "torch_compile"]})
    described = []  # what each run says it ran (a listing writes no results file: its description is caught here)
    monkeypatch.setattr(Recorder, "describe_run", lambda self, **fields: described.append(fields["cells"]))

    def cells_of_last_run(*args) -> str:
        run_plan(plan, "--collect-only", "-q", *args, in_process=True)
        return described.pop()

    sample = "a pairwise sample of 4 of 8 runnable cells"
    assert cells_of_last_run() == sample  # dev
    assert cells_of_last_run("--plan-profile", "nightly") == "every runnable cell (8)"
    assert cells_of_last_run("--plan-profile", "nightly", "--cells", "sampled") == sample
    assert cells_of_last_run("--cells", "all") == "every runnable cell (8)"
    assert cells_of_last_run("-m", "decode") == "the 4 runnable cells selected (-k, -m, --lf or node ids; no sampling)"
    monkeypatch.setenv("CI", "1")
    assert cells_of_last_run() == sample  # ci
