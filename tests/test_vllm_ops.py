"""The plan's route into vLLM as data: the route templates, the plugins rendered from them for the bundled plans, and
the names the plans give checked against vLLM's own registries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from string import Template

import pytest

from harness.vllm.plugin_source import TEMPLATES, plugin_template, render_plugin
from harness.runtime.vllm_compiled import vllm_missing
from harness.vllm_facts.defaults import CPU, CUDA, CUSTOM_OP, DEFAULTS, FUSION_PASS, INDUCTOR_ON, IR, ROCM
from harness.plan.load import load_plan
from harness.plan.tolerances import tolerance_for
from harness.vllm_facts.names import ROUTE_KINDS, adapter_module, enable_setting, in_tree_flag, oot_flag, \
    plugin_route, provider_name, unsupported

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_PLANS = [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml"))]
# The bundled plans whose route the harness drives: a plugin and integration items each.
DRIVEN = [p for p in BUNDLED_PLANS if plugin_route(load_plan(p))]
needs_vllm = pytest.mark.skipif(bool(vllm_missing()), reason="vllm not installed")


def _ruff(path: Path) -> subprocess.CompletedProcess:
    ruff = Path(sys.executable).with_name("ruff")
    return subprocess.run([str(ruff), "check", "--no-cache", "--select", "E9,F", "--line-length", "120", str(path)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("route", [r for r, kind in ROUTE_KINDS.items() if kind.driven])
def test_every_driven_route_has_one_template_and_it_names_no_op(route):
    """One template per route, whose placeholders the plugin fills in; nothing op-specific is written in it."""
    template = Template(plugin_template(route).read_text())
    assert template.is_valid()
    assert set(template.get_identifiers()) <= {"docstring", "imports", "generic", "op", "layer_module", "layer_class",
                                               "ir_op", "inplace", "provider", "route", "act_dtypes",
                                               "min_capability"}
    text = plugin_template(route).read_text()
    for plan_path in BUNDLED_PLANS:
        plan = load_plan(plan_path)
        for name in (plan.op.name, plan.vllm.layer, plan.vllm.ir_op, plan.vllm.custom_op):
            assert not name or name not in text, f"{route}.py.tmpl names {name}"
    assert sorted(p.name for p in TEMPLATES.iterdir()) == sorted(f"{r}.py.tmpl" for r, k in ROUTE_KINDS.items()
                                                                 if k.driven)


def test_the_bundled_plans_drive_the_routes_vllm_has_for_their_kind():
    routes = {load_plan(p).op.name: load_plan(p).vllm.route for p in BUNDLED_PLANS}
    assert routes["rms_norm"] == routes["fused_add_rms_norm"] == "ir"
    assert routes["silu_and_mul"] == routes["rotary_embedding"] == routes["dynamic_per_token_fp8_quant"] == "custom_op"
    assert routes["paged_attention"] == "attention_backend"
    assert routes["int8_linear_column"] == routes["int8_linear_row"] == "quantization"
    assert {routes[n] for n in ("rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant",
                                "silu_and_mul_quant")} == {"fusion"}


@pytest.mark.parametrize("plan_path", DRIVEN, ids=lambda p: p.stem)
def test_rendered_plugin_lints_and_names_the_one_op(plan_path, tmp_path):
    plan = load_plan(plan_path)
    text = render_plugin(plan)
    assert f'OP = "{plan.op_qualname}"' in text and enable_setting(plan) in text
    assert (f'PROVIDER = "{provider_name(plan)}"' in text) == (plan.vllm.route == "ir")
    assert (f'QUANTIZATION = "{provider_name(plan)}"' in text) == (plan.vllm.route == "quantization")
    # the attention backend maps vLLM's tensors onto the kernel's by the plan's shapes: no adapter module
    assert (f"import {adapter_module(plan)} as adapter" in text) == (plan.vllm.route != "attention_backend")
    (tmp_path / "plugin.py").write_text(text)
    proc = _ruff(tmp_path / "plugin.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_flags_say_which_kernel_they_turn_on():
    rms, silu = load_plan(ROOT / "plan.yaml"), load_plan(ROOT / "kernels/plans/silu_and_mul.yaml")
    assert (in_tree_flag(rms), oot_flag(rms)) == ("+rms_norm", "+RMSNorm")
    assert (in_tree_flag(silu), oot_flag(silu)) == ("+silu_and_mul", "+SiluAndMul")
    assert "+SiluAndMul" in enable_setting(silu)
    assert '"rms_norm": ["rms_norm_kernel", "native"]' in enable_setting(rms)


def test_a_route_the_harness_does_not_drive_says_why():
    plan = load_plan(ROOT / "kernels/plans/rms_norm_static_fp8_quant.yaml")
    assert plugin_route(plan) is None
    assert "fusion" in unsupported(plan)


_IN_VLLM = r"""
import importlib.util, json, os, sys, traceback
import torch
from vllm import ir
from vllm.model_executor.custom_op import CustomOp, op_registry
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from harness.runtime.resolve import import_object
from harness.plan.load import load_plan

