"""Evidence that survives a refactor: a record is stale only when it could now come out differently. Each record is
stamped with the checks it ran (with their versions), the plan fields it rests on and the implementation it ran
(harness.results.stamps); a refactor, a comment or another provider's edit stales nothing, a check's version that
rose, a plan field it rests on or its kernel's source does, and a check added since reads "not checked for X yet"."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

from harness.decisions.verdicts import STALE, sm_verdicts
from harness.rendering import report
from harness.results import checks
from harness.results.merge import collect, judged
from harness.results.stamps import UNSTAMPED, stamp
from harness.results.store import BenchRecord, ImplFigures, load, write_atomic
from harness.plan.load import load_plan
from tests.plans import small_plan
from tests.test_report import ROOT, bench, cell, machine, section, stamp_current, write_results

FAST = {"decode-64": bench("decode", 64, 10.0, 50.0, 20.0), "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0)}
CELLS = ("decode-bf16-tp1-eager-sm90", "prefill-bf16-tp1-eager-sm90")


def page(tmp_path: Path, plan=None, stamped: bool = True, benchmarks=FAST, **cells) -> tuple[object, str]:
    """small_plan's page from an H200's results (both cells passed, the kernel faster everywhere: go), stamped as a
    run of today's checks on the plan would stamp them (`stamped`), or as results from before records were stamped."""
    plan = plan or small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    records = {cid: cell(cid, "passed") for cid in CELLS}
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-h200", machine("sm90", "h200"),
                  {**records, **cells}, benchmarks)
    if stamped:
        stamp_current(plan, op_dir)
    return plan, rerender(plan, tmp_path)


def rerender(plan, tmp_path: Path) -> str:
    text, problems = report.render(plan, tmp_path / "reports" / "rms_norm")
    assert problems == []
    return text


def verdict_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("- **Verdict:**"))


def assert_stale(text: str, why: str, cells: int = 2, benchmarks: int = 2) -> None:
    assert verdict_line(text) == f"- **Verdict:** sm90: {STALE}"
    header = text.split("\n## ", 1)[0]
    assert "could now come out differently" in header and "until then they give: go" in header and why in header
    matrix = section(text, "Support matrix")
    if cells:
        assert "| decode  | bf16    | ✅ stale |" in matrix and "| prefill | bf16    | ✅ stale |" in matrix
        assert f"| stale: {why} | {cells} " in matrix
    if benchmarks:
        assert section(text, "Performance").count(f"stale: {why}") == benchmarks  # each benchmark row says so
    assert "`pytest --plan small.yaml --cells stale`" in section(text, "Open items")


def test_results_of_the_current_checks_are_not_stale(tmp_path):
    plan, text = page(tmp_path)
    assert "stale" not in text.replace("--cells stale", "") and "not checked for" not in text
    assert verdict_line(text) == "- **Verdict:** sm90: go"
    assert collect(plan, tmp_path / "reports" / "rms_norm").stale_summary() == ""


def test_results_without_a_stamp_are_stale_on_the_page(tmp_path):
    _, text = page(tmp_path, stamped=False)  # a results file from before records were stamped still loads
    assert_stale(text, UNSTAMPED)


def test_comments_descriptions_and_benchmark_models_stale_nothing(tmp_path):
    plan, text = page(tmp_path)
    source = plan.path.read_text()
    plan.path.write_text("# a comment on top\n" + source.replace("op:\n", "op:\n  description: an RMSNorm\n", 1)
                         + "# and one at the end\n")
    plan = load_plan(plan.path)
    assert verdict_line(rerender(plan, tmp_path)) == "- **Verdict:** sm90: go"


def test_a_field_the_records_rest_on_stales_them(tmp_path):
    plan, _ = page(tmp_path)
    plan.path.write_text(plan.path.read_text().replace("hidden: [4096]", "hidden: [4096, 5120]"))
    plan = load_plan(plan.path)
    assert_stale(rerender(plan, tmp_path), "the plan fields it rests on changed", benchmarks=0)


def test_a_check_whose_version_rose_stales_the_records_it_made_and_says_which(tmp_path, monkeypatch):
    plan, _ = page(tmp_path)
    declared = checks.declared_versions
    now = declared("runtime/numerics.py")
    monkeypatch.setattr(checks, "declared_versions", lambda module, *root, **kw: {**now, "values": now["values"] + 1}
                        if module == "runtime/numerics.py" and not kw else declared(module, *root, **kw))
    why = f"values v{now['values']} → v{now['values'] + 1}"
    text = rerender(plan, tmp_path)
    assert_stale(text, why, benchmarks=0)  # benchmarks do not run the value check of cells: they stay current
    assert "stale: " not in section(text, "Performance")


