"""Running one cell: hypothesis draws examples, each is checked against the reference in the cell's graph mode.

`run_cell` is a plain function of (plan path, cell, settings) returning a JSON-able outcome, so
it runs the same in this process or in an isolated worker (see workers.py).
"""

from __future__ import annotations

import re
import time
import traceback
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import HypothesisException

from . import numerics
from .hardware import detect
from .inputs import Example, build_args, clone_args, examples, token_cap
from .matrix import Cell
from .modes import make_runner, returned_outputs
from .numerics import Mismatch, Stats, compare, tolerance_for
from .plan import Plan, load_plan

# Substrings of errors after which the CUDA context is unusable: the worker must be replaced.
FATAL_DEVICE_ERRORS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                       "CUDA error: an illegal instruction", "misaligned address", "CUDA-capable device(s) is/are busy")


@dataclass
class RunSettings:
    examples: int
    profile: str = "dev"  # dev | ci | nightly
    database: str | None = ".hypothesis/examples"


class KernelRaised(AssertionError):
    """The kernel (or its launcher) raised: reported with the exception and where it came from."""


def _outputs(plan: Plan, values: dict, returned) -> dict:
    returned_names = returned_outputs(plan)
    got = returned if isinstance(returned, tuple) else (returned,)
    out = {}
    for name in plan.outputs:
        if name in returned_names:
            i = returned_names.index(name)
            out[name] = got[i] if i < len(got) else None
        else:
            out[name] = values[name]
    return out


def reference_outputs(plan: Plan, reference, values: dict) -> dict:
    """Run the functional reference on copies of the inputs; its return values map onto plan.outputs."""
    inputs = {k: v for k, v in clone_args(values).items() if not plan.arg(k).role == "output"}
    ref = reference(**inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    if len(ref) != len(plan.outputs):
        raise Mismatch(f"the reference returned {len(ref)} values; op.outputs names {len(plan.outputs)}")
    return dict(zip(plan.outputs, ref))


def exact_outputs(plan: Plan, reference, values: dict) -> dict:
    """The reference in fp64, for judging borderline failures."""
    up = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in values.items()}
    with torch.no_grad():
        return {k: v.double() for k, v in reference_outputs(plan, reference, up).items()}


class CellCheck:
    """Checks one example: the op in the cell's graph mode against the reference."""

    def __init__(self, plan: Plan, cell: Cell, device: str, tol_default=None):
        self.plan, self.cell, self.device = plan, cell, device
        self.kernel, self.reference = plan.load_kernel(), plan.load_reference()
        self.runner = make_runner(cell.graph_mode, plan, self.kernel, device)
        self.tol = tolerance_for(plan, cell.dtype, tol_default)
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
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            if _out_of_memory(exc):
                raise KernelRaised(f"out of memory at {ex.describe()}: the kernel asked for more memory than the "
                                   f"{self.device} has ({str(exc).strip().splitlines()[0][:300]}; "
                                   f"{frame.filename}:{frame.lineno})") from None
            text = str(exc).strip()
            raise KernelRaised(f"the kernel raised {type(exc).__name__}: {text[:500]} "
                               f"({frame.filename}:{frame.lineno})") from None

    def _check(self, ex: Example) -> None:
        plan = self.plan
        self.count += 1
        values = build_args(plan, self.cell, ex, self.device)
        expected = reference_outputs(plan, self.reference, values)
        untouched = {a.name: values[a.name].clone() for a in plan.tensor_args
                     if a.role == "input" and a.name not in plan.mutates}
        actual = _outputs(plan, values, self._call(values, ex))
        for name in plan.outputs:
            self._compare(name, actual[name], expected[name], values, name in returned_outputs(plan))
        for name, before in untouched.items():
            numerics.check_unchanged(name, before, values[name])
        if returned_outputs(plan):
            # A returned tensor must still hold its result after the next call (no cached output buffer).
            again = build_args(plan, self.cell, Example(**{**ex.__dict__, "seed": ex.seed + 1}), self.device)
            self._call(again, ex)
            for name in returned_outputs(plan):
                try:
                    compare(name, actual[name], expected[name], self.tol, Stats())
                except Mismatch as exc:
                    raise Mismatch(f"output '{name}' changed when the op was called again: it returns a buffer "
                                   f"it reuses across calls ({exc})") from None

    def _compare(self, name, actual, expected, values, returned: bool):
        try:
            compare(name, actual, expected, self.tol, self.stats, check_strides=returned)
        except Mismatch:
            if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.dtype != expected.dtype:
                raise
            exact = exact_outputs(self.plan, self.reference, values)[name]
            compare(name, actual, expected, self.tol, Stats(), exact64=exact, check_strides=returned)


