"""vLLM ops as data: the descriptions, the plugin templates rendered from them, and both checked against vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from string import Template

import pytest

from harness.spec.load import load_plan
from harness.runtime.vllm_kernels import vllm_missing
from harness.rendering.python_source import plugin_template, render_plugin
from harness.spec.tolerances import IR_DEFAULT_TOLERANCE
from harness.spec.vllm_ops import VLLM_OPS, enable_setting, provider_name, vllm_op

ROOT = Path(__file__).resolve().parents[1]
PLANS = [ROOT / "plan.yaml", ROOT / "kernels/plans/fused_add_rms_norm.yaml", ROOT / "kernels/plans/silu_and_mul.yaml"]
BUNDLED = dict(zip(("rms_norm", "fused_add_rms_norm", "silu_and_mul"), PLANS))  # each vLLM op's bundled plan
needs_vllm = pytest.mark.skipif(bool(vllm_missing()), reason="vllm not installed")


def _ruff(path: Path) -> subprocess.CompletedProcess:
    ruff = Path(sys.executable).with_name("ruff")
    return subprocess.run([str(ruff), "check", "--no-cache", "--select", "E9,F", "--line-length", "120", str(path)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("op", sorted(VLLM_OPS))
def test_every_description_has_a_template_and_a_bundled_plan(op):
    """Every placeholder of the template is one the plugin fills in (the bundled plan's plugin lints, below)."""
    template = Template(plugin_template(VLLM_OPS[op]).read_text())
    assert template.is_valid()
    assert set(template.get_identifiers()) == {"docstring", "kernel", "op", "provider", "route", "contract"}
    assert vllm_op(load_plan(BUNDLED[op])) is VLLM_OPS[op]


@pytest.mark.parametrize("plan_path", PLANS, ids=lambda p: p.stem)
def test_rendered_plugin_lints_and_names_the_one_op(plan_path, tmp_path):
    plan = load_plan(plan_path)
    text = render_plugin(plan)
    assert f'OP = "{plan.op_qualname}"' in text and f'PROVIDER = "{provider_name(plan)}"' in text
    assert enable_setting(plan) in text
    (tmp_path / "plugin.py").write_text(text)
    proc = _ruff(tmp_path / "plugin.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_flags_say_which_kernel_they_turn_on():
    rms, silu = VLLM_OPS["rms_norm"], VLLM_OPS["silu_and_mul"]
    assert (rms.in_tree_flag, rms.oot_flag) == ("+rms_norm", "+RMSNorm")
    assert (silu.in_tree_flag, silu.oot_flag) == ("+silu_and_mul", "+SiluAndMul")
    assert "+SiluAndMul" in enable_setting(load_plan(PLANS[2]))
    assert '"rms_norm": ["rms_norm_kernel", "native"]' in enable_setting(load_plan(PLANS[0]))


_AGAINST_VLLM = r"""
import json, sys
import torch
from vllm import ir
from vllm.model_executor.custom_op import op_registry
from harness.runtime.resolve import import_object
from harness.spec.tolerances import IR_DEFAULT_TOLERANCE
from harness.spec.vllm_ops import VLLM_OPS
dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
out = {}
for name, op in VLLM_OPS.items():
    layer = import_object(op.layer)
    entry = {"custom_op_registered": op_registry.get(op.custom_op) is layer,
             "ir_op_exists": op.ir_op is None or hasattr(ir.ops, op.ir_op), "tolerance": {}}
    if op.ir_op:
        for dt, t in dtypes.items():
            tol = getattr(ir.ops, op.ir_op).get_tolerance(t)
            entry["tolerance"][dt] = [float(tol["atol"]), float(tol["rtol"])]
    out[name] = entry
print(json.dumps(out))
"""


@needs_vllm
def test_descriptions_match_vllms_own_registries():
    """CustomOp registry names, IR ops and IR tolerances as vLLM itself has them (a fresh process: vLLM's import
    registers ops this process's tests also define)."""
    proc = subprocess.run([sys.executable, "-c", _AGAINST_VLLM], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, op in VLLM_OPS.items():
        assert seen[name]["custom_op_registered"], f"vLLM registers no CustomOp {op.custom_op!r} for {op.layer}"
        assert seen[name]["ir_op_exists"], f"vLLM has no vllm.ir.ops.{op.ir_op}"
        for dt, (atol, rtol) in seen[name]["tolerance"].items():
            mine = op.tolerance_overrides.get(dt, IR_DEFAULT_TOLERANCE[dt])
            assert (mine.atol, mine.rtol) == pytest.approx((atol, rtol)), f"{name} {dt}: vLLM IR says {atol}/{rtol}"


@needs_vllm
@pytest.mark.parametrize("op", sorted(VLLM_OPS))
def test_bundled_plugin_imports_and_registers_with_vllm(op, tmp_path):
    (tmp_path / "plugin.py").write_text(render_plugin(load_plan(BUNDLED[op])))
    code = ("import importlib.util, sys\nspec = importlib.util.spec_from_file_location('plugin', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\nm.register()\nm.register()\n"
            "import torch\nname = m.OP.split('::')\nassert hasattr(getattr(torch.ops, name[0]), name[1])\nprint('ok')")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "plugin.py")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_vllm_op_is_found_by_ir_op_name_or_custom_op():
    assert vllm_op(load_plan(PLANS[1])).name == "fused_add_rms_norm"
    assert vllm_op(load_plan(PLANS[2])).ir_op is None