def test_a_check_that_acts_on_faults_only_stales_only_the_cells_that_faulted(tmp_path, monkeypatch):
    """A check's version rising stales the records it acted on: the shrinking after a fault acts on a cell whose
    kernel faulted (its facts say it was shrunk), not on one that passed, though both ran under it."""
    faulted = cell(CELLS[0], "failed", reason="the worker process running this cell was killed by SIGSEGV",
                   facts={"shrunk after the fault": {"replays": 3}})
    plan, _ = page(tmp_path, **{CELLS[0]: faulted})
    declared = checks.declared_versions
    now = declared("runtime/shrinking.py")
    monkeypatch.setattr(checks, "declared_versions", lambda module, *root, **kw: {"fault isolation":
                        now["fault isolation"] + 1} if module == "runtime/shrinking.py" and not kw
                        else declared(module, *root, **kw))
    res = collect(plan, tmp_path / "reports" / "rms_norm")
    assert res.stale_checks(res.records[CELLS[0]]) == f"fault isolation v{now['fault isolation']} → " \
        f"v{now['fault isolation'] + 1}"
    assert res.stale_checks(res.records[CELLS[1]]) == ""


def test_a_rise_that_changes_only_failures_stales_only_the_records_of_failures(tmp_path, monkeypatch):
    """A version rise declared in FAILURES_ONLY (what a failure says or shrinks to) leaves a passed record current
    and stales a failed one."""
    failed = cell(CELLS[0], "failed", reason="output 'out': max abs error 0.5")
    plan, _ = page(tmp_path, **{CELLS[0]: failed})
    declared = checks.declared_versions
    v = declared("runtime/numerics.py")["values"]

    def rose(module, *root, literal="CHECK_VERSIONS"):
        if module != "runtime/numerics.py":
            return declared(module, *root, literal=literal)
        return {**declared(module), "values": v + 1} if literal == "CHECK_VERSIONS" else {"values": [v + 1]}

    monkeypatch.setattr(checks, "declared_versions", rose)
    res = collect(plan, tmp_path / "reports" / "rms_norm")
    assert res.stale_checks(res.records[CELLS[0]]) == f"values v{v} → v{v + 1}"
    assert res.stale_checks(res.records[CELLS[1]]) == ""


def test_a_check_added_later_leaves_plans_it_does_not_apply_to_current(tmp_path, monkeypatch):
    plan, _ = page(tmp_path)
    new = checks.Check("racecheck", "runtime/numerics.py", lambda s: s.section == "cells" and s.quantized,
                       "compute-sanitizer racecheck finds no hazard between threads")
    declared = checks.declared_versions
    now = declared("runtime/numerics.py")
    monkeypatch.setattr(checks, "CHECKS", (*checks.CHECKS, new))
    monkeypatch.setattr(checks, "declared_versions", lambda module, *root, **kw: {**now, "racecheck": 1}
                        if module == "runtime/numerics.py" and not kw else declared(module, *root, **kw))
    text = rerender(plan, tmp_path)  # small_plan quantizes nothing: the check does not apply
    assert verdict_line(text) == "- **Verdict:** sm90: go" and "not checked for" not in text
    monkeypatch.setattr(checks, "CHECKS", (*checks.CHECKS[:-1],
                                           dataclasses.replace(new, applies=lambda s: s.section == "cells")))
    text = rerender(plan, tmp_path)
    assert verdict_line(text) == "- **Verdict:** sm90: go"  # the verdict rests on the checks that did run
    assert "| not checked for racecheck yet | 2 " in section(text, "Support matrix")
    res = collect(plan, tmp_path / "reports" / "rms_norm")
    assert res.needs_run("cells", CELLS[0], lambda reason: False)  # --cells stale runs them
    assert not res.needs_run("benchmarks", "decode-64", lambda reason: False)


def test_an_edit_to_the_kernel_stales_its_cells_and_no_other_implementations(tmp_path):
    """The kernel's module lies beside the plan: a docstring or comment in it stales nothing, its code does, and the
    cells of another implementation (one the plan audits beside the kernel) stay current."""
    shutil.copy(ROOT / "kernels" / "rms_norm.py", tmp_path / "my_rms_norm.py")
    plan = small_plan(tmp_path, op={"kernel": "my_rms_norm:rms_norm"})
    plan, text = page(tmp_path, plan)
    assert verdict_line(text) == "- **Verdict:** sm90: go"
    module = tmp_path / "my_rms_norm.py"
    module.write_text('"""Another docstring."""\n# and a comment\n' + module.read_text().split('"""', 2)[2])
    assert verdict_line(rerender(plan, tmp_path)) == "- **Verdict:** sm90: go"
    module.write_text(module.read_text().replace("tl.rsqrt", "1.0 / tl.sqrt", 1))
    text = rerender(plan, tmp_path)
    assert_stale(text, "the kernel's source changed", benchmarks=0)
    assert section(text, "Performance").count("stale: an implementation it timed changed") == 2


