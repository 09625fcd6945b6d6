"""The plugin end to end: `pytest --plan` as a user runs it. The runs are pytester's in this process (the cells run
in the run's own worker processes either way; a fresh pytest process imports torch and the harness again, about
8 s on a 2-core machine), but for a plan outside the repository, run from another folder in a process of its own."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.plans import read_results as load
from tests.plans import SMALL_BATCHES, cpu_machine_only, rms_norm_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]


def cells(pytester, op="rms_norm") -> dict:
    return load(pytester.path / "reports" / op / "results" / "cpu.json")["cells"]


@cpu_machine_only
def test_every_cell_ends_in_one_status_with_its_reason(pytester, run_plan):
    plan = rms_norm_plan(pytester.path, matrix={"phase": ["decode", "prefill"], "dtype": ["fp32", "bf16"],
                                                "tp": [1, 16], "graph_mode": ["eager", "cuda_graph"],
                                                "sm": ["cpu", "sm90"]},
                         numerics={"examples": 4, **SMALL_BATCHES},
                         exclude=[{"phase": "prefill", "dtype": "bf16", "why": "no bf16 prefill | yet"}],
                         expect=[{"phase": "decode", "dtype": "bf16", "graph_mode": "eager", "why": "tracked"}])
    result = run_plan(plan, "-rsxX")
    got = cells(pytester)
    assert len(got) == 2 * 2 * 2 * 2 * 2  # no cell silently disappears
    assert got["decode-fp32-tp1-eager-cpu"]["status"] == "passed"
    assert got["prefill-fp32-tp1-eager-cpu"]["status"] == "passed"
    assert got["prefill-bf16-tp1-eager-cpu"]["status"] == "excluded"
    assert "no bf16 prefill | yet" in got["prefill-bf16-tp1-eager-cpu"]["reason"]
    assert got["decode-fp32-tp1-eager-sm90"] == {**got["decode-fp32-tp1-eager-sm90"], "status": "not_run",
                                                 "reason": "needs sm90; this machine is cpu"}
    assert got["decode-fp32-tp1-cuda_graph-cpu"]["reason"] == "cuda_graph needs a CUDA device; this machine has none"
    assert "needs 16 ranks" in got["decode-fp32-tp16-eager-cpu"]["reason"]
    # the plan expected a failure that did not happen: strict, reported as an unexpected pass
    assert got["decode-bf16-tp1-eager-cpu"]["status"] == "xpass"
    result.assert_outcomes(passed=2, failed=1, deselected=29)  # the cells not run: one count, their statuses kept
    assert "[XPASS(strict)] expected to fail by the plan" in result.stdout.str()
    rec = got["decode-fp32-tp1-eager-cpu"]
    assert rec["examples"] == 4 and rec["facts"]["token_cap"] == 65536 // 128
    run = load(pytester.path / "reports" / "rms_norm" / "results" / "cpu.json")["runs"][rec["run"]]
    assert run["sm"] == "cpu" and run["triton_interpreter"] is True and run["torch"]
    assert (pytester.path / "reports" / "rms_norm" / "PLAN.md").exists()


@cpu_machine_only
def test_ids_markers_k_and_junit(pytester, run_plan):
    plan = rms_norm_plan(pytester.path, matrix={"phase": ["decode", "prefill"], "dtype": ["fp32", "fp16"]},
                         numerics={"examples": 3, **SMALL_BATCHES})
    collected = run_plan(plan, "--collect-only", "-q").stdout.str()
    assert "plan.yaml::numerics[decode-fp16-tp1-eager-cpu]" in collected
    assert not (pytester.path / "reports" / "rms_norm" / "PLAN.md").exists()  # listing the cells writes no page
    assert not list((pytester.path / "reports").rglob("*.json"))  # nor a results file with a run of no record
    result = run_plan(plan, "-m", "decode and fp16", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=1)
    testcases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    assert [t.get("name") for t in testcases] == ["numerics[decode-fp16-tp1-eager-cpu]"]
    run_plan(plan, "-k", "prefill-fp32").assert_outcomes(passed=1)


@cpu_machine_only
def test_failure_shows_minimal_example_and_repro_command(pytester, run_plan):
    plan = rms_norm_plan(pytester.path, "tests.broken.rms_norm_bugs:tail_rows_dropped", numerics={"examples": 20})
    result = run_plan(plan)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "cell decode-fp32-tp1-eager-cpu failed: output 'out'" in out
    assert "minimal example: num_tokens=" in out
    assert "reproduce: pytest --plan " in out and "--replay decode-fp32-tp1-eager-cpu" in out
    assert "Traceback" not in out
    rec = cells(pytester)["decode-fp32-tp1-eager-cpu"]
    assert rec["status"] == "failed" and rec["minimal_example"].startswith("num_tokens=") and rec["repro"]


def test_invalid_plan_is_a_usage_error_without_traceback(pytester, run_plan):
    plan = rms_norm_plan(pytester.path, matrix={"dtype": ["fp32", "fp61"]})
    result = run_plan(plan)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    line = plan.read_text().splitlines().index("  dtype: [fp32, fp61]") + 1
    assert f"invalid plan: {plan}:{line}: matrix.dtype[1]: expected one of fp32" in err
    assert "Traceback" not in err


@cpu_machine_only
def test_report_command_rebuilds_from_stored_results(pytester, run_plan):
    plan = rms_norm_plan(pytester.path, numerics={"examples": 3})
    run_plan(plan).assert_outcomes(passed=1)
    report = pytester.path / "reports" / "rms_norm" / "PLAN.md"
    first = report.read_text()
    report.unlink()
    result = pytester.run(sys.executable, "-m", "harness", "report", str(plan), "--reports-dir",
                          str(pytester.path / "reports"))
    assert result.ret == 0 and report.read_text() == first
    (pytester.path / "reports" / "rms_norm" / "results" / "broken.json").write_text('{"format": "harness-res')
    result = pytester.run(sys.executable, "-m", "harness", "report", str(plan), "--reports-dir",
                          str(pytester.path / "reports"))
    assert result.ret == 0 and "broken.json: not valid JSON" in result.stderr.str()
    assert "decode-fp32-tp1-eager-cpu" in json.dumps(cells(pytester))


@cpu_machine_only
def test_a_plan_outside_the_repository_imports_from_its_own_folder_and_its_reproduce_command_runs_as_printed(
        tmp_path):
    """A user's plan beside a module of their own, run from another folder with the installed plugin: the plan's
    folder is on the import path, and the reproduce command a failure prints runs, as printed, from there."""
    user = tmp_path / "my_op"
    user.mkdir()
    (user / "my_kernels.py").write_text(
        "import torch\n\n"
        "def rms_norm(out, x, weight, eps):  # drops eps: wrong on all-zero and tiny rows\n"
        "    xf = x.float()\n"
        "    out.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True))).to(x.dtype) * weight)\n\n"
        "def rms_norm_ref(x, weight, eps):\n"
        "    xf = x.float()\n"
        "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight\n")
    write_plan(user / "plan.yaml", ROOT / "plan.yaml",
               op={"kernel": "my_kernels:rms_norm", "reference": "my_kernels:rms_norm_ref"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cmd = [sys.executable, "-m", "pytest", "--plan", "../my_op/plan.yaml", "--plan-profile", "ci",
           "-p", "no:cacheprovider", "-k", "decode-fp32-tp1-eager-cpu"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    first = subprocess.run(cmd, cwd=elsewhere, capture_output=True, text=True, env=env, timeout=600)
    out = first.stdout + first.stderr
    assert first.returncode == 1 and "1 failed" in out, out[-3000:]
    assert "ModuleNotFoundError" not in out, out[-3000:]
    printed = next(line.split("reproduce: ", 1)[1] for line in out.splitlines() if "reproduce: " in line)
    assert printed.startswith("pytest --plan ../my_op/plan.yaml"), printed
    again = subprocess.run([sys.executable, "-m", *shlex.split(printed)], cwd=elsewhere, capture_output=True,
                           text=True, env=env, timeout=600)
    assert again.returncode == 1 and "1 failed" in again.stdout, again.stdout[-3000:]


# A `pytest --plan` plugin that writes, as the run ends, which of triton's patch points (harness.interpreter.faithful)
# the run's own process holds patched.
PATCH_PROBE = """
import json, os, sys

