"""Running one cell: hypothesis draws examples, each is checked against the reference in the cell's graph mode.

`run_cell` is a plain function of (plan path, cell id, settings) returning an `Outcome`, so it runs
the same in the pytest process or in an isolated worker (harness.workers). Tensor-parallel cells
check their examples with `tp.TPCheck` through the same `run_examples` loop.
"""

from __future__ import annotations

import re
import time
import traceback
from dataclasses import dataclass, replace

import torch
from hypothesis import Phase, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import HypothesisException

from . import numerics
from .calls import kernel_outputs, reference_outputs
from .device import detect
from .inputs import Example, build_args, examples, token_cap
from .matrix import Cell
from .modes import make_runner
from .numerics import Mismatch, Stats, compare
from .plan import Plan, load_plan
from .results import CellRecord, Status, Tol
from .tolerances import tolerance_for

# Substrings of errors after which the CUDA context is unusable: the worker must be replaced.
FATAL_DEVICE_ERRORS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                       "CUDA error: an illegal instruction", "misaligned address", "CUDA-capable device(s) is/are busy")

# Hypothesis profiles for cells, selectable with --plan-profile or hypothesis's own --hypothesis-profile.
# No deadline: the Triton interpreter and first-call compilation are slow by design. No "explain" phase:
# it re-runs the failing example under sys.settrace, which over the Triton interpreter takes minutes.
_COMMON = dict(deadline=None, report_multiple_bugs=False, print_blob=False,
               phases=[p for p in Phase if p != Phase.explain])
settings.register_profile("harness-dev", **_COMMON)
settings.register_profile("harness-ci", **_COMMON, derandomize=True, database=None)
settings.register_profile("harness-nightly", **_COMMON)
NIGHTLY_FACTOR = 5  # nightly runs draw this many times the plan's examples


@dataclass(frozen=True)
class RunSettings:
    examples: int
    profile: str = "dev"  # dev | ci | nightly
    database: str | None = ".hypothesis/examples"


@dataclass
class Outcome:
    """What running a cell gave: its record, whether the worker must be replaced, and a traceback to show."""

    record: CellRecord
    fatal: bool = False
    traceback: str | None = None


class KernelRaised(AssertionError):
    """The kernel (or its launcher) raised: reported with the exception and where it came from."""


def hypothesis_settings(run: RunSettings) -> settings:
    database = None if run.profile == "ci" or not run.database else DirectoryBasedExampleDatabase(run.database)
    return settings(settings.get_profile(f"harness-{run.profile}"), max_examples=run.examples, database=database)


def exact_outputs(plan: Plan, reference, values: dict) -> dict:
    """The reference in fp64, for judging borderline failures."""
    up = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in values.items()}
    with torch.no_grad():
        return {k: v.double() for k, v in reference_outputs(plan, reference, up).items()}


def kernel_error(exc: Exception, ex: Example, device: str) -> KernelRaised:
    """What a user reads when the kernel raises: out of memory in words, else the exception and where."""
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    text = str(exc).strip()
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text \
            or "not enough memory" in text.lower():
        return KernelRaised(f"out of memory at {ex.describe()}: the kernel asked for more memory than the {device} "
                            f"has ({text.splitlines()[0][:300]}; {frame.filename}:{frame.lineno})")
    return KernelRaised(f"the kernel raised {type(exc).__name__}: {text[:500]} ({frame.filename}:{frame.lineno})")