pairs = json.loads(sys.argv[1])  # [plan path, rendered plugin path]
dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
registries = {}
for plan_path, _ in pairs:  # vLLM's own names, before any plugin registered
    v = load_plan(plan_path).vllm
    layer = import_object(v.layer)  # vLLM and the layer the plugin replaces, imported once
    entry = {"custom_op": v.custom_op is None or op_registry.get(v.custom_op) in [c for c in layer.__mro__],
             "is_custom_op": issubclass(layer, CustomOp), "is_linear": issubclass(layer, LinearBase),
             "is_attention": issubclass(layer, AttentionLayerBase),
             "ir_op": v.ir_op is None or hasattr(ir.ops, v.ir_op), "tolerance": {}, "providers": []}
    if v.ir_op and hasattr(ir.ops, v.ir_op):
        entry["providers"] = sorted(getattr(ir.ops, v.ir_op).impls)
        for dt, t in dtypes.items():
            tol = getattr(ir.ops, v.ir_op).get_tolerance(t)
            entry["tolerance"][dt] = [float(tol["atol"]), float(tol["rtol"])]
    registries[plan_path] = entry
# vLLM's own defaults on this machine's platform, per profile (harness.vllm_facts.defaults pins them): the custom_ops
# base mode and fusion-pass flags the config gives, and the platform's default IR op priority.
from vllm.config import CompilationConfig, VllmConfig
from vllm.config.compilation import CompilationMode
from vllm.platforms import current_platform
defaults = {}
for profile, mode in (("Inductor on", CompilationMode.VLLM_COMPILE), ("Inductor off", CompilationMode.NONE)):
    config = VllmConfig(compilation_config=CompilationConfig(mode=mode))
    cc = config.compilation_config
    defaults[profile] = {"custom_ops": list(cc.custom_ops), "fusion_flags": [cc.pass_config.fuse_norm_quant,
                         cc.pass_config.fuse_act_quant], "platform": type(current_platform).__name__,
                         "ir_priority": list(current_platform.get_default_ir_op_priority(config).rms_norm)}
registrations = {}
for plan_path, plugin_path in pairs:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a process of its own, where no other plugin registered
        os.close(read)
        message, code = "ok", 0
        try:
            spec = importlib.util.spec_from_file_location("plugin", plugin_path)
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            m.register()
            m.register()
            name = m.OP.split("::")
            assert hasattr(getattr(torch.ops, name[0]), name[1])
        except BaseException:
            message, code = traceback.format_exc(), 1
        os.write(write, message.encode())
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    _, status = os.waitpid(pid, 0)
    registrations[plan_path] = [os.waitstatus_to_exitcode(status), message]
