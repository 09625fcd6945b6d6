"""A kernel that raises says where and what: at the line of its own Triton source (not the interpreter's frame
that wraps every error), whether a GPU's compiler rejects the same launch too (compiled for the plan's SMs on this
CPU machine), and, in a torch_compile cell, that the kernel raised as in eager rather than that opcheck failed.

Cells run in this process with the `ci` profile, through the same run_cell the plugin's workers use; the plans
name sm90 beside the CPU cell run, as the GPU their compile is checked for."""

from __future__ import annotations

import pytest

from harness.results.store import to_json
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from tests.plans import cpu_machine_only, rms_norm_plan

KERNELS = "tests.broken.crash_kernels"
FILE = "tests/broken/crash_kernels.py"

# Every test here runs a kernel in Triton's interpreter, in this process: made faithful, as the workers run them.
pytestmark = [cpu_machine_only, pytest.mark.usefixtures("faithful_interpreter")]


def _line(text: str) -> int:
    """The line of tests/broken/crash_kernels.py that holds `text` (the reason must name it)."""
    with open(FILE) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def _run(tmp_path, kernel: str, cell_id: str, sms=("cpu", "sm90")) -> dict:
    """`kernel`: a function of tests/broken/crash_kernels.py, or any kernel as module:function."""
    phase, dtype, _, mode, _ = cell_id.split("-")
    plan = rms_norm_plan(tmp_path, kernel if ":" in kernel else f"{KERNELS}:{kernel}",
                         matrix={"phase": [phase], "dtype": [dtype], "graph_mode": [mode], "sm": list(sms)})
    return to_json(run_cell(CellTask.load(plan, cell_id, RunSettings(5, "ci", None))).record)


def test_a_type_error_in_the_kernel_is_reported_at_the_kernels_line_and_a_gpu_fails_alike(tmp_path):
    rec = _run(tmp_path, "shape_not_a_tuple", "decode-fp32-tp1-eager-cpu")
    assert rec["status"] == "failed", rec
    line = _line("acc = tl.zeros(BLOCK, dtype=tl.float32)")
    assert rec["reason"] == (
        f"the kernel raised at {FILE}:{line} in _shape_not_a_tuple_kernel: `acc = tl.zeros(BLOCK, dtype=tl.float32)`: "
        "TypeError: 'int' object is not iterable; "
        "a GPU fails alike (compiling for sm_90 fails: TypeError: 'int' object is not iterable)"), rec["reason"]
    assert "interpreter.py" not in rec["reason"]
    assert rec["minimal_example"].startswith("num_tokens=1 "), rec


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_libdevice_tanh_on_16_bit_values_is_named_and_fails_alike_on_a_gpu(tmp_path, dtype):
    rec = _run(tmp_path, "tanh_16bit", f"decode-{dtype}-tp1-eager-cpu", sms=("cpu", "sm80", "sm90"))
    assert rec["status"] == "failed", rec
    no_variant = f"libdevice's tanh has no variant for {dtype} (it takes fp32 or fp64)"
    assert rec["reason"] == (
        f"the kernel raised at {FILE}:{_line('libdevice.tanh(raw)')} in _tanh_16bit_kernel: "
        f"`x = libdevice.tanh(raw).to(tl.float32)`: {no_variant}; "
        f"a GPU fails alike (compiling for sm_80 and sm_90 fails: {no_variant})"), rec["reason"]


def test_a_crash_only_the_interpreter_has_is_said_to_be_inconclusive(tmp_path):
    rec = _run(tmp_path, "asks_num_warps", "decode-fp32-tp1-eager-cpu", sms=("cpu", "sm80", "sm90"))
    assert rec["status"] == "failed", rec
    assert rec["reason"].startswith(f"the kernel raised at {FILE}:{_line('cuda.num_warps()')} in "
                                    "_asks_num_warps_kernel: `tl.static_assert(cuda.num_warps() <= 16)`: "
                                    "AttributeError: "), rec["reason"]
    assert rec["reason"].endswith("; interpreter only: inconclusive (the kernel compiles for sm_80 and sm_90)"), \
        rec["reason"]


def test_a_plan_with_no_gpu_says_nothing_of_compiling(tmp_path):
    rec = _run(tmp_path, "tanh_16bit", "decode-bf16-tp1-eager-cpu", sms=("cpu",))
    assert rec["status"] == "failed", rec
    assert rec["reason"].endswith("libdevice's tanh has no variant for bf16 (it takes fp32 or fp64)"), rec["reason"]


def test_a_compile_that_cannot_be_tried_says_nothing(tmp_path):
    # A kernel's module that imports only where the interpreter runs: the child compiling it for a GPU cannot
    # import it, and the reason says nothing of a GPU rather than guess.
    source = open(FILE).read()
    (tmp_path / "interpreted_only.py").write_text(
        "import os\n\nif os.environ.get('TRITON_INTERPRET') != '1':\n    raise ImportError('interpreter only')\n"
        + source[source.index("import triton"):])
    rec = _run(tmp_path, "interpreted_only:shape_not_a_tuple", "decode-fp32-tp1-eager-cpu")
    assert rec["status"] == "failed", rec
    assert rec["reason"].startswith("the kernel raised at ") and "interpreted_only.py:" in rec["reason"], rec["reason"]
    assert rec["reason"].endswith("TypeError: 'int' object is not iterable"), rec["reason"]


def test_a_torch_compile_cell_whose_kernel_raises_says_so_as_in_eager(tmp_path):
    rec = _run(tmp_path, "shape_not_a_tuple", "decode-fp32-tp1-torch_compile-cpu")
    assert rec["status"] == "failed", rec
    assert "opcheck" not in rec["reason"] and "scroll up" not in rec["reason"], rec["reason"]
    assert rec["reason"].startswith(
        f"the kernel raised at {FILE}:{_line('acc = tl.zeros(BLOCK')} in _shape_not_a_tuple_kernel: "
        "`acc = tl.zeros(BLOCK, dtype=tl.float32)`: TypeError: 'int' object is not iterable (as in eager); "
        "a GPU fails alike"), rec["reason"]


def test_a_torch_compile_cell_whose_launcher_raises_says_so_as_in_eager(tmp_path):
    rec = _run(tmp_path, "tests.broken.rms_norm_bugs:raises", "decode-fp32-tp1-torch_compile-cpu")
    assert rec["status"] == "failed", rec
    assert rec["reason"].startswith("the kernel raised ValueError: unsupported hidden size "), rec["reason"]
    assert rec["reason"].endswith("(tests/broken/rms_norm_bugs.py:231) (as in eager)"), rec["reason"]
