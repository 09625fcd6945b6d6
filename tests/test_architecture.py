"""The harness's shape as a checked contract: layers (lint-imports), no hidden imports, an inert plugin, and
committed reports that are a pure function of their plan and results."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from harness.rendering.overview import render_overview
from harness.rendering.report import render
from harness.runtime.resolve import resolve_in_child
from harness.plan.load import load_plan
from harness.plan.field_docs import fields_table
from harness.plan.schema import json_schema_text

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


# ---------------------------------------------------------------- a plan's text, its schema and its code


def test_committed_plan_schema_is_the_schemas_export():
    """plan.schema.json (for editors: `# yaml-language-server: $schema=./plan.schema.json`) is the pydantic
    models' JSON Schema, as `python -m harness schema` prints it."""
    assert (ROOT / "plan.schema.json").read_text() == json_schema_text(), \
        "plan.schema.json differs from the schema: run python -m harness schema > plan.schema.json"


def test_every_field_of_the_schema_is_in_the_field_table_the_readme_holds():
    """The table of fields (harness.plan.field_docs, the README's and the JSON Schema's words) names every field a
    plan may hold (a field left out of it is one users cannot know of): each field's name, as a word, in the table;
    and the README holds the table as `python -m harness fields` prints it."""
    from pydantic import BaseModel

    from harness.plan.load import _is_union, _unwrap, keys
    from harness.plan.model import Plan

    def fields(model: type[BaseModel], prefix: str = ""):
        for name, info in keys(model).items():
            path = f"{prefix}.{name}" if prefix else name
            yield path, name
            pending = [info.annotation]
            while pending:
                annotation = _unwrap(pending.pop())[0]
                if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                    yield from fields(annotation, path)
                elif _is_union(annotation) or typing.get_origin(annotation) in (list, dict):
                    pending += typing.get_args(annotation)

    table = fields_table()
    assert table in (ROOT / "README.md").read_text(), \
        "the README's field table differs from harness.plan.field_docs: paste `python -m harness fields` into it"
    found = {path for path, name in fields(Plan) if re.search(rf"\b{re.escape(name)}\b", table)}
    missing = sorted({path for path, _ in fields(Plan)} - found)
    assert not missing, f"fields the README's field table does not name: {', '.join(missing)}"


def test_the_readmes_layout_names_every_module():
    """The README's layout is the map a reader takes the tree in with: a module it leaves out is one nobody finds."""
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    modules = [p for p in sorted((ROOT / "harness").rglob("*.py")) if p.name not in ("__init__.py", "__main__.py")]
    missing = [str(p.relative_to(ROOT)) for p in modules if not re.search(rf"\b{re.escape(p.name)}\b", layout)]
    assert not missing, f"modules the README's layout does not name: {', '.join(missing)}"


