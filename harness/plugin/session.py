"""The run of one plan under pytest: its items (numerics cells, benchmarks, vLLM integration), their records, the
report.

Registered by harness.plugin only when `--plan` is given. Data flows one way: plan -> cells (items)
-> results file -> report. Every item that runs a kernel runs it in an isolated worker
(harness.runtime.workers), so a kernel that crashes, hangs or poisons the device fails its own item only.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings
from tabulate import tabulate

from harness.runtime.bench import BenchOutcome, BenchSpec, bench_specs, check_models, not_run_record, precompile, \
    prepare_benchmarks, run_benchmark, skip_reason
from harness.runtime.device import detect, provenance, use_triton_interpreter
from harness.runtime.interpreter import make_faithful
from harness.runtime.memcheck import run_memcheck, sanitizer
from harness.integration.routes import LAYER_DTYPES, MAX_EXAMPLES, integration_routes, run_integration_item
from harness.plugin.vllm_items import MARKERS as VLLM_RUN_MARKERS, vllm_run_items
from harness.spec.matrix import Cell, Decision, decide, expand, pairwise_sample
from harness.runtime.check_code import plan_code_warnings
from harness.spec.load import load_plan
from harness.spec.plan import Plan, PlanError
from harness.rendering.plots import draw_plots
from harness.decisions.verdicts import SmVerdict, sm_verdicts, verdict
from harness.rendering.report import write_report
from harness.results.merge import collect
from harness.results.store import BenchRecord, CellRecord, IntegrationRecord, Recorder, Status
from harness.runtime.runner import NIGHTLY_FACTOR, Outcome, RunSettings, run_cell, shrink_example
from harness.runtime.tasks import BenchTask, CellTask, IntegrationTask
from harness.runtime.timing import Timing
from harness.runtime.tp import run_cell_on_rank, tp_multiples
from harness.runtime.vllm_kernels import LIBRARY_ENV, vllm_missing
from harness.spec.vllm_ops import unsupported
from harness.runtime.shrinking import shrink_fault
from harness.runtime.workers import Fault, Worker, WorkerGroup


@dataclass
class Session:
    """What the items of one run share."""

    plan: Plan
    plan_path: Path
    profile: str
    examples: int
    op_dir: Path
    isolation: str
    max_cpu_ranks: int
    database: str
    cells: str = "all"  # all | sampled (--cells)
    recorder: Recorder | None = None
    workers: dict = field(default_factory=dict)  # "kernels" / "vllm" -> Worker; tp size -> WorkerGroup
    memchecks: dict[str, Future] = field(default_factory=dict)  # cell id -> its memcheck run, started early
    memcheck_pool: ThreadPoolExecutor | None = None
    # (phase, tp) -> the examples earlier cells' faults shrank to: a later cell's fault is often the same one
    fault_minimals: dict[tuple, list] = field(default_factory=dict)
    precompiled: str = ""  # precompile's line, once the first benchmark item has run it
    gpu_turn: object = None  # the open lock file while this run holds the GPU (HARNESS_GPU_TURN)
    report_path: Path | None = None
    report_problems: list = field(default_factory=list)
    verdict: str = ""  # the report's verdict line, and per SM
    verdicts: list[SmVerdict] = field(default_factory=list)
    stale: str = ""  # how many records other checks made, said at the end (Merged.stale_summary)
    plan_warnings: list[str] = field(default_factory=list)  # file:line: what the plan leaves idle, said at the end
    # Whether the kernel killed its worker in every numerics cell so far, and per vLLM route the first item whose
    # worker it killed: such a kernel's later items of that route are not run (each would cost a worker and vLLM's
    # import, to crash again), so a plan whose kernel faults everywhere costs about what a passing one does.
    cells_killed: int = 0
    cells_survived: int = 0
    route_faults: dict[str, str] = field(default_factory=dict)

    def run_settings(self, examples: int | None = None) -> RunSettings:
        return RunSettings(examples=examples or self.examples, profile=self.profile, database=self.database)

    def worker(self, key) -> Worker | WorkerGroup:
        if key not in self.workers:
            self.workers[key] = WorkerGroup(key) if isinstance(key, int) else Worker()
        return self.workers[key]

    def record(self, section: str, key: str, rec, defer: bool = False) -> None:
        rec.finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.recorder.record(section, key, rec, defer)

    def stop_workers(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        if self.memcheck_pool:  # memcheck runs not started yet are dropped; running ones end by their time limit
            self.memcheck_pool.shutdown(wait=False, cancel_futures=True)


_SESSION = pytest.StashKey[Session]()

# A lock file the benchmark runs of several plans take turns on (scripts/gpu_run.sh bench starts the next plan while
# one is timed): a run holds it from its first benchmark item to its last record, so no other process times on the
# GPU meanwhile, while the next run's start (interpreter, collection, its timing process's CUDA context and vLLM's
# library) and the last run's report overlap the timed items. Unset: a run times whenever it gets there.
GPU_TURN_ENV = "HARNESS_GPU_TURN"


def take_gpu_turn(s: Session) -> None:
    path = os.environ.get(GPU_TURN_ENV)
    if path and s.gpu_turn is None:
        s.gpu_turn = open(path, "a")  # released when closed, or when the process ends in any way
        fcntl.flock(s.gpu_turn, fcntl.LOCK_EX)


def session_of(config) -> Session:
    return config.stash[_SESSION]


def pytest_configure(config):
    use_triton_interpreter()  # before the plan's kernels import triton: on CPUs they run in its interpreter
    make_faithful()  # ... computing what a GPU computes, in this process too (--isolation none)
    library = config.getoption("--vllm-ops-library")
    if library:
        os.environ[LIBRARY_ENV] = str(Path(library).resolve())  # workers inherit it
    plan_path = Path(config.getoption("--plan")).resolve()
    try:
        plan = load_plan(plan_path)
        plan_warnings = [*plan.warnings, *plan_code_warnings(plan)]  # a bad import path: a usage error, at its line
        if config.getoption("--bench"):
            check_models(plan)
    except PlanError as exc:
        raise pytest.UsageError(f"invalid plan: {exc}") from None
    for values in plan.matrix.values():
        for v in values:
            config.addinivalue_line("markers", f"{f'tp{v}' if isinstance(v, int) else v}: cells with this matrix value")
    config.addinivalue_line("markers", "bench: benchmark items (collected with --bench)")
    for line in VLLM_RUN_MARKERS:
        config.addinivalue_line("markers", line)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(plan_path)]  # `pytest --plan X` alone collects the plan, not the test suite
    profile = config.getoption("--plan-profile") or _hypothesis_profile() or ("ci" if os.environ.get("CI") else "dev")
    examples = config.getoption("--examples") or \
        plan.numerics.examples * (NIGHTLY_FACTOR if profile == "nightly" else 1)
    reports = Path(config.getoption("--reports-dir") or config.rootpath / "reports")
    cells = config.getoption("--cells") or ("all" if profile == "nightly" else "sampled")
    config.stash[_SESSION] = Session(plan, plan_path, profile, examples, reports / plan.name,
                                     config.getoption("--isolation"), config.getoption("--max-cpu-ranks"),
                                     str(config.rootpath / ".hypothesis" / "examples"), cells=cells,
                                     plan_warnings=plan_warnings)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    xdist_controller = bool(getattr(config.option, "numprocesses", None)) and not _xdist_worker(config)
    if config.getoption("--bench") and not config.option.collectonly and not xdist_controller:
        # The benchmark process imports torch, makes its CUDA context and loads vLLM's library (seconds) while
        # this one starts the session and collects.
        session_of(config).worker("kernels").start(prepare=(prepare_benchmarks, plan))


def _hypothesis_profile() -> str | None:
    """The harness profile chosen with hypothesis's own --hypothesis-profile harness-<name>, if any."""
    current = getattr(settings, "get_current_profile_name", None)  # hypothesis >= 6.1xx; older ones: no choice
    name = current() if current else ""
    return name.removeprefix("harness-") if name.startswith("harness-") else None


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")  # pytest then finishes the session: results kept, report written


