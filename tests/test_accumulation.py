"""`op.accumulation: fp32` is checked (harness.runtime.accumulation): a kernel accumulating in bf16 inside the bf16
tolerance fails with that reason; correct kernels whose rounding differs from the reference's pass."""

from __future__ import annotations

import pytest
import torch

from harness.results.store import Status
from harness.runtime import accumulation
from harness.runtime.numerics import Mismatch
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from kernels.rms_norm import rms_norm_ref
from tests.broken.rms_norm_bugs import bf16_accumulator, fp32_accumulator
from tests.plans import rms_norm_plan


def _outputs(kernel, rows=64, hidden=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16)
    out = torch.empty_like(x)
    kernel(out, x, w, 1e-6)
    truth = rms_norm_ref(x.double(), w.double(), 1e-6)
    return out, rms_norm_ref(x, w, 1e-6), truth


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("hidden", [256, 1000, 4096])
def test_bf16_accumulator_fails_inside_the_tolerance_and_fp32_passes(seed, hidden):
    out, expected, truth = _outputs(bf16_accumulator, hidden=hidden, seed=seed)
    torch.testing.assert_close(out, expected, atol=1e-3 * 40, rtol=1.6e-2)  # within bf16's tolerance (x atol_of)
    with pytest.raises(Mismatch, match=r"accumulation: the kernel shifts whole rows .* fp32-accumulating reference"):
        accumulation.check("out", out, expected, truth)
    accumulation.check("out", *_outputs(fp32_accumulator, hidden=hidden, seed=seed))


def test_too_few_rows_or_elements_are_left_to_the_tolerance():
    accumulation.check("out", *_outputs(bf16_accumulator, rows=accumulation.MIN_ROWS - 1))  # too few rows
    accumulation.check("out", *_outputs(bf16_accumulator, hidden=accumulation.MIN_ROW_ELEMENTS - 1))


def test_a_cell_of_a_bf16_accumulator_fails_with_the_accumulation_reason(tmp_path):
    def run(kernel, accumulation_line=""):
        path = rms_norm_plan(tmp_path, f"tests.broken.rms_norm_bugs:{kernel}", phase="[prefill]", dtype="[bf16]",
                             hidden="[1024]", numerics="{examples: 3, prefill_tokens: [64, 128]}",
                             name=f"{kernel}{bool(accumulation_line)}.yaml")
        if accumulation_line:
            path.write_text(path.read_text().replace("  sizes:", f"  {accumulation_line}\n  sizes:"))
        return run_cell(CellTask.load(path, "prefill-bf16-tp1-eager-cpu",
                                      RunSettings(examples=3, profile="ci", database=None))).record

    rec = run("bf16_accumulator")
    assert rec.status == Status.FAILED and "accumulation:" in rec.reason, rec
    assert run("fp32_accumulator").status == Status.PASSED
    assert run("correct").status == Status.PASSED  # the bundled Triton kernel, in the faithful interpreter
    assert run("bf16_accumulator", "accumulation: input").status == Status.PASSED  # declared: not checked
