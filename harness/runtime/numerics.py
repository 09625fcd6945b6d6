"""Comparing one output with the reference: metadata first, then values, with the statistics the report shows.

torch.testing.assert_close does the value check with the tolerance; this module adds what it
does not: poison left in the output, NaN/Inf where the reference is finite, ULP distance, and an
fp64 tie-break for borderline failures (whoever is closer to the exact result wins).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.spec.dtypes import CELL_OF_TORCH, DTYPE
from harness.runtime.inputs import PADDING_BITS, holds_poison, poison_pattern
from harness.spec.plan import Tolerance
from harness.results.store import ErrorStats, finite_number

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"values": 1, "nan origin": 1, "unchanged inputs": 1, "quantized steps": 1}

# A failure within this many tolerances is "borderline" and gets judged against fp64.
BORDERLINE = 4.0
# A relative error over a reference element near zero is division by noise: an element whose reference is below
# this fraction of the output's largest magnitude has its error taken relative to that fraction of it instead.
REL_FLOOR = 1e-3


@dataclass
class Stats:
    """Worst errors seen over a cell's examples."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: int | None = None
    worst_output: str = ""

    def add(self, name: str, abs_err: float, rel_err: float, ulp: int | None):
        if abs_err > self.max_abs or not self.worst_output:
            self.worst_output = name
        self.max_abs, self.max_rel = max(self.max_abs, abs_err), max(self.max_rel, rel_err)
        if ulp is not None:
            self.max_ulp = max(self.max_ulp or 0, ulp)

    def record(self) -> ErrorStats:
        return ErrorStats(*(v if finite_number(v) else str(v) for v in (self.max_abs, self.max_rel)), self.max_ulp,
                          self.worst_output)


@dataclass
class Mismatch(AssertionError):
    """A comparison that failed, with the message a user reads."""

    message: str
    stats: ErrorStats | None = None

    def __str__(self) -> str:
        return self.message


# A torch dtype's cell dtype name (torch.float32 -> fp32), where it is one: harness.spec.dtypes.
SHORT_NAMES = {getattr(torch, t): name for t, name in CELL_OF_TORCH.items()}
# The float cell dtypes (fp32, fp16, bf16), whose errors are also counted in ULPs: torch dtype -> its bits' int dtype.
ULP_BITS = {getattr(torch, DTYPE[n].torch): getattr(torch, f"int{DTYPE[n].bits}") for n in SHORT_NAMES.values()
            if DTYPE[n].kind == "float"}


def finite(t: torch.Tensor) -> torch.Tensor:
    """Where `t` is finite (every element of an integer tensor; fp8 through fp32, which has the kernels)."""
    if not t.is_floating_point():
        return torch.ones_like(t, dtype=torch.bool)
    return torch.isfinite(t.float() if t.element_size() == 1 else t)


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Values on an integer line where neighbours in the dtype are 1 apart (floats by their bit patterns)."""
    if not t.is_floating_point():
        return t.to(torch.int64)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    i = t.contiguous().view(bits).to(torch.int64)
    sign = 1 << (8 * t.element_size() - 1)
    if t.element_size() == 1:  # uint8 patterns: the sign is the top bit
        return torch.where(i >= sign, -(i - sign), i)
    return torch.where(i < 0, -(i & (sign - 1)), i)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place, for fp16/bf16/fp32 (finite elements only)."""
    bits = ULP_BITS[a.dtype]
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not finite.any():
        return 0

    def ordered(t):  # map float bit patterns onto a monotonic integer line
        i = t[finite].contiguous().view(bits).to(torch.int64)
        return torch.where(i < 0, -(i & (2 ** (8 * t.element_size() - 1) - 1)), i)

    return int((ordered(a) - ordered(b)).abs().max().item())


def errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float, int | None]:
    """(max abs error, max rel error, max ULP distance or None) over elements where both are finite."""
    if actual.numel() == 0:
        return 0.0, 0.0, 0
    a, e = actual.double(), expected.double()
    finite = torch.isfinite(a) & torch.isfinite(e)
    if not finite.any():
        return 0.0, 0.0, None
    diff = (a - e).abs()[finite]
    scale = e.abs()[finite]
    rel = diff / scale.clamp_min(max(REL_FLOOR * float(scale.max()), torch.finfo(torch.float32).tiny))
    ulp = ulp_distance(actual, expected) if actual.dtype in ULP_BITS else None
    return float(diff.max()), float(rel.max()), ulp


