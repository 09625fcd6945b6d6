"""No stale page: every run stamps its records with the version of the checks that made them (the harness modules
that decide a record and the plan file), and the page and the run's summary mark records of other checks as stale."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

from harness.decisions.verdicts import STALE, sm_verdicts
from harness.rendering import report
from harness.results import checks_version as cv
from harness.results.merge import collect
from harness.results.store import load, merge_dir
from tests.plans import small_plan
from tests.test_report import ROOT, bench, cell, machine, passed_sm90, section, write_results

OTHER = {"numerics": "0123456789ab", "integration": "0a1b2c3d4e5f", "bench": "ba9876543210"}
FAST = {"decode-64": bench("decode", 64, 10.0, 50.0, 20.0), "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0)}


def page(tmp_path: Path, checks: dict | None, benchmarks=FAST, **cells) -> tuple[object, str]:
    """small_plan's page from an H200's results (both cells passed, the kernel faster everywhere: go), made by the
    checks `checks` (None: results from before runs stamped them)."""
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    prov = {**machine("sm90", "h200"), **({"checks": checks} if checks is not None else {})}
    records = {cid: cell(cid, "passed") for cid in ("decode-bf16-tp1-eager-sm90", "prefill-bf16-tp1-eager-sm90")}
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-h200", prov, {**records, **cells}, benchmarks)
    text, problems = report.render(plan, op_dir)  # not tests.test_report.render, which stamps as current
    assert problems == []
    return plan, text


def verdict_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("- **Verdict:**"))


def assert_stale(plan, text: str, made: dict | None) -> None:
    now = cv.checks_version(plan.path)
    cells_why = f"made by other checks ({(made or {}).get('numerics', 'unstamped')} ≠ {now['numerics']})"
    bench_why = f"made by other checks ({(made or {}).get('bench', 'unstamped')} ≠ {now['bench']})"
    assert verdict_line(text) == f"- **Verdict:** sm90: {STALE}"
    header = text.split("\n## ", 1)[0]
    assert "2 cells, 2 benchmarks made by other checks" in header and "until then they give: go" in header
    matrix = section(text, "Support matrix")
    assert "| decode  | bf16    | ✅ stale |" in matrix and "| prefill | bf16    | ✅ stale |" in matrix
    assert f"| stale: {cells_why} | 2 " in matrix
    perf = section(text, "Performance")
    assert perf.count(f"stale: {bench_why}") == 2  # each benchmark row says so
    assert "stale: 1 of 1 benchmarks" in perf  # and each decision resting on them
    assert "Re-run on sm90 what other checks made (2 cells, 2 benchmarks, stale): " \
           "`pytest --plan small.yaml --cells all --bench`" in section(text, "Open items")
    verdict_rows = [line for line in section(text, "Decisions and verdict").splitlines() if "verdict on sm90" in line]
    assert len(verdict_rows) == 1 and f"**{STALE}**" in verdict_rows[0]


def test_results_of_other_checks_are_stale_on_the_page(tmp_path):
    plan, text = page(tmp_path, OTHER)
    assert_stale(plan, text, OTHER)


def test_results_without_a_stamp_are_stale_on_the_page(tmp_path):
    plan, text = page(tmp_path, None)  # a results file from before runs stamped their checks still loads
    assert_stale(plan, text, None)


def test_results_of_the_current_checks_are_not_stale(tmp_path):
    plan = small_plan(tmp_path)
    plan, text = page(tmp_path, cv.checks_version(plan.path))
    assert "stale" not in text and "made by other checks" not in text
    assert verdict_line(text) == "- **Verdict:** sm90: go"
    assert collect(plan, tmp_path / "reports" / "rms_norm").stale_summary() == ""


def test_editing_the_plan_makes_its_results_stale(tmp_path):
    current = cv.checks_version(small_plan(tmp_path).path)
    plan, text = page(tmp_path, current)
    assert "stale" not in text
    plan.path.write_text(plan.path.read_text() + "# one more line\n")
    text, _ = report.render(plan, tmp_path / "reports" / "rms_norm")
    assert_stale(plan, text, current)


def test_a_verdict_rests_on_its_stale_benchmarks_and_a_current_failure_still_blocks(tmp_path):
    plan = small_plan(tmp_path)
    mixed = {**cv.checks_version(plan.path), "bench": OTHER["bench"]}  # cells current, benchmarks another's
    plan, text = page(tmp_path, mixed)
    assert verdict_line(text) == f"- **Verdict:** sm90: {STALE}"
    assert "2 benchmarks made by other checks" in text and "✅ stale" not in text
    failed = cell("decode-bf16-tp1-eager-sm90", "failed", reason="output 'out' differs")
    plan, text = page(tmp_path, mixed, **{"decode-bf16-tp1-eager-sm90": failed})
    assert verdict_line(text) == "- **Verdict:** sm90: blocked"  # what the current checks found wrong blocks


def test_the_stamp_covers_the_modules_that_decide_a_record_and_the_plan(tmp_path, monkeypatch):
    plan = small_plan(tmp_path)
    copy = tmp_path / "harness"
    shutil.copytree(cv.HARNESS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cv, "HARNESS_DIR", copy)
    before = cv.checks_version(plan.path)
    assert before == cv.checks_version(plan.path) and all(len(v) == 12 for v in before.values())
    (copy / "rendering" / "report.py").write_text("# pages decide nothing\n")
    assert cv.checks_version(plan.path) == before
    (copy / "runtime" / "numerics.py").write_text("# another comparison\n")
    numerics_changed = cv.checks_version(plan.path)
    assert numerics_changed["numerics"] != before["numerics"] and numerics_changed["bench"] == before["bench"]
    (copy / "vllm" / "fusion.py").write_text("# another pass check\n")
    integration_changed = cv.checks_version(plan.path)
    assert integration_changed["integration"] != numerics_changed["integration"]
    assert integration_changed["numerics"] == numerics_changed["numerics"]  # the cells stay current
    (copy / "decisions" / "bounds.py").write_text("# another bound\n")
    assert cv.checks_version(plan.path)["bench"] != before["bench"]
    plan.path.write_text(plan.path.read_text() + "\n")
    assert all(cv.checks_version(plan.path)[k] != v for k, v in numerics_changed.items())


def test_old_results_files_load_and_the_stamp_round_trips(tmp_path):
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir)  # the helpers write no stamp: a results file from before runs recorded one
    path = op_dir / "results" / "sm90-nvidia-h200.json"
    assert load(path).runs["run-h200"].checks is None
    data = json.loads(path.read_text())
    data["runs"]["run-h200"]["checks"] = OTHER
    path.write_text(json.dumps(data))
    assert load(path).runs["run-h200"].checks == OTHER


def test_a_stale_verdict_needs_a_stale_record_it_rests_on(tmp_path):
    """Another SM's machine saying "not run here" is no result: stale or not, it leaves the verdict alone."""
    plan = small_plan(tmp_path, matrix={"sm": ["cpu", "sm90"]})
    op_dir = tmp_path / "reports" / "rms_norm"
    current = cv.checks_version(plan.path)
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-h200", {**machine("sm90", "h200"),
                  "checks": current}, {cid: cell(cid, "passed") for cid in ("decode-bf16-tp1-eager-sm90",
                                                                            "prefill-bf16-tp1-eager-sm90")}, FAST)
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", {**machine("cpu"), "checks": OTHER}, {
        "decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "not_run", "2026-11-28T00:00:00Z",
                                           reason="needs sm90; this machine is cpu")})
    words = {v.sm: v.word for v in sm_verdicts(collect(plan, op_dir))}
    assert words["sm90"].startswith("go") and words["cpu"] == "no results"