def pytest_collect_file(file_path: Path, parent):
    if file_path.resolve() == session_of(parent.config).plan_path:
        return PlanFile.from_parent(parent, path=file_path)
    return None


class PlanFile(pytest.File):
    def collect(self):
        s = session_of(self.config)
        plan, hw = s.plan, detect()
        for cell in expand(plan):
            decision = decide(plan, cell, hw, s.max_cpu_ranks)
            item = CellItem.from_parent(self, name=f"numerics[{cell.id}]", cell=cell, decision=decision)
            for axis, value in cell.axes().items():
                item.add_marker(f"tp{value}" if axis == "tp" else value)
            if decision.expects_failure:
                item.add_marker(pytest.mark.xfail(reason=decision.reason, strict=True))
            yield item
        yield from self._integration_items(plan, hw)
        yield from vllm_run_items(self, plan, hw.sm, s)  # vLLM's fusion passes; a running engine
        if self.config.getoption("--bench"):
            for spec in bench_specs(plan, hw.sm):
                item = BenchItem.create(self, spec, skip_reason(plan, spec, hw, s.max_cpu_ranks))
                for marker in ("bench", spec.phase, spec.dtype, spec.graph_mode, spec.sm):
                    item.add_marker(marker)
                yield item

    def _integration_items(self, plan: Plan, hw):
        """One per (route, phase, dtype) on this machine's SM, for plans whose `vllm:` section names a route the harness
        drives (a kernel that is vLLM's own is in vLLM already; the page says why other routes are not proven)."""
        if hw.sm not in plan.matrix["sm"]:
            return
        for route in integration_routes(plan):
            for phase in plan.matrix["phase"]:
                for dtype in [d for d in plan.matrix["dtype"] if d in LAYER_DTYPES]:
                    cell = Cell(phase, dtype, 1, "eager", hw.sm)
                    decision = decide(plan, cell, hw, session_of(self.config).max_cpu_ranks)
                    item = VllmItem.from_parent(self, name=f"vllm-{route}[{phase}-{dtype}-{hw.sm}]", cell=cell,
                                                route=route, decision=decision)
                    item.add_marker(phase)
                    item.add_marker(dtype)
                    if decision.expects_failure:
                        item.add_marker(pytest.mark.xfail(reason=decision.reason, strict=True))
                    yield item


