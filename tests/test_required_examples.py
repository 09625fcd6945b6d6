"""Examples a cell checks whatever hypothesis draws (harness.runtime.required_examples): one past each of the
kernel's declared size-selected paths (`op.paths`), and on a GPU one at int32-overflow sizes."""

from __future__ import annotations

import pytest

from harness.results.store import Status
from harness.runtime.required_examples import INT32_ELEMENTS, int32_example, path_example, required_examples
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from harness.plan.load import load_plan
from harness.cells.matrix import Cell
from harness.plan.model import PlanError
from tests.broken.rms_norm_bugs import SHORT_LOOP_TWO_PASS_BYTES
from tests.plans import rms_norm_plan

TWO_PASS = "num_tokens * hidden * act_bytes >= 192 * 2**20"  # kernels/rms_norm.py's TWO_PASS_BYTES


def _plan(tmp_path, paths: dict | None = None):
    return load_plan(rms_norm_plan(
        tmp_path, matrix={"phase": ["decode", "prefill"], "dtype": ["bf16", "fp32"], "sm": ["cpu", "sm90"]},
        hidden=[2048, 4096, 5120, 8192], op={"paths": paths}, benchmark={"prefill": [32768], "decode": [256]}))


def test_the_cheapest_example_past_a_path_and_where_none_is_reachable(tmp_path):
    plan = _plan(tmp_path, {"two_pass": TWO_PASS})
    ex = path_example(plan, Cell.from_id("prefill-bf16-tp1-eager-sm90"), "cuda", TWO_PASS)
    # 192 MiB of bf16: 2**26 * 1.5 elements; the fewest tokens at that many elements (4096 x 24576 or 8192 x 12288)
    assert ex.num_tokens * ex.sizes["hidden"] == 3 * 2**25, ex
    assert ex.num_tokens > plan.numerics.max_num_batched_tokens  # reached through the benchmark's 32768 tokens
    fp32 = path_example(plan, Cell.from_id("prefill-fp32-tp1-eager-sm90"), "cuda", TWO_PASS)
    assert fp32.num_tokens * fp32.sizes["hidden"] * 4 == 192 * 2**20
    decode = path_example(plan, Cell.from_id("decode-bf16-tp1-eager-sm90"), "cuda", TWO_PASS)
    assert isinstance(decode, str) and "256 tokens of decode" in decode
    on_cpu = path_example(plan, Cell.from_id("prefill-bf16-tp1-eager-cpu"), "cpu", TWO_PASS)
    assert "on a CPU machine" in on_cpu


@pytest.mark.parametrize("expr, tokens", [("num_tokens <= 2", 1), ("num_tokens == 64", 64), ("num_tokens != 1", 2),
                                          ("not num_tokens < 100", 100)])
def test_a_path_of_any_comparison_gets_its_cheapest_example(tmp_path, expr, tokens):
    plan = _plan(tmp_path, {"p": expr})
    ex = path_example(plan, Cell.from_id("decode-bf16-tp1-eager-sm90"), "cuda", expr)
    assert not isinstance(ex, str) and ex.num_tokens == tokens, ex


def test_int32_overflow_example_only_where_a_gpu_runs_it(tmp_path):
    path = rms_norm_plan(tmp_path, matrix={"phase": ["prefill"]}, numerics={"examples": 2, "int32_overflow": True})
    plan = load_plan(path)
    assert "CPU machine" in int32_example(plan, Cell.from_id("prefill-fp32-tp1-eager-cpu"), "cpu")
    assert "eager prefill" in int32_example(plan, Cell.from_id("prefill-fp32-tp1-cuda_graph-sm90"), "cuda")
    _, facts = required_examples(plan, Cell.from_id("prefill-fp32-tp1-eager-cpu"), "cpu")
    assert "int32 overflow" in facts
    assert INT32_ELEMENTS == 2**31


@pytest.mark.parametrize("expr, words", [("num_tokens * hidden", "not a comparison"),
                                         ("num_tokens * width > 1", "unknown name 'width'"),
                                         ("num_tokens >", "not an arithmetic expression")])
def test_a_path_that_is_no_condition_is_a_plan_error(tmp_path, expr, words):
    with pytest.raises(PlanError, match=words) as err:
        _plan(tmp_path, {"two_pass": expr})
    assert "op.paths.two_pass" in str(err.value) and ":" in str(err.value).split("op.paths")[0]


@pytest.mark.usefixtures("faithful_interpreter")  # runs kernels in this process, as a worker does
def test_a_bug_in_a_declared_path_fails_where_random_draws_miss_it(tmp_path):
    # Prefill of at most 16 tokens of 128 fp32 elements: 8 KiB, never the bug's 64 KiB. The plan times 600 tokens,
    # so its cells check an example past the declared path (128 tokens), within a CPU machine's budget.
    def plan_file(paths: dict | None):
        return rms_norm_plan(tmp_path, "tests.broken.rms_norm_bugs:two_pass_short_loop", hidden=[128],
                             name=f"plan{len(paths or ())}.yaml", op={"paths": paths}, matrix={"phase": ["prefill"]},
                             numerics={"examples": 3, "prefill_tokens": [1, 16], "max_num_batched_tokens": 16},
                             benchmark={"prefill": [600]})

    def run(path):
        return run_cell(CellTask.load(path, "prefill-fp32-tp1-eager-cpu", RunSettings(examples=3, profile="ci",
                                                                                    database=None))).record
    assert run(plan_file(None)).status == Status.PASSED  # the draws never reach the path
    rec = run(plan_file({"two_pass": f"num_tokens * hidden * act_bytes >= {SHORT_LOOP_TWO_PASS_BYTES}"}))
    assert rec.status == Status.FAILED, rec
    assert rec.minimal_example.startswith("num_tokens=128 hidden=128"), rec.minimal_example
    assert rec.facts["path two_pass"].startswith("num_tokens=128 hidden=128"), rec.facts


@pytest.mark.usefixtures("faithful_interpreter")  # runs kernels in this process, as a worker does
def test_an_output_larger_than_a_chunk_is_compared_slice_by_slice_to_its_last_row(tmp_path, monkeypatch):
    import torch

    from harness.runtime import runner
    from harness.runtime.numerics import Mismatch

    monkeypatch.setattr(runner, "CHUNK_ELEMENTS", 64)  # as an int32-overflow example is, at a CPU's size
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"dtype": ["fp32"]}))
    check = runner.CellCheck(plan, Cell.from_id("decode-fp32-tp1-eager-cpu"), "cpu")
    expected = torch.randn(40, 16)
    check.compare("out", expected.clone(), expected, {}, False)
    wrong = expected.clone()
    wrong[-1, -1] += 1.0
    with pytest.raises(Mismatch, match="output 'out'"):
        check.compare("out", wrong, expected, {}, False)
