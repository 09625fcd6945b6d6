"""harness.interpreter.bounds: in Triton's interpreter, a load, store or atomic with an active lane outside every tensor
the launch was given raises OutOfBounds at the kernel's line, and is not performed; masked-off lanes are no access.
Through a cell, the reason names the access, the line, the program and the tensor."""

import inspect
import os

import numpy as np
import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("a machine with CUDA runs Triton kernels compiled, not in the interpreter", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1, set before triton's first import", allow_module_level=True)

import triton  # noqa: E402  (after the check: TRITON_INTERPRET must be set before this import)
import triton.language as tl  # noqa: E402

from harness.interpreter.bounds import OutOfBounds  # noqa: E402
from harness.interpreter.sites import chain  # noqa: E402
from harness.results.store import to_json  # noqa: E402
from harness.runtime.runner import RunSettings, run_cell  # noqa: E402
from harness.runtime.tasks import CellTask  # noqa: E402
from tests.broken import rms_norm_bugs  # noqa: E402
from tests.plans import rms_norm_plan  # noqa: E402

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

HERE = "tests/test_interpreter_bounds.py"
B = 256


@triton.jit
def _copy(x_ptr, y_ptr, n, LOAD_PAST: tl.constexpr, STORE_PAST: tl.constexpr, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    x = tl.load(x_ptr + offs, mask=offs < n + LOAD_PAST)  # load
    tl.store(y_ptr + offs, x, mask=offs < n + STORE_PAST)  # store


@triton.jit
def _add_row_bias(x_ptr, w_ptr, out_ptr, hidden, BEFORE: tl.constexpr, B: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, B)
    mask = cols < hidden
    x = tl.load(x_ptr + row * hidden + cols, mask=mask)
    w = tl.load(w_ptr + cols - BEFORE, mask=mask)  # bias
    tl.store(out_ptr + row * hidden + cols, x + w, mask=mask)


@triton.jit
def _pick(x_ptr, w_ptr, out_ptr, n, B: tl.constexpr):
    # One access whose lanes lie in two tensors: even lanes read x, odd ones w.
    i = tl.arange(0, B)
    ptrs = tl.where(i % 2 == 0, x_ptr + i // 2, w_ptr + i // 2)
    tl.store(out_ptr + i, tl.load(ptrs, mask=i < n), mask=i < n)


@triton.jit
def _count(counts_ptr, n, B: tl.constexpr):
    offs = tl.arange(0, B)
    tl.atomic_add(counts_ptr + offs, 1, mask=offs <= n)  # atomic


@triton.jit
def _gather_rows(table_ptr, out_ptr, B: tl.constexpr):
    # Each program reads a row through an address held in a table (vLLM's pointer tables do so).
    row = tl.load(table_ptr + tl.program_id(0)).to(tl.pointer_type(tl.float32))
    i = tl.arange(0, B)
    tl.store(out_ptr + tl.program_id(0) * B + i, tl.load(row + i))


def _line(kernel, marker: str) -> int:
    """The line of `kernel`'s source that holds `marker`."""
    lines, start = inspect.getsourcelines(kernel.fn)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def _out_of_bounds(call) -> OutOfBounds:
    with pytest.raises(Exception) as info:
        call()
    found = [e for e in chain(info.value) if isinstance(e, OutOfBounds)]
    assert found, f"{type(info.value).__name__}: {info.value}"
    return found[0]


def _grid(n: int) -> tuple:
    return (triton.cdiv(n + 1, B),)


def test_a_read_one_past_the_end_is_reported_at_its_line():
    x, y = torch.randn(4, 96), torch.zeros(4, 96)
    error = _out_of_bounds(lambda: _copy[_grid(384)](x, y, 384, LOAD_PAST=1, STORE_PAST=0, B=B))
    assert str(error).startswith(f"load at {HERE}:{_line(_copy, '# load')} in _copy (`x = tl.load(x_ptr + offs, "), \
        str(error)
    # Program 1 holds offsets 256..511: 129 lanes active under the off-by-one mask, offset 384 (lane 128) outside.
    assert ", program (1, 0, 0): 1 of 129 active lanes outside every tensor the kernel was given; the first, lane " \
           "128, is element 384 of `x_ptr` (shape [4, 96], float32, 384 elements), 1 past its end; not performed" \
           in str(error), str(error)


def test_the_same_kernel_with_a_right_mask_passes():
    # Lanes 384..511 of the last program lie past the end, masked off: no access.
    x, y = torch.randn(4, 96), torch.zeros(4, 96)
    _copy[_grid(384)](x, y, 384, LOAD_PAST=0, STORE_PAST=0, B=B)
    assert torch.equal(y, x)


def test_a_store_past_the_end_is_caught_and_the_tensor_beside_it_is_kept():
    # y and its neighbour are two tensors over one buffer, side by side: a store one past y's end would land in the
    # neighbour's first element.
    buffer = np.full(2 * 384, 7.0, dtype=np.float32)
    y, neighbour = torch.from_numpy(buffer[:384]), torch.from_numpy(buffer[384:])
    x = torch.randn(384)
    error = _out_of_bounds(lambda: _copy[_grid(384)](x, y, 384, LOAD_PAST=0, STORE_PAST=1, B=B))
    assert str(error).startswith(f"store at {HERE}:{_line(_copy, '# store')} in _copy"), str(error)
    assert "element 384 of `y_ptr` (shape [384], float32, 384 elements), 1 past its end" in str(error), str(error)
    assert bool((neighbour == 7.0).all()), "the store past y's end was performed"
    assert bool((y[256:] == 7.0).all()), "lanes of the reported store were performed"


def test_a_second_tensor_read_in_bounds_is_fine_and_one_before_its_start_is_not():
    x, w = torch.randn(3, 80), torch.randn(80)
    out = torch.empty(3, 80)
    _add_row_bias[(3,)](x, w, out, 80, BEFORE=0, B=128)
    assert torch.equal(out, x + w)
    error = _out_of_bounds(lambda: _add_row_bias[(3,)](x, w, out, 80, BEFORE=1, B=128))
    assert f"{HERE}:{_line(_add_row_bias, '# bias')}" in str(error), str(error)
    assert ", program (0, 0, 0): 1 of 80 active lanes" in str(error), str(error)
    assert "lane 0, is element -1 of `w_ptr` (shape [80], float32, 80 elements), 1 before its start" in str(error)


def test_lanes_of_one_access_in_two_tensors_are_judged_each_in_its_own():
    x, w = torch.arange(8.0), torch.arange(100.0, 108.0)
    out = torch.zeros(16)
    _pick[(1,)](x, w, out, 16, B=16)
    assert out.tolist() == [v for pair in zip(x.tolist(), w.tolist()) for v in pair]
    # 18 lanes: the last even lane reads x[8], the last odd one w[8], both one past their tensor's end.
    out = torch.zeros(18)
    error = _out_of_bounds(lambda: _pick[(1,)](x, w, out, 18, B=32))
    assert "2 of 18 active lanes" in str(error) and "lane 16, is element 8 of `x_ptr`" in str(error), str(error)


def test_an_atomic_past_the_end_is_reported():
    counts = torch.zeros(64, dtype=torch.int32)
    _count[(1,)](counts, 63, B=64)  # lanes 0..63 active: in bounds
    assert bool((counts == 1).all())
    error = _out_of_bounds(lambda: _count[(1,)](counts, 64, B=128))
    assert str(error).startswith(f"atomic read-modify-write at {HERE}:{_line(_count, '# atomic')}"), str(error)
    assert "element 64 of `counts_ptr` (shape [64], int32, 64 elements), 1 past its end" in str(error), str(error)
    assert bool((counts == 1).all()), "the reported atomic was performed"


def test_a_launch_that_makes_pointers_from_integers_is_not_failed_for_it():
    # The rows are no argument of the launch: only their addresses are. The launch after it is checked again.
    rows = [torch.randn(16), torch.randn(16)]
    table = torch.tensor([r.data_ptr() for r in rows], dtype=torch.int64)
    out = torch.empty(2, 16)
    _gather_rows[(2,)](table, out, B=16)
    assert torch.equal(out, torch.stack(rows))
    x, y = torch.randn(4, 96), torch.zeros(4, 96)
    _out_of_bounds(lambda: _copy[_grid(384)](x, y, 384, LOAD_PAST=1, STORE_PAST=0, B=B))


def test_an_off_by_one_mask_fails_its_cell_with_the_kernel_line_where_its_values_are_right(tmp_path):
    kernel = "tests.broken.rms_norm_bugs:weight_mask_off_by_one"
    plan = rms_norm_plan(tmp_path, kernel, matrix={"sm": ["cpu", "sm90"]})  # sm90: what a GPU would say is asked
    record = to_json(run_cell(CellTask.load(plan, "decode-fp32-tp1-eager-cpu", RunSettings(10, "ci", None))).record)
    assert record["status"] == "failed", record
    line = _line(rms_norm_bugs._weight_mask_off_by_one_kernel, "mask=cols <= hidden")
    reason = record["reason"]
    assert reason.startswith(f"the kernel raised OutOfBounds: load at tests/broken/rms_norm_bugs.py:{line} in "
                             "_weight_mask_off_by_one_kernel (`w = tl.load(w_ptr + cols, mask=cols <= hidden, "
                             "other=0.0).to(tl.float32)`), program ("), reason
    assert "active lanes outside every tensor the kernel was given; the first, lane " in reason, reason
    assert "of `w_ptr` (shape [" in reason and "1 past its end; not performed" in reason, reason
    # A GPU meets an out-of-bounds access running the kernel, not compiling it: no compile verdict is added.
    assert "interpreter only" not in reason and "a GPU fails alike" not in reason, reason
    assert record["minimal_example"].startswith("num_tokens="), record
