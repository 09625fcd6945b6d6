"""A value failure says what it is: a correct kernel that rounds where vLLM's native path does, failing against a
reference that rounds once, is named a rounding-order difference (from fp64, and from op.native where the plan
names it); a kernel 2% off is not; and no ULP figure is given where the reference is 0."""

from __future__ import annotations

import re

import pytest
import torch

from harness.results.store import to_json
from harness.runtime.numerics import Mismatch, compare
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from harness.plan.model import Tolerance
from tests.plans import cpu_machine_only, rms_norm_args, rms_norm_plan

HERE = "tests.test_diagnosis"
ROUNDING = "rounding-order difference, not a wrong result"
# A tolerance under one bf16 ULP (2^-8 to 2^-7 relative): the two roundings differ on about a fifth of elements.
TIGHT = {"bf16": {"atol": 1.0e-4, "rtol": 1.0e-3}}


def rms_norm_rounds_once(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The user's reference: the weight product in fp32, one rounding to the activation dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rms_norm_rounds_twice(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's RMSNorm.forward_native: x * rsqrt(var + eps) cast to the activation dtype, then times the weight in
    that dtype (two roundings)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype) * weight


def correct_kernel(out, x, weight, eps):
    out.copy_(rms_norm_rounds_twice(x, weight, eps))


def two_percent_off(out, x, weight, eps):
    out.copy_(rms_norm_rounds_twice(x, weight, eps).float() * 1.02)


def off_where_zero(out, x, weight, eps):
    """A tiny absolute error on an output whose reference is 0 everywhere (x is all zeros)."""
    out.copy_(rms_norm_rounds_once(x, weight, eps) + 1e-4)


def _failure(tmp_path, kernel: str, cell_id: str = "decode-bf16-tp1-eager-cpu", **plan_kw) -> str:
    dtype = cell_id.split("-")[1]
    op = {"reference": f"{HERE}:rms_norm_rounds_once", **plan_kw.pop("op", {})}
    plan = rms_norm_plan(tmp_path, f"{HERE}:{kernel}", op=op, matrix={"dtype": [dtype]}, **plan_kw)
    rec = to_json(run_cell(CellTask.load(plan, cell_id, RunSettings(10, "ci", None))).record)
    assert rec["status"] == "failed", rec
    return rec["reason"]


@cpu_machine_only
def test_a_kernel_rounding_like_vllms_native_path_is_named_a_rounding_order_difference(tmp_path):
    reason = _failure(tmp_path, "correct_kernel", tolerance=TIGHT)
    assert ROUNDING in reason, reason
    # from fp64 alone: no op.native to compare with
    assert "within 4x the reference's own rounding" in reason and "bit-identical" not in reason, reason
    assert "`atol_of: max`" in reason and "`tolerance`" in reason, reason
    assert reason.index(ROUNDING) < reason.index("Mismatched elements"), reason  # before torch's lines: kept when cut


@cpu_machine_only
def test_with_op_native_the_failure_says_the_kernel_rounds_like_it(tmp_path):
    reason = _failure(tmp_path, "correct_kernel", tolerance=TIGHT,
                      op={"native": f"{HERE}:rms_norm_rounds_twice"})
    assert ROUNDING in reason, reason
    assert re.search(r"the kernel rounds like vLLM's native path \(op\.native; bit-identical on 100% of elements, "
                     r"the reference on \d+%\)", reason), reason


@cpu_machine_only
@pytest.mark.parametrize("native", [None, f"{HERE}:rms_norm_rounds_twice"], ids=["fp64", "op.native"])
def test_a_kernel_two_percent_off_is_not_called_rounding(tmp_path, native):
    reason = _failure(tmp_path, "two_percent_off", tolerance=TIGHT, op={"native": native} if native else {})
    assert "rounding-order" not in reason and "more than a rounding difference" in reason, reason
    assert re.search(r"worst at index \(\d+, \d+\): kernel [-\d.e]+, reference [-\d.e]+, fp64", reason), reason


@cpu_machine_only
def test_no_ulp_figure_where_the_reference_is_zero(tmp_path):
    args = rms_norm_args()
    args["x"] = {**args["x"], "init": "zeros"}
    reason = _failure(tmp_path, "off_where_zero", "decode-fp32-tp1-eager-cpu", op={"args": args})
    # 1e-4 against an fp32 0 is 953,267,991 ULP: a count of binades, not an error
    assert not re.search(r"\d ULP", reason), reason
    assert "0.0001 off where the reference is 0" in reason and "no ULP distance" in reason, reason


def test_ulps_are_counted_only_where_the_reference_is_not_near_zero():
    expected = torch.tensor([[0.0, 1.0, 2.0, 0.0], [3.0, 0.0, 0.0, 1.5]])
    actual = torch.where(expected == 0, torch.tensor(1e-4), expected)
    actual[0, 1] = torch.nextafter(actual[0, 1], torch.tensor(2.0))  # one ULP off where the reference is 1
    with pytest.raises(Mismatch) as caught:
        compare("out", actual, expected, Tolerance(1e-5, 1.3e-6), None, exact64=expected.double())
    text = str(caught.value)
    assert ", 1 ULP where the reference is not near 0 (0.0001 off where the reference is 0" in text, text
    assert max(int(n) for n in re.findall(r"(\d+) ULP", text)) == 1, text
    assert caught.value.stats.max_ulp > 10**8  # the recorded measurement is the one measured, as before


def test_a_reference_further_from_fp64_than_the_kernel_is_named_as_the_one_off():
    """A reference computing in bf16 throughout (no fp32 upcast) against a kernel that rounds once from fp32."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 256, generator=gen).bfloat16()
    exact = x.double().cumsum(dim=-1)
    kernel = x.float().cumsum(dim=-1).bfloat16()
    reference = x.clone()
    for i in range(1, x.shape[1]):  # partial sums rounded to bf16 at every step
        reference[:, i] = reference[:, i - 1] + x[:, i]
    with pytest.raises(Mismatch) as caught:
        compare("out", kernel, reference, Tolerance(1e-4, 1e-3), None, exact64=exact)
    text = str(caught.value)
    assert "the reference, not the kernel, is off" in text and ROUNDING not in text, text
