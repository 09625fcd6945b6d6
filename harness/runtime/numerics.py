"""Comparing one output with the reference: metadata first, then values, with the statistics the report shows.

torch.testing.assert_close does the value check with the tolerance; this module adds what it
does not: poison left in the output, NaN/Inf where the reference is finite, ULP distance, and an
fp64 tie-break for borderline failures (whoever is closer to the exact result wins).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from harness.plan.dtypes import CELL_OF_TORCH, DTYPE
from harness.runtime.inputs import PADDING_BITS, holds_poison, poison_pattern
from harness.plan.model import Tolerance
from harness.results.store import ErrorStats, finite_number

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"values": 1, "nan origin": 1, "unchanged inputs": 1, "quantized steps": 2}
# quantized steps v2: the count one step off allowed by the binomial spread of the tensor's size (looser on small
# tensors only: a record that passed passes again)
FAILURES_ONLY = {"quantized steps": [2]}

# A failure within this many tolerances is "borderline" and gets judged against fp64.
BORDERLINE = 4.0
# A relative error over a reference element near zero is division by noise: an element whose reference is below
# this fraction of the output's largest magnitude has its error taken relative to that fraction of it instead.
REL_FLOOR = 1e-3
# A value failure's diagnosis (`diagnosis`), in ULPs of the output's dtype at each fp64 value. A result rounded to
# that dtype twice (once on an intermediate, as vLLM's RMSNorm forward_native casts x * rsqrt(var) before the weight
# product) is off by at most about 1.5 ULP where one rounded once is off by 0.5: 3x. One more for a small example, on
# which the reference's worst element falls short of half an ULP. A kernel 2% off is 2.5 ULP or more even in bf16.
ROUNDING_MULTIPLE = 4.0
# The kernel "rounds like" op.native where at least this fraction of its elements are bit-identical to native's.
SAME_AS_NATIVE = 0.9


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


class Mismatch(AssertionError):
    """A comparison that failed, with the message a user reads and the error statistics recorded. Either may be
    given as `said`, a function returning both, called the first time either is read: shrinking a failure and
    judging generated wrong kernels raise many mismatches and read few."""

    def __init__(self, message: str = "", stats: ErrorStats | None = None,
                 said: Callable[[], tuple[str, ErrorStats | None]] | None = None):
        super().__init__()
        self._message, self._stats, self._said = message, stats, said

    def _words(self) -> None:
        if self._said is not None:
            (self._message, self._stats), self._said = self._said(), None

    @property
    def message(self) -> str:
        self._words()
        return self._message

    @message.setter
    def message(self, text: str) -> None:
        self._words()
        self._message = text

    @property
    def stats(self) -> ErrorStats | None:
        self._words()
        return self._stats

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"Mismatch({self.message!r})"

    def __reduce__(self):  # across processes as what it says
        return Mismatch, (self.message, self.stats)


# A torch dtype's cell dtype name (torch.float32 -> fp32), where it is one: harness.plan.dtypes.
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


class NotFinite(Mismatch):
    """A Mismatch for NaN/Inf where the reference is finite, naming the `output` (its words may be made again from
    a second call: harness.runtime.failures.allocated_nan_words)."""

    def __init__(self, output: str, message: str, stats: ErrorStats | None = None):
        super().__init__(message, stats)
        self.output = output


def not_finite_reason(name: str, actual: torch.Tensor, bad: torch.Tensor, allocated: bool = False) -> str:
    """Why `bad` elements are NaN/Inf: never written (they still hold the output's poison), computed from a strided
    input's poisoned padding (where arithmetic kept its payload, as on a CPU), or computed. `allocated`: `actual` is
    an output the kernel allocated, from a second call made with its allocations poisoned
    (inputs.PoisonedAllocations): the poison it still holds was put there by that, not by the harness's buffer."""
    total = actual.numel()
    unwritten = holds_poison(actual) & bad
    from_padding = holds_poison(actual, PADDING_BITS) & bad
    computed = bad & ~unwritten & ~from_padding
    where = lambda mask: tuple(int(i) for i in mask.nonzero()[0])  # noqa: E731
    parts = []
    if unwritten.any() and allocated:
        n = int(unwritten.sum())
        parts.append(f"{n} of {total} elements are NaN/Inf where the reference is finite, never written (the memory "
                     f"the kernel allocated was poisoned for a second call and {n} elements still hold it), first at "
                     f"index {where(unwritten)}")
    elif unwritten.any():
        parts.append(f"{int(unwritten.sum())} of {total} elements were never written (they still hold the NaN the "
                     f"output was poisoned with before the call), first at index {where(unwritten)}")
    if from_padding.any():
        parts.append(f"{int(from_padding.sum())} of {total} elements are NaN computed from the poisoned padding of a "
                     f"strided input (the kernel read past the end of a row), first at index {where(from_padding)}")
    if computed.any():
        what = "computed by the kernel" if poison_pattern(actual.dtype) is not None else \
            f"written or left unwritten ({actual.dtype} has a single NaN, so the two cannot be told apart)"
        if allocated and poison_pattern(actual.dtype) is not None:
            what += " (a second call with the memory it allocated poisoned still gives them)"
        parts.append(f"{int(computed.sum())} of {total} elements are NaN/Inf where the reference is finite, {what}, "
                     f"first at index {where(computed)}")
    return f"output '{name}': " + "; ".join(parts)


def compare(name: str, actual, expected: torch.Tensor, tol: Tolerance, stats: Stats | None,
            exact64: torch.Tensor | None = None, check_strides: bool = False,
            native: Callable[[], torch.Tensor | None] | None = None) -> None:
    """Raise Mismatch unless `actual` matches `expected` in metadata and values within `tol`. The errors (in fp64,
    several passes over the output) are added to `stats`; with None they are computed only for a mismatch's
    message (a benchmark's check after timing, a comparison made again). With `exact64` (the reference in fp64) a
    borderline failure is judged against it and a value failure says what it is (`diagnosis`), from op.native's
    output too where `native` (called only then) gives one."""
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
        raise NotFinite(name, not_finite_reason(name, actual, bad), ErrorStats("nan", "nan", None, name))
    if tol.of_max and expected.numel():  # atol_of: max: a fraction of the output's largest magnitude
        tol = Tolerance(tol.atol * max(1.0, float(expected.abs().float().nan_to_num(0.0).max())), tol.rtol)
    try:
        torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol, equal_nan=True)
        return
    except AssertionError as exc:
        detail = str(exc).strip().splitlines()
    if exact64 is not None:
        both = finite(actual) & finite(expected)
        abs_err = float((actual.double() - expected.double()).abs()[both].max()) if both.any() else 0.0
        if abs_err <= BORDERLINE * (tol.atol + tol.rtol * float(expected.abs().max())):
            # Borderline: the kernel passes if it is no further from the exact result than the reference is.
            kernel_err = float((actual.double() - exact64).abs().max())
            ref_err = float((expected.double() - exact64).abs().max())
            if kernel_err <= ref_err + tol.atol:
                return
    actual = actual.detach().clone()  # the words are made when read: a reused output buffer may change by then

    def said() -> tuple[str, ErrorStats]:
        abs_err, rel_err, ulp = errors(actual, expected)
        msg = (f"output '{name}': max abs error {abs_err:.3g}, max rel error {rel_err:.3g}"
               + ulp_words(actual, expected, ulp) + f" (atol {tol.atol:g}, rtol {tol.rtol:g}); ")
        if exact64 is not None:
            # Before torch's lines, so that the report's one-line reason (cut at 400 characters) keeps it.
            msg += diagnosis(actual, expected, exact64, native() if native is not None else None) + "; "
        msg += " ".join(line.strip() for line in detail[1:4])
        return msg, ErrorStats(abs_err, rel_err, ulp, name)

    raise Mismatch(said=said)