print(json.dumps({"registries": registries, "registrations": registrations, "defaults": defaults}))
"""


@pytest.fixture(scope="module")
def in_vllm(tmp_path_factory) -> dict:
    """A process of its own where vLLM is imported (this process's tests define ops vLLM's import registers too) and
    no plugin registered: vLLM's registries as it has them, and per bundled plan its rendered plugin loaded and
    registered twice (as vLLM's plugin loader may call it) in a child forked for it: (exit status, "ok" or the
    traceback), and vLLM's defaults per profile on this machine's platform. One process imports vLLM and the layers
    once for all of it (12 s on a 2-core CPU machine each time)."""
    tmp = tmp_path_factory.mktemp("plugins")
    pairs = []
    for i, plan_path in enumerate(DRIVEN):
        (tmp / f"plugin{i}.py").write_text(render_plugin(load_plan(plan_path)))
        pairs.append([str(plan_path), str(tmp / f"plugin{i}.py")])
    proc = subprocess.run([sys.executable, "-c", _IN_VLLM, json.dumps(pairs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_vllm
@pytest.mark.xdist_group("vllm_plugins")  # one worker under --dist loadgroup: the fixture's process starts once
def test_the_plans_names_match_vllms_own_registries(in_vllm):
    """CustomOp registry names, IR ops, in-tree providers and IR tolerances as vLLM itself has them."""
    for path in map(str, DRIVEN):
        plan, entry = load_plan(path), in_vllm["registries"][path]
        assert entry["custom_op"], f"{path}: {plan.vllm.custom_op} is not {plan.vllm.layer}'s"
        kind = {"quantization": "is_linear", "attention_backend": "is_attention"}.get(plan.vllm.route, "is_custom_op")
        assert entry[kind], entry
        assert entry["ir_op"], f"{path}: vLLM has no vllm.ir.ops.{plan.vllm.ir_op}"
        assert not plan.vllm.in_tree_provider or plan.vllm.in_tree_provider in entry["providers"], entry
        for dt, (atol, rtol) in entry["tolerance"].items():
            mine = tolerance_for(plan, dt)
            assert (mine.atol, mine.rtol) == pytest.approx((atol, rtol)), f"{path} {dt}: vLLM IR says {atol}/{rtol}"


@needs_vllm
@pytest.mark.xdist_group("vllm_plugins")
def test_the_pinned_vllm_defaults_are_the_installed_vllms(in_vllm):
    """harness.vllm_facts.defaults pins vLLM's defaults per switch kind, platform and profile (the pages and decisions
    read them without importing vLLM): where the installed vLLM runs (a CPU machine), its config and platform give the
    same. The custom_ops base mode is the config's, the same on every platform."""
    def pinned(kind, platform, profile):
        return next(d for d in DEFAULTS if (d.kind, d.platform, d.profile) == (kind, platform, profile)).on

    platform = {"CpuPlatform": CPU, "CudaPlatform": CUDA, "RocmPlatform": ROCM}
    for profile, seen in in_vllm["defaults"].items():
        for where in (CUDA, ROCM, CPU):
            assert pinned(CUSTOM_OP, where, profile) == (seen["custom_ops"][0] == "all"), (profile, seen)
        here = platform[seen["platform"]]
        assert pinned(IR, here, profile) == ("vllm_c" in seen["ir_priority"]), (profile, seen)
        if profile == INDUCTOR_ON:  # without Inductor no fusion pass runs, whatever its flag says
            assert pinned(FUSION_PASS, here, profile) == any(seen["fusion_flags"]), (profile, seen)


@needs_vllm
@pytest.mark.xdist_group("vllm_plugins")  # one worker under --dist loadgroup: the fixture's process starts once
@pytest.mark.parametrize("plan_path", DRIVEN, ids=lambda p: p.stem)
def test_bundled_plugin_imports_and_registers_with_vllm(plan_path, in_vllm):
    status, message = in_vllm["registrations"][str(plan_path)]
    assert status == 0 and message == "ok", f"exit status {status}: {message[-3000:]}"