def test_the_run_stamps_its_records_and_counts_the_stale_ones_at_the_end(tmp_path):
    reports = tmp_path / "reports"
    write_results(reports / "rms_norm", "cpu.json", "rms_norm", "run-old", {**machine("cpu"), "checks": OTHER},
                  {"decode-fp32-tp1-eager-cpu": cell("decode-fp32-tp1-eager-cpu", "passed")})
    # A cell no machine here runs (sm100): the run runs nothing, and writes the report.
    done = subprocess.run([sys.executable, "-m", "pytest", "--plan", "plan.yaml", "--reports-dir", str(reports),
                           "-k", "decode-bf16-tp1-eager-sm100", "-p", "no:cacheprovider", "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert "1 stale record (made by other checks): re-run them on cpu: pytest --plan plan.yaml --cells all" in out, \
        out[-3000:]
    runs = merge_dir(reports / "rms_norm" / "results", "rms_norm")[0].runs
    assert runs.pop("run-old").checks == OTHER
    assert [prov.checks for prov in runs.values()] == [cv.checks_version(ROOT / "plan.yaml")]
    # the harness's own version beside the plan repository's commit
    assert [prov.harness.split(" ")[0] for prov in runs.values()] == [importlib.metadata.version("vllm-op-plan")]


def test_integration_items_of_a_route_the_plan_no_longer_takes_are_not_its_results(tmp_path):
    """A plan that moved from an IR provider to a CustomOp keeps its results files: the IR items in them are not
    this plan's (no open item asks to re-run them); the page counts them as not shown."""
    from harness.results.store import IntegrationRecord, Provenance, Results, Status, write_atomic
    from harness.spec.load import load_plan

    plan = load_plan(ROOT / "kernels" / "plans" / "silu_and_mul.yaml")  # route custom_op
    assert plan.vllm.route == "custom_op"
    item = dict(phase="decode", dtype="bf16", tp=1, graph_mode="eager", sm="cpu", status=Status.PASSED, run="r")
    results = Results(plan.name, {"r": Provenance(sm="cpu", device="cpu", gpu="", device_count=0, cpu_count=2,
                                                  date="2026-12-01T00:00:00Z")})
    for route in ("ir", "custom_op", "plugin"):
        results.integration[f"vllm-{route}[decode-bf16-cpu]"] = IntegrationRecord(route=route, **item)
    write_atomic(tmp_path / plan.name / "results" / "cpu.json", results)
    res = collect(plan, tmp_path / plan.name)
    assert sorted(res.integration) == ["vllm-custom_op[decode-bf16-cpu]", "vllm-plugin[decode-bf16-cpu]"]
    assert res.ignored >= 1
