"""A toolchain change kept and compared: a result replaced by one of another torch, Triton or vLLM on the same GPU is
kept beside it (in its machine's file, through merges, bounded), one of the same toolchain is replaced as before, an
older toolchain's record never becomes the latest; `python -m harness diff` and the page's section say what changed
between the latest two toolchains."""

from __future__ import annotations

import dataclasses
import json

from harness.__main__ import main
from harness.rendering.report import render
from harness.results.store import BenchRecord, CellRecord, ErrorStats, ImplFigures, Provenance, Recorder, Results, \
    fold, load
from harness.results.toolchains import TOOLCHAINS_KEPT
from harness.cells.status import Status
from tests.plans import small_plan

OP, CELL = "rms_norm", "decode-bf16-tp1-eager-sm90"
H200 = Provenance("sm90", "cuda", "NVIDIA H200", 1, 16, host="vm", torch="2.11.0+cu130", triton="3.6.0",
                  vllm="0.26.0", commit="abc", date="2026-12-01")
NEW_TRITON = dataclasses.replace(H200, triton="3.7.0", date="2026-12-08")


def cell(status: Status, finished: str, reason: str = "", max_abs: float | None = None, key: str = CELL,
         run: str = "") -> CellRecord:
    phase, dtype = key.split("-")[:2]
    error = ErrorStats(max_abs, 0.01, output="out") if max_abs is not None else None
    return CellRecord(phase, dtype, 1, "eager", "sm90", status, reason=reason, error=error, finished=finished,
                      run=run)


def bench(kernel_us: float, native_us: float, finished: str, phase: str = "decode", tokens: int = 64,
          run: str = "") -> BenchRecord:
    impls = {name: ImplFigures(median_us=us, q20_us=us, q80_us=us, launches=1)
             for name, us in (("kernel", kernel_us), ("native", native_us))}
    return BenchRecord(phase, "bf16", "sm90", "cuda_graph", tokens, sizes={"hidden": 4096}, copy_bw_gbps=4250.0,
                       bytes=tokens * 4096 * 4, impls=impls, finished=finished, run=run)


def record(directory, prov: Provenance, run: str, *items) -> Recorder:
    """One run of a machine: its records, written to the machine's file as a run writes them."""
    recorder = Recorder(directory, OP, prov, run)
    for section, key, rec in items:
        recorder.record(section, key, rec)
    return recorder


def kept(path, section: str = "cells", key: str = CELL) -> list[tuple[str, str]]:
    """The key's records in a results file: (run, status or kernel time), the latest first, then the earlier."""
    results = load(path, OP)
    recs = [results.section(section)[key], *results.earlier.section(section).get(key, [])]
    return [(r.run, r.status.value if section == "cells" else r.impls["kernel"].median_us) for r in recs]


# ---------------------------------------------------------------- the store


def test_another_toolchain_is_kept_beside_the_latest_and_the_same_toolchain_replaced(tmp_path):
    record(tmp_path, H200, "run-1", ("cells", CELL, cell(Status.PASSED, "2026-12-01T01:00:00Z")))
    record(tmp_path, H200, "run-2", ("cells", CELL, cell(Status.FAILED, "2026-12-02T01:00:00Z", "NaN")))
    path = tmp_path / "sm90-nvidia-h200.json"
    assert kept(path) == [("run-2", "failed")]  # the same toolchain: replaced, as always
    assert "earlier" not in json.loads(path.read_text())  # a file of one toolchain reads as it always did
    record(tmp_path, NEW_TRITON, "run-3", ("cells", CELL, cell(Status.PASSED, "2026-12-08T01:00:00Z")))
    assert kept(path) == [("run-3", "passed"), ("run-2", "failed")]
    record(tmp_path, NEW_TRITON, "run-4", ("cells", CELL, cell(Status.FAILED, "2026-12-09T01:00:00Z", "NaN")))
    assert kept(path) == [("run-4", "failed"), ("run-2", "failed")]
    lines = path.read_text().splitlines()
    assert lines[lines.index(' "earlier": {') + 1:lines.index(' "earlier": {') + 3] == [
        '  "cells": {', f'   "{CELL}": [' + '{"dtype":"bf16","facts":{},"finished":"2026-12-02T01:00:00Z",'
        '"graph_mode":"eager","phase":"decode","reason":"NaN","run":"run-2","sm":"sm90","status":"failed","tp":1}]']


def test_a_not_run_record_is_no_toolchain_result(tmp_path):
    """A machine of the new toolchain that could not run the cell leaves the older result the latest, and keeps
    nothing of its own (fold's rule, as before)."""
    record(tmp_path, H200, "run-1", ("cells", CELL, cell(Status.PASSED, "2026-12-01T01:00:00Z")))
    record(tmp_path, NEW_TRITON, "run-2", ("cells", CELL, cell(Status.NOT_RUN, "2026-12-08T01:00:00Z",
                                                              "memory held by other processes")))
    assert kept(tmp_path / "sm90-nvidia-h200.json") == [("run-1", "passed")]


