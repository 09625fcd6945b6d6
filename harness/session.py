"""The run of one plan under pytest: its items (numerics cells, benchmarks, vLLM integration), their records, the report.

Registered by harness.plugin only when `--plan` is given. Data flows one way: plan -> cells (items)
-> results file -> report. Every item that runs a kernel runs it in an isolated worker
(harness.workers), so a kernel that crashes, hangs or poisons the device fails its own item only.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings

from .bench import BenchOutcome, BenchSpec, Timing, bench_specs, check_models, not_run_record, run_benchmark, \
    skip_reason
from .device import detect, provenance, use_triton_interpreter
from .interpreter import make_faithful
from .memcheck import run_memcheck
from .integration import LAYER_DTYPES, MAX_EXAMPLES, ROUTES, run_integration_item
from .matrix import Cell, Decision, decide, expand
from .plan import Plan, PlanError, load_plan
from .plots import draw_plots
from .report import write_report
from .results import BenchRecord, CellRecord, IntegrationRecord, Recorder, Status
from .runner import NIGHTLY_FACTOR, Outcome, RunSettings, run_cell, shrink_example
from .tp import run_cell_on_rank, tp_multiples
from .vllm_kernels import LIBRARY_ENV, vllm_missing
from .vllm_ops import unsupported
from .workers import Fault, Worker, WorkerGroup, shrink_fault


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
    recorder: Recorder | None = None
    workers: dict = field(default_factory=dict)  # "kernels" / "vllm" -> Worker; tp size -> WorkerGroup
    report_path: Path | None = None
    report_problems: list = field(default_factory=list)

    def run_settings(self, examples: int | None = None) -> RunSettings:
        return RunSettings(examples=examples or self.examples, profile=self.profile, database=self.database)

    def worker(self, key) -> Worker | WorkerGroup:
        if key not in self.workers:
            self.workers[key] = WorkerGroup(key) if isinstance(key, int) else Worker()
        return self.workers[key]

    def record(self, section: str, key: str, rec) -> None:
        rec.finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.recorder.record(section, key, rec)

    def stop_workers(self) -> None:
        for worker in self.workers.values():
            worker.stop()


_SESSION = pytest.StashKey[Session]()


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
        if config.getoption("--bench"):
            check_models(plan)
    except PlanError as exc:
        raise pytest.UsageError(f"invalid plan: {exc}") from None
    for values in plan.matrix.values():
        for v in values:
            config.addinivalue_line("markers", f"{f'tp{v}' if isinstance(v, int) else v}: cells with this matrix value")
    config.addinivalue_line("markers", "bench: benchmark items (collected with --bench)")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(plan_path)]  # `pytest --plan X` alone collects the plan, not the test suite
    profile = config.getoption("--plan-profile") or _hypothesis_profile() or ("ci" if os.environ.get("CI") else "dev")
    examples = config.getoption("--examples") or plan.numerics.examples * (NIGHTLY_FACTOR if profile == "nightly" else 1)
    reports = Path(config.getoption("--reports-dir") or config.rootpath / "reports")
    config.stash[_SESSION] = Session(plan, plan_path, profile, examples, reports / plan.name,
                                     config.getoption("--isolation"), config.getoption("--max-cpu-ranks"),
                                     str(config.rootpath / ".hypothesis" / "examples"))
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


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
            if decision.kind == "xfail":
                item.add_marker(pytest.mark.xfail(reason=decision.reason, strict=True))
            yield item
        yield from self._integration_items(plan, hw)
        if self.config.getoption("--bench"):
            for spec in bench_specs(plan, hw.sm):
                item = BenchItem.from_parent(self, name=f"bench[{spec.id}]", spec=spec,
                                             skip=skip_reason(plan, spec, hw, s.max_cpu_ranks))
                for marker in ("bench", spec.phase, spec.dtype, spec.graph_mode, spec.sm):
                    item.add_marker(marker)
                yield item

    def _integration_items(self, plan: Plan, hw):
        """One per (route, phase, dtype) on this machine's SM, for plans whose `vllm:` section names a vLLM op."""
        if hw.sm not in plan.matrix["sm"] or not (plan.vllm.layer or plan.vllm.ir_op or plan.vllm.custom_op):
            return
        for route in ROUTES:
            for phase in plan.matrix["phase"]:
                for dtype in [d for d in plan.matrix["dtype"] if d in LAYER_DTYPES]:
                    cell = Cell(phase, dtype, 1, "eager", hw.sm)
                    decision = decide(plan, cell, hw, session_of(self.config).max_cpu_ranks)
                    item = VllmItem.from_parent(self, name=f"vllm-{route}[{phase}-{dtype}-{hw.sm}]", cell=cell,
                                                route=route, decision=decision)
                    item.add_marker(phase)
                    item.add_marker(dtype)
                    if decision.kind == "xfail":
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
        return self.path, None, f"{self.parent.name}::{self.name}"