class ItemFailed(Exception):
    """An item's failure, shown as its message (no traceback: the message says what to do)."""


class PlanItem(pytest.Item):
    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ItemFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        # Line 0 (the plan file's first line), not None: pytest places a skip by marker (--benchmark-skip,
        # --benchmark-only, -m with skipif) at the item's line, and asserts there is one.
        return self.path, 0, f"{self.parent.name}::{self.name}"


def _expected(decision: Decision, status: Status) -> Status:
    """A plan's expected failure turns failed into xfail and passed into xpass."""
    if not decision.expects_failure or status not in (Status.FAILED, Status.PASSED):
        return status  # a cell not run after all stays not run
    return Status.XFAIL if status == Status.FAILED else Status.XPASS


class CellItem(PlanItem):
    def __init__(self, *, cell: Cell, decision: Decision, **kwargs):
        super().__init__(**kwargs)
        self.cell, self.decision, self.outcome = cell, decision, None
        self.sampled_out = ""  # why the run's sample left this cell out (pytest_collection_finish)

    def setup(self):
        if not self.decision.runs:
            pytest.skip(self.decision.reason)
        if self.sampled_out:
            pytest.skip(self.sampled_out)

    def runtest(self):
        s = session_of(self.config)
        if self.cell.graph_mode == "memcheck":  # a process of its own, under compute-sanitizer
            started = s.memchecks.pop(self.cell.id, None)
            self.outcome = started.result() if started else run_memcheck(*memcheck_args(s, self.cell))
            if self.outcome.record.status == Status.NOT_RUN:
                pytest.skip(self.outcome.record.reason)
            if self.outcome.record.status != Status.PASSED:
                raise ItemFailed(self.failure_text())
            return
        task = CellTask(s.plan, self.cell, s.run_settings())
        shrunk = None
        if s.isolation == "none" and self.cell.tp == 1:
            value, facts = run_cell(task), {}
        else:
            if self.cell.tp > 1:  # TP cells always need a group
                worker, fn = s.worker(self.cell.tp), run_cell_on_rank
            else:
                worker, fn = s.worker("kernels"), run_cell
            value = worker.call(fn, task, s.plan.numerics.timeout_s)
            facts = worker.facts
            # A crash or a device fault killed the worker hypothesis was shrinking in: shrink in fresh ones.
            multiples = tp_multiples(s.plan, self.cell.tp) if self.cell.tp > 1 else None
            known = s.fault_minimals.setdefault((self.cell.phase, self.cell.tp), [])
            shrunk = shrink_fault(worker, fn, task, s.plan.numerics.timeout_s, value,
                                  lambda ex, reproduces: shrink_example(s.plan, self.cell, ex, reproduces, multiples,
                                                                        known))
            if shrunk and shrunk.example not in known:
                known.append(shrunk.example)
        if s.isolation != "none" or self.cell.tp > 1:
            if isinstance(value, Fault):
                s.cells_killed += 1
            else:
                s.cells_survived += 1
        if isinstance(value, Fault):
            value = Outcome(CellRecord(**self.cell.axes(), status=Status.FAILED, reason=value.reason,
                                       examples=value.examples, facts=value.facts or {}), traceback=value.traceback)
        value.record.facts.update(facts)
        if shrunk:
            value.record.minimal_example = shrunk.example.describe()
            value.record.facts.update(shrunk.facts)
        self.outcome = value
        if value.record.status == Status.NOT_RUN:  # vLLM's kernel cannot be loaded here: not run, as memcheck cells
            pytest.skip(value.record.reason)
        if value.record.status != Status.PASSED:
            raise ItemFailed(self.failure_text())

    def failure_text(self) -> str:
        rec = self.outcome.record
        lines = [f"cell {self.cell.id} failed: {rec.reason}"]
        if rec.minimal_example:
            lines.append(f"minimal example: {rec.minimal_example}")
        for f in rec.more_failures or ():  # distinct failures besides the first (plans of vLLM's own kernels)
            lines.append(f"also failed: {f.reason}" + (f"; minimal example: {f.minimal_example}" if f.minimal_example
                                                       else ""))
        lines.append(f"reproduce: {self.repro_command()}")
        if self.outcome.traceback:
            lines.append(self.outcome.traceback)
        return "\n".join(lines)

    def repro_command(self) -> str:
        s = session_of(self.config)
        try:
            plan = os.path.relpath(s.plan_path, self.config.invocation_params.dir)
        except ValueError:
            plan = str(s.plan_path)
        return f"pytest --plan {plan} --plan-profile {s.profile} -k '{self.cell.id}'"

    def result(self, skipped: bool) -> CellRecord:
        if skipped:
            return CellRecord(**self.cell.axes(), status=self.decision.status, reason=self.decision.reason)
        rec = self.outcome.record if self.outcome else CellRecord(**self.cell.axes(), status=Status.FAILED,
                                                                  reason="the item stopped before a result")
        rec.status = _expected(self.decision, rec.status)
        if rec.status in (Status.FAILED, Status.XFAIL):
            rec.repro = self.repro_command()
        if self.decision.expects_failure:
            rec.expectation = self.decision.reason
        return rec