def test_an_older_toolchain_arriving_later_does_not_become_the_latest(tmp_path):
    """A run on Triton 3.6 made after one on 3.7 (a machine not upgraded yet), in its own file or folded after:
    the 3.7 result stays the latest, the 3.6 one is kept as its toolchain's."""
    record(tmp_path, NEW_TRITON, "new", ("cells", CELL, cell(Status.PASSED, "2026-12-08T01:00:00Z")))
    record(tmp_path, H200, "old", ("cells", CELL, cell(Status.FAILED, "2026-12-09T01:00:00Z", "NaN")))
    assert kept(tmp_path / "sm90-nvidia-h200.json") == [("new", "passed"), ("old", "failed")]
    newer = Results(OP, {"new": NEW_TRITON}, {CELL: cell(Status.PASSED, "2026-12-08T01:00:00Z", run="new")})
    older = Results(OP, {"old": H200}, {CELL: cell(Status.FAILED, "2026-12-09T01:00:00Z", "NaN", run="old")})
    for first, second in ((newer, older), (older, newer)):
        merged = fold(fold(Results(OP), first), second)
        assert merged.cells[CELL].run == "new"
        assert [r.run for r in merged.earlier.cells[CELL]] == ["old"]


def test_folding_keeps_each_toolchains_records_whichever_file_comes_first(tmp_path):
    """Two files of one GPU kind from two toolchains, each with an earlier record of a third: the merged file holds
    the newest as the latest and the others once each, the same in either order; `python -m harness merge` too."""
    oldest = dataclasses.replace(H200, torch="2.10.0+cu130", triton="3.5.0")
    a, b = tmp_path / "a" / OP / "results", tmp_path / "b" / OP / "results"
    record(a, oldest, "r0", ("cells", CELL, cell(Status.PASSED, "2026-11-20T01:00:00Z")))
    record(a, H200, "r1", ("cells", CELL, cell(Status.PASSED, "2026-12-01T01:00:00Z")))
    record(b, NEW_TRITON, "r2", ("cells", CELL, cell(Status.FAILED, "2026-12-08T01:00:00Z", "NaN")),
           ("benchmarks", "b", bench(1.71, 12.0, "2026-12-08T01:00:00Z")))
    for first, second in ((a, b), (b, a)):
        merged = fold(fold(Results(OP), load(first / "sm90-nvidia-h200.json", OP)),
                      load(second / "sm90-nvidia-h200.json", OP))
        assert merged.cells[CELL].run == "r2"
        assert [r.run for r in merged.earlier.cells[CELL]] == ["r1", "r0"]
    reports = tmp_path / "reports"
    assert main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "--reports-dir", str(reports)]) == 0
    assert kept(reports / OP / "results" / "sm90-nvidia-h200.json") == [("r2", "failed"), ("r1", "passed"),
                                                                        ("r0", "passed")]


def test_a_file_keeps_the_latest_toolchains_only(tmp_path):
    """Upgraded five times: the file keeps the TOOLCHAINS_KEPT newest, the latest included."""
    for minor in range(5):
        prov = dataclasses.replace(H200, triton=f"3.{minor}.0")
        finished = f"2026-12-0{minor + 1}T01:00:00Z"
        record(tmp_path, prov, f"run-3.{minor}", ("cells", CELL, cell(Status.PASSED, finished)))
    runs = [run for run, _ in kept(tmp_path / "sm90-nvidia-h200.json")]
    assert TOOLCHAINS_KEPT == 3 and runs == ["run-3.4", "run-3.3", "run-3.2"]


# ---------------------------------------------------------------- python -m harness diff, the page


def two_toolchains(tmp_path, changed: bool):
    """rms_norm on an H200 under Triton 3.6, then 3.7: the decode cell fails under 3.7 where `changed`, and the
    decode benchmark's kernel is slower."""
    plan = small_plan(tmp_path)
    results = tmp_path / "reports" / OP / "results"
    prefill = "prefill-bf16-tp1-eager-sm90"
    record(results, H200, "old", ("cells", CELL, cell(Status.PASSED, "2026-12-01T01:00:00Z", max_abs=0.0156)),
           ("cells", prefill, cell(Status.PASSED, "2026-12-01T01:00:00Z", max_abs=0.0625, key=prefill)),
           ("benchmarks", "decode-64", bench(1.48, 12.0, "2026-12-01T01:00:00Z")))
    record(results, NEW_TRITON, "new",
           ("cells", CELL, cell(Status.FAILED, "2026-12-08T01:00:00Z", "output 'out': max abs error 0.5",
                                max_abs=0.5) if changed else cell(Status.PASSED, "2026-12-08T01:00:00Z",
                                                                  max_abs=0.0156)),
           ("cells", prefill, cell(Status.PASSED, "2026-12-08T01:00:00Z", max_abs=0.125, key=prefill)),
           ("benchmarks", "decode-64", bench(1.71, 11.4, "2026-12-08T01:00:00Z")))
    return plan


