"""The calibration corpus (tests/calibration): its plans validate, its mutants are what they say, and its table says
"FALSE FAILURE" / "MISSED" when a check gets a kernel wrong (the H200's table: docs/calibration.md)."""

from __future__ import annotations

import json

import pytest

from harness.results.store import Status
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from harness.plan.load import load_plan
from tests.calibration import __main__ as corpus
from tests.plans import rms_norm_plan

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")


def test_every_entry_is_a_valid_plan_of_its_base_op_with_its_kernel():
    paths = corpus.write_plans(corpus.CORPUS)
    families = {e.family for e in corpus.CORPUS}
    assert families == {"row reduction", "element-wise", "GEMM", "attention", "vLLM hazards"}
    for e in corpus.CORPUS:
        plan = load_plan(paths[e.label])
        assert tuple(plan.matrix["tp"]) == (1,) and set(plan.matrix["sm"]) <= {"cpu", "sm90"}, e
        assert plan.op.kernel == (e.kernel or load_plan(corpus.ROOT / e.plan).op.kernel)
    # several authors, and broken kernels in every family
    assert {e.author for e in corpus.CORPUS} >= {"bundled", "variant", "Liger-Kernel", "flash-linear-attention",
                                                 "vLLM (compiled)", "broken"}
    assert {e.family for e in corpus.CORPUS if e.broken} == families


def test_a_mutant_with_an_edit_that_no_longer_applies_is_refused():
    from tests.calibration.mutants import mutant

    with pytest.raises(ValueError, match="is not in the source"):
        mutant("kernels.rms_norm", "never_built", ("a line the kernel does not have", "x"))


def test_a_correct_mutant_passes_on_a_cpu_machine(tmp_path):
    path = rms_norm_plan(tmp_path, "tests.calibration.kernels:rms_norm_two_pass", op={"reduction": "row_scale"},
                         matrix={"phase": ["prefill"], "dtype": ["bf16"]}, hidden=[1024],
                         numerics={"examples": 3, "prefill_tokens": [64, 128]})
    rec = run_cell(CellTask.load(path, "prefill-bf16-tp1-eager-cpu", RunSettings(3, "ci", None))).record
    assert rec.status == Status.PASSED, rec
    assert rec.readings["row_shift"] <= 4, rec


def _results(tmp_path, label: str, cells: list[dict]):
    folder = tmp_path / f"cal_{label}" / "results"
    folder.mkdir(parents=True)
    cells = {f"prefill-bf16-tp{i + 1}-eager-sm90": c for i, c in enumerate(cells)}  # distinct cell ids
    (folder / "sm90-nvidia-h200.json").write_text(json.dumps({"cells": cells}))


def _cell(status, reason="", **readings):
    return {"status": status, "reason": reason, "sm": "sm90", "facts": {}, "readings": readings or None}


@pytest.mark.parametrize("label, cells, holds, words", [
    ("rms_norm", [_cell("passed", element=1.0)], True, "passes (1 cells)"),
    ("rms_norm", [_cell("passed"), _cell("failed", "output 'out': accumulation: ...")], False, "FALSE FAILURE"),
    ("rms_norm_bf16_accumulator", [_cell("passed", row_shift=2.0)], False, "MISSED"),
    ("rms_norm_bf16_accumulator", [_cell("failed", "the kernel raised ValueError")], False, "ANOTHER REASON"),
    ("rms_norm_bf16_accumulator", [_cell("failed", "output 'out': accumulation: the kernel shifts", row_shift=90.0)],
     True, "fails: output 'out': accumulation"),
])
def test_the_table_says_when_a_check_gets_a_kernel_wrong(tmp_path, label, cells, holds, words):
    entry = next(e for e in corpus.CORPUS if e.label == label)
    _results(tmp_path, label, cells)
    rows, ok = corpus.rows_of(entry, corpus.cells_ran(tmp_path, entry), "row_scale")
    assert ok is holds and words in rows[0][-1], rows
    if any(c["readings"] for c in cells):
        assert rows[1][3].startswith("accumulation:") and rows[1][5] == "4 / 4", rows
