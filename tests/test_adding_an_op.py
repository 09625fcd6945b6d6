"""docs/adding-an-op.md is true: its two files, copied out of the page into a folder of their own, take vLLM's
GeluAndMul through every route the plan names, with nothing added to harness/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.vllm_facts.names import integration_routes
from harness.vllm import routes as integration
from harness.results.store import Status
from harness.runtime.vllm_compiled import vllm_missing
from harness.plan.load import load_plan
from harness.cells.matrix import Cell

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-an-op.md"


def guide_files(folder: Path) -> dict[str, Path]:
    """The page's code blocks marked `file=<name>`, written into `folder`."""
    files = {}
    for name, body in re.findall(r"```\w+ file=(\S+)\n(.*?)```", GUIDE.read_text(), re.S):
        (folder / name).write_text(body)
        files[name] = folder / name
    return files


def test_the_guide_adds_an_op_with_its_kernel_and_its_plan_only(tmp_path):
    files = guide_files(tmp_path)
    assert sorted(files) == ["gelu_and_mul.py", "gelu_and_mul.yaml"]
    proc = subprocess.run([sys.executable, "-m", "harness", "validate", str(files["gelu_and_mul.yaml"])], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "its code resolves" in proc.stdout, proc.stdout + proc.stderr
    assert integration_routes(load_plan(files["gelu_and_mul.yaml"])) == ("custom_op", "plugin")


@pytest.mark.skipif(bool(vllm_missing()), reason="vllm not installed")
@pytest.mark.parametrize("route", ["custom_op", "plugin"])
def test_the_guides_op_reaches_its_kernel_through_vllm(tmp_path, monkeypatch, route):
    files = guide_files(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = load_plan(files["gelu_and_mul.yaml"])
    rec = integration.check_route(plan, Cell("decode", "bf16", 1, "eager", "cpu"), route, examples=2)
    assert rec.status == Status.PASSED and rec.kernel_calls >= rec.examples == 2, rec.reason
