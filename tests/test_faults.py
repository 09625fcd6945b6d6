"""A kernel that crashes, hangs or is interrupted must not take the run down or lose results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.plans import cpu_machine_only, write_plan
from tests.plans import read_results as load

ROOT = Path(__file__).resolve().parents[1]
FAULTY_PLAN = ROOT / "tests" / "fixtures" / "faulty_plan.yaml"


def _pytest(plan: Path, reports: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "harness.plugin", "--plan", str(plan), "--plan-profile", "ci",
            "--reports-dir", str(reports), "-p", "no:cacheprovider", *args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}


@cpu_machine_only
def test_crash_and_hang_fail_their_cells_and_the_rest_still_runs(tmp_path):
    # timeout_s 8, not 40: the hung cell spins a core for all of it
    plan = write_plan(tmp_path / "faulty_plan.yaml", FAULTY_PLAN, matrix={"phase": ["decode"]},
                      numerics={"timeout_s": 8})
    reports = tmp_path / "reports"
    proc = subprocess.run(_pytest(plan, reports, "-q"), cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cells = load(reports / "faulty_rms_norm" / "results" / "cpu.json")["cells"]
    crash, hang, ok = (cells[f"decode-{d}-tp1-eager-cpu"] for d in ("fp16", "bf16", "fp32"))
    assert crash["status"] == "failed"
    # Under the interpreter the far read is reported at the kernel's line, never performed.
    assert "OutOfBounds: load at " in crash["reason"] and "tests/broken/rms_norm_bugs.py:" in crash["reason"], \
        crash["reason"]
    assert hang["status"] == "failed" and "no example finished within 8 s (numerics.timeout_s)" in hang["reason"]
    assert ok["status"] == "passed", ok["reason"]
    report = (reports / "faulty_rms_norm" / "PLAN.md").read_text()
    assert "no example finished within 8 s" in report
    assert "2 failed, 1 passed" in proc.stdout


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _descendants_of(pid: int) -> list[int]:
    children = _children_of(pid)
    return children + [d for c in children for d in _descendants_of(c)]


def _running(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


def _slow_plan(tmp_path: Path) -> Path:
    from tests.plans import rms_norm_plan

    return rms_norm_plan(tmp_path, matrix={"phase": ["decode", "prefill", "chunked_prefill"],
                                           "dtype": ["fp32", "fp16", "bf16"]}, numerics={"examples": 6})


def _wait_for_cells(results: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        if results.exists():
            data = load(results)
            if len(data["cells"]) >= n:
                return data
        time.sleep(0.2)
    raise AssertionError("no cell finished in time")


@cpu_machine_only
def test_sigkill_of_the_whole_run_keeps_finished_cells(tmp_path):
    reports = tmp_path / "reports"
    results = reports / "rms_norm" / "results" / "cpu.json"
    proc = subprocess.Popen(_pytest(_slow_plan(tmp_path), reports, "-q"), cwd=tmp_path, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_cells(results, 2, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    data = load(results)  # valid JSON, every finished cell kept
    assert len(data["cells"]) >= 2 and {c["status"] for c in data["cells"].values()} == {"passed"}
    report = subprocess.run([sys.executable, "-m", "harness", "report", str(tmp_path / "plan.yaml"),
                             "--reports-dir", str(reports)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                            timeout=300)
    assert report.returncode == 0, report.stderr
    assert (reports / "rms_norm" / "PLAN.md").exists()


@cpu_machine_only
def test_sigterm_keeps_results_writes_report_and_leaves_no_workers(tmp_path):
    reports = tmp_path / "reports"
    results = reports / "rms_norm" / "results" / "cpu.json"
    proc = subprocess.Popen(_pytest(_slow_plan(tmp_path), reports, "-q"), cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _wait_for_cells(results, 1, proc)
    workers = _descendants_of(proc.pid)  # the fork server, the worker it forked, multiprocessing's resource tracker
    assert len(workers) >= 2, "cells run in a worker process forked from the fork server"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "living plan written" in out, out
    assert len(load(results)["cells"]) >= 1
    # They exit on their own once the run is gone; an interpreter with torch loaded takes a moment to shut down.
    deadline = time.monotonic() + 30
    while (left := [p for p in workers if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left running: {left}"
