"""The harness's shape as a checked contract: layers (lint-imports), no hidden imports, an inert plugin, and
committed reports that are a pure function of their plan and results."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.rendering.overview import render_overview
from harness.spec.plan import load_plan
from harness.rendering.report import render

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "harness"
PLANS = {"rms_norm": ROOT / "plan.yaml", "fused_add_rms_norm": ROOT / "kernels/plans/fused_add_rms_norm.yaml",
         "silu_and_mul": ROOT / "kernels/plans/silu_and_mul.yaml"}


def test_layers_import_only_downward():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" not in proc.stdout.split("Contracts:")[-1].replace("0 broken", "")


def test_no_harness_module_is_imported_inside_a_function():
    hidden = []
    for path in sorted(HARNESS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("harness")):
                    hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                if isinstance(node, ast.Import) and any(a.name.startswith("harness") for a in node.names):
                    hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not hidden, f"harness modules imported inside functions: {hidden}"


def test_the_plugin_is_inert_without_a_plan(tmp_path):
    """An unrelated suite in the same environment: no torch imported, no environment variable changed."""
    (tmp_path / "test_unrelated.py").write_text(
        "import os, sys\n\n"
        "def test_nothing_of_the_harness_leaks():\n"
        "    assert 'torch' not in sys.modules\n"
        "    assert 'triton' not in sys.modules\n"
        "    assert 'TRITON_INTERPRET' not in os.environ\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "-p", "no:cacheprovider",
                           "-p", "no:benchmark", "-q", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


@pytest.mark.parametrize("op", sorted(PLANS))
def test_committed_report_is_rendered_from_its_committed_results(op):
    """Golden: PLAN.md is a pure function of the plan and the results beside it (no matplotlib, no torch)."""
    text, problems = render(load_plan(PLANS[op]), ROOT / "reports" / op)
    assert problems == []
    assert text == (ROOT / "reports" / op / "PLAN.md").read_text(), \
        f"reports/{op}/PLAN.md differs from its rendering: run python -m harness report {PLANS[op].relative_to(ROOT)}"


def test_committed_overview_is_rendered_from_the_committed_plans_and_results():
    """Golden: reports/README.md is a pure function of every bundled plan and the results beside their pages."""
    paths = [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml"))]
    text, problems = render_overview([load_plan(p) for p in paths], ROOT / "reports")
    assert problems == []
    assert text == (ROOT / "reports" / "README.md").read_text(), \
        "reports/README.md differs from its rendering: run python -m harness overview plan.yaml kernels/plans/*.yaml"


def test_committed_faulty_plan_report_is_rendered_from_its_results():
    op_dir = ROOT / "tests/fixtures/h200/faulty_rms_norm"
    text, _ = render(load_plan(ROOT / "tests/fixtures/faulty_plan.yaml"), op_dir)
    assert text == (op_dir / "PLAN.md").read_text()