def ulp_words(actual: torch.Tensor, expected: torch.Tensor, ulp: int | None) -> str:
    """The ULP distance as a failure says it: where the reference is 0 or near it (below REL_FLOOR of its largest
    magnitude, as for max rel error) a distance in ULPs counts the binades between tiny values, not an error (1e-6
    against an fp32 0 is 897,988,541 ULP), so those elements are left out of it and their absolute error said
    instead. Words only: the recorded max_ulp stays the measured one (`errors`)."""
    if ulp is None:
        return ""
    if actual.numel() == 0:
        return f", {ulp} ULP"
    a, e = actual.double(), expected.double()
    both = torch.isfinite(a) & torch.isfinite(e)
    scale = e.abs()
    largest = float(scale[both].max()) if both.any() else 0.0
    near = both & ((scale < REL_FLOOR * largest) | (scale == 0))
    near_err = float((a - e).abs()[near].max()) if near.any() else 0.0
    far = both & ~near
    far_ulp = ulp_distance(actual[far], expected[far]) if far.any() else None
    if near_err == 0 or far_ulp == ulp:
        return f", {ulp} ULP"
    near_said = f"{near_err:.3g} off where the reference is 0 or below {REL_FLOOR:g} of its largest magnitude"
    if far_ulp is None:
        return f" ({near_said}: everywhere, so no ULP distance)"
    return f", {far_ulp} ULP where the reference is not near 0 ({near_said}: ULPs there count binades, not error)"


