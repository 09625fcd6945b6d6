"""The items of one plan's run, collected from the plan file: a numerics cell, a vLLM route item, vLLM's fusion pass
under one profile (`fusion[none-bf16-cpu]`, for plans of fused ops), a running engine (`engine[tiny_llama-...]`, for
plans whose kernel replaces a vLLM layer) and a benchmark shape. Each runs its kernel in an isolated worker
(harness.runtime.workers), or in processes of its own, and records what it ended in. A benchmark item hands the
kernel's device samples to pytest-benchmark. Markers `fusion` and `engine` select or deselect the vLLM run items
(`-m "not engine"` leaves out the engine's start-ups, 2 to 4 minutes on a 2-core CPU machine)."""

from __future__ import annotations

import os

import pytest

from harness.decisions.bounds import bound, broken_timing, throughput
from harness.decisions.speedups import baselines, shape_speedup
from harness.vllm.engine import engine_profiles, engine_unsupported, run_engine_item
from harness.vllm.engine import item_name as engine_item_name
from harness.vllm.fusion import FusionTask, fusion_items, run_fusion_item
from harness.vllm.routes import LAYER_DTYPES, MAX_EXAMPLES, run_integration_item
from harness.vllm.attention_backend import ROUTE as ATTENTION_ROUTE, graph_phases, run_attention_item
from harness.plugin.state import memcheck_args, session_of, take_gpu_turn, xdist_worker
from harness.plugin.replay import keep, replayed
from harness.results.store import BenchRecord, CellRecord, FusionOutcome, IntegrationRecord, Status, lead_reason
from harness.runtime.bench.measure import BenchOutcome, run_benchmark
from harness.runtime.bench.precompile import precompile
from harness.runtime.bench.records import not_run_record
from harness.runtime.bench.specs import BenchSpec, bench_specs, skip_reason
from harness.runtime.device import detect
from harness.runtime.inputs import Example
from harness.runtime.memcheck import run_memcheck
from harness.runtime.runner import Outcome, run_cell, shrink_example
from harness.runtime.shrinking import shrink_fault
from harness.runtime.tasks import BenchTask, CellTask, IntegrationTask
from harness.runtime.timing import Timing
from harness.runtime.tp import run_cell_on_rank, tp_multiples
from harness.runtime.vllm_compiled import vllm_missing
from harness.runtime.workers import Fault
from harness.cells.matrix import Cell, Decision, decide, every_cell, provider_view
from harness.plan.model import Plan
from harness.vllm_facts.fusion_cases import FUSION_DTYPE, FusionProfile, fusion_case
from harness.vllm_facts.names import integration_routes, unsupported