def test_a_changed_step_allowance_re_judges_stored_benchmarks_without_a_run():
    """Benchmark records keep the after-timing check's observation (the fraction of quantized elements one step
    off); each implementation's allowance is applied when the page is made: vLLM's kernel with its own (5%), the
    kernel with the plan's (1%)."""
    plan = load_plan(ROOT / "kernels" / "plans" / "rms_norm_static_fp8_quant.yaml")
    assert plan.quantization.max_step_fraction == 0.01 and plan.vllm_kernel.max_step_fraction == 0.05
    rec = BenchRecord("decode", "bf16", "sm90", "eager", 64, impls={
        "kernel": ImplFigures(median_us=3.0, step_fraction=0.0117),
        "vllm": ImplFigures(median_us=3.0, step_fraction=0.0117)})
    out = judged(plan, rec)
    assert out.impls["vllm"].differs is None
    assert out.impls["kernel"].error == ("wrong result after timing: 1.17% of quantized elements are one step from "
                                         "the reference (at most 1.00% allowed: quantization.max_step_fraction)")
    looser = plan.model_copy(update={"quantization": plan.quantization.model_copy(
        update={"max_step_fraction": 0.02})})
    assert judged(looser, rec).impls["kernel"].error is None
    stricter = plan.model_copy(update={"implementations": {**plan.implementations, "vllm": plan.vllm_kernel.model_copy(
        update={"max_step_fraction": 0.001})}})
    assert "1.17% of quantized elements" in judged(stricter, rec).impls["vllm"].differs


def test_a_stale_verdict_needs_a_stale_record_it_rests_on(tmp_path):
    """Another SM's machine saying "not run here" is no result: stale or not, it leaves the verdict alone."""
    plan = small_plan(tmp_path, matrix={"sm": ["cpu", "sm90"]})
    op_dir = tmp_path / "reports" / "rms_norm"
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-h200", machine("sm90", "h200"),
                  {cid: cell(cid, "passed") for cid in CELLS}, FAST)
    stamp_current(plan, op_dir)
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", machine("cpu"), {  # unstamped
        "decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "not_run", "2026-11-28T00:00:00Z",
                                           reason="needs sm90; this machine is cpu")})
    words = {v.sm: v.word for v in sm_verdicts(collect(plan, op_dir))}
    assert words["sm90"].startswith("go") and words["cpu"] == "no results"


def test_a_current_failure_still_blocks_beside_stale_benchmarks(tmp_path):
    plan = small_plan(tmp_path)
    failed = cell(CELLS[0], "failed", reason="output 'out' differs")
    plan, text = page(tmp_path, plan, **{CELLS[0]: failed})
    op_dir = tmp_path / "reports" / "rms_norm"
    path = op_dir / "results" / "sm90-nvidia-h200.json"
    results = load(path)
    for rec in results.benchmarks.values():  # the benchmarks from before records were stamped
        rec.stamp = None
    write_atomic(path, results)
    assert verdict_line(rerender(plan, tmp_path)) == "- **Verdict:** sm90: blocked"


def test_the_run_stamps_its_records_and_cells_stale_runs_only_what_is_stale(tmp_path):
    """A run stamps every record it makes; `--cells stale` then collects nothing on an unchanged tree, and after a
    record loses its stamp (a record of older checks), that record's item alone."""
    reports = tmp_path / "reports"
    one = "numerics and decode-fp32-tp1-eager-cpu and not vllm"
    run = [sys.executable, "-m", "pytest", "--plan", "plan.yaml", "--reports-dir", str(reports), "-p",
           "no:cacheprovider", "-q", "-k", one]
    done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    path = reports / "rms_norm" / "results" / "cpu.json"
    ran = load(path).cells["decode-fp32-tp1-eager-cpu"]
    assert ran.stamp == stamp(load_plan(ROOT / "plan.yaml"), ran)
    assert {"values", "interpreter", "tf32"} <= set(ran.stamp.checks) and "accumulation" not in ran.stamp.checks
    unchanged = subprocess.run([*run, "--cells", "stale"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert unchanged.returncode == 5 and "1468 deselected in" in unchanged.stdout, unchanged.stdout[-3000:]
    results = load(path)
    results.cells["decode-fp32-tp1-eager-cpu"].stamp = None
    write_atomic(path, results)
    again = subprocess.run([*run, "--cells", "stale"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "1 passed" in again.stdout, again.stdout[-3000:]
    assert load(path).cells["decode-fp32-tp1-eager-cpu"].stamp is not None
