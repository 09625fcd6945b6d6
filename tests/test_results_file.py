"""The results file's records through pydantic: a record that does not fit is named down to its field, fields another
harness wrote are skipped, numbers that are not finite keep their text, and the committed files read back as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results.store import CellRecord, ResultsError, from_json, load, results_text, to_json
from harness.cells.status import Status

ROOT = Path(__file__).resolve().parents[1]
RECORD = {"phase": "decode", "dtype": "bf16", "tp": 1, "graph_mode": "eager", "sm": "sm90", "status": "failed",
          "reason": "output 'out': max abs error nan", "run": "r1"}


def results_file(tmp_path: Path, **record) -> Path:
    path = tmp_path / "sm90-nvidia-h200.json"
    run = {"sm": "sm90", "device": "cuda", "gpu": "NVIDIA H200", "device_count": 1, "cpu_count": 16}
    path.write_text(json.dumps({"format": "harness-results", "version": 2, "op": "rms_norm", "runs": {"r1": run},
                                "cells": {"decode-bf16-tp1-eager-sm90": {**RECORD, **record}}}))
    return path


@pytest.mark.parametrize("field, value, words", [
    ("status", "broken", "cells.decode-bf16-tp1-eager-sm90.status: Input should be 'passed'"),
    ("tp", "two", "cells.decode-bf16-tp1-eager-sm90.tp: Input should be a valid integer"),
    ("error", [1.0], "cells.decode-bf16-tp1-eager-sm90.error: Input should be a dictionary"),
    ("more_failures", [{"reason": 3}], "cells.decode-bf16-tp1-eager-sm90.more_failures[0].reason: Input should be "
                                       "a valid string"),
])
def test_a_record_that_does_not_fit_is_named_with_its_file_and_field(tmp_path, field, value, words):
    path = results_file(tmp_path, **{field: value})
    with pytest.raises(ResultsError) as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}: {words}"), caught.value


def test_fields_of_another_harness_are_skipped_and_non_finite_numbers_keep_their_text(tmp_path):
    path = results_file(tmp_path, written_by_a_newer_harness={"x": 1},
                        error={"max_abs": "nan", "max_rel": "inf", "output": "out"}, readings={"max_abs": "nan"})
    rec = load(path).cells["decode-bf16-tp1-eager-sm90"]
    assert rec.status is Status.FAILED and rec.error.max_abs == "nan" and rec.error.max_rel == "inf"
    data = to_json(rec)
    assert "written_by_a_newer_harness" not in data and data["readings"] == {"max_abs": "nan"}
    assert data["error"] == {"max_abs": "nan", "max_rel": "inf", "output": "out"}
    assert to_json(from_json(CellRecord, data, "again")) == data


def test_committed_results_files_read_back_as_written():
    """Every record of every committed results file: read, written again, the same JSON (no field lost or changed
    by the conversion)."""
    files = sorted(ROOT.glob("reports/*/results/*.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        again = json.loads(results_text(load(path).to_json()))
        for section in ("runs", "cells", "benchmarks", "integration"):
            assert again.get(section, {}) == data.get(section, {}) or _same_but_defaults(data, again, section), \
                (path, section)


def _same_but_defaults(data: dict, again: dict, section: str) -> bool:
    """Files written before a field had a default (error.max_rel: 0.0) gain it on reading: nothing else differs."""
    for key, old in data.get(section, {}).items():
        new = again[section][key]
        if any(new.get(k) != v for k, v in old.items() if k != "error"):
            return False
        if old.get("error") and any(new["error"].get(k) != v for k, v in old["error"].items()):
            return False
    return True


def test_not_run_here_never_replaces_a_result_of_the_same_sm(tmp_path):
    """A machine that cannot run a cell (vLLM's kernels not installed, the GPU's memory held elsewhere) records "not
    run here"; the result an earlier run of the same SM made stands, in its own file and across files, and a new
    result still replaces it."""
    from harness.results.store import Provenance, Recorder, Results, fold

    prov = Provenance("cpu", "cpu", "x86_64", 0, 2, host="vm", commit="abc", date="2026-12-06")
    key = "decode-bf16-tp1-eager-cpu-vllm"
    first = Recorder(tmp_path, "rms_norm", prov, "run-1")
    first.record("cells", key, CellRecord("decode", "bf16", 1, "eager", "cpu", Status.FAILED, reason="NaN",
                                          finished="2026-12-06T01:00:00Z"))
    again = Recorder(tmp_path, "rms_norm", prov, "run-2")
    again.record("cells", key, CellRecord("decode", "bf16", 1, "eager", "cpu", Status.NOT_RUN,
                                          reason="vllm not installed", finished="2026-12-06T02:00:00Z"))
    assert load(again.path, "rms_norm").cells[key].reason == "NaN"
    other = Results("rms_norm", {"run-3": prov}, {key: CellRecord("decode", "bf16", 1, "eager", "cpu", Status.NOT_RUN,
                                                                  finished="2026-12-06T03:00:00Z", run="run-3")})
    assert fold(load(again.path, "rms_norm"), other).cells[key].status is Status.FAILED
    again.record("cells", key, CellRecord("decode", "bf16", 1, "eager", "cpu", Status.PASSED,
                                          finished="2026-12-06T04:00:00Z"))
    assert load(again.path, "rms_norm").cells[key].status is Status.PASSED


def test_made_by_other_checks_the_later_record_wins_even_not_run(tmp_path):
    """A failure the old checks reported (vLLM's build lacking one of its own kernels, once called the kernel's
    failure) and "not run here" from the checks now: the record of the current checks stands, as "not run", in the
    machine's own file and across files; the old failure is gone, not kept as a finding the checks no longer make."""
    import dataclasses

    from harness.results.store import IntegrationRecord, Provenance, Recorder, Results, Stamp, fold

    old = new = Provenance("sm90", "cuda", "x86_64", 1, 16, host="vm", commit="abc", date="2026-12-06")
    key = "fusion[all-bf16-sm90]"

    def made_by(version):  # the stamps of records made by fusion check v1 and v2
        return lambda key, rec: Stamp({"fusion": version}, "p", "i")

    def item(status, reason, finished):
        return IntegrationRecord(route="fusion", phase="all", dtype="bf16", tp=1, sm="sm90", status=status,
                                 graph_mode="torch_compile", reason=reason, finished=finished)

    first = Recorder(tmp_path, "op", old, "run-1", stamp=made_by(1))
    first.record("integration", key, item(Status.FAILED, "NotImplementedError", "2026-12-06T01:00:00Z"))
    again = Recorder(tmp_path, "op", new, "run-2", stamp=made_by(2))
    again.record("integration", key, item(Status.NOT_RUN, "vLLM cannot run its own layers here",
                                          "2026-12-06T02:00:00Z"))
    assert load(again.path, "op").integration[key].status is Status.NOT_RUN
    stale = Results("op", {"run-0": old}, integration={key: dataclasses.replace(
        item(Status.FAILED, "NotImplementedError", "2026-12-06T00:30:00Z"), run="run-0")})
    assert fold(stale, load(again.path, "op")).integration[key].status is Status.NOT_RUN
    assert fold(load(again.path, "op"), stale).integration[key].status is Status.NOT_RUN


