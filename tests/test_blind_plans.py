"""A plan proves it can fail: wrong kernels made from its reference (an input ignored or read out of order, an
output off by twice the tolerance, its last row zeroed or copied from the one before) must fail the plan's own
comparison, or `python -m harness validate` refuses the plan, naming the field at its line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.runtime.mutants import blind_spots
from harness.plan.load import load_plan
from tests.plans import write_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml")),
         *sorted((ROOT / "tests" / "thirdparty").glob("*.yaml"))]


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
def test_every_bundled_plan_fails_every_generated_wrong_kernel(path):
    assert blind_spots(load_plan(path)) == []


def test_a_scale_of_zero_blinds_an_attention_plan_to_its_query(tmp_path):
    """A softmax scale of 0 makes every logit 0: a kernel that never reads the query (or the keys) passes."""
    plan = load_plan(write_plan(tmp_path / "pa.yaml", ROOT / "kernels" / "plans" / "paged_attention.yaml",
                                op={"args": {**_args("paged_attention"), "scale": 0.0}}))
    found = blind_spots(plan)
    query = next(line for line in found if "a kernel that ignores query passes" in line)
    assert query.startswith(f"{plan.path}:{plan.where('op.args.query')}: op.args.query: ")
    assert "check the values the plan fixes (scale=0.0)" in query
    assert any("op.args.key_cache: a kernel that ignores key_cache passes" in line for line in found)


def test_a_tolerance_too_loose_to_see_a_missing_row_is_named(tmp_path):
    loose = {d: {"atol": 5.0, "rtol": 0.5} for d in ("fp16", "bf16", "fp32")}  # rows of rms ~1: zeros pass
    plan = load_plan(write_plan(tmp_path / "loose.yaml", ROOT / "plan.yaml", tolerance=loose))
    found = blind_spots(plan)
    assert any("op.outputs: a kernel that leaves the last row of 'out' at zero passes this plan's comparison"
               in line for line in found), found
    assert any("a kernel that ignores weight passes" in line for line in found), found


def test_validate_refuses_a_plan_that_cannot_fail(tmp_path):
    path = write_plan(tmp_path / "pa.yaml", ROOT / "kernels" / "plans" / "paged_attention.yaml",
                      op={"args": {**_args("paged_attention"), "scale": 0.0}})
    done = subprocess.run([sys.executable, "-m", "harness", "validate", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: {path}: a plan that cannot fail is refused:" in done.stderr
    assert "op.args.query: a kernel that ignores query passes this plan" in done.stderr


def _args(name: str) -> dict:
    from tests.plans import read_plan
    return read_plan(ROOT / "kernels" / "plans" / f"{name}.yaml")["op"]["args"]


def test_prefill_benchmarks_sized_like_decode_are_refused(tmp_path):
    """A "prefill" of 2-32 tokens is decode-sized: it would be decided as a prefill regime."""
    from harness.plan.model import PlanError

    path = write_plan(tmp_path / "small_prefill.yaml", ROOT / "plan.yaml", benchmark={"prefill": [2, 8, 32]})
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert str(caught.value).startswith(f"{path}:")
    assert "benchmark.prefill[0]: expected a prefill batch of no fewer tokens than the largest decode batch timed " \
           "(256)" in str(caught.value)


def test_a_copied_op_name_is_refused_naming_both_plans(tmp_path):
    """Two plans of one op.name would write one page and one results folder: validate names both, and a run refuses
    a reports folder another plan's runs wrote."""
    from harness.results.store import Provenance, Results, write_atomic

    copy = tmp_path / "copy.yaml"
    copy.write_text((ROOT / "plan.yaml").read_text())
    done = subprocess.run([sys.executable, "-m", "harness", "validate", "plan.yaml", str(copy)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert f"error: {copy}:3: op.name: 'rms_norm' is already the op of plan.yaml" in done.stderr, done.stderr
    reports = tmp_path / "reports"
    other = Provenance("cpu", "cpu", "x86_64", 0, 2, date="2026-12-07T00:00:00Z", plan="kernels/plans/other.yaml")
    write_atomic(reports / "rms_norm" / "results" / "cpu.json", Results("rms_norm", {"run": other}))
    run = subprocess.run([sys.executable, "-m", "pytest", "--plan", "plan.yaml", "--reports-dir", str(reports),
                          "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "op.name: 'rms_norm' is already the op of kernels/plans/other.yaml" in run.stderr, run.stderr[-2000:]
