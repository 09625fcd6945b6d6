"""Running one cell: hypothesis draws examples, each is checked against the reference in the cell's graph mode.

`run_cell` is a plain function of a `CellTask` (the parsed plan, the cell, the run's settings) returning
an `Outcome`, so it runs the same in the pytest process or in an isolated worker (harness.runtime.workers).
Tensor-parallel cells check their examples with `tp.TPCheck` through the same `run_examples` loop.
"""

from __future__ import annotations

import math
import re
import time
import traceback
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable

import torch
from hypothesis import Phase, example, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import FlakyFailure, HypothesisException

from harness.runtime import accumulation, batch_invariance, determinism, numerics, padding
from harness.runtime.failures import allocated_nan_words, saved_inputs
from harness.runtime.calls import kernel_outputs, reference_outputs
from harness.runtime.device import detect, free_device_memory, memory_held_elsewhere
from harness.runtime.inputs import Example, build_args, examples, token_cap, within_contract
from harness.interpreter.bounds import OutOfBounds
from harness.interpreter.sites import interpreted_launch, no_variant, raise_site, shown_path
from harness.interpreter.unfaithful import unfaithful
from harness.cells.matrix import Cell
from harness.runtime.gpu_compile import COMPILE_LIMIT_S, compile_words, describe_launch, gpu_archs
from harness.runtime.modes import RaisedInEager, make_runner
from harness.runtime.numerics import SHORT_NAMES, Mismatch, Stats, compare, compare_quantized, in_place_reason
from harness.runtime.required_examples import required_examples
from harness.runtime.shrink_clock import ShrinkClock
from harness.runtime.resolve import resolve, stand_in_library
from harness.plan.model import Plan, Tolerance
from harness.results.store import CellRecord, Failure, InputsSeen, Status, more_failures_words

from harness.plan.tolerances import output_tolerance, tolerance_for
from harness.runtime.tasks import CellTask, RunSettings
from harness.runtime.tf32 import fp32_dot_precision
from harness.runtime.implementations import KernelUnavailable, load_implementation

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"cell runner": 2, "returned buffer": 1}
# cell runner v2: every distinct failure of the kernel's cells kept (hypothesis's report_multiple_bugs, as providers'
# cells had it): a failed record's reason goes on to them and its minimal example may differ (hypothesis draws on after
# the first failure); a cell that passed draws and checks the same examples
FAILURES_ONLY = {"cell runner": [2]}

# Substrings of errors after which the CUDA context is unusable: the worker must be replaced.
FATAL_DEVICE_ERRORS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                       "CUDA error: an illegal instruction", "misaligned address", "CUDA-capable device(s) is/are busy")

# Errors that say the kernel has no code for this machine: built without this GPU's architecture, or an op with no
# implementation registered for this device (a CPU-only or schema-only build). The build's fault, not the numerics'.
NOT_BUILT_FOR_THIS_MACHINE = re.compile(r"no kernel image is available for execution on the device"
                                        r"|Could not run '[^']+' with arguments from the '\w+' backend")

# Hypothesis profiles for cells, selectable with --plan-profile or hypothesis's own --hypothesis-profile.
# No deadline: the Triton interpreter and first-call compilation are slow by design. No "explain" phase:
# it re-runs the failing example under sys.settrace, which over the Triton interpreter takes minutes.
_COMMON = dict(deadline=None, report_multiple_bugs=False, print_blob=False,
               phases=[p for p in Phase if p != Phase.explain])
settings.register_profile("harness-dev", **_COMMON)
settings.register_profile("harness-ci", **_COMMON, derandomize=True, database=None)
settings.register_profile("harness-nightly", **_COMMON)
NIGHTLY_FACTOR = 5  # nightly runs draw this many times the plan's examples


@dataclass
class Outcome:
    """What running a cell gave: its record, whether the worker must be replaced, and a traceback to show.
    device_fault: the device faulted (the CUDA context is unusable), so hypothesis could not shrink here."""

    record: CellRecord
    fatal: bool = False
    traceback: str | None = None
    device_fault: bool = False
    # A failed cell's examples, the leading failure's first and then each more failure's (None where unknown), and
    # the leading one's input tensors as torch.save's bytes where small, else why not (harness.runtime.failures):
    # the run keeps them under reports/<op>/failures/ for `--replay`.
    failing: list[Example | None] = field(default_factory=list)
    inputs: bytes | None = None
    inputs_note: str = ""