def test_a_not_run_record_of_the_same_checks_never_replaces_a_result(tmp_path):
    """A machine without vLLM's kernel records its provider's cells "not run"; made by the same checks on the same
    plan and implementation, that never replaces the failure a machine with vLLM found (fold's rule)."""
    from harness.results.store import IntegrationRecord, Provenance, Recorder, Stamp

    prov = Provenance("cpu", "cpu", "x86_64", 0, 2, host="vm", commit="abc", date="2026-12-07")
    key = "vllm-ir[decode-bf16-cpu]"

    def item(status, reason, finished):
        return IntegrationRecord(route="ir", phase="decode", dtype="bf16", tp=1, sm="cpu", status=status,
                                 graph_mode="eager", reason=reason, finished=finished)

    def same(key, rec):
        return Stamp({"values": 1}, "p", "i")

    Recorder(tmp_path, "op", prov, "run-1", stamp=same).record("integration", key, item(
        Status.FAILED, "output 'out' differs", "2026-12-07T01:00:00Z"))
    again = Recorder(tmp_path, "op", prov, "run-2", stamp=lambda key, rec: Stamp({}, "p", "i"))
    again.record("integration", key, item(Status.NOT_RUN, "vllm not installed", "2026-12-07T02:00:00Z"))
    assert load(again.path, "op").integration[key].status is Status.FAILED