class PlanFile(pytest.File):
    def collect(self):
        s = session_of(self.config)
        plan, hw = s.plan, detect()
        for cell in every_cell(plan):  # the kernel's cells, then each provider's (harness.cells.matrix)
            decision = decide(plan, cell, hw, s.max_cpu_ranks)
            item = CellItem.from_parent(self, name=f"numerics[{cell.id}]", cell=cell, decision=decision)
            for axis, value in cell.axes().items():
                item.add_marker(f"tp{value}" if axis == "tp" else value)
            if decision.expects_failure:
                item.add_marker(pytest.mark.xfail(reason=decision.reason, strict=True))
            yield item
        yield from self._integration_items(plan, hw)
        yield from vllm_run_items(self, plan, hw.sm)  # vLLM's fusion passes; a running engine
        if s.bench:
            for spec in bench_specs(plan, hw.sm):
                item = BenchItem.create(self, spec, skip_reason(plan, spec, hw, s.max_cpu_ranks))
                for marker in ("bench", spec.phase, spec.dtype, spec.graph_mode, spec.sm):
                    item.add_marker(marker)
                yield item

    def _integration_items(self, plan: Plan, hw):
        """One per (route, phase, dtype) on this machine's SM, for plans whose `vllm:` section names a route the harness
        drives (a kernel that is vLLM's own is in vLLM already; the page says why other routes are not proven); the
        attention_backend route's decode and mixed items again in a full CUDA graph (`vllm-attention_backend[decode-
        bf16-cuda_graph-sm90]`: not run on a CPU machine)."""
        if hw.sm not in plan.matrix["sm"]:
            return
        for route in integration_routes(plan):
            graphed = graph_phases(plan) if route == ATTENTION_ROUTE else []
            modes = [(phase, mode) for phase in plan.matrix["phase"]
                     for mode in ("eager", *(["cuda_graph"] if phase in graphed else []))]
            for phase, mode in modes:
                for dtype in [d for d in plan.matrix["dtype"] if d in LAYER_DTYPES]:
                    cell = Cell(phase, dtype, 1, mode, hw.sm)
                    decision = decide(plan, cell, hw, session_of(self.config).max_cpu_ranks)
                    shown = "" if mode == "eager" else f"-{mode}"  # eager items keep the names they were recorded by
                    item = VllmItem.from_parent(self, name=f"vllm-{route}[{phase}-{dtype}{shown}-{hw.sm}]", cell=cell,
                                                route=route, decision=decision)
                    for marker in (phase, dtype, *([mode] if shown else [])):
                        item.add_marker(marker)
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
        # --benchmark-only, -m with skipif) at the item's line, and asserts there is one. The name alone, as a test
        # function's: pytest's -v line turns each "." before a "[" into "::" (plan.yaml became plan::yaml).
        return self.path, 0, self.name


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
        self.saved = False  # its failure is saved under reports/<op>/failures/ (harness.plugin.replay)

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
            self.fail_if_failed()
            return
        plan = provider_view(s.plan, self.cell.provider)
        replaying = s.replay == self.cell.id  # --replay: the saved failure's example alone
        task = CellTask(plan, self.cell, s.run_settings(), replay=s.replay_example if replaying else None)
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
            multiples = tp_multiples(plan, self.cell.tp) if self.cell.tp > 1 else None
            shrunk = None if replaying else shrink_fault(
                worker, fn, task, s.plan.numerics.timeout_s, value,
                lambda ex, reproduces: shrink_example(plan, self.cell, ex, reproduces, multiples),
                s.fault_minimals.setdefault((self.cell.phase, self.cell.tp, self.cell.provider), []))
        if s.isolation != "none" or self.cell.tp > 1:
            if isinstance(value, Fault):
                s.cells_killed += 1
            else:
                s.cells_survived += 1
        if isinstance(value, Fault):
            value = Outcome(CellRecord(**self.cell.axes(), status=Status.FAILED, reason=value.reason,
                                       examples=value.examples, facts=value.facts or {}), traceback=value.traceback,
                            failing=[value.example if isinstance(value.example, Example) else None])
        value.record.facts.update(facts)
        if shrunk:
            value.record.minimal_example = shrunk.example.describe()
            value.record.facts.update(shrunk.facts)
            value.failing = [shrunk.example, *value.failing[1:]]
            value.inputs, value.inputs_note = None, "the kernel faulted: the example rebuilds them"
        self.outcome = value
        if replaying:
            s.replay_said = replayed(s.op_dir, self.cell.id, s.replay_data, value.record)
        else:
            self.saved = keep(s.op_dir, s.plan.op.name, self.cell.id, value)
        if value.record.status == Status.NOT_RUN:  # a provider cannot be loaded here: not run, as memcheck cells
            pytest.skip(value.record.reason)
        self.fail_if_failed()

    def fail_if_failed(self) -> None:
        """A failed cell fails its item; a provider's failure is a finding about that provider, recorded as failed
        and shown on the page (what it accepts), while the run's outcome stays the kernel's (pytest: xfailed)."""
        if self.outcome.record.status == Status.PASSED:
            return
        if self.cell.provider:
            pytest.xfail(f"{self.cell.provider}: {self.outcome.record.reason}")
        raise ItemFailed(self.failure_text())

    def failure_text(self) -> str:
        rec = self.outcome.record
        lines = [f"cell {self.cell.id} failed: {lead_reason(rec)}"]
        if rec.minimal_example:
            lines.append(f"minimal example: {rec.minimal_example}")
        for i, f in enumerate(rec.more_failures or (), start=2):  # the distinct failures besides the first
            lines.append(f"also failed [{i}]: {f.reason}" + (f"; minimal example: {f.minimal_example}"
                                                             if f.minimal_example else ""))
        s = session_of(self.config)
        if s.replay == self.cell.id:
            lines.append(s.replay_said)
        lines.append(f"reproduce: {self.repro_command()}")
        if self.outcome.traceback:
            lines.append(self.outcome.traceback)
        return "\n".join(lines)

    def repro_command(self) -> str:
        """`pytest --plan P --replay <cell>` where the cell's failing example is saved (a replay of it, too), else the
        command that runs the cell again."""
        s = session_of(self.config)

        def shown(path) -> str:
            try:
                return os.path.relpath(path, self.config.invocation_params.dir)
            except ValueError:
                return str(path)
        plan = shown(s.plan_path)
        if self.saved or s.replay == self.cell.id:
            reports = f" --reports-dir {shown(s.reports_option)}" if s.reports_option else ""
            return f"pytest --plan {plan}{reports} --replay {self.cell.id}"
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
        run = run_attention_item if self.route == ATTENTION_ROUTE else run_integration_item
        value = s.worker("vllm").call(run, task, s.plan.numerics.timeout_s)
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
            if xdist_worker(self.config):  # each worker would compile every shape; they share the compiles anyway
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
        broken = broken_timing(value.record, value.record.impls.get("kernel"))
        if broken:  # timed faster than the hardware allows: the timing says nothing about the kernel's speed
            value.failures["kernel"] = broken
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
    reached = throughput(rec, figs)
    speedups = {name: shape_speedup(rec, name) for name in baselines(rec)}
    benchmark.extra_info.update({
        "impl": "kernel", "timer": timing.timer, "calls_per_sample": timing.calls_per_sample, "gbps": reached.gbps,
        "pct_copy_bw": reached.pct_copy_bw, "pct_of_bound": reached.pct_of_bound, "bound_us": bound(rec)[0],
        "launches": figs.launches, "rotated_sets": rec.rotated_sets,
        "speedup": {name: s.value for name, s in speedups.items() if s is not None}})
    benchmark.pedantic(clock.advance, rounds=clock.load(timing), iterations=1)