class VllmItem(PlanItem):
    """vLLM's own layer, with the kernel registered through one route, on one (phase, dtype)."""

    def __init__(self, *, cell: Cell, route: str, decision: Decision, **kwargs):
        super().__init__(**kwargs)
        self.cell, self.route, self.decision = cell, route, decision

    def setup(self):
        if not self.decision.runs:
            self._record(IntegrationRecord(route=self.route, **self.cell.axes(), status=self.decision.status,
                                           reason=self.decision.reason))
            pytest.skip(self.decision.reason)
        why = vllm_missing() or unsupported(session_of(self.config).plan)  # without starting a worker
        if why:
            self._record(IntegrationRecord(route=self.route, **self.cell.axes(), status=Status.NOT_RUN, reason=why))
            pytest.skip(why)

    def runtest(self):
        s = session_of(self.config)
        task = IntegrationTask(s.plan, self.cell, self.route, s.run_settings(max(1, min(s.examples, MAX_EXAMPLES))))
        # vLLM items get a worker of their own: importing vLLM costs seconds, and the plugin they load defines
        # the same torch.library op the cells define.
        if self.route in s.route_faults and s.cells_killed and not s.cells_survived:
            why = (f"not run: the kernel killed its worker in every numerics cell ({s.cells_killed}) and in "
                   f"{s.route_faults[self.route]}; this route's other items would only crash again")
            self._record(IntegrationRecord(route=self.route, **self.cell.axes(), status=Status.NOT_RUN, reason=why))
            pytest.skip(why)
        value = s.worker("vllm").call(run_integration_item, task, s.plan.numerics.timeout_s)
        if isinstance(value, Fault):
            s.route_faults.setdefault(self.route, f"{self.name} ({value.reason.splitlines()[0][:160]})")
        rec = value.record if not isinstance(value, Fault) else IntegrationRecord(
            route=self.route, **self.cell.axes(), status=Status.FAILED, reason=value.reason)
        if rec.status == Status.NOT_RUN:
            self._record(rec)
            pytest.skip(rec.reason)
        failed = rec.status == Status.FAILED
        rec.status = _expected(self.decision, rec.status)
        self._record(rec)
        if failed:
            raise ItemFailed(f"{self.name} failed: {rec.reason}")

    def _record(self, rec: IntegrationRecord) -> None:
        session_of(self.config).record("integration", self.name, rec)