CHUNK_ELEMENTS = 2**26  # outputs larger than this (int32-overflow examples) are compared a slice of tokens at a time


class KernelRaised(AssertionError):
    """The kernel (or its launcher) raised: reported with the exception and where it came from. `launch`: the
    interpreted launch it raised in, described for compiling it for the plan's GPUs (harness.runtime.gpu_compile)."""

    def __init__(self, message: str, launch: dict | None = None, raised_at: str = ""):
        super().__init__(message)
        self.launch, self.raised_at = launch, raised_at  # raised_at: the kernel's source line, where known


def hypothesis_settings(run: RunSettings, multiple_bugs: bool = False) -> settings:
    """`multiple_bugs`: shrink and report every distinct failure (by exception type and place), not the first only."""
    database = None if run.profile == "ci" or not run.database else DirectoryBasedExampleDatabase(run.database)
    return settings(settings.get_profile(f"harness-{run.profile}"), max_examples=run.examples, database=database,
                    report_multiple_bugs=multiple_bugs)


def exact_outputs(plan: Plan, reference, values: dict) -> dict:
    """The reference in fp64, for judging borderline failures."""
    up = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in values.items()}
    with torch.no_grad():
        return {k: v.double() for k, v in reference_outputs(plan, reference, up).items()}


def exception_text(exc: BaseException) -> str:
    """An exception's message, without the request torch appends to every TORCH_CHECK failure."""
    return str(exc).strip().replace("  (Could this error message be improved?  If so, please report an enhancement "
                                    "request to PyTorch.)", "")


def raised(exc: BaseException) -> str:
    """What a kernel raised, and where: in Triton's interpreter, at the line of the kernel's own source it raised
    at (not the interpreter's frame that wraps every error); else at the traceback's last frame."""
    if isinstance(exc, RaisedInEager) and exc.__cause__ is not None:
        return f"{raised(exc.__cause__)} (as in eager)"
    site = raise_site(exc)
    if site is not None:
        error = site.error
        if isinstance(error, OutOfBounds):  # its words name the kernel's line already
            return f"{type(error).__name__}: {exception_text(error)}"
        return f"at {site}: {no_variant(error) or f'{type(error).__name__}: {exception_text(error)[:500]}'}"
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {exception_text(exc)[:500]} ({shown_path(frame.filename)}:{frame.lineno})"


def _raised_in_source(message: str, exc: BaseException) -> KernelRaised:
    """KernelRaised with, where `exc` came from the kernel's source in Triton's interpreter, its launch described
    for compiling it for a GPU. Not for a device assertion that fired, nor an out-of-bounds access: a GPU meets those
    running, not compiling."""
    site = raise_site(exc)
    if site is None or isinstance(site.error, OutOfBounds) or (
            isinstance(site.error, AssertionError) and site.error.__traceback__ is not None and
            traceback.extract_tb(site.error.__traceback__)[-1].name == "create_assert"):
        return KernelRaised(message)
    launch = interpreted_launch(exc)
    return KernelRaised(message, describe_launch(*launch) if launch else None, site.source)


def kernel_error(exc: Exception, ex: Example, device: str) -> BaseException:
    """What a user reads when the kernel raises: out of memory in words, else the exception and where. Where this
    machine, not the kernel, is at fault (memory other processes hold, a library's stand-in, a build with no code
    for this GPU), a NotRunHere. A RaisedInEager (a torch_compile cell's kernel raised, as its eager cell's does)
    reads as its eager cell's reason."""
    said, exc = exc, exc.__cause__ if isinstance(exc, RaisedInEager) and exc.__cause__ is not None else exc
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    where = f"{shown_path(frame.filename)}:{frame.lineno}"
    text = exception_text(exc)
    library = stand_in_library(exc)
    if library:
        return NotRunHere(f"{library} cannot run on this machine (the kernel ran against a stand-in for it: "
                          f"{type(exc).__name__}: {text.splitlines()[0][:300]}; {where})")
    if NOT_BUILT_FOR_THIS_MACHINE.search(text):
        return NotRunHere(f"the kernel as built has no code for this {device} (rebuild it for this GPU's "
                          f"architecture): {type(exc).__name__}: {text.splitlines()[0][:300]} ({where})")
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text \
            or "not enough memory" in text.lower():
        elsewhere = memory_held_elsewhere(text)
        if elsewhere:
            return NotRunHere(elsewhere, out_of_memory=True)
        return KernelRaised(f"out of memory at {ex.describe()}: the kernel asked for more memory than the {device} "
                            f"has ({text.splitlines()[0][:300]}; {where})")
    return _raised_in_source(f"the kernel raised {raised(said)}", exc)