# ---------------------------------------------------------------- vLLM's fusion passes and a running engine

MARKERS = ("fusion: vLLM's fusion pass over vLLM's layers, per profile",
           "engine: vLLM's engine serving requests with the plan's plugin (minutes on a CPU machine)")
FUSION_TIMEOUT_S = 600.0  # two Inductor compiles of a few layers, and vLLM's import in a fresh worker


def names_vllm_op(plan: Plan) -> bool:
    """The plans the route items are collected for: a `vllm:` section naming a layer or op."""
    return bool(plan.vllm.layer or plan.vllm.ir_op or plan.vllm.custom_op)


def vllm_run_items(parent, plan: Plan, sm: str):
    """The fusion items of a fused op's plan and the engine item of a plan naming a vLLM op, on this machine's SM."""
    for name, profile in fusion_items(plan, sm):
        item = FusionItem.from_parent(parent, name=name, profile=profile, sm=sm)
        item.add_marker("fusion")
        yield item
    if sm in plan.matrix["sm"] and names_vllm_op(plan):
        for profile in engine_profiles(sm):
            item = EngineItem.from_parent(parent, name=engine_item_name(sm, profile), sm=sm, profile=profile)
            item.add_marker("engine")
            yield item


class _VllmRunItem(PlanItem):
    def __init__(self, *, sm: str, **kwargs):
        super().__init__(**kwargs)
        self.sm = sm

    def _finish(self, rec: IntegrationRecord) -> None:
        """Record the item; skip it where it did not run here, fail it with its reason (no traceback)."""
        session_of(self.config).record("integration", self.name, rec)
        if rec.status == Status.NOT_RUN:
            pytest.skip(rec.reason)
        if rec.status == Status.FAILED:
            pytest.fail(f"{self.name} failed: {rec.reason}", pytrace=False)


class FusionItem(_VllmRunItem):
    """vLLM's fusion pass over vLLM's layer sequence under one profile."""

    def __init__(self, *, profile: FusionProfile, **kwargs):
        super().__init__(**kwargs)
        self.profile = profile

    def _record_of(self, status: Status, reason: str) -> IntegrationRecord:
        case = fusion_case(session_of(self.config).plan)
        return IntegrationRecord(route="fusion", phase="all", dtype=FUSION_DTYPE, tp=1, graph_mode="torch_compile",
                                 sm=self.sm, status=status, reason=reason,
                                 fusion=FusionOutcome(self.profile.id, list(self.profile.custom_ops),
                                                      self.profile.ir_priorities(case), case.pass_class))

    def setup(self):
        if vllm_missing():  # without starting a worker
            self._finish(self._record_of(Status.NOT_RUN, vllm_missing()))

    def runtest(self):
        # The vLLM worker the route items use: vLLM is imported there once.
        task = FusionTask(session_of(self.config).plan, self.profile.id, self.sm)
        value = session_of(self.config).worker("vllm").call(run_fusion_item, task, FUSION_TIMEOUT_S)
        self._finish(self._record_of(Status.FAILED, value.reason) if isinstance(value, Fault) else value)


class EngineItem(_VllmRunItem):
    """vLLM's engine serving requests with the plan's plugin loaded, against the engine without it."""

    def __init__(self, *, profile: str, **kwargs):
        super().__init__(**kwargs)
        self.profile = profile

    def setup(self):
        s = session_of(self.config)
        why = engine_unsupported(s.plan) or (
            f"not run: the kernel killed its worker in every numerics cell ({s.cells_killed}); an engine serving it "
            "would only crash" if s.cells_killed and not s.cells_survived else "")
        if why:
            self._finish(IntegrationRecord(route="engine", phase="all", dtype="bf16", tp=1, graph_mode="eager",
                                           sm=self.sm, status=Status.NOT_RUN, reason=why))

    def runtest(self):
        # In this process: the engines run in processes of their own, started by spawn.
        self._finish(run_engine_item(session_of(self.config).plan, self.sm, profile=self.profile))
