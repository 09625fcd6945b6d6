"""A failure says what it is: a quantized output whose every step off the reference went toward zero is named a
truncating cast; a cell whose kernel raised, crashed, faulted or hung before any output was compared reads so in the
failed-cells table, not as an error of 0."""

from __future__ import annotations

import re

import pytest
import torch

from harness.rendering import report
from harness.runtime.numerics import Mismatch, compare_quantized
from tests.plans import small_plan
from tests.test_report import cell, machine, section, stamp_current, write_results


def test_an_int8_quant_that_truncates_is_named_a_truncating_cast():
    x = (torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 20).clamp(-120, 120)
    rounded, truncated = x.round().to(torch.int8), x.trunc().to(torch.int8)
    with pytest.raises(Mismatch) as caught:
        compare_quantized("out", truncated, rounded, 0.01, None)
    moved = int((truncated != rounded).sum())
    assert f"all {moved:,} toward zero: a truncating cast?" in str(caught.value)


def test_a_quant_that_rounds_another_way_is_not_called_truncating():
    x = (torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 20).clamp(-120, 120)
    rounded, ceiled = x.round().to(torch.int8), x.ceil().to(torch.int8)
    with pytest.raises(Mismatch) as caught:
        compare_quantized("out", ceiled, rounded, 0.01, None)
    text = str(caught.value)
    assert "truncating" not in text and "toward zero," in text and "away from it" in text


@pytest.mark.parametrize("reason, word", [
    ("the kernel raised ValueError: bad block size (kernels/k.py:12)", "raised"),
    ("the worker process running this cell was killed by SIGSEGV (segmentation fault)", "crashed"),
    ("the kernel faulted on the device: CUDA error: misaligned address", "faulted"),
    ("no example finished within 300 s (numerics.timeout_s): the kernel did not return on num_tokens=7", "hung"),
])
def test_a_failure_no_comparison_measured_says_what_it_was(tmp_path, reason, word):
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    failed = cell("decode-bf16-tp1-eager-sm90", "failed", reason=reason,
                  error={"max_abs": 0.0, "max_rel": 0.0, "output": ""})
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run", machine("sm90", "h200"),
                  {"decode-bf16-tp1-eager-sm90": failed, "prefill-bf16-tp1-eager-sm90":
                   cell("prefill-bf16-tp1-eager-sm90", "passed")})
    stamp_current(plan, op_dir)
    text, _ = report.render(plan, op_dir)
    row = next(line for line in section(text, "Support matrix").splitlines()
               if line.startswith("| `decode-bf16-tp1-eager-sm90`"))
    assert re.search(rf"\| {word} +\| {word} +\|", row), row