class Inconclusive(BaseException):
    """The kernel used a construct Triton's interpreter cannot compute as a GPU does: the cell says nothing of the
    kernel on this machine. A BaseException, so that hypothesis stops at once instead of shrinking it."""


class NotRunHere(Inconclusive):
    """This machine failed the example, not the kernel: the GPU's memory held by other processes (`out_of_memory`:
    the example is tried once more with caches freed), or a library that cannot run here. Not run here, never failed."""

    def __init__(self, reason: str, out_of_memory: bool = False):
        super().__init__(reason)
        self.out_of_memory = out_of_memory


class CellCheck:
    """Checks one example: the op in the cell's graph mode against the reference."""

    def __init__(self, plan: Plan, cell: Cell, device: str):
        self.plan, self.cell, self.device = plan, cell, device
        # KernelUnavailable: not run here
        self.kernel, self.reference = load_implementation(plan, cell.provider), resolve(plan).reference
        self.runner = make_runner(cell.graph_mode, plan, self.kernel, device)
        self.tol = tolerance_for(plan, cell.dtype)
        self.stats = Stats()
        self.accumulation = accumulation.Readings(plan.op.reduction)
        sixteen_bit = plan.op.accumulation == "fp32" and cell.dtype in ("fp16", "bf16")
        self.accumulation_note = accumulation.NOT_ON_CPU if sixteen_bit and device != "cuda" and \
            plan.op.reduction != "row_scale" else None
        self.accumulation_checked = sixteen_bit and self.accumulation_note is None
        self.one_rank = cell.tp == 1  # the checks of one call's buffers (TPCheck: the ranks hold them)
        # vLLM's hazards no value comparison sees, each on the cells its registry entry names
        self.hazards = [kind(plan, cell, device, self.kernel) for module, kind in (
            (determinism, determinism.Determinism), (padding, padding.PaddingIsolation),
            (batch_invariance, batch_invariance.BatchInvariance)) if module.applies(plan, cell)]
        # run_examples: tells the worker's parent which example a call is of, so that a crash in a check's call of a
        # larger batch (batch invariance, the padded launch) is that example's, not the one being checked
        self.announce: Callable[[Example], None] = lambda ex: None
        self.count = 0
        self.last_failure: tuple[Example, BaseException] | None = None
        self.passing = InputsSeen()  # what the examples that passed looked like
        self.failed_on: dict[int, Example] = {}  # id of each exception raised -> its example

    def __call__(self, ex: Example) -> None:
        try:
            self._check(ex)
        except BaseException as exc:
            self.last_failure = (ex, exc)
            self.failed_on[id(exc)] = ex
            raise
        self.passing.add(ex.num_tokens, ex.sizes, example_layouts(self.plan, ex))

    def _call(self, values: dict, ex: Example):
        return self._guarded(lambda: self.runner(values, ex), ex)

    def _guarded(self, run, ex: Example, of: Example | None = None):
        """`run()`, a call of the kernel for `ex`, with what it raises said as the cell's own call says it; `of`: the
        example the call really makes where a check calls at other sizes than `ex`'s (announced first)."""
        if of is not None:
            self.announce(of)
            ex = of
        try:
            return run()
        except Mismatch:
            raise
        except Exception as exc:
            if unfaithful(exc):
                raise Inconclusive(f"inconclusive on a CPU machine: {unfaithful(exc)} (at {ex.describe()})") \
                    from None
            raise kernel_error(exc, ex, self.device) from None

    def _check(self, ex: Example) -> None:
        """One example through every check that applies to the cell (harness.results.checks), in one sequence for
        tp1 and tensor-parallel cells alike: the outputs (TPCheck: recombined from the ranks) against the
        reference, then on one rank the accumulation, the inputs left unchanged, the returned buffers and vLLM's
        hazards (determinism, padding isolation, batch invariance: each on a few examples of the cell)."""
        plan = self.plan
        self.count += 1
        values = build_args(plan, self.cell, ex, self.device)
        expected = reference_outputs(plan, self.reference, values)
        untouched = {a.name: values[a.name].clone() for a in plan.tensor_args if self.one_rank and
                     a.role == "input" and a.name not in plan.op.mutates and a.name not in ex.omitted}
        inputs = {**values, **{n: values[n].clone() for n in plan.op.mutates}}  # as drawn, for the fp64 tie-break
        actual, returned = self._outputs(values, ex)
        self._values(actual, expected, inputs, returned)
        if self.accumulation_checked:
            self._accumulation(actual, expected, inputs)
        for name, before in untouched.items():
            numerics.check_unchanged(name, before, values[name])
        if self.one_rank and plan.returned_outputs:
            self._returned_buffers(actual, ex)
        for hazard in self.hazards:  # after the checks of this call's own buffers: they make calls of their own
            hazard.check(ex, actual, partial(self._guarded, ex=ex, of=ex))  # each call announced: its own time limit
            if hazard.unsteady:  # bits that change from call to call tell nothing of padding or batches
                break

    def _outputs(self, values: dict, ex: Example) -> tuple[dict, object]:
        """The op's outputs by name, and what the call returned."""
        returned = self._call(values, ex)
        return kernel_outputs(self.plan, values, returned), returned

    def _values(self, actual: dict, expected: dict, inputs: dict, returned) -> None:
        plan = self.plan
        for name in plan.op.outputs:
            try:
                self.compare(name, actual[name], expected[name], inputs,
                             self.one_rank and name in plan.returned_outputs)
            except Mismatch as exc:
                if self.one_rank and name in plan.op.mutates and name not in plan.returned_outputs and \
                        isinstance(actual[name], torch.Tensor) and isinstance(expected[name], torch.Tensor):
                    tol = output_tolerance(plan, self.cell.dtype, name, SHORT_NAMES.get(expected[name].dtype))
                    exc.message += "; " + in_place_reason(name, actual[name], inputs[name], returned,
                                                          expected[name], tol)
                raise

    def _accumulation(self, actual: dict, expected: dict, inputs: dict) -> None:
        plan = self.plan
        if max((t.numel() for t in actual.values() if isinstance(t, torch.Tensor)), default=0) > \
                accumulation.MAX_ELEMENTS:
            return
        truth = exact_outputs(plan, self.reference, inputs)
        for name in plan.op.outputs:
            if not plan.quantization.of(name):
                self.accumulation.check(name, actual[name], expected[name], truth[name])

    def _returned_buffers(self, actual: dict, ex: Example) -> None:
        """A returned tensor must still hold its result after the next call, on other inputs (no cached output
        buffer): bit for bit, since what it held has passed already (a tolerance here would fail a result the fp64
        tie-break accepted)."""
        plan = self.plan
        held = {n: actual[n].clone() for n in plan.returned_outputs if isinstance(actual[n], torch.Tensor)}
        self._call(build_args(plan, self.cell, replace(ex, seed=ex.seed + 1), self.device), ex)
        for name, before in held.items():
            after = actual[name]
            if not numerics.bits_equal(before, after):
                # A buffer resized in place between the calls has no element-wise count to give.
                changed = f"{int((numerics.ordered(before) != numerics.ordered(after)).sum())} of " \
                    f"{before.numel()} elements" if after.shape == before.shape else \
                    f"its shape {tuple(before.shape)} became {tuple(after.shape)}"
                raise Mismatch(f"output '{name}' changed when the op was called again on other inputs "
                               f"({changed}): it returns a buffer it reuses across calls")

    def compare(self, name, actual, expected, values, returned: bool) -> None:
        if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor) and actual.dim() > 0 and \
                actual.shape == expected.shape and actual.dtype == expected.dtype and actual.numel() > CHUNK_ELEMENTS:
            # An int32-overflow example: compared in slices of tokens, as the comparison's fp64 copies of the whole
            # output would not fit beside it (no fp64 tie-break there: it re-runs the reference on every input)
            rows = max(1, CHUNK_ELEMENTS // max(1, actual[0].numel()))
            for start in range(0, actual.shape[0], rows):
                compare_judged(self.plan, self.reference, self.cell.dtype, self.stats, name,
                               actual[start:start + rows], expected[start:start + rows], values, False, tie_break=False)
            return
        compare_judged(self.plan, self.reference, self.cell.dtype, self.stats, name, actual, expected, values,
                       returned)


def example_layouts(plan: Plan, ex: Example) -> dict[str, tuple[str, int | None]]:
    """Per tensor input, its layout as built and, where strided, its row stride in elements (None: not known)."""
    sizes = {**ex.sizes, "num_tokens": ex.num_tokens}
    out = {}
    for name, (layout, pad) in ex.layouts.items():
        shape = plan.arg(name).shape
        known = all(d.names <= set(sizes) for d in shape[:-1])
        rows = math.prod(d.size(sizes) for d in shape[:-1]) if known else 2
        # in_layout pads tensors of 2 dims and more only, and a single padded row is contiguous all the same
        if layout != "strided" or len(shape) < 2 or rows < 2:
            out[name] = ("contiguous", None)
        else:
            out[name] = ("strided", shape[-1].size(sizes) + pad if shape[-1].names <= set(sizes) else None)
    return out


def not_run(cell: Cell, reason: str) -> Outcome:
    """A cell this machine cannot run after all (vLLM's kernel not loadable here), with why."""
    return Outcome(CellRecord(**cell.axes(), status=Status.NOT_RUN, reason=reason))


def compare_judged(plan: Plan, reference, dtype: str, stats: Stats | None, name: str, actual, expected, values: dict,
                   returned: bool, tie_break: bool = True) -> float | None:
    """Compare one output (Mismatch if it fails) with its own tolerance: quantized outputs in their quantized
    domain (returning the fraction of elements one step from the reference), the rest by value, a borderline
    failure judged against the fp64 reference (run on `values`, the inputs as drawn), and any value failure
    diagnosed from it and from op.native's output (harness.runtime.numerics.diagnosis)."""
    if plan.quantization.of(name):
        return compare_quantized(name, actual, expected, plan.quantization.max_step_fraction, stats)
    tol = output_tolerance(plan, dtype, name, SHORT_NAMES.get(getattr(expected, "dtype", None)))
    try:
        compare(name, actual, expected, tol, stats, check_strides=returned)
    except Mismatch:
        if not tie_break or not isinstance(actual, torch.Tensor) or actual.shape != expected.shape \
                or actual.dtype != expected.dtype:
            raise
        exact = exact_outputs(plan, reference, values)[name]
        compare(name, actual, expected, tol, None, exact64=exact, check_strides=returned,
                native=partial(native_output, plan, values, name))
    return None


def native_output(plan: Plan, values: dict, name: str) -> torch.Tensor | None:
    """op.native's output on the inputs as drawn, for a failure's diagnosis: None where the plan names none or it
    cannot run here (vLLM's forward_native without vLLM), and the diagnosis rests on fp64 alone."""
    if not plan.op.native:
        return None
    try:
        with torch.no_grad():
            return reference_outputs(plan, resolve(plan).native, values)[name]
    except Exception:  # the diagnosis is words: a native path that fails here must not change the failure
        return None


def _no_progress(event: str, **details) -> None:
    pass


def lead_and_more(exc: BaseException) -> tuple[BaseException, list[BaseException]]:
    """The failure a cell's record leads with and its other distinct failures, from what hypothesis raised: one
    exception; a FlakyFailure (failed once, not on its replay): its first; or a group of distinct failures (by
    exception type and place: hypothesis's report_multiple_bugs), listing generated examples' failures from the most
    complex example to the simplest and explicit examples' in the order they ran. The simplest generated failure
    leads (the one hypothesis reported alone before every distinct failure was kept), or the first explicit
    example's (the one that stopped the explicit examples then). A flaky member stands for its first failure."""
    if not isinstance(exc, BaseExceptionGroup) or not exc.exceptions:
        return exc, []
    if isinstance(exc, FlakyFailure):
        return exc.exceptions[0], []
    members = [e.exceptions[0] if isinstance(e, FlakyFailure) and e.exceptions else e for e in exc.exceptions]
    if "explicit example" not in exc.message:
        members.reverse()
    return members[0], members[1:]


def run_examples(plan: Plan, cell: Cell, check: CellCheck, run: RunSettings, tp_multiple: dict | None = None,
                 start: float | None = None, progress=None, replay: Example | None = None) -> Outcome:
    """Draw the cell's examples with hypothesis and check each; the minimal failure ends up in the record.

    `progress(event, **details)` hears "example" (example=...) before and "finished" (failed=...,
    device_fault=...) after each example: a worker's parent times the cell per example with it, and knows
    which example faulted (harness.runtime.workers).
    `replay`: check this one example instead of drawing any (replaying a fault with a smaller input)."""
    start = time.monotonic() if start is None else start
    device = check.device
    progress = progress or _no_progress
    clock = ShrinkClock(device)  # on a CPU machine, shrinking a failure is capped in time
    check.announce = lambda made: progress("example", example=made)

    def test(ex):
        clock.admit(ex)
        progress("example", example=ex)
        try:
            retry = False
            try:
                check(ex)
            except (NotRunHere, torch.OutOfMemoryError) as exc:  # the kernel's own OOM is a KernelRaised
                if isinstance(exc, NotRunHere) and not exc.out_of_memory:
                    raise
                retry = True
            if retry:  # memory held by others or by this process's caches: once more with them freed
                check.last_failure = None  # it held the failed call's tensors
                free_device_memory()
                check(ex)
        except BaseException as exc:
            clock.failed(ex)
            faulted = device == "cuda" and any(s in str(exc) for s in FATAL_DEVICE_ERRORS)
            progress("finished", failed=True, device_fault=faulted)
            raise
        progress("finished", failed=False)

    # A distinct name per plan and cell gives each cell its own entry in hypothesis's example database.
    test.__name__ = test.__qualname__ = re.sub(r"\W", "_", f"{plan.op.name}__{cell.id}")
    required, required_facts = required_examples(plan, cell, device) if replay is None and not tp_multiple \
        else ([], {})
    if replay is None:
        test = given(examples(plan, cell, device, tp_multiple))(test)
        for ex in required:  # past each size-selected path, at int32-overflow sizes: checked before any draw
            test = example(ex)(test)
        # Every distinct failure is shrunk and kept, so that one (a degenerate size, hidden=1; a size a provider
        # refuses) does not hide another (wrong values from some width on; a strided input read wrong): a provider's
        # cells find what it accepts, the kernel's say every way it fails. Not the kernel's memcheck cells: each of
        # their examples costs seconds under compute-sanitizer, and their first error is what they report.
        test = hypothesis_settings(run, multiple_bugs=bool(cell.provider) or cell.graph_mode != "memcheck")(test)
    else:
        test = partial(test, replay)
    rec = CellRecord(**cell.axes(), status=Status.PASSED)
    device_fault = False
    shrunk = {}  # a minimal failure walked on past hypothesis's
    failing_examples: list[Example | None] = []  # the leading failure's example, then each more failure's
    try:
        test()
    except Inconclusive as exc:  # not failed: a GPU judges this cell (README: inconclusive on a CPU machine), or
        rec.status, rec.reason = Status.NOT_RUN, str(exc)  # a machine whose memory others hold (NotRunHere)
    except Exception as exc:  # hypothesis re-raises the minimal example's failure, or a group of distinct ones
        exc, more = lead_and_more(exc)
        for e in (exc, *more):  # NaN in an output the kernel allocates: worded from a call with it poisoned
            if id(e) in check.failed_on and (words := allocated_nan_words(check, check.failed_on[id(e)], e)):
                e.message = words
        failing_examples = [check.failed_on.get(id(e)) for e in (exc, *more)]
        rec.status = Status.FAILED
        rec.more_failures = [Failure(str(e).strip() or type(e).__name__,
                                     check.failed_on[id(e)].describe() if id(e) in check.failed_on else None)
                             for e in more] or None
        elsewhere = memory_held_elsewhere(str(exc))
        if elsewhere:  # out of memory outside the kernel call (its inputs, the reference) or on a TP rank: not its
            rec.status, rec.reason, rec.more_failures = Status.NOT_RUN, elsewhere, None
        elif isinstance(exc, HypothesisException):
            rec.reason = f"hypothesis: {exc}"
        else:
            failing = (check.failed_on[id(exc)],) if id(exc) in check.failed_on else check.last_failure
            reason = str(exc).strip() or type(exc).__name__
            if device == "cuda" and any(s in reason for s in FATAL_DEVICE_ERRORS):
                device_fault = True
                # CUDA reports a fault at the next sync, often outside the kernel call: say it in words
                reason = (f"the kernel faulted on the device: {reason.splitlines()[0]} (the CUDA context is "
                          "unusable after this; later cells run in a fresh worker)")
            if isinstance(exc, KernelRaised) and exc.launch and not tp_multiple:
                # once, for the minimal example's launch: hypothesis raised in many more while shrinking
                limit = min(COMPILE_LIMIT_S, plan.numerics.timeout_s / 2)  # within the worker's limit per example
                words = compile_words(exc.launch, gpu_archs(plan.matrix["sm"]), limit, exc.raised_at)
                reason += f"; {words}" if words else ""
            rec.reason = reason
            rec.minimal_example = failing[0].describe() if failing else None
            failing_examples[0] = failing[0] if failing else None
            if isinstance(exc, Mismatch) and exc.stats:
                rec.error = exc.stats
            if isinstance(exc, Mismatch) and failing and replay is None and not tp_multiple \
                    and not check.passing.examples:
                smaller, its_failure = shrink_below_phase(plan, cell, check, failing[0], exc)
                if smaller != failing[0]:  # the reason and error then are those of the smaller example
                    if words := allocated_nan_words(check, smaller, its_failure):
                        its_failure.message = words
                    failing_examples[0] = smaller
                    rec.minimal_example, rec.reason = smaller.describe(), str(its_failure).strip()
                    rec.error = its_failure.stats or rec.error
                    shrunk = {"shrunk on": {"from": failing[0].describe(), "to": smaller.describe(),
                                                     "why": "every example drawn failed, so the walk went on past "
                                                            "the sizes hypothesis draws for this phase"}}
    if rec.status == Status.FAILED and clock.stopped:
        rec.reason += f"; {clock.note()}"
    if rec.status == Status.FAILED and rec.more_failures:
        rec.reason += more_failures_words(rec.more_failures)
    outcome = Outcome(rec, fatal=device_poisoned(rec.reason, device), device_fault=device_fault,
                      failing=failing_examples if rec.status == Status.FAILED else [])
    if outcome.failing and outcome.failing[0] is not None and replay is None and not outcome.fatal \
            and cell.graph_mode != "memcheck":  # memcheck's process keeps its record alone
        outcome.inputs, outcome.inputs_note = saved_inputs(plan, cell, outcome.failing[0], device)
    cap = token_cap(plan, {sym: max(v) for sym, v in plan.sizes.items()}, device)
    rec.examples = check.count
    rec.duration_s = round(time.monotonic() - start, 3)
    rec.tolerance = Tolerance(check.tol.atol, check.tol.rtol)
    rec.facts = {**check.runner.facts, **({"token_cap": cap} if cap else {}), **required_facts, **shrunk}
    if cell.dtype == "fp32" and (precision := fp32_dot_precision(check.kernel)):
        rec.facts["fp32 dots"] = precision
    said = check.accumulation.verdict() or check.accumulation_note
    rec.facts.update({"accumulation": said} if said else {})
    rec.readings = dict(check.accumulation.values) or None
    unsteady = any(h.unsteady for h in check.hazards)
    rec.facts.update({h.name: said if h.unsteady or not unsteady else determinism.UNDECIDED
                      for h in check.hazards if (said := h.fact())})
    rec.passing = check.passing if check.passing.examples else None
    if not plan.contract.empty:  # what the inputs were drawn within (results outlive a plan's edits)
        rec.facts["contract"] = plan.contract.describe()
    rec.error = rec.error or check.stats.record()
    return outcome


def run_cell(task: CellTask, progress=None) -> Outcome:
    """Run one tp1 cell's hypothesis examples in this process (or only `task.replay`); `progress` as in
    run_examples."""
    start = time.monotonic()
    plan, cell = task.plan, task.cell
    try:
        check = CellCheck(plan, cell, detect().device)
    except KernelUnavailable as exc:
        return not_run(cell, str(exc))
    if task.fault_replay:  # a crash of the replayed example's own call is what is confirmed, not one of a probe's
        check.hazards = []
    return run_examples(plan, cell, check, task.run, start=start, progress=progress, replay=task.replay)


def shrink_example(plan: Plan, cell: Cell, ex: Example, reproduces, tp_multiple: dict | None = None,
                   token_floor: int | None = None) -> Example:
    """The smallest example near `ex` that still reproduces a fault, for a fault hypothesis could not shrink
    (it killed the worker, or poisoned its device). Field by field (the token counts, each size,
    each input's row padding, the value scale), bisects toward the field's smallest value this cell could
    draw, keeping a candidate only when `reproduces(candidate)` (a replay in a fresh worker) says it faults
    too; repeats while a pass gains. `reproduces` answers False once its budget is spent, so this always
    ends with a reproducing example: `ex` itself when nothing smaller does. `token_floor`: the fewest tokens
    tried (by default the phase's fewest)."""
    tp_multiple = tp_multiple or {}

    def faults(candidate: Example) -> bool:  # outside the kernel's contract: never drawn, so never tried
        return within_contract(plan, candidate) and reproduces(candidate)

    best = ex

    def bisect(values, make) -> bool:
        """`values` ascending, the last one `best`'s: move `best` to the smallest that reproduces."""
        nonlocal best
        if len(values) < 2:
            return False
        low, high = 0, len(values) - 1  # values[high] reproduces
        cand = make(values[0])
        if faults(cand):
            best = cand
            return True
        while high - low > 1:
            mid = (low + high) // 2
            cand = make(values[mid])
            if faults(cand):
                high, best = mid, cand
            else:
                low = mid
        return high < len(values) - 1

    gained = True
    while gained:
        gained = False
        n, decode = best.num_tokens, best.decode_tokens
        if decode:  # chunked prefill: the prefill chunk, then the decode tokens; at least one of each
            gained |= bisect(range(1, n - decode + 1), lambda c: replace(best, num_tokens=best.decode_tokens + c))
            chunk = best.num_tokens - best.decode_tokens
            gained |= bisect(range(1, best.decode_tokens + 1),
                             lambda d: replace(best, num_tokens=d + chunk, decode_tokens=d))
        else:
            low = token_floor or (min(plan.numerics.prefill_tokens[0], n) if cell.phase == "prefill" else 1)
            gained |= bisect(range(low, n + 1), lambda k: replace(best, num_tokens=k))
        sizes = {}  # size symbol -> the values this cell could draw up to the current one, ascending
        for sym in sorted(best.sizes):
            v, m = best.sizes[sym], math.lcm(tp_multiple.get(sym, 1), plan.contract.size_step(sym, plan.args))
            drawn = {c for c in plan.sizes.get(sym, ()) if c % m == 0 and c < v}  # as inputs.size_values draws
            spec = plan.op.sizes.get(sym)
            awkward = plan.numerics.awkward_sizes if spec is None or spec.awkward is None else spec.awkward
            if awkward and not (spec and spec.divides):  # a symbol drawn without awkward sizes shrinks without them
                drawn |= set(range(m, v, 2 * m))
            sizes[sym] = sorted(c for c in drawn if plan.contract.allows_size(sym, c, plan.args)) + [v]
        layouts = {}  # input -> its layouts from the smallest padding up to the current one
        for name, (layout, pad) in sorted(best.layouts.items()):
            plain = [("contiguous", 0)] if "contiguous" in plan.arg(name).layouts else []
            strided = [("strided", p) for p in range(1, pad + 1)]
            layouts[name] = plain + strided if layout == "strided" else [(layout, 0)]
        # Often only the token count matters: every other field at its smallest at once, in one replay.
        floor = replace(best, sizes={sym: values[0] for sym, values in sizes.items()},
                        layouts={name: steps[0] for name, steps in layouts.items()}, scale="normal")
        if floor != best and faults(floor):
            best, gained = floor, True
            continue
        for sym, values in sizes.items():
            gained |= bisect(values, lambda k, sym=sym: replace(best, sizes={**best.sizes, sym: k}))
        for name, steps in layouts.items():
            gained |= bisect(steps, lambda lp, name=name: replace(best, layouts={**best.layouts, name: lp}))
        if best.scale != "normal":
            gained |= bisect(["normal", best.scale], lambda sc: replace(best, scale=sc))
    return best


# Walking on past hypothesis's minimal failure: at most this many checks, or this many seconds.
BELOW_PHASE_CHECKS = 16
BELOW_PHASE_BUDGET_S = 30.0


def shrink_below_phase(plan: Plan, cell: Cell, check: CellCheck, ex: Example,
                       failure: Mismatch) -> tuple[Example, Mismatch]:
    """When every example failed, the smallest example that still fails alike, down to one token, and its
    mismatch: hypothesis stops at the smallest size the phase draws (a prefill's first token count), a reproducer
    need not. Checked in this process (a mismatch leaves the worker sound); alike means the same output's
    mismatch."""
    started, budget = time.monotonic(), [BELOW_PHASE_CHECKS]
    what = str(failure).split(":", 1)[0]
    seen = {ex.describe(): failure}  # each reproducing example's mismatch

    def reproduces(candidate: Example) -> bool:
        if budget[0] <= 0 or time.monotonic() - started > BELOW_PHASE_BUDGET_S:
            return False
        budget[0] -= 1
        try:
            check(candidate)
        except Mismatch as exc:
            if str(exc).split(":", 1)[0] != what:
                return False
            seen[candidate.describe()] = exc
            return True
        except Exception:
            return False
        return False

    count = check.count  # the cell's examples are those hypothesis drew
    smaller = shrink_example(plan, cell, ex, reproduces, token_floor=1)
    check.count, check.last_failure = count, None  # it held the last candidate's tensors
    return smaller, seen[smaller.describe()]


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
