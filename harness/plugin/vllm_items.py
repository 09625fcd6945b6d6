"""The vLLM items beyond the routes: vLLM's fusion pass per profile (`fusion[none-bf16-cpu]`) for plans of fused
ops, and a running engine (`engine[tiny_llama-cpu]`) for plans whose kernel replaces a vLLM layer.

Collected by harness.plugin.session beside the route items, recorded in the results file's integration
section. Markers `fusion` and `engine` select or deselect them (`-m "not engine"` leaves out the engine's
start-ups, 2 to 4 minutes on a 2-core CPU machine).
"""

from __future__ import annotations

import pytest

from harness.integration.engine import engine_profiles, engine_unsupported, item_name as engine_item_name, \
    run_engine_item
from harness.integration.fusion import FusionTask, fusion_items, run_fusion_item
from harness.results.store import FusionOutcome, IntegrationRecord, Status
from harness.runtime.vllm_kernels import vllm_missing
from harness.runtime.workers import Fault
from harness.spec.plan import Plan
from harness.spec.vllm_fusions import FUSION_DTYPE, FusionProfile, fusion_case

MARKERS = ("fusion: vLLM's fusion pass over vLLM's layers, per profile",
           "engine: vLLM's engine serving requests with the plan's plugin (minutes on a CPU machine)")
FUSION_TIMEOUT_S = 600.0  # two Inductor compiles of a few layers, and vLLM's import in a fresh worker


def names_vllm_op(plan: Plan) -> bool:
    """The plans the route items are collected for: a `vllm:` section naming a layer or op, not vLLM's own kernel."""
    return bool(plan.vllm.layer or plan.vllm.ir_op or plan.vllm.custom_op) and not plan.vllm_kernel


def vllm_run_items(parent, plan: Plan, sm: str, session):
    """The fusion items of a fused op's plan and the engine item of a plan naming a vLLM op, on this machine's SM."""
    for name, profile in fusion_items(plan, sm):
        item = FusionItem.from_parent(parent, name=name, profile=profile, sm=sm, plan_session=session)
        item.add_marker("fusion")
        yield item
    if sm in plan.matrix["sm"] and names_vllm_op(plan):
        for profile in engine_profiles(sm):
            item = EngineItem.from_parent(parent, name=engine_item_name(sm, profile), sm=sm, profile=profile,
                                          plan_session=session)
            item.add_marker("engine")
            yield item


class _VllmRunItem(pytest.Item):
    def __init__(self, *, sm: str, plan_session, **kwargs):
        super().__init__(**kwargs)
        self.sm, self.plan_session = sm, plan_session

    def reportinfo(self):
        return self.path, 0, f"{self.parent.name}::{self.name}"  # the plan file's first line, as the other items

    def _finish(self, rec: IntegrationRecord) -> None:
        """Record the item; skip it where it did not run here, fail it with its reason (no traceback)."""
        self.plan_session.record("integration", self.name, rec)
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
        case = fusion_case(self.plan_session.plan)
        return IntegrationRecord(route="fusion", phase="all", dtype=FUSION_DTYPE, tp=1, graph_mode="torch_compile",
                                 sm=self.sm, status=status, reason=reason,
                                 fusion=FusionOutcome(self.profile.id, list(self.profile.custom_ops),
                                                      self.profile.ir_priorities(case), case.pass_class))

    def setup(self):
        if vllm_missing():  # without starting a worker
            self._finish(self._record_of(Status.NOT_RUN, vllm_missing()))

    def runtest(self):
        # The vLLM worker the route items use: vLLM is imported there once.
        task = FusionTask(self.plan_session.plan, self.profile.id, self.sm)
        value = self.plan_session.worker("vllm").call(run_fusion_item, task, FUSION_TIMEOUT_S)
        self._finish(self._record_of(Status.FAILED, value.reason) if isinstance(value, Fault) else value)


class EngineItem(_VllmRunItem):
    """vLLM's engine serving requests with the plan's plugin loaded, against the engine without it."""

    def __init__(self, *, profile: str, **kwargs):
        super().__init__(**kwargs)
        self.profile = profile

    def setup(self):
        s = self.plan_session
        why = engine_unsupported(s.plan) or (
            f"not run: the kernel killed its worker in every numerics cell ({s.cells_killed}); an engine serving it "
            "would only crash" if s.cells_killed and not s.cells_survived else "")
        if why:
            self._finish(IntegrationRecord(route="engine", phase="all", dtype="bf16", tp=1, graph_mode="eager",
                                           sm=self.sm, status=Status.NOT_RUN, reason=why))

    def runtest(self):
        # In this process: the engines run in processes of their own, started by spawn.
        self._finish(run_engine_item(self.plan_session.plan, self.sm, profile=self.profile))