def pytest_sessionfinish(session):
    loaded = "triton.runtime.interpreter" in sys.modules
    import triton.runtime.interpreter as interp
    from harness.interpreter.faithful import _patch_points
    points = [(owner, attr) for owner, attr, _ in _patch_points(interp) if owner is not None]
    patched = [attr for owner, attr in points if getattr(getattr(owner, attr, None), "_harness_faithful", False)]
    with open(os.environ["PATCH_PROBE_OUT"], "w") as f:
        json.dump({"loaded": loaded, "points": len(points), "patched": patched,
                   "interpret": os.environ.get("TRITON_INTERPRET")}, f)
"""

# The bundled RMSNorm after a launch that runs only in a faithful interpreter: a float argument is the fp32 scalar a
# GPU kernel gets, where the interpreter as shipped passes a Python float, which has no `.to`.
NEEDS_FAITHFUL = """
import torch
import triton
import triton.language as tl

from kernels.rms_norm import rms_norm as bundled


@triton.jit
def _scalar(out_ptr, s):
    tl.store(out_ptr, s.to(tl.float32))


def rms_norm(out, x, weight, eps):
    _scalar[(1,)](torch.empty(1), eps)
    bundled(out, x, weight, eps)
"""


@cpu_machine_only
def test_the_process_of_pytest_plan_leaves_triton_unpatched_and_its_workers_patch_it(tmp_path):
    """Triton's interpreter is made faithful where kernels run, in the workers, never in the process of `pytest
    --plan` itself, which runs none: run from the repository (its conftest.py loaded) in a process of its own, that
    process ends with triton's interpreter loaded (the plan's kernel imported) and every patch point as triton ships
    it, and the cell passes with a kernel that runs only in a faithful interpreter."""
    (tmp_path / "needs_faithful.py").write_text(NEEDS_FAITHFUL)
    (tmp_path / "patch_probe.py").write_text(PATCH_PROBE)
    plan = rms_norm_plan(tmp_path, "needs_faithful:rms_norm", numerics={"examples": 3})
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "PATCH_PROBE_OUT": str(tmp_path / "probe.json")}
    done = subprocess.run([sys.executable, "-m", "pytest", "--plan", str(plan), "--plan-profile", "ci", "-p",
                           "patch_probe", "--reports-dir", str(tmp_path / "reports"), "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "1 passed" in out, out[-3000:]
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["interpret"] == "1" and probe["loaded"], probe
    assert probe["points"] > 10 and probe["patched"] == [], probe


@cpu_machine_only
def test_cells_retry_runs_again_only_what_memory_others_held_left_not_run(pytester, run_plan):
    """Plans side by side on one GPU leave some cells "not run" for memory other processes held; `--cells retry` runs
    those again (the nightly does, with the GPU to each plan in turn) and leaves every other record as it was."""
    plan = rms_norm_plan(pytester.path, matrix={"phase": ["decode", "prefill"], "dtype": ["fp32"], "tp": [1],
                                                "graph_mode": ["eager"], "sm": ["cpu"]},
                         numerics={"examples": 4, **SMALL_BATCHES})
    run_plan(plan, "--cells", "all").assert_outcomes(passed=2)
    path = pytester.path / "reports" / "rms_norm" / "results" / "cpu.json"
    data = json.loads(path.read_text())
    data["cells"]["prefill-fp32-tp1-eager-cpu"].update(
        status="not_run", reason="the GPU ran out of memory (4.6 GiB held by other processes; this process's cap is "
                                 "14.2 GiB (HARNESS_GPU_MEMORY_FRACTION: plans side by side share the GPU))")
    path.write_text(json.dumps(data))
    kept = data["cells"]["decode-fp32-tp1-eager-cpu"]
    run_plan(plan, "--cells", "retry").assert_outcomes(passed=1, deselected=1)
    got = cells(pytester)
    assert got["prefill-fp32-tp1-eager-cpu"]["status"] == "passed"
    assert got["decode-fp32-tp1-eager-cpu"] == kept  # not retried: its record stays as it was
    assert run_plan(plan, "--cells", "retry").ret == pytest.ExitCode.NO_TESTS_COLLECTED  # nothing left to retry