def diff_lines(capsys, plan, *more) -> list[str]:
    assert main(["diff", str(plan.path), "--reports-dir", str(plan.path.parent / "reports"), *more]) == 0
    return capsys.readouterr().out.splitlines()


def test_diff_names_a_numerics_change_and_a_benchmark_change(tmp_path, capsys):
    plan = two_toolchains(tmp_path, changed=True)
    assert diff_lines(capsys, plan) == [
        "rms_norm: sm90 (NVIDIA H200), Triton 3.6.0 → 3.7.0 (2 cells and 1 benchmark under both)",
        f"  {CELL}: passed → failed: output 'out': max abs error 0.5; max abs error 0.0156 → 0.5",
        "  1 of 2 cells changed status; the max abs error grew most at decode-bf16-tp1-eager-sm90: 0.0156 → 0.5",
        "  benchmark    kernel                   native",
        "  -----------  -----------------------  ----------------------",
        "  decode-64    1.48 → 1.71 µs (+15.5%)  12.0 → 11.4 µs (-5.0%)",
    ]
    assert diff_lines(capsys, plan, "--sm", "sm100") == [
        "rms_norm on sm100: the stored results hold one toolchain per GPU: nothing to compare"]


def test_diff_says_numerics_unchanged(tmp_path, capsys):
    plan = two_toolchains(tmp_path, changed=False)
    assert diff_lines(capsys, plan)[:2] == [
        "rms_norm: sm90 (NVIDIA H200), Triton 3.6.0 → 3.7.0 (2 cells and 1 benchmark under both)",
        "  numerics unchanged (2 cells of the same status); the max abs error grew most at "
        "prefill-bf16-tp1-eager-sm90: 0.0625 → 0.125"]


def test_one_toolchain_says_so_in_one_line_and_its_page_has_no_section(tmp_path, capsys):
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / OP
    record(op_dir / "results", H200, "run-1", ("cells", CELL, cell(Status.PASSED, "2026-12-01T01:00:00Z")))
    record(op_dir / "results", H200, "run-2", ("cells", CELL, cell(Status.FAILED, "2026-12-02T01:00:00Z", "NaN")))
    assert diff_lines(capsys, plan) == ["rms_norm: the stored results hold one toolchain per GPU: nothing to compare"]
    text, _ = render(plan, op_dir)
    assert "Toolchain" not in text and "\n## Trade-offs\n" in text


def test_the_page_says_what_changed_with_the_toolchain(tmp_path):
    plan = two_toolchains(tmp_path, changed=False)
    text, _ = render(plan, tmp_path / "reports" / OP)
    section = text.split("\n## Toolchain changes\n", 1)[1].split("\n## ", 1)[0]
    assert text.index("\n## Performance\n") < text.index("\n## Toolchain changes\n") < text.index("\n## Trade-offs\n")
    assert section.strip().splitlines() == [
        "Where a GPU's results hold two toolchains (torch, Triton, vLLM), what the latest two say, per cell and per "
        "benchmark (`python -m harness diff small.yaml` lists each):",
        "",
        "- **sm90 (NVIDIA H200), Triton 3.6.0 → 3.7.0** (2 cells and 1 benchmark under both):",
        "  - numerics unchanged (2 cells of the same status); the max abs error grew most at "
        "prefill-bf16-tp1-eager-sm90: 0.0625 → 0.125",
        "  - bf16 decode, cuda_graph: the kernel 1.48 → 1.71 µs (+15.5%), the median over 1 shape",
    ]


def test_vllms_version_is_part_of_the_toolchain_of_vllms_records_alone(tmp_path):
    """A machine with vLLM installed and one without run the plan's kernel alike: one toolchain for its cells. The
    cells of vLLM's own kernel are kept per vLLM version."""
    from harness.results.store import Stamp

    without = dataclasses.replace(H200, vllm=None, date="2026-11-30")
    vllm_cell = f"{CELL}-vllm"

    def vllms(finished: str) -> CellRecord:
        return dataclasses.replace(cell(Status.PASSED, finished), stamp=Stamp({}, "p", "i", "vllm"))

    record(tmp_path, without, "run-1", ("cells", CELL, cell(Status.PASSED, "2026-11-30T01:00:00Z")),
           ("cells", vllm_cell, vllms("2026-11-30T01:00:00Z")))
    record(tmp_path, H200, "run-2", ("cells", CELL, cell(Status.PASSED, "2026-12-01T01:00:00Z")),
           ("cells", vllm_cell, vllms("2026-12-01T01:00:00Z")))
    path = tmp_path / "sm90-nvidia-h200.json"
    assert kept(path) == [("run-2", "passed")]  # the kernel's: replaced, vLLM's presence changes nothing of it
    assert kept(path, key=vllm_cell) == [("run-2", "passed"), ("run-1", "passed")]