def _timed_bench_item(benchmark):
    """What pytest sees as a benchmark item's test function where pytest-benchmark is active: it requests the
    `benchmark` fixture, which BenchItem.runtest hands the kernel's device samples (the function itself never runs)."""


def _bench_item():
    """A benchmark item's test function without pytest-benchmark (not installed, or -p no:benchmark)."""


class BenchItem(PlanItem, pytest.Function):
    """One benchmark shape: a pytest.Function, so that pytest-benchmark's public `benchmark` fixture is filled in for
    it (and its --benchmark-skip / --benchmark-only select it), though the item runs in a worker, not the function."""

    def __init__(self, *, spec: BenchSpec, skip: str, **kwargs):
        super().__init__(**kwargs)
        self.spec, self.skip = spec, skip
        self.clock = DeviceClock()

    @classmethod
    def create(cls, parent, spec: BenchSpec, skip: str) -> BenchItem:
        timed = parent.config.pluginmanager.hasplugin("benchmark")  # pytest-benchmark's entry point's name
        item = cls.from_parent(parent, name=f"bench[{spec.id}]", callobj=_timed_bench_item if timed else _bench_item,
                               spec=spec, skip=skip)
        if timed:  # pytest-benchmark's documented per-test options: the timer its rounds read, the group it lists
            item.add_marker(pytest.mark.benchmark(timer=item.clock, group=f"{spec.phase}-{spec.dtype}-"
                                                                          f"{spec.graph_mode}-{spec.sm}"))
        return item

    def setup(self):
        if self.skip:
            self._record(not_run_record(self.spec, self.skip))
            pytest.skip(self.skip)
        super().setup()  # pytest.Function's: the fixtures, pytest-benchmark's among them

    def runtest(self):
        s = session_of(self.config)
        take_gpu_turn(s)
        if not s.precompiled:  # once, before the first item is timed: every shape compiled side by side
            if _xdist_worker(self.config):  # each worker would compile every shape; they share the compiles anyway
                s.precompiled = "not under xdist"
            elif detect().device != "cuda":
                s.precompiled = "not on a CPU"
            else:
                specs = [i.spec for i in self.session.items if isinstance(i, BenchItem) and not i.skip]
                s.precompiled = precompile(s.plan, specs)
        # The last item's record is written while the worker times this one (11 ms a write on an H200 machine).
        value = s.worker("kernels").call(run_benchmark, BenchTask(s.plan, self.spec), s.plan.numerics.timeout_s,
                                         meanwhile=s.recorder.flush)
        if isinstance(value, Fault):
            rec = not_run_record(self.spec, value.reason)
            rec.impls = {name: type(impl)(error=value.reason) for name, impl in rec.impls.items()}
            value = BenchOutcome(rec, failures={"benchmark": value.reason})
        benchmark = self.funcargs.get("benchmark")
        if benchmark is not None and "kernel" in value.timings:
            store_in_pytest_benchmark(benchmark, self.clock, value.timings["kernel"], value.record)
        self._record(value.record)
        if value.failures:
            raise ItemFailed(f"benchmark {self.spec.id} failed: "
                             + "; ".join(f"{name}: {msg}" for name, msg in value.failures.items()))
        kernel = value.record.impls["kernel"]
        if kernel.not_run:
            pytest.skip(f"kernel {kernel.not_run}; native vs compiled recorded ({value.record.timer} timer)")

    def _record(self, rec: BenchRecord) -> None:  # written by the next item's call, or at the session's end
        session_of(self.config).record("benchmarks", self.spec.id, rec, defer=True)


