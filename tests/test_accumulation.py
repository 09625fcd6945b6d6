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
        accumulation.Readings("row_scale").check("out", out, expected, truth)
    readings = accumulation.Readings("row_scale")
    readings.check("out", *_outputs(fp32_accumulator, hidden=hidden, seed=seed))
    assert readings.verdict().startswith("fp32: consistent"), readings


def test_what_a_correct_kernel_of_another_kind_may_show_is_inconclusive_not_failed():
    """Between the limit and what correct kernels of the op's kind reach, the cell is decided on values; past the
    decisive limit it fails. An op that does not say its kind fails only past what no correct kernel showed."""
    out, expected, truth = _outputs(bf16_accumulator, hidden=4096)
    shift = accumulation.statistics(out, expected, truth)["row_shift"]
    assert shift > accumulation.LIMITS["row_scale"]["row_shift"].decisive
    for kind in ("weighted_sum", "dot", "unknown"):
        readings = accumulation.Readings(kind)
        if shift > accumulation.LIMITS[kind]["row_shift"].decisive or \
                accumulation.statistics(out, expected, truth)["element"] > \
                accumulation.LIMITS[kind]["element"].decisive:
            continue
        readings.check("out", out, expected, truth)
        assert readings.verdict().startswith("inconclusive for this op (row shift"), readings.verdict()
        assert readings.values["row_shift"] == pytest.approx(shift, abs=1e-3)


def test_too_few_rows_or_elements_are_left_to_the_tolerance():
    readings = accumulation.Readings("row_scale")
    readings.check("out", *_outputs(bf16_accumulator, rows=accumulation.MIN_ROWS - 1))  # too few rows: no row shift
    assert "row_shift" not in readings.values
    readings = accumulation.Readings("row_scale")
    readings.check("out", *_outputs(bf16_accumulator, hidden=accumulation.MIN_ROW_ELEMENTS - 1))
    assert readings.verdict() is None


@pytest.mark.usefixtures("faithful_interpreter")  # runs kernels in this process, as a worker does
def test_a_cell_of_a_bf16_accumulator_fails_with_the_accumulation_reason(tmp_path):
    def run(kernel, accumulation=None):
        path = rms_norm_plan(tmp_path, f"tests.broken.rms_norm_bugs:{kernel}",
                             op={"reduction": "row_scale", "accumulation": accumulation},
                             matrix={"phase": ["prefill"], "dtype": ["bf16"]}, hidden=[1024],
                             numerics={"examples": 3, "prefill_tokens": [64, 128]},
                             name=f"{kernel}{bool(accumulation)}.yaml")
        return run_cell(CellTask.load(path, "prefill-bf16-tp1-eager-cpu",
                                      RunSettings(examples=3, profile="ci", database=None))).record

    rec = run("bf16_accumulator")
    assert rec.status == Status.FAILED and "accumulation:" in rec.reason, rec
    rec = run("fp32_accumulator")
    assert rec.status == Status.PASSED and rec.facts["accumulation"].startswith("fp32: consistent"), rec
    assert rec.readings["row_shift"] <= accumulation.LIMITS["row_scale"]["row_shift"].limit, rec
    assert run("correct").status == Status.PASSED  # the bundled Triton kernel, in the faithful interpreter
    assert run("bf16_accumulator", accumulation="input").status == Status.PASSED  # declared: not checked


@pytest.mark.usefixtures("faithful_interpreter")  # runs kernels in this process, as a worker does
def test_on_a_cpu_machine_a_dot_product_op_records_that_its_accumulation_was_not_checked(tmp_path):
    """The interpreter's capped sizes reduce over tens of elements: a GEMM's 16-bit accumulator cannot show, and the
    cell says so instead of passing as if it had been checked."""
    path = rms_norm_plan(tmp_path, "tests.broken.rms_norm_bugs:bf16_accumulator", op={"reduction": "dot"},
                         matrix={"phase": ["prefill"], "dtype": ["bf16"]}, hidden=[1024],
                         numerics={"examples": 2, "prefill_tokens": [64, 64]})
    rec = run_cell(CellTask.load(path, "prefill-bf16-tp1-eager-cpu",
                                 RunSettings(examples=2, profile="ci", database=None))).record
    assert rec.status == Status.PASSED and rec.facts["accumulation"] == accumulation.NOT_ON_CPU, rec
    assert rec.readings is None