class CellCheck:
    """Checks one example: the op in the cell's graph mode against the reference."""

    def __init__(self, plan: Plan, cell: Cell, device: str):
        self.plan, self.cell, self.device = plan, cell, device
        self.kernel, self.reference = plan.load_kernel(), plan.load_reference()
        self.runner = make_runner(cell.graph_mode, plan, self.kernel, device)
        self.tol = tolerance_for(plan, cell.dtype)
        self.stats = Stats()
        self.count = 0
        self.last_failure: tuple[Example, BaseException] | None = None

    def __call__(self, ex: Example) -> None:
        try:
            self._check(ex)
        except BaseException as exc:
            self.last_failure = (ex, exc)
            raise

    def _call(self, values: dict, ex: Example):
        try:
            return self.runner(values, ex)
        except Mismatch:
            raise
        except Exception as exc:
            raise kernel_error(exc, ex, self.device) from None

    def _check(self, ex: Example) -> None:
        plan = self.plan
        self.count += 1
        values = build_args(plan, self.cell, ex, self.device)
        expected = reference_outputs(plan, self.reference, values)
        untouched = {a.name: values[a.name].clone() for a in plan.tensor_args
                     if a.role == "input" and a.name not in plan.mutates}
        actual = kernel_outputs(plan, values, self._call(values, ex))
        for name in plan.outputs:
            self.compare(name, actual[name], expected[name], values, name in plan.returned_outputs)
        for name, before in untouched.items():
            numerics.check_unchanged(name, before, values[name])
        if plan.returned_outputs:
            # A returned tensor must still hold its result after the next call (no cached output buffer).
            self._call(build_args(plan, self.cell, replace(ex, seed=ex.seed + 1), self.device), ex)
            for name in plan.returned_outputs:
                try:
                    compare(name, actual[name], expected[name], self.tol, Stats())
                except Mismatch as exc:
                    raise Mismatch(f"output '{name}' changed when the op was called again: it returns a buffer "
                                   f"it reuses across calls ({exc})") from None

    def compare(self, name, actual, expected, values, returned: bool) -> None:
        compare_judged(self.plan, self.reference, self.tol, self.stats, name, actual, expected, values, returned)


def compare_judged(plan: Plan, reference, tol, stats: Stats, name: str, actual, expected, values: dict,
                   returned: bool) -> None:
    """Compare one output (Mismatch if it fails); a borderline failure is judged against the fp64 reference."""
    try:
        compare(name, actual, expected, tol, stats, check_strides=returned)
    except Mismatch:
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise
        exact = exact_outputs(plan, reference, values)[name]
        compare(name, actual, expected, tol, Stats(), exact64=exact, check_strides=returned)


def run_examples(plan: Plan, cell: Cell, check: CellCheck, run: RunSettings, tp_multiple: dict | None = None,
                 start: float | None = None) -> Outcome:
    """Draw the cell's examples with hypothesis and check each; the minimal failure ends up in the record."""
    start = time.monotonic() if start is None else start
    device = check.device

    def test(ex):
        check(ex)

    # A distinct name per plan and cell gives each cell its own entry in hypothesis's example database.
    test.__name__ = test.__qualname__ = re.sub(r"\W", "_", f"{plan.name}__{cell.id}")
    test = hypothesis_settings(run)(given(examples(plan, cell, device, tp_multiple))(test))
    rec = CellRecord(**cell.axes(), status=Status.PASSED)
    try:
        test()
    except Exception as exc:  # hypothesis re-raises the minimal example's failure
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # flaky: failed once, not on replay
            exc = exc.exceptions[0]
        rec.status = Status.FAILED
        if isinstance(exc, HypothesisException):
            rec.reason = f"hypothesis: {exc}"
        else:
            failing = check.last_failure
            reason = str(exc).strip() or type(exc).__name__
            if device == "cuda" and any(s in reason for s in FATAL_DEVICE_ERRORS):
                # CUDA reports a fault at the next sync, often outside the kernel call: say it in words
                reason = (f"the kernel faulted on the device: {reason.splitlines()[0]} (the CUDA context is "
                          "unusable after this; later cells run in a fresh worker)")
            rec.reason = reason
            rec.minimal_example = failing[0].describe() if failing else None
            if isinstance(exc, Mismatch) and exc.stats:
                rec.error = exc.stats
    cap = token_cap(plan, {sym: max(v) for sym, v in plan.sizes.items()}, device)
    rec.examples = check.count
    rec.duration_s = round(time.monotonic() - start, 3)
    rec.tolerance = Tol(check.tol.atol, check.tol.rtol)
    rec.facts = {**check.runner.facts, **({"token_cap": cap} if cap else {})}
    rec.error = rec.error or check.stats.record()
    return Outcome(rec, fatal=device_poisoned(rec.reason, device))


def run_cell(plan_path: str, cell_id: str, run: RunSettings) -> Outcome:
    """Run one tp1 cell's hypothesis examples in this process."""
    start = time.monotonic()
    plan, cell = load_plan(plan_path), Cell.from_id(cell_id)
    return run_examples(plan, cell, CellCheck(plan, cell, detect().device), run, start=start)


def device_poisoned(reason: str, device: str) -> bool:
    """True when the device context is unusable: later cells in this process would fail for the wrong reason."""
    if device != "cuda":
        return False
    if any(s in reason for s in FATAL_DEVICE_ERRORS):
        return True
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True