def ulp_units(exact64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` at each exact value, the magnitude floored at REL_FLOOR of the largest (near zero an
    output's error is cancellation, not rounding, as for max rel error) and at the dtype's smallest normal."""
    info = torch.finfo(dtype)
    mag = exact64.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0)
    floor = max(REL_FLOOR * float(mag.max()) if mag.numel() else 0.0, info.tiny)
    _, exponent = torch.frexp(mag.clamp_min(floor))
    return torch.ldexp(torch.full_like(mag, info.eps / 2), exponent)  # eps * 2^(e-1): 1 ULP on [2^(e-1), 2^e)


def diagnosis(actual: torch.Tensor, expected: torch.Tensor, exact64: torch.Tensor,
              native: torch.Tensor | None = None) -> str:
    """What a value failure is, from the kernel's and the reference's distances to the reference run in fp64 (and,
    where the plan names op.native, vLLM's native path's on the same inputs), in ULPs of the output dtype:

    - the kernel within ROUNDING_MULTIPLE of the reference's own rounding error (at least the half ULP any rounding
      costs), or bit-identical to op.native on most elements and within that multiple of it: a rounding-order
      difference, such as a kernel rounding where vLLM's native path does against a reference rounding once;
    - the reference that many times further from fp64 than the kernel: the reference is the one off;
    - else more than rounding explains, with the worst element."""
    dtype = actual.dtype
    a, e = actual.double(), expected.double()
    ok = torch.isfinite(a) & torch.isfinite(e) & torch.isfinite(exact64)
    if not ok.any():
        return "against fp64: no element where the kernel, the reference and fp64 are all finite"
    if not dtype.is_floating_point:  # integer outputs: their unit is 1 already
        kernel_err, ref_err = (float((t - exact64).abs()[ok].max()) for t in (a, e))
        return f"against fp64 the kernel is off by {kernel_err:.3g}, the reference by {ref_err:.3g}"
    unit = ulp_units(exact64, dtype)
    off = lambda t: torch.where(ok, (t.double() - exact64).abs() / unit, 0.0)  # noqa: E731
    k, r = off(actual), off(expected)
    k_max, r_max = float(k.max()), float(r.max())
    short = SHORT_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    # The figures in ULPs where fp64 is not near zero, in absolute terms where it is (ULPs there count binades).
    mag = exact64.abs()
    near = ok & ((mag < REL_FLOOR * float(mag[ok].max())) | (mag == 0))
    far = ok & ~near

    def said(t: torch.Tensor, units: torch.Tensor) -> str:
        parts = [f"{float(units[far].max()):.2g} ULP"] if far.any() else []
        near_err = float((t.double() - exact64).abs()[near].max()) if near.any() else 0.0
        parts += [f"{near_err:.3g} where fp64 is 0 or near it"] if near_err else []
        return " and ".join(parts) or "0"

    figures = (f"against fp64 (ULPs of {short}) the kernel is off by up to {said(actual, k)}, the reference by "
               f"{said(expected, r)}")
    same_native = same_ref = None
    n_max = 0.0
    if isinstance(native, torch.Tensor) and native.shape == actual.shape and native.dtype == dtype:
        n = off(native)
        n_max = float(n.max())
        same_native = float((ordered(actual) == ordered(native))[ok].double().mean())
        same_ref = float((ordered(actual) == ordered(expected))[ok].double().mean())
        figures += f", vLLM's native path (op.native) by {said(native, n)}"
    allowed = ROUNDING_MULTIPLE * max(r_max, 0.5)
    like_native = same_native is not None and same_native >= SAME_AS_NATIVE and \
        k_max <= ROUNDING_MULTIPLE * max(r_max, n_max, 0.5)
    advice = (f"use a reference that rounds where the kernel does (to {short} after each product, as vLLM's native "
              f"path does), or loosen `tolerance` (`atol_of: max` for a reduction)")
    if r_max > ROUNDING_MULTIPLE * max(k_max, 0.5):
        return (f"the reference, not the kernel, is off: {figures}; make the reference compute in fp32 before "
                f"its rounding to {short}")
    if like_native:
        return (f"rounding-order difference, not a wrong result: the kernel rounds like vLLM's native path "
                f"(op.native; bit-identical on {same_native:.0%} of elements, the reference on {same_ref:.0%}); "
                f"{figures}; {advice}")
    if k_max <= allowed:
        return (f"rounding-order difference, not a wrong result: {figures}, within {ROUNDING_MULTIPLE:g}x the "
                f"reference's own rounding; {advice}")
    worst = tuple(int(i) for i in torch.unravel_index(k.argmax(), k.shape))
    return (f"more than a rounding difference: {figures} (worst at index {worst}: kernel {float(a[worst]):.6g}, "
            f"reference {float(e[worst]):.6g}, fp64 {float(exact64[worst]):.6g})"
            + (f"; bit-identical to vLLM's native path on {same_native:.0%} of elements" if same_native is not None
               else ""))


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
        raise NotFinite(name, f"output '{name}': {int(bad.sum())} of {actual.numel()} quantized elements are NaN/Inf "
                        f"where the reference is finite, first at index {first}", ErrorStats("nan", "nan", None, name))
    steps = (ordered(actual) - ordered(expected)).abs()
    both = finite(actual) & finite(expected)
    steps = torch.where(both, steps, torch.zeros_like(steps))
    diff = (actual.double() - expected.double()).abs()[both]
    abs_err = float(diff.max()) if diff.numel() else 0.0
    worst = int(steps.max())
    if stats is not None:
        stats.add(name, abs_err, 0.0, worst)
    count = int((steps == 1).sum())
    one_step = count / actual.numel()
    if worst > 1:
        first = tuple(int(i) for i in (steps == worst).nonzero()[0])
        raise Mismatch(f"output '{name}': {int((steps > 1).sum())} of {actual.numel()} quantized elements are more "
                       f"than "
                       f"one step from the reference (up to {worst} steps, first at index {first}: "
                       f"{float(actual[first]):g} against {float(expected[first]):g})"
                       + step_directions(actual, expected, steps > 0), ErrorStats(abs_err, None, worst, name))
    allowed = allowed_one_step(actual.numel(), max_step_fraction)
    if count > allowed:
        raise Mismatch(f"output '{name}': {count} of {actual.numel()} quantized elements ({one_step:.2%}) are one step "
                       f"from the reference (at most {allowed} allowed: quantization.max_step_fraction "
                       f"{max_step_fraction:.2%} and the binomial spread of {actual.numel()} elements)"
                       + step_directions(actual, expected, steps > 0), ErrorStats(abs_err, None, worst, name))
    return one_step


# The chance that a correct kernel, putting each element one step off with probability max_step_fraction (a rounding
# boundary), exceeds the count allowed by luck alone: on a small tensor 2.31% of 260 elements is 6 where 1% gives 2.6.
STEP_RISK = 1e-6
STEP_RISK_Z = 4.7534  # the standard normal's 1 - STEP_RISK quantile, for tensors whose count is near normal


def allowed_one_step(n: int, fraction: float) -> int:
    """The most of `n` elements allowed one step off: the 1 - STEP_RISK quantile of Binomial(n, fraction), exact where
    the expected spread is small and by the normal approximation where it is large (never below fraction * n)."""
    if fraction <= 0 or n == 0:
        return 0
    if fraction >= 1:
        return n
    variance = n * fraction * (1 - fraction)
    if variance > 100:
        return min(n, math.ceil(n * fraction + STEP_RISK_Z * math.sqrt(variance)))
    log_p, log_q, tail, k = math.log(fraction), math.log1p(-fraction), 1.0, 0
    while k < n:
        tail -= math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p
                         + (n - k) * log_q)  # P(X > k)
        if tail <= STEP_RISK:
            break
        k += 1
    return max(k, math.floor(n * fraction))


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