def not_finite_reason(name: str, actual: torch.Tensor, bad: torch.Tensor) -> str:
    """Why `bad` elements are NaN/Inf: never written (they still hold the output's poison), computed from a strided
    input's poisoned padding (where arithmetic kept its payload, as on a CPU), or computed."""
    total = actual.numel()
    unwritten = holds_poison(actual) & bad
    from_padding = holds_poison(actual, PADDING_BITS) & bad
    computed = bad & ~unwritten & ~from_padding
    where = lambda mask: tuple(int(i) for i in mask.nonzero()[0])  # noqa: E731
    parts = []
    if unwritten.any():
        parts.append(f"{int(unwritten.sum())} of {total} elements were never written (they still hold the NaN the "
                     f"output was poisoned with before the call), first at index {where(unwritten)}")
    if from_padding.any():
        parts.append(f"{int(from_padding.sum())} of {total} elements are NaN computed from the poisoned padding of a "
                     f"strided input (the kernel read past the end of a row), first at index {where(from_padding)}")
    if computed.any():
        what = "computed by the kernel" if poison_pattern(actual.dtype) is not None else \
            f"written or left unwritten ({actual.dtype} has a single NaN, so the two cannot be told apart)"
        parts.append(f"{int(computed.sum())} of {total} elements are NaN/Inf where the reference is finite, {what}, "
                     f"first at index {where(computed)}")
    return f"output '{name}': " + "; ".join(parts)


def compare(name: str, actual, expected: torch.Tensor, tol: Tolerance, stats: Stats | None,
            exact64: torch.Tensor | None = None, check_strides: bool = False) -> None:
    """Raise Mismatch unless `actual` matches `expected` in metadata and values within `tol`. The errors (in fp64,
    several passes over the output) are added to `stats`; with None they are computed only for a mismatch's
    message (a benchmark's check after timing, a comparison made again)."""
    if not isinstance(actual, torch.Tensor):
        raise Mismatch(f"output '{name}': expected a tensor, got {type(actual).__name__}")
    if actual.shape != expected.shape:
        raise Mismatch(f"output '{name}': shape {tuple(actual.shape)}, reference {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        raise Mismatch(f"output '{name}': dtype {actual.dtype}, reference {expected.dtype}")
    if check_strides and actual.numel() > 1 and actual.stride() != expected.stride():
        raise Mismatch(f"output '{name}': strides {actual.stride()}, reference {expected.stride()}")
    if stats is not None:
        stats.add(name, *errors(actual, expected))
    bad = ~finite(actual) & finite(expected)
    if bad.any():
        raise Mismatch(not_finite_reason(name, actual, bad), ErrorStats("nan", "nan", None, name))
    if tol.of_max and expected.numel():  # atol_of: max: a fraction of the output's largest magnitude
        tol = Tolerance(tol.atol * max(1.0, float(expected.abs().float().nan_to_num(0.0).max())), tol.rtol)
    try:
        torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol, equal_nan=True)
        return
    except AssertionError as exc:
        detail = str(exc).strip().splitlines()
    abs_err, rel_err, ulp = errors(actual, expected)
    msg = (f"output '{name}': max abs error {abs_err:.3g}, max rel error {rel_err:.3g}"
           + (f", {ulp} ULP" if ulp is not None else "") + f" (atol {tol.atol:g}, rtol {tol.rtol:g}); "
           + " ".join(line.strip() for line in detail[1:4]))
    if exact64 is not None and abs_err <= BORDERLINE * (tol.atol + tol.rtol * float(expected.abs().max())):
        # Borderline: the kernel passes if it is no further from the exact result than the reference is.
        kernel_err = float((actual.double() - exact64).abs().max())
        ref_err = float((expected.double() - exact64).abs().max())
        if kernel_err <= ref_err + tol.atol:
            return
        msg += f"; against fp64 the kernel is off by {kernel_err:.3g}, the reference by {ref_err:.3g}"
    raise Mismatch(msg, ErrorStats(abs_err, rel_err, ulp, name))