def test_no_import_hides_under_type_checking():
    """An import only type checkers see is how a cycle between modules hides (lint-imports leaves them out): every
    harness import is a real one, but for vLLM's facts naming the plan's types in their hints (the plan's checks
    import the facts, so the facts import no plan module at run time)."""
    hiding = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        if "TYPE_CHECKING" not in path.read_text():
            continue
        rel = path.relative_to(ROOT)
        blocks = [n for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"]
        hints_of_the_plan = rel.parts[:2] == ("harness", "vllm_facts") and all(
            isinstance(s, ast.ImportFrom) and (s.module or "").startswith("harness.plan.")
            for b in blocks for s in [*b.body, *b.orelse])
        if not hints_of_the_plan:
            hiding.append(str(rel))
    assert not hiding, f"imports under TYPE_CHECKING in {', '.join(hiding)}"


def test_vllms_facts_import_nothing_else_of_the_harness():
    """The bottom layer at run time: importing every module of harness.vllm_facts loads no other harness module (the
    plan's types are in their type hints only)."""
    code = ("import importlib, pkgutil, sys\n"
            "import harness.vllm_facts as facts\n"
            "for m in pkgutil.iter_modules(facts.__path__):\n"
            "    importlib.import_module(f'harness.vllm_facts.{m.name}')\n"
            "print(sorted(m for m in sys.modules if m.startswith('harness.')\n"
            "             and not m.startswith('harness.vllm_facts')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"harness.vllm_facts imports {proc.stdout.strip()}"


def test_every_bundled_plan_fits_the_json_schema():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(json.loads((ROOT / "plan.schema.json").read_text()))
    for path in [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml"))]:
        data = yaml.safe_load(path.read_text())
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(data)]
        assert not errors, f"{path.name}: {errors[:3]}"
    assert list(validator.iter_errors({"op": {"name": "x"}, "matrix": {}, "numercs": {}}))


_NO_TORCH = """\
import runpy, sys
sys.argv = ["python -m harness", *sys.argv[1:]]
try:
    runpy.run_module("harness", run_name="__main__")
except SystemExit as exc:
    status = exc.code
heavy = sorted(m for m in ("torch", "triton", "numpy", "vllm", "matplotlib") if m in sys.modules)
assert not heavy, f"imported {heavy}"
sys.exit(status)
"""


@pytest.mark.parametrize("command", ["validate", "report"])
def test_validate_and_report_import_no_torch(tmp_path, command):
    """`report` reads the plan and results only; `validate` imports the plan's code in a child process."""
    args = [command, "plan.yaml"]
    if command == "report":
        shutil.copytree(ROOT / "reports" / "rms_norm", tmp_path / "rms_norm")  # results, and the plots it links
        (tmp_path / "rms_norm" / "PLAN.md").unlink()
        args += ["--reports-dir", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if command == "validate":
        assert "plan.yaml: ok (rms_norm, 720 cells, and 720 of vllm); its code resolves" in proc.stdout
    else:
        written = (tmp_path / "rms_norm" / "PLAN.md").read_text()
        assert written == (ROOT / "reports" / "rms_norm" / "PLAN.md").read_text()


def test_validate_says_which_plans_code_does_not_resolve(tmp_path, monkeypatch):
    """Parsing is in-process; the code is imported in a child process, which a crashing or hanging import does
    not take down with it: each plan gets its own answer."""
    (tmp_path / "crashes.py").write_text("import os\nos._exit(3)\n")
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT)]))
    text = (ROOT / "plan.yaml").read_text()
    paths = []
    for name, kernel in (("crashes", "crashes:kernel"), ("typo", "kernels.rms_norm:rms_nrm"),
                         ("fine", "kernels.rms_norm:rms_norm"), ("hangs", "hangs:kernel")):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(text.replace("kernel: kernels.rms_norm:rms_norm ", f"kernel: {kernel} ", 1))
    answers = resolve_in_child([str(p) for p in paths], timeout_s=30)
    assert "ended with exit status 3" in answers[str(paths[0])]
    assert answers[str(paths[1])].startswith(f"{paths[1]}:8: op.kernel: expected an importable object (AttributeError")
    assert answers[str(paths[2])] == ""
    assert "did not finish in 30 s" in answers[str(paths[3])]


def test_harness_modules_stay_small():
    """Readable in one sitting: no module of the harness over 700 lines."""
    big = {str(p.relative_to(HARNESS)): n for p in sorted(HARNESS.rglob("*.py"))
           if (n := len(p.read_text().splitlines())) > 700}
    assert not big, f"harness modules over 700 lines: {big}"


def test_the_tree_is_the_flow_plan_cells_results_decisions_pages():
    """Each kind of work in its own sub-package, and nothing of the harness's own beside them but its entry points."""
    packages = {p.name for p in HARNESS.iterdir() if (p / "__init__.py").exists()}
    assert packages == {"plan", "cells", "results", "decisions", "rendering", "runtime", "vllm", "vllm_facts",
                        "plugin", "interpreter"}, packages
    loose = {p.name for p in HARNESS.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert not loose, f"modules outside the sub-packages: {loose}"