def _expected(decision: Decision, status: Status) -> Status:
    """A plan's expected failure turns failed into xfail and passed into xpass."""
    if decision.kind != "xfail":
        return status
    return Status.XFAIL if status == Status.FAILED else Status.XPASS


class CellItem(PlanItem):
    def __init__(self, *, cell: Cell, decision: Decision, **kwargs):
        super().__init__(**kwargs)
        self.cell, self.decision, self.outcome = cell, decision, None

    def setup(self):
        if self.decision.kind in ("excluded", "not_run"):
            pytest.skip(self.decision.reason)

    def runtest(self):
        s = session_of(self.config)
        if self.cell.graph_mode == "memcheck":  # a process of its own, under compute-sanitizer
            self.outcome = run_memcheck(str(s.plan_path), self.cell.id, 10 * s.plan.numerics.timeout_s)
            if self.outcome.record.status == Status.NOT_RUN:
                pytest.skip(self.outcome.record.reason)
            if self.outcome.record.status != Status.PASSED:
                raise ItemFailed(self.failure_text())
            return
        args = {"plan_path": str(s.plan_path), "cell_id": self.cell.id, "run": s.run_settings()}
        shrunk = None
        if s.isolation == "none" and self.cell.tp == 1:
            value, facts = run_cell(**args), {}
        else:
            if self.cell.tp > 1:  # TP cells always need a group
                worker, fn = s.worker(self.cell.tp), run_cell_on_rank
            else:
                worker, fn = s.worker("kernels"), run_cell
            value = worker.call(fn, args, s.plan.numerics.timeout_s)
            facts = worker.facts
            # A crash or a device fault killed the worker hypothesis was shrinking in: shrink in fresh ones.
            multiples = tp_multiples(s.plan, self.cell.tp) if self.cell.tp > 1 else None
            shrunk = shrink_fault(worker, fn, args, s.plan.numerics.timeout_s, value,
                                  lambda ex, reproduces: shrink_example(s.plan, self.cell, ex, reproduces, multiples))
        if isinstance(value, Fault):
            value = Outcome(CellRecord(**self.cell.axes(), status=Status.FAILED, reason=value.reason,
                                       examples=value.examples, facts=value.facts or {}), traceback=value.traceback)
        value.record.facts.update(facts)
        if shrunk:
            value.record.minimal_example = shrunk.example.describe()
            value.record.facts.update(shrunk.facts)
        self.outcome = value
        if value.record.status != Status.PASSED:
            raise ItemFailed(self.failure_text())

    def failure_text(self) -> str:
        rec = self.outcome.record
        lines = [f"cell {self.cell.id} failed: {rec.reason}"]
        if rec.minimal_example:
            lines.append(f"minimal example: {rec.minimal_example}")
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
            return CellRecord(**self.cell.axes(), status=Status(self.decision.kind), reason=self.decision.reason)
        rec = self.outcome.record if self.outcome else CellRecord(**self.cell.axes(), status=Status.FAILED,
                                                                  reason="the item stopped before a result")
        rec.status = _expected(self.decision, rec.status)
        if rec.status in (Status.FAILED, Status.XFAIL):
            rec.repro = self.repro_command()
        if self.decision.kind == "xfail":
            rec.expectation = self.decision.reason
        return rec


class VllmItem(PlanItem):
    """vLLM's own layer, with the kernel registered through one route, on one (phase, dtype)."""

    def __init__(self, *, cell: Cell, route: str, decision: Decision, **kwargs):
        super().__init__(**kwargs)
        self.cell, self.route, self.decision = cell, route, decision

    def setup(self):
        if self.decision.kind in ("excluded", "not_run"):
            self._record(IntegrationRecord(route=self.route, **self.cell.axes(), status=Status(self.decision.kind),
                                           reason=self.decision.reason))
            pytest.skip(self.decision.reason)
        why = vllm_missing() or unsupported(session_of(self.config).plan)  # without starting a worker
        if why:
            self._record(IntegrationRecord(route=self.route, **self.cell.axes(), status=Status.NOT_RUN, reason=why))
            pytest.skip(why)

    def runtest(self):
        s = session_of(self.config)
        args = {"plan_path": str(s.plan_path), "cell_id": self.cell.id, "route": self.route,
                "examples": max(1, min(s.examples, MAX_EXAMPLES)), "profile": s.profile, "database": s.database}
        # vLLM items get a worker of their own: importing vLLM costs seconds, and the plugin they load defines
        # the same torch.library op the cells define.
        value = s.worker("vllm").call(run_integration_item, args, s.plan.numerics.timeout_s)
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