def hypothesis_settings(run: RunSettings) -> settings:
    from hypothesis.database import DirectoryBasedExampleDatabase

    return settings(
        max_examples=run.examples,
        deadline=None,  # the Triton interpreter and first-call compilation are slow by design
        derandomize=run.profile == "ci",
        database=None if run.profile == "ci" or not run.database else DirectoryBasedExampleDatabase(run.database),
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        # no "explain" phase: it re-runs the failing example under sys.settrace, which over the Triton
        # interpreter takes minutes (and outlives numerics.timeout_s)
        phases=[p for p in Phase if p != Phase.explain],
    )


def run_cell(plan_path: str, cell_id: str, run: RunSettings, tol_default=None) -> dict:
    """Run one cell's hypothesis examples; returns the outcome as a JSON-able dict."""
    start = time.monotonic()
    plan = load_plan(plan_path)
    cell = Cell.from_id(cell_id)
    device = detect().device
    if tol_default is None:  # vLLM IR's own tolerance for the op, where vllm is installed and the plan sets none
        from .vllm_support import vllm_tolerance

        tol_default = vllm_tolerance(plan, cell.dtype)
    if cell.tp > 1:
        from .tp import TPCheck  # on rank 0 of a group of cell.tp worker processes (workers.WorkerGroup)

        check = TPCheck(plan, cell, device, tol_default)
    else:
        check = CellCheck(plan, cell, device, tol_default)

    def test(ex):
        check(ex)

    # A distinct name per plan and cell gives each cell its own entry in hypothesis's example database.
    test.__name__ = test.__qualname__ = re.sub(r"\W", "_", f"{plan.name}__{cell.id}")
    strategy = examples(plan, cell, device, getattr(check, "tp_multiple", None))  # TP: sharded sizes split evenly
    test = settings(hypothesis_settings(run))(given(strategy)(test))
    outcome = {"status": "passed", "reason": ""}
    try:
        test()
    except (AssertionError, Exception) as exc:  # hypothesis re-raises the minimal example's failure
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # flaky: failed once, not on replay
            exc = exc.exceptions[0]
        if isinstance(exc, HypothesisException):
            outcome = {"status": "failed", "reason": f"hypothesis: {exc}"}
        else:
            failing = check.last_failure
            reason = str(exc).strip() or type(exc).__name__
            if device == "cuda" and any(s in reason for s in FATAL_DEVICE_ERRORS):
                # CUDA reports a fault at the next sync, often outside the kernel call: say it in words
                reason = (f"the kernel faulted on the device: {reason.splitlines()[0]} (the CUDA context is "
                          "unusable after this; later cells run in a fresh worker)")
            outcome = {"status": "failed", "reason": reason,
                       "minimal_example": failing[0].describe() if failing else None}
            if isinstance(exc, Mismatch) and exc.stats:
                outcome["error"] = exc.stats
    largest = {sym: max(v) for sym, v in plan.sizes.items()}
    cap = token_cap(plan, largest, device)
    outcome.update({
        "examples": check.count,
        "duration_s": round(time.monotonic() - start, 3),
        "tolerance": {"atol": check.tol.atol, "rtol": check.tol.rtol},
        "facts": {**check.runner.facts, **({"token_cap": cap} if cap else {})},
        "fatal": _is_fatal(outcome.get("reason", ""), device),
    })
    outcome.setdefault("error", check.stats.as_dict())
    return outcome


def _is_fatal(reason: str, device: str) -> bool:
    """True when the device context is poisoned: later cells in this process would fail for the wrong reason."""
    if device != "cuda":
        return False
    if any(s in reason for s in FATAL_DEVICE_ERRORS):
        return True
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text \
        or "not enough memory" in text.lower()