class DeviceClock:
    """A benchmark item's pytest-benchmark timer (the `timer` option of its `benchmark` marker): it replays the samples
    measured on the device, each round of `benchmark.pedantic(clock.advance, ...)` advancing it by one."""

    def __init__(self):
        self.__name__ = "device"  # what pytest-benchmark stores as the timer's name: the harness's timer, once loaded
        self.now = 0.0
        self._samples = iter(())

    def load(self, timing: Timing) -> int:
        """The samples the next rounds replay; returns how many."""
        self.__name__, self._samples = timing.timer, iter(timing.samples_us)
        return len(timing.samples_us)

    def __call__(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += next(self._samples) * 1e-6


def store_in_pytest_benchmark(benchmark, clock: DeviceClock, timing: Timing, rec: BenchRecord) -> None:
    """Hand the kernel's device samples to pytest-benchmark (storage, --benchmark-compare[-fail]) through its public
    API: the item's `benchmark` fixture, its marker's `timer`, `benchmark.pedantic` and `benchmark.extra_info`.

    One series per item, the kernel's, since a pytest-benchmark fixture times one function per test; the baselines'
    timings are in the results file, and their speedups in the series' extra_info."""
    figs = rec.impls["kernel"]
    benchmark.extra_info.update({
        "impl": "kernel", "timer": timing.timer, "calls_per_sample": timing.calls_per_sample, "gbps": figs.gbps,
        "pct_copy_bw": figs.pct_copy_bw, "pct_of_bound": figs.pct_of_bound, "bound_us": rec.bound_us,
        "launches": figs.launches, "rotated_sets": rec.rotated_sets,
        "speedup": {name: sp.value for name, sp in rec.speedup.items() if sp.value is not None}})
    benchmark.pedantic(clock.advance, rounds=clock.load(timing), iterations=1)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    """The GPU and the software stack in pytest-benchmark's machine_info, so saved runs from different GPUs are
    told apart (pytest-benchmark warns when a comparison's machine_info differs)."""
    prov = provenance(config.rootpath)
    machine_info["harness"] = {k: getattr(prov, k) for k in ("sm", "gpu", "device_count", "torch", "triton", "cuda",
                                                             "vllm", "triton_interpreter")}


# ---------------------------------------------------------------- results and report


def _xdist_worker(config) -> str | None:
    """This process's xdist worker id (not the environment variable: a pytest started from a worker inherits it)."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else None


def pytest_sessionstart(session):
    s = session_of(session.config)
    prov = provenance(session.config.rootpath, s.plan_path)  # with the checks' version: the report marks others' stale
    run_id = f"{prov.date}-{socket.gethostname()}-{os.getpid()}"
    s.recorder = Recorder(s.op_dir / "results", s.plan.name, prov, run_id, worker=_xdist_worker(session.config))


def pytest_collection_finish(session):
    """Sample the cells this machine can run (--cells sampled), when the run selects every cell of the plan: a -k,
    -m, --lf or node-id selection that leaves cells out runs every selected cell. Called once collection, and every
    deselection, is done; under xdist in each worker, which all pick the same sample."""
    s = session_of(session.config)
    cells = [i for i in session.items if isinstance(i, CellItem)]
    if not cells:
        return
    runnable = [i for i in cells if i.decision.runs]
    if not runnable:
        ran = "no cell: none can run here"
    elif s.cells == "all":
        ran = f"every runnable cell ({len(runnable)})"
    elif len(cells) < len(expand(s.plan)):
        ran = f"the {len(runnable)} runnable cells selected (-k, -m, --lf or node ids; no sampling)"
    else:
        chosen = set(pairwise_sample([i.cell for i in runnable], s.plan.name))
        sample = f"pairwise sample of {len(chosen)} of {len(runnable)} runnable cells"
        ran = f"a {sample}"
        for item in runnable:
            if item.cell not in chosen:
                item.sampled_out = f"sampled out: {sample}; --cells all runs it"
    s.recorder.describe_run(cells=ran)
    # Under xdist a worker runs only some items: there each memcheck item runs its own.
    if not _xdist_worker(session.config) and not session.config.option.collectonly:
        start_memchecks(s, [i for i in runnable if not i.sampled_out])


# Memcheck runs side by side with the other cells: each is a process of its own under compute-sanitizer, which
# spends most of its time starting up and instrumenting, so they overlap well with each other and with the worker.
MEMCHECK_PARALLEL = 3


def memcheck_args(s: Session, cell: Cell) -> tuple[Plan, Cell, float]:
    return s.plan, cell, 10 * s.plan.numerics.timeout_s


def start_memchecks(s: Session, items: list) -> None:
    """Start the run's memcheck cells when collection ends; each memcheck item then waits for its own result."""
    todo = [i.cell for i in items if i.cell.graph_mode == "memcheck"]
    if not todo or sanitizer() is None:  # without the tool each item reports that itself, at once
        return
    s.memcheck_pool = ThreadPoolExecutor(max_workers=min(len(todo), MEMCHECK_PARALLEL))
    for cell in todo:
        s.memchecks[cell.id] = s.memcheck_pool.submit(run_memcheck, *memcheck_args(s, cell))


SAMPLED_OUT = "sampled_out"  # a cell's status in the summary only: sampled-out cells are not recorded


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if isinstance(item, CellItem) and (report.when == "call" or report.when == "setup" and report.skipped):
        # The cell's status on its report (xdist sends it to the controller) for the terminal summary.
        report.plan_cell = item.cell.id
        if item.sampled_out:  # not recorded: what an earlier run recorded for the cell stays
            report.plan_status, report.plan_reason = SAMPLED_OUT, item.sampled_out
            return
        skipped = report.when == "setup"
        if skipped and item.decision.runs:  # a skip marker (--benchmark-only, a conftest's): not
            return  # run this time, and not recorded, so what an earlier run recorded for the cell stays
        rec = item.result(skipped=skipped)
        # A cell skipped before it ran (not run here, excluded) is written with the next cell that runs, or at the end.
        session_of(item.config).record("cells", item.cell.id, rec, defer=skipped)
        report.plan_status, report.plan_reason = rec.status.value, rec.reason


def pytest_report_teststatus(report, config):
    """A cell this machine did not run (another SM, excluded, sampled out) prints no `s` of its own: the terminal
    summary counts them by reason. -v still lists each; -rs too."""
    if report.skipped and getattr(report, "plan_status", None) in (SAMPLED_OUT, Status.NOT_RUN, Status.EXCLUDED):
        return "skipped", "", "SKIPPED"
    return None


def pytest_sessionfinish(session, exitstatus):
    s = session_of(session.config)
    if s.recorder is None:
        return
    s.recorder.flush()
    if s.gpu_turn is not None:  # every record is written: the next plan's run may time
        s.gpu_turn.close()
    # The workers wind down while the report is written: a benchmark worker took 1.3 s to exit on an H200 machine.
    for worker in s.workers.values():
        worker.ask_to_stop()
    try:
        if _xdist_worker(session.config):
            return  # the controller folds worker files and writes the report
        s.recorder.fold_worker_files()
        if session.config.getoption("--no-report"):
            return
        draw_plots(s.plan, s.op_dir)
        s.report_path, s.report_problems = write_report(s.plan, s.op_dir)
        res = collect(s.plan, s.op_dir)
        s.verdicts = sm_verdicts(res)
        s.verdict = verdict(res, per_sm=s.verdicts).word
        s.stale = res.stale_summary()
    finally:
        s.stop_workers()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    s = session_of(config)
    reports = [r for rs in terminalreporter.stats.values() for r in rs if getattr(r, "plan_status", None)]
    if reports:
        terminalreporter.ensure_newline()
        terminalreporter.section(f"{s.plan.name}: numerics cells", sep="-")
        for line in cells_summary(s.plan, [(Cell.from_id(r.plan_cell), r.plan_status, r.plan_reason)
                                           for r in reports]):
            terminalreporter.write_line(line)
    if s.precompiled.startswith("precompile"):
        terminalreporter.write_line(f"benchmarks: {s.precompiled}")
    for warning in s.plan_warnings:
        terminalreporter.write_line(f"plan warning: {warning}", yellow=True)
    if s.report_path is None:
        return
    for problem in s.report_problems:
        terminalreporter.write_line(f"results problem: {problem}", yellow=True)
    if s.stale:
        terminalreporter.write_line(s.stale, yellow=True)
    if s.verdicts:
        terminalreporter.write_line(f"verdict: {s.verdict}")
        here = detect().sm
        for v in s.verdicts:
            if v.sm == here:
                terminalreporter.write_line(f"  {v.where} (this machine): {v.word}: {v.rule}")
    terminalreporter.write_line(f"living plan written: {s.report_path}")


SUMMARY_STATUSES = {"passed": "passed", "failed": "failed", "xfail": "expected failure", "xpass": "unexpected pass",
                    SAMPLED_OUT: "sampled out", "not_run": "not run here", "excluded": "excluded"}
OTHER_SM = re.compile(r"needs (\w+); (this machine is .*)")


def cells_summary(plan: Plan, cells: list[tuple[Cell, str, str]]) -> list[str]:
    """The run's cells (cell, status, reason) as lines: a table of statuses per graph mode and TP size, how many
    were sampled out, and why the others did not run here, grouped (cells needing another SM in one group)."""
    statuses = [st for st in SUMMARY_STATUSES if any(status == st for _, status, _ in cells)]
    counts = Counter((c.graph_mode, c.tp, status) for c, status, _ in cells)
    rows = [[mode, f"tp{tp}", *(counts[mode, tp, st] or "" for st in statuses)]
            for mode in plan.matrix["graph_mode"] for tp in plan.matrix["tp"]
            if any(counts[mode, tp, st] for st in statuses)]
    lines = tabulate(rows, headers=["graph mode", "tp", *(SUMMARY_STATUSES[st] for st in statuses)],
                     disable_numparse=True).splitlines()
    sampled = sum(1 for _, status, _ in cells if status == SAMPLED_OUT)
    if sampled:
        ran = sum(1 for _, status, _ in cells if status in ("passed", "failed", "xfail", "xpass"))
        lines.append(f"pairwise sample: {ran} of {ran + sampled} runnable cells ran, every pair of axis values in one "
                     f"at least; --cells all runs all {ran + sampled}")
    groups: dict[tuple[str, str, bool], list[Cell]] = {}
    for c, status, reason in cells:
        if status in ("not_run", "excluded"):
            other = OTHER_SM.fullmatch(reason)  # "needs sm90; this machine is cpu": one group for every other SM
            groups.setdefault((status, other.group(2) if other else reason, bool(other)), []).append(c)
    shown = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for (status, reason, other_sm), group in shown[:6]:
        if other_sm:
            sms = [sm for sm in plan.matrix["sm"] if any(c.sm == sm for c in group)]
            reason = f"needs {' or '.join([', '.join(sms[:-1]), sms[-1]] if len(sms) > 1 else sms)}; {reason}"
        lines.append(f"{len(group)} {SUMMARY_STATUSES[status]}: {reason}")
    if len(shown) > 6:
        lines.append(f"… and {sum(len(g) for _, g in shown[6:])} more cells for {len(shown) - 6} other reasons "
                     "(the living plan lists them)")
    return lines