def compare_quantized(name: str, actual, expected: torch.Tensor, max_step_fraction: float,
                      stats: Stats | None) -> float:
    """A quantized output against the reference's: no element more than one quantization step apart, and at most
    `max_step_fraction` of them one step apart (an fp8 rounding boundary, as vLLM's fp8 tests allow). Returns the
    fraction one step apart: the observation a benchmark record keeps, judged again when a page is made."""
    if not isinstance(actual, torch.Tensor):
        raise Mismatch(f"output '{name}': expected a tensor, got {type(actual).__name__}")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise Mismatch(f"output '{name}': {actual.dtype}{tuple(actual.shape)}, reference "
                       f"{expected.dtype}{tuple(expected.shape)}")
    if actual.numel() == 0:
        return 0.0
    bad = ~finite(actual) & finite(expected)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise Mismatch(f"output '{name}': {int(bad.sum())} of {actual.numel()} quantized elements are NaN/Inf where "
                       f"the reference is finite, first at index {first}", ErrorStats("nan", "nan", None, name))
    steps = (ordered(actual) - ordered(expected)).abs()
    both = finite(actual) & finite(expected)
    steps = torch.where(both, steps, torch.zeros_like(steps))
    diff = (actual.double() - expected.double()).abs()[both]
    abs_err = float(diff.max()) if diff.numel() else 0.0
    worst = int(steps.max())
    if stats is not None:
        stats.add(name, abs_err, 0.0, worst)
    one_step = float((steps == 1).float().mean())
    if worst > 1:
        first = tuple(int(i) for i in (steps == worst).nonzero()[0])
        raise Mismatch(f"output '{name}': {int((steps > 1).sum())} of {actual.numel()} quantized elements are more "
                       f"than "
                       f"one step from the reference (up to {worst} steps, first at index {first}: "
                       f"{float(actual[first]):g} against {float(expected[first]):g})"
                       + step_directions(actual, expected, steps > 0), ErrorStats(abs_err, None, worst, name))
    if one_step > max_step_fraction:
        raise Mismatch(f"output '{name}': {one_step:.2%} of quantized elements are one step from the reference "
                       f"(at most {max_step_fraction:.2%} allowed: quantization.max_step_fraction)"
                       + step_directions(actual, expected, steps > 0), ErrorStats(abs_err, None, worst, name))
    return one_step


def step_directions(actual: torch.Tensor, expected: torch.Tensor, moved: torch.Tensor) -> str:
    """Which way the elements off the reference moved: all toward zero is the mark of a truncating cast (rounding
    goes either way)."""
    toward = int((actual.double().abs() < expected.double().abs())[moved].sum())
    total = int(moved.sum())
    if total and toward == total:
        return f"; all {total:,} toward zero: a truncating cast?"
    return f"; {toward:,} toward zero, {total - toward:,} away from it" if total else ""


def in_place_reason(name: str, after: torch.Tensor, before: torch.Tensor, returned, expected: torch.Tensor,
                    tol: Tolerance) -> str:
    """For an in-place output that did not match: whether the call left it as drawn, and whether a tensor the
    kernel returned holds the result instead (it computed out of place)."""
    said = (f"'{name}' was left unchanged by the call (op.mutates says the kernel writes its result into it)"
            if bits_equal(before, after)
            else f"'{name}' was written, with other values")
    for value in returned if isinstance(returned, tuple) else (returned,):
        if isinstance(value, torch.Tensor) and value.shape == expected.shape and value.dtype == expected.dtype \
                and value.data_ptr() != after.data_ptr():
            try:
                compare(name, value, expected, tol, None)
            except Mismatch:
                continue
            return said + "; the tensor the kernel returned matches the reference: it computed out of place"
    return said


def bits_equal(before: torch.Tensor, after: torch.Tensor) -> bool:
    """The same bit patterns: NaN equals NaN, every dtype (fp8) compares."""
    return before.shape == after.shape and before.dtype == after.dtype and bool(
        torch.equal(ordered(before), ordered(after)))


def check_unchanged(name: str, before: torch.Tensor, after: torch.Tensor) -> None:
    """An input the op does not declare as mutated must be bit-identical after the call."""
    if not bits_equal(before, after):
        raise Mismatch(f"input '{name}' was modified by the op, which does not declare it in op.mutates")
