"""Known-bad kernels the harness must fail, each for the reason it is broken (and a correct one that passes).

Cells run in this process with the `ci` profile (derandomized), through the same run_cell the
plugin's workers use.
"""

from __future__ import annotations

import pytest
import torch

from harness.results.store import to_json
from harness.runtime.inputs import poisoned
from harness.runtime.numerics import Mismatch, compare
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from harness.plan.model import Tolerance
from tests.plans import cpu_machine_only, rms_norm_plan

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

BUGS = "tests.broken.rms_norm_bugs"
CI = RunSettings(examples=25, profile="ci", database=None)

# (kernel, cell, functional plan?, words the failure reason must contain)
WRONG_RESULTS = [
    # Past the end of x and weight: the interpreter reports the load; a GPU reads whatever lies there.
    ("no_load_mask", "decode-fp32-tp1-eager-cpu", False,
     "output 'out'" if torch.cuda.is_available() else "OutOfBounds: load at tests/broken/rms_norm_bugs.py:"),
    ("eps_dropped", "decode-fp32-tp1-eager-cpu", False, "output 'out'"),
    ("mean_over_block", "decode-fp32-tp1-eager-cpu", False, "max abs error"),
    ("fp16_square_sum", "decode-fp16-tp1-eager-cpu", False, "output 'out'"),
    # A CPU's arithmetic keeps the padding's NaN payload, so the reason names it; a GPU's yields its own NaN.
    ("row_stride_ignored", "decode-fp32-tp1-eager-cpu", False,
     "where the reference is finite" if torch.cuda.is_available() else "poisoned padding of a strided input"),
    ("tail_rows_dropped", "decode-fp32-tp1-eager-cpu", False, "were never written"),
    ("writes_input", "decode-fp32-tp1-eager-cpu", False, "input 'x' was modified"),
    ("wrong_out_dtype_functional", "decode-bf16-tp1-eager-cpu", True,
     "dtype torch.float32, reference torch.bfloat16"),
    ("cached_output", "decode-fp32-tp1-eager-cpu", True, "changed when the op was called again"),
    ("raises", "decode-fp32-tp1-eager-cpu", False, "the kernel raised ValueError: unsupported hidden size"),
    ("returns_nan", "decode-fp32-tp1-eager-cpu", False, "where the reference is finite, computed by the kernel"),
    ("zero_over_zero", "decode-bf16-tp1-eager-cpu", False, "where the reference is finite, computed by the kernel"),
    ("allocates_too_much", "decode-fp32-tp1-eager-cpu", False, "out of memory at num_tokens="),
    # torch.compile cells: the registration itself is checked before anything runs
    ("writes_input", "decode-fp32-tp1-torch_compile-cpu", False, "opcheck failed"),
]


def _run(tmp_path, kernel: str, cell_id: str, functional: bool, examples: int = 25, **plan_kw) -> dict:
    phase, dtype, _, mode, _ = cell_id.split("-")
    plan = rms_norm_plan(tmp_path, kernel, functional=functional,
                         matrix={"phase": [phase], "dtype": [dtype], "graph_mode": [mode]}, **plan_kw)
    return to_json(run_cell(CellTask.load(plan, cell_id, RunSettings(examples, "ci", None))).record)


@pytest.mark.parametrize("kernel, cell_id, functional, words", WRONG_RESULTS,
                         ids=[f"{k}-{c.split('-')[3]}" for k, c, _, _ in WRONG_RESULTS])
def test_broken_kernel_fails_for_its_reason(tmp_path, kernel, cell_id, functional, words):
    outcome = _run(tmp_path, f"{BUGS}:{kernel}", cell_id, functional)
    assert outcome["status"] == "failed", outcome
    assert words in outcome["reason"], outcome["reason"]
    assert outcome["minimal_example"].startswith("num_tokens="), outcome