def test_a_record_of_newer_checks_wins_in_either_order_of_folding(tmp_path):
    """Two machines of one SM: an older record made before stamps (passed) and a newer one of the current checks
    (not run for memory): the current one stands, whichever file is folded first."""
    from harness.results.store import CellRecord, Provenance, Results, Stamp, fold

    prov = Provenance("sm90", "cuda", "NVIDIA H200", 1, 16, host="vm", commit="abc", date="2026-12-07")
    old = CellRecord("decode", "bf16", 1, "eager", "sm90", Status.PASSED, finished="2026-12-04T00:00:00Z", run="a")
    new = CellRecord("decode", "bf16", 1, "eager", "sm90", Status.NOT_RUN, reason="memory held elsewhere",
                     stamp=Stamp({"values": 1}, "p", "i"), finished="2026-12-01T00:00:00Z", run="b")
    for first, second in ((old, new), (new, old)):
        into = Results("op", {"a": prov, "b": prov}, cells={"k": first})
        assert fold(into, Results("op", {"a": prov, "b": prov}, cells={"k": second})).cells["k"] is new


def test_merge_folds_two_runs_files_of_one_name_record_by_record(tmp_path):
    """Nightly CI's artifacts: two runners of one GPU kind write the same file name (sm90-nvidia-h200.json), each with
    cells the other did not run. `python -m harness merge` keeps both runs' records where a copy keeps one file; a
    later "not run here" does not replace a result; an unreadable file is named and left as it is, the rest merged."""
    from harness.__main__ import main
    from harness.results.store import Provenance, Recorder

    prov = Provenance("sm90", "cuda", "NVIDIA H200", 1, 16, host="vm", commit="abc", date="2026-12-06")

    def cell(status, finished, reason=None):
        return CellRecord("decode", "bf16", 1, "eager", "sm90", status, reason=reason, finished=finished)

    reports, one, two = tmp_path / "reports", tmp_path / "results-h200", tmp_path / "results-h200-x2"
    Recorder(reports / "rms_norm" / "results", "rms_norm", prov, "run-0").record(
        "cells", "kept-from-before", cell(Status.PASSED, "2026-12-05T00:00:00Z"))
    Recorder(one / "rms_norm" / "results", "rms_norm", prov, "run-1").record(
        "cells", "tp1-cell", cell(Status.FAILED, "2026-12-06T01:00:00Z", "NaN"))
    second = Recorder(two / "rms_norm" / "results", "rms_norm", prov, "run-2")
    second.record("cells", "tp2-cell", cell(Status.PASSED, "2026-12-06T02:00:00Z"))
    second.record("cells", "tp1-cell", cell(Status.NOT_RUN, "2026-12-06T02:00:00Z", "memory held by others"))
    (two / "silu_and_mul" / "results").mkdir(parents=True)
    (two / "silu_and_mul" / "results" / "sm90-nvidia-h200.json").write_text("{truncated")

    assert main(["merge", str(one), str(two), "--reports-dir", str(reports)]) == 2  # the unreadable file
    merged = load(reports / "rms_norm" / "results" / "sm90-nvidia-h200.json", "rms_norm").cells
    assert sorted(merged) == ["kept-from-before", "tp1-cell", "tp2-cell"]
    assert merged["tp1-cell"].status is Status.FAILED and merged["tp2-cell"].status is Status.PASSED
    assert not (reports / "silu_and_mul").exists()
    assert main(["merge", str(one), "--reports-dir", str(reports)]) == 0  # again: nothing changes
    assert load(reports / "rms_norm" / "results" / "sm90-nvidia-h200.json", "rms_norm").cells == merged