class BenchItem(PlanItem):
    def __init__(self, *, spec: BenchSpec, skip: str, **kwargs):
        super().__init__(**kwargs)
        self.spec, self.skip = spec, skip
        # pytest-benchmark's --benchmark-skip and --benchmark-only select items by this attribute.
        self.fixturenames = ("benchmark",)

    def setup(self):
        if self.skip:
            self._record(not_run_record(self.spec, self.skip))
            pytest.skip(self.skip)

    def runtest(self):
        s = session_of(self.config)
        value = s.worker("kernels").call(run_benchmark, {"plan_path": str(s.plan_path), "spec": self.spec},
                                         s.plan.numerics.timeout_s)
        if isinstance(value, Fault):
            rec = not_run_record(self.spec, value.reason)
            rec.impls = {name: type(impl)(error=value.reason) for name, impl in rec.impls.items()}
            value = BenchOutcome(rec, failures={"benchmark": value.reason})
        for name, timing in value.timings.items():
            store_in_pytest_benchmark(self, name, timing, value.record)
        self._record(value.record)
        if value.failures:
            raise ItemFailed(f"benchmark {self.spec.id} failed: "
                             + "; ".join(f"{name}: {msg}" for name, msg in value.failures.items()))
        kernel = value.record.impls["kernel"]
        if kernel.not_run:
            pytest.skip(f"kernel {kernel.not_run}; native vs compiled recorded ({value.record.timer} timer)")

    def _record(self, rec: BenchRecord) -> None:
        session_of(self.config).record("benchmarks", self.spec.id, rec)


class _ReplayClock:
    """pytest-benchmark's timer for times measured on the device: each round advances it by one sample."""

    def __init__(self, timing: Timing):
        self.__name__ = timing.timer  # what pytest-benchmark stores as the timer's name
        self.now = 0.0
        self._samples = iter(timing.samples_us)

    def __call__(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += next(self._samples) * 1e-6


def store_in_pytest_benchmark(item: pytest.Item, impl: str, timing: Timing, rec: BenchRecord) -> None:
    """Hand one implementation's device samples to pytest-benchmark (storage, --benchmark-compare[-fail]).

    pytest-benchmark has no public way to take samples measured elsewhere (here: on the device, in a
    worker process), so its fixture is built from its session the way its own `benchmark` fixture is.
    """
    bench_session = getattr(item.config, "_benchmarksession", None)
    if bench_session is None:  # pytest-benchmark not installed, or -p no:benchmark
        return
    from pytest_benchmark.fixture import BenchmarkFixture  # optional plugin: only where it is installed
    from pytest_benchmark.utils import NameWrapper

    clock = _ReplayClock(timing)
    fixture = BenchmarkFixture(item, add_stats=bench_session.benchmarks.append, logger=bench_session.logger,
                               warner=item.warn, disabled=bench_session.disabled,
                               **{**bench_session.options, "timer": NameWrapper(clock), "group": item.name})
    fixture.name = f"{item.name[:-1]}-{impl}]"
    fixture.fullname = f"{item.nodeid[:-1]}-{impl}]"
    figs = rec.impls[impl]
    fixture.extra_info.update({"impl": impl, "timer": timing.timer, "calls_per_sample": timing.calls_per_sample,
                               "gbps": figs.gbps, "pct_copy_bw": figs.pct_copy_bw, "launches": figs.launches,
                               "rotated_sets": rec.rotated_sets})
    fixture.pedantic(clock.advance, rounds=len(timing.samples_us), iterations=1)


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
    prov = provenance(session.config.rootpath)
    run_id = f"{prov.date}-{socket.gethostname()}-{os.getpid()}"
    s.recorder = Recorder(s.op_dir / "results", s.plan.name, prov, run_id, worker=_xdist_worker(session.config))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if isinstance(item, CellItem) and (report.when == "call" or report.when == "setup" and report.skipped):
        session_of(item.config).record("cells", item.cell.id, item.result(skipped=report.when == "setup"))


def pytest_sessionfinish(session, exitstatus):
    s = session_of(session.config)
    if s.recorder is None:
        return
    s.stop_workers()
    if _xdist_worker(session.config):
        return  # the controller folds worker files and writes the report
    s.recorder.fold_worker_files()
    if session.config.getoption("--no-report"):
        return
    draw_plots(s.plan, s.op_dir)
    s.report_path, s.report_problems = write_report(s.plan, s.op_dir)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    s = session_of(config)
    if s.report_path is None:
        return
    for problem in s.report_problems:
        terminalreporter.write_line(f"results problem: {problem}", yellow=True)
    terminalreporter.write_line(f"living plan written: {s.report_path}")