def test_a_returned_result_the_tie_break_accepted_is_not_taken_for_a_reused_buffer(tmp_path):
    # A kernel more exact than the reference, under a tolerance below one step: the elements one step off pass on
    # the fp64 tie-break; calling it again on other inputs leaves its first result as it was: nothing "changed".
    outcome = _run(tmp_path, f"{BUGS}:rounded_from_fp64", "decode-fp16-tp1-eager-cpu", True,
                   tolerance={"fp16": {"atol": 0, "rtol": 3.0e-4}})
    assert outcome["status"] == "passed", outcome["reason"]
    assert outcome["error"]["max_abs"] > 0  # it does differ from the reference


@pytest.mark.parametrize("fake", ["fake_wrong_dtype", "fake_wrong_shape"])
def test_wrong_fake_implementation_fails_opcheck(tmp_path, fake):
    outcome = _run(tmp_path, f"{BUGS}:functional", "decode-bf16-tp1-torch_compile-cpu", True, examples=5)
    assert outcome["status"] == "passed", outcome  # the same kernel with a derived fake is fine
    plan = rms_norm_plan(tmp_path, f"{BUGS}:functional", functional=True, op={"fake": f"{BUGS}:{fake}"},
                         matrix={"dtype": ["bf16"], "graph_mode": ["torch_compile"]})
    outcome = to_json(run_cell(CellTask.load(plan, "decode-bf16-tp1-torch_compile-cpu", CI)).record)
    assert outcome["status"] == "failed" and "opcheck failed" in outcome["reason"], outcome


@pytest.mark.parametrize("cell_id", ["decode-fp32-tp1-eager-cpu", "chunked_prefill-bf16-tp1-eager-cpu",
                                     "prefill-fp16-tp1-torch_compile-cpu"])
def test_correct_kernel_passes(tmp_path, cell_id):
    # Batches of at most 512 tokens: the interpreter runs one program per row, and the default 8192 made the
    # chunked-prefill cell take 49 s on a 2-core machine; the kernel's rows do not depend on how many there are.
    outcome = _run(tmp_path, f"{BUGS}:correct", cell_id, False, examples=10,
                   numerics={"max_num_batched_tokens": 512, "prefill_tokens": [128, 512]})
    assert outcome["status"] == "passed", outcome["reason"]
    assert outcome["examples"] >= 5
    assert outcome["error"]["max_abs"] <= outcome["tolerance"]["atol"] + 1.0  # recorded, finite
    if "torch_compile" in cell_id:
        facts = outcome["facts"]
        assert facts["opcheck"] == "passed"
        assert 1 <= facts["compiles"] <= facts["shapes"], facts  # never a recompile per token count


def test_functional_correct_kernel_passes_both_modes(tmp_path):
    for cell_id in ("decode-bf16-tp1-eager-cpu", "decode-bf16-tp1-torch_compile-cpu"):
        assert _run(tmp_path, f"{BUGS}:functional", cell_id, True, examples=10)["status"] == "passed"


@cpu_machine_only
@pytest.mark.parametrize("mode", ["eager", "torch_compile"])
def test_a_construct_the_interpreter_cannot_compute_is_inconclusive_on_a_cpu_machine_not_failed(tmp_path, mode):
    outcome = _run(tmp_path, f"{BUGS}:rsqrt_in_ptx", f"decode-fp32-tp1-{mode}-cpu", False, examples=5)
    assert outcome["status"] == "not_run", outcome
    assert outcome["reason"].startswith("inconclusive on a CPU machine: tl.inline_asm_elementwise"), outcome["reason"]
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_an_element_never_written_and_a_computed_nan_are_told_apart(dtype):
    expected = torch.ones(4, 8, dtype=getattr(torch, dtype))
    out = poisoned((4, 8), expected.dtype, "cpu")
    out[:3] = 1.0
    out[0, 5] = float("nan")  # what a kernel computing 0 / 0 writes
    with pytest.raises(Mismatch) as failure:
        compare("out", out, expected, Tolerance(1e-3, 1e-3), None)
    reason = str(failure.value)
    assert "8 of 32 elements were never written" in reason and "first at index (3, 0)" in reason, reason
    assert "1 of 32 elements are NaN/Inf where the reference is finite, computed by the kernel, first at index (0, 5)" \
        in reason, reason
