"""Real third-party Triton kernels under the matrix on a CPU machine (tests/thirdparty/): each package's plan,
written from its docstrings as a new user would, passes through `pytest --plan` (pytester's, in this process: the
cells run in the run's worker processes either way), and a deliberately wrong adapter of the same kernel fails for
its reason.

These kernels are correct on an H200; on a CPU machine they run in Triton's interpreter, which as shipped fails
them (a float argument stays a Python float, libdevice returns None, @triton.autotune needs a GPU to time its
configs). harness.interpreter makes it faithful; `python -m tests.thirdparty.survey stock|faithful` runs
more of these packages' kernels, before and after.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import torch

from harness.results.store import to_json
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from tests.plans import read_plan, read_results, write_plan

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

ROOT = Path(__file__).resolve().parents[1]
THIRDPARTY = ROOT / "tests" / "thirdparty"

if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("checks the kernels in Triton's interpreter on a CPU machine", allow_module_level=True)

# plan -> (the package its kernel comes from, its op name, a wrong adapter and the words its failure must contain)
PLANS = {
    "liger_rms_norm.yaml": ("liger_kernel", "liger_rms_norm", "rms_norm_weight_offset", "output 'y': max abs error"),
    "fla_swiglu.yaml": ("fla", "fla_swiglu", "silu_and_mul_swapped_halves", "output 'out': max abs error"),
}
# Narrowed for a CPU machine's time: decode, both dtypes, eager and torch_compile (4 cells a plan).
SELECTION = ("--cells", "all", "-k", "decode")


def _importable(package: str) -> str:
    """'' when the package imports, else why not (at collection: a missing package skips its plans' tests)."""
    try:
        importlib.import_module(package)
        return ""
    except ImportError as e:
        return str(e)


MISSING = {package: why for package, *_ in PLANS.values() if (why := _importable(package))}


def _require(package: str) -> None:
    if package in MISSING:
        pytest.skip(f"{package} is not importable ({MISSING[package]}); `bash scripts/setup.sh test` installs it")


@pytest.fixture
def run_plan(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))

    def run(plan: Path, *args: str):
        result = pytester.runpytest_inprocess("-p", "harness.plugin", "--plan", str(plan), "--plan-profile", "ci",
                                              "--reports-dir", str(pytester.path / "reports"),
                                              "-p", "no:cacheprovider", *args)
        return result

    return run


def _cells(pytester, op: str) -> dict:
    return {cid: rec for cid, rec in read_results(pytester.path / "reports" / op / "results" / "cpu.json")["cells"]
            .items() if rec["status"] != "not_run"}


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_correct_third_party_kernel_passes_on_a_cpu_machine(pytester, run_plan, plan):
    package, op, _, _ = PLANS[plan]
    _require(package)
    copy = pytester.path / plan  # a plan outside the repository, as a user's (the repository's conftest stays out)
    copy.write_text((THIRDPARTY / plan).read_text())
    result = run_plan(copy, *SELECTION)
    cells = _cells(pytester, op)
    assert sorted(cells) == [f"decode-{d}-tp1-{m}-cpu" for d in ("bf16", "fp16") for m in ("eager", "torch_compile")]
    failed = {cid: rec["reason"] for cid, rec in cells.items() if rec["status"] != "passed"}
    assert not failed, failed
    assert all(rec["examples"] >= 3 for rec in cells.values()), cells
    result.assert_outcomes(passed=4, deselected=12)  # prefill by -k; the sm90 cells, not run on a CPU machine


WRONG = [(plan, wrong, words) for plan, (_, _, wrong, words) in sorted(PLANS.items())] + [
    ("liger_rms_norm.yaml", "rms_norm_transposed_weight_rows", "output 'y': max abs error")]


@pytest.mark.parametrize("plan, wrong, words", WRONG, ids=[w for _, w, _ in WRONG])
def test_wrong_adapter_of_the_same_kernel_fails_for_its_reason(tmp_path, plan, wrong, words):
    # Through the workers' own entry point, in this process (already made faithful, as every worker is).
    _require(PLANS[plan][0])
    module = read_plan(THIRDPARTY / plan)["op"]["kernel"].split(":")[0]
    wrong_plan = write_plan(tmp_path / plan, THIRDPARTY / plan, op={"kernel": f"{module}:{wrong}"})
    rec = to_json(run_cell(CellTask.load(wrong_plan, "decode-bf16-tp1-eager-cpu",
                                         RunSettings(examples=6, profile="ci", database=None))).record)
    assert rec["status"] == "failed", rec
    assert words in rec["reason"], rec["reason"]
    assert rec["minimal_example"].startswith("num_tokens="), rec
