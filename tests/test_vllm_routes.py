"""Routes into vLLM beyond the bundled kernels: kernels that return their outputs, failures told by whose code
raised, routes the installed vLLM lacks, pages that name only what the plan and the run checked, and integration
failures in the verdict."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import kernels.rms_norm  # noqa: F401  triton imported here first
from harness.vllm_facts.names import integration_routes
from harness.decisions.verdicts import BLOCKED, sm_verdicts
from harness.vllm import routes as integration
from harness.vllm.plugin_source import render_plugin
from harness.rendering.report import render
from harness.results.merge import collect
from harness.results.store import IntegrationRecord, Status
from harness.runtime.vllm_compiled import vllm_missing
from harness.plan.load import load_plan
from harness.cells.matrix import Cell
from tests.plans import read_plan, rms_norm_plan, write_plan

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

needs_vllm = pytest.mark.skipif(bool(vllm_missing()), reason="vllm not installed")
RMS_VLLM = {"route": "ir", "layer": "vllm.model_executor.layers.layernorm:RMSNorm", "ir_op": "rms_norm"}
CELL = Cell("decode", "bf16", 1, "eager", "cpu")
CPU_BF16 = {"phase": ["decode"], "dtype": ["bf16"], "tp": [1], "graph_mode": ["eager"], "sm": ["cpu"]}  # CELL alone

# A kernel that returns its output (as the README allows), with the op's vLLM side taken from the bundled RMSNorm.
RETURNING = """
import torch
from kernels.rms_norm import rms_norm, vllm_forward_inputs, vllm_ir_inputs, vllm_layer  # noqa: F401  the vLLM side


def rms_norm_returning(x, weight, eps):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rms_norm(y, x, weight, eps)
    return y
"""

SILU_RETURNING = """
import torch
from kernels.silu_and_mul import silu_and_mul, vllm_forward_inputs, vllm_layer  # noqa: F401  the vLLM side


def silu_and_mul_returning(x):
    out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
    silu_and_mul(out, x)
    return out
"""



def silu_plan(tmp_path: Path) -> Path:
    """silu_and_mul through a kernel that returns its output, routed as vLLM's SiluAndMul CustomOp."""
    return write_plan(
        tmp_path / "silu.yaml",
        op={"name": "silu_and_mul", "intent": "drop-in", "kernel": "returning_silu:silu_and_mul_returning",
            "reference": "kernels.silu_and_mul:silu_and_mul_ref",
            "args": {"x": {"shape": ["num_tokens", "2*intermediate"], "dtype": "act"}},
            "outputs": ["out"], "sizes": {"intermediate": [32]}},
        matrix=CPU_BF16,
        vllm={"route": "custom_op", "layer": "vllm.model_executor.layers.activation:SiluAndMul",
              "custom_op": "silu_and_mul"})


def _module(tmp_path: Path, monkeypatch, name: str, text: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_the_plugin_calls_a_returning_kernel_as_the_plan_says(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, "returning_rms:rms_norm_returning", functional=True, vllm=RMS_VLLM))
    text = render_plugin(plan)
    assert "def kernel_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:" in text
    assert "return kernel(x=x, weight=weight, eps=eps)" in text
    assert "    y = kernel_op(x, weight, eps)\n    return y" in text
    assert "kernel_op(out" not in text and "torch.empty" not in text.split("def run_kernel")[1]
    silu = render_plugin(load_plan(silu_plan(tmp_path)))
    assert "return kernel(x=x)" in silu and "    out = kernel_op(x)\n    return out" in silu


@needs_vllm
@pytest.mark.parametrize("route", ["ir", "custom_op", "plugin"])
def test_a_returning_kernel_goes_through_every_route(tmp_path, monkeypatch, route):
    _module(tmp_path, monkeypatch, "returning_rms", RETURNING)
    plan = load_plan(rms_norm_plan(tmp_path, "returning_rms:rms_norm_returning", matrix={"dtype": ["bf16"]},
                                   functional=True, vllm=RMS_VLLM))
    rec = integration.check_route(plan, CELL, route, examples=2)
    assert rec.status == Status.PASSED and rec.kernel_calls >= rec.examples == 2, rec.reason


@needs_vllm
@pytest.mark.parametrize("route", ["custom_op", "plugin"])
def test_a_returning_silu_kernel_goes_through_vllms_silu_and_mul(tmp_path, monkeypatch, route):
    _module(tmp_path, monkeypatch, "returning_silu", SILU_RETURNING)
    plan = load_plan(silu_plan(tmp_path))
    rec = integration.check_route(plan, CELL, route, examples=2)
    assert rec.status == Status.PASSED and rec.kernel_calls >= 2, rec.reason


BROKEN = """
from kernels.rms_norm import rms_norm, vllm_ir_inputs, vllm_layer  # noqa: F401


def raising(out, x, weight, eps):
    raise ValueError("the kernel's own bug")


def vllm_forward_inputs(layer, x, residual=None):
    return {"x": x, "weight": layer.weight.data, "eps": layer.missing_attribute}
"""


@needs_vllm
@pytest.mark.parametrize("kernel, route, words", [
    ("broken_side:raising", "ir", "the kernel broken_side:raising raised ValueError: the kernel's own bug"),
    ("kernels.rms_norm:rms_norm", "custom_op",
     "the op's adapter broken_side.vllm_forward_inputs raised AttributeError: "),
])
def test_a_failure_says_whose_code_raised(tmp_path, monkeypatch, kernel, route, words):
    _module(tmp_path, monkeypatch, "broken_side", BROKEN)
    plan = load_plan(rms_norm_plan(tmp_path, kernel, matrix={"dtype": ["bf16"]},
                                   vllm={**RMS_VLLM, "adapter": "broken_side"}))
    rec = integration.check_route(plan, CELL, route, examples=2)
    assert rec.status == Status.FAILED and rec.reason.startswith(words), rec.reason
    assert "vLLM's RMSNorm raised" not in rec.reason


FIRST_CALL_FAILS = """
from kernels.rms_norm import rms_norm, vllm_forward_inputs, vllm_ir_inputs, vllm_layer  # noqa: F401  the vLLM side

calls = []


def rms_norm_once_wrong(out, x, weight, eps):
    \"\"\"Right on every call but the first (a race, a stale cache), so hypothesis's replay passes.\"\"\"
    calls.append(1)
    rms_norm(out, x, weight, eps)
    if len(calls) == 1:
        out.zero_()
"""


@needs_vllm
def test_a_failure_that_does_not_recur_on_replay_is_the_kernels_said_once(tmp_path, monkeypatch):
    """hypothesis raises FlakyFailure where the replayed example passes: the item is judged by the first failure
    (a wrong output is the kernel's), said to have happened once, never "the harness raised FlakyFailure"."""
    _module(tmp_path, monkeypatch, "first_call_fails", FIRST_CALL_FAILS)
    plan = load_plan(rms_norm_plan(tmp_path, "first_call_fails:rms_norm_once_wrong", matrix={"dtype": ["bf16"]},
                                   vllm=RMS_VLLM))
    rec = integration.check_route(plan, CELL, "custom_op", examples=3)
    assert rec.status == Status.FAILED, rec
    assert "Flaky" not in rec.reason and "the harness raised" not in rec.reason, rec.reason
    assert rec.reason.endswith("(once: the same input passed when hypothesis replayed it)"), rec.reason
    assert "'out'" in rec.reason, rec.reason


@needs_vllm
def test_a_failure_in_the_generated_plugin_is_the_harnesss(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"dtype": ["bf16"]}, vllm=RMS_VLLM))
    text = render_plugin(plan) + "\n\ndef run_kernel(*args, **kwargs):\n    raise RuntimeError('generated wrongly')\n"
    rec = integration.check_route(plan, CELL, "custom_op", examples=2, plugin_text=text)
    assert rec.status == Status.FAILED, rec
    assert rec.reason.startswith("the generated plugin rms_norm_vllm_plugin raised RuntimeError: generated wrongly"), \
        rec.reason
    assert "the harness's code" in rec.reason


@needs_vllm
@pytest.mark.parametrize("section, words", [
    ({**RMS_VLLM, "ir_op": "rotary_embedding"}, "vLLM 0.32.0 has no vllm.ir.ops.rotary_embedding (vllm.ir.ops: "),
    ({"route": "custom_op", "layer": "torch.nn:LayerNorm"},
     "vLLM 0.32.0's torch.nn:LayerNorm is not a CustomOp: no out-of-tree CustomOp route for it"),
    ({**RMS_VLLM, "in_tree_provider": "elsewhere"},
     "vLLM 0.32.0 registers no provider 'elsewhere' (vllm.in_tree_provider)"),
])
def test_a_route_the_installed_vllm_lacks_fails_its_items(tmp_path, section, words):
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"dtype": ["bf16"]}, vllm=section))
    rec = integration.check_route(plan, CELL, plan.vllm.route, examples=1)
    assert rec.status == Status.FAILED and rec.reason.startswith(words), rec.reason
    assert rec.vllm == "0.32.0" and rec.kernel_calls is None


def test_a_plan_without_a_vllm_section_names_no_route(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path))
    assert integration_routes(plan) == ()
    page = render(plan, tmp_path / "reports" / "rms_norm")[0]
    assert "vllm.ir.ops" not in page and "register_impl" not in page and "register_oot" not in page
    assert "none named (the plan has no `vllm.route`)" in page
    assert "not proven here: the plan names no route into vLLM (vllm.route)" in page


def test_the_page_says_on_which_vllm_the_route_was_proven_or_why_not(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, vllm=RMS_VLLM))
    op_dir = tmp_path / "reports" / "rms_norm"
    page = render(plan, op_dir)[0]
    assert "not proven here: no integration item has run yet" in page
    res = collect(plan, op_dir)
    item = dict(phase="decode", dtype="fp32", tp=1, graph_mode="eager", sm="cpu")
    res.integration = {"vllm-ir[decode-fp32-cpu]": IntegrationRecord(route="ir", **item, status=Status.PASSED,
                                                                     vllm="0.32.0")}
    from harness.rendering.plan_words import vllm_answer

    assert "proven on vLLM 0.32.0 (cpu): 1 integration items passed" in vllm_answer(plan, res.integration)
    res.integration["vllm-plugin[decode-fp32-cpu]"] = IntegrationRecord(route="plugin", **item, status=Status.FAILED,
                                                                        reason="boom", vllm="0.32.0")
    assert "FAILED on vLLM 0.32.0 in 1 of 2 integration items: boom" in vllm_answer(plan, res.integration)


def test_a_failed_integration_item_blocks_the_verdict(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, vllm=RMS_VLLM))
    res = collect(plan, tmp_path / "reports" / "rms_norm")
    item = dict(route="custom_op", phase="decode", dtype="fp32", tp=1, graph_mode="eager", sm="cpu")
    res.integration = {"vllm-custom_op[decode-fp32-cpu]": IntegrationRecord(**item, status=Status.PASSED)}
    assert sm_verdicts(res)[0].word != BLOCKED
    res.integration["vllm-custom_op[decode-fp32-cpu]"] = IntegrationRecord(**item, status=Status.FAILED, reason="x")
    verdict = sm_verdicts(res)[0]
    assert verdict.word == BLOCKED and "1 vLLM integration items failed" in verdict.rule, verdict


WRONG_NAMES = """
from kernels.rms_norm import rms_norm, vllm_ir_inputs, vllm_layer  # noqa: F401


def vllm_forward_inputs(layer, x, residual=None):
    return {"input": x, "weight": layer.weight.data, "eps": layer.variance_epsilon}
"""


def test_validate_warns_where_the_ops_vllm_side_lacks_what_its_routes_call(tmp_path, monkeypatch):
    from harness.runtime.resolve import resolve

    _module(tmp_path, monkeypatch, "half_side", "from kernels.rms_norm import rms_norm, vllm_layer  # noqa: F401\n")
    plan = load_plan(rms_norm_plan(tmp_path, "half_side:rms_norm", vllm=RMS_VLLM))
    warnings = resolve(plan).warnings
    assert len(warnings) == 1 and re.search(
        r"plan.yaml:\d+: vllm.route: the op's vLLM side, half_side, defines no vllm_ir_inputs, vllm_forward_inputs "
        r"\(its routes call vllm_ir_inputs, vllm_layer, vllm_forward_inputs; docs/adding-an-op.md\): its vLLM "
        r"integration items will fail", warnings[0]), warnings
    fixed = load_plan(rms_norm_plan(tmp_path, "half_side:rms_norm", vllm={**RMS_VLLM, "adapter": "kernels.rms_norm"}))
    assert resolve(fixed).warnings == []


@needs_vllm
def test_an_adapter_mapping_onto_other_names_than_the_kernels_says_so(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "wrong_names", WRONG_NAMES)
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"dtype": ["bf16"]}, vllm={**RMS_VLLM, "adapter": "wrong_names"}))
    rec = integration.check_route(plan, CELL, "custom_op", examples=1)
    assert rec.status == Status.FAILED and rec.reason == (
        "the op's adapter wrong_names.vllm_forward_inputs returned the arguments eps, input, weight; the kernel's "
        "inputs are x, weight, eps (the plan's names)"), rec.reason


@needs_vllm
def test_a_quantization_method_vllm_does_not_pick_says_which_it_picked(tmp_path):
    plan = load_plan(Path(__file__).resolve().parents[1] / "kernels" / "plans" / "int8_linear_column.yaml")
    text = render_plugin(plan).replace("return PluginLinearMethod() if", "return DequantizingMethod() if") + """

class DequantizingMethod(PluginLinearMethod):  # the plugin's weights, but apply never calls the kernel
    def apply(self, layer, x, bias=None):
        return x @ (layer.weight.float() * layer.weight_scale[:, None]).T.to(x.dtype)
"""
    rec = integration.check_route(plan, CELL, "quantization", examples=1, plugin_text=text)
    assert rec.status == Status.FAILED and rec.kernel_calls == 0, rec
    assert rec.reason == ("vLLM's ColumnParallelLinear did not call the kernel: its quant_method is "
                          "DequantizingMethod, not the plugin's PluginLinearMethod"), rec.reason


@pytest.mark.parametrize("section, words", [
    ({"route": "ir", "layer": "vllm.model_executor.layers.layernorm:RMSNorm"},
     "vllm.route: expected vllm.ir_op beside route ir (the vLLM IR op the provider registers for)"),
    ({"route": "custom_op"},
     "vllm.route: expected vllm.layer beside route custom_op (the vLLM layer whose calls reach the kernel)"),
])
def test_a_route_without_what_it_needs_is_a_plan_error(tmp_path, section, words):
    from harness.plan.model import PlanError

    with pytest.raises(PlanError, match=r"plan.yaml:\d+: " + re.escape(words)):
        load_plan(rms_norm_plan(tmp_path, vllm=section))


QUANT_RETURNING = """
import torch
from kernels.fp8_quant import dynamic_per_token_scaled_fp8_quant, vllm_forward_inputs, vllm_layer  # noqa: F401


def quant_returning(x, scale_ub=None):
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)
    dynamic_per_token_scaled_fp8_quant(out, x, scales, scale_ub)
    return out, scales
"""


@needs_vllm
def test_a_kernel_returning_a_tuple_goes_through_the_custom_op_route(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "quant_returning", QUANT_RETURNING)
    bundled = Path(__file__).resolve().parents[1] / "kernels" / "plans" / "dynamic_per_token_fp8_quant.yaml"
    args = {name: arg for name, arg in read_plan(bundled)["op"]["args"].items()
            if name not in ("out", "scales")}  # its outputs, returned
    plan = load_plan(write_plan(tmp_path / "quant.yaml", bundled,
                                op={"kernel": "quant_returning:quant_returning", "args": args},
                                implementations={"vllm": None}))  # vLLM's kernel writes `out` and `scales`: not this op
    assert plan.returned_outputs == ("out", "scales")
    assert "    out, scales = kernel_op(x, scale_ub)\n    return out, scales" in render_plugin(plan)
    rec = integration.check_route(plan, CELL, "custom_op", examples=2)
    assert rec.status == Status.PASSED and rec.kernel_calls >= 2, rec.reason


def test_a_page_draws_nothing_of_a_route_the_vllm_it_ran_against_lacks(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, vllm={**RMS_VLLM, "ir_op": "rotary_embedding"}))
    op_dir = tmp_path / "reports" / "rms_norm"
    assert "vllm.ir.ops.rotary_embedding" in render(plan, op_dir)[0]  # no item has run: the plan's route, unproven
    lacks = "vLLM 0.32.0 has no vllm.ir.ops.rotary_embedding (vllm.ir.ops: rms_norm): no IR route for this op"
    item = dict(phase="decode", dtype="fp32", tp=1, graph_mode="eager", sm="cpu", vllm="0.32.0")
    integration_records = {f"vllm-{r}[decode-fp32-cpu]": IntegrationRecord(route=r, **item, status=Status.FAILED,
                                                                           reason=lacks) for r in ("ir", "plugin")}
    from harness.rendering.design import design, plugin_markdown
    from harness.rendering.plan_words import vllm_answer

    for text in (design(plan, integration_records), plugin_markdown(plan, integration_records),
                 vllm_answer(plan, integration_records)):
        assert text.count("vllm.ir.ops.rotary_embedding") == 1 and lacks.replace(":", "") in text.replace(":", ""), \
            text


SPARSE = """
import torch
import torch.nn.functional as F


def gelu_and_mul_sparse(x, std_multiplier, approximate):
    # the plan's kernel (a returning one); any code would do: the test is that vLLM IR reaches it
    d = x.shape[-1] // 2
    gate = x[..., :d]
    mean, std = gate.mean(dim=-1, keepdim=True), gate.std(dim=-1, keepdim=True, unbiased=False)
    return F.gelu(F.relu(gate - (mean + std * std_multiplier)), approximate=approximate) * x[..., d:]


gelu_and_mul_sparse_ref = gelu_and_mul_sparse


def vllm_layer(layer_class, x, std_multiplier, approximate):
    layer = layer_class(activation_sparsity=0.95, approximate=approximate)
    layer.std_multiplier = std_multiplier
    return layer, (x,)


def vllm_forward_inputs(layer, x):
    return {"x": x, "std_multiplier": layer.std_multiplier, "approximate": layer.approximate}


def vllm_ir_inputs(x, std_multiplier, approximate="none"):
    return {"x": x, "std_multiplier": std_multiplier, "approximate": approximate}
"""



def sparse_plan(tmp_path: Path) -> Path:
    """gelu_and_mul_sparse, vLLM 0.32's third IR op, through SPARSE's kernel and vLLM side."""
    return write_plan(
        tmp_path / "sparse.yaml",
        op={"name": "gelu_and_mul_sparse", "intent": "drop-in", "kernel": "sparse_side:gelu_and_mul_sparse",
            "reference": "sparse_side:gelu_and_mul_sparse_ref",
            "args": {"x": {"shape": ["num_tokens", "2*d"], "dtype": "act"}, "std_multiplier": 1.6448536269514722,
                     "approximate": "none"},
            "outputs": ["out"], "sizes": {"d": [32]}},
        matrix=CPU_BF16,
        vllm={"route": "ir", "ir_op": "gelu_and_mul_sparse",
              "layer": "vllm.model_executor.layers.activation:GeluAndMulSparse"})


@needs_vllm
@pytest.mark.parametrize("route", ["ir", "custom_op", "plugin"])
def test_a_third_vllm_ir_op_goes_through_the_same_ir_template(tmp_path, monkeypatch, route):
    """vLLM 0.32's third IR op, gelu_and_mul_sparse: its kernel, its vLLM side and its plan, nothing else."""
    _module(tmp_path, monkeypatch, "sparse_side", SPARSE)
    plan = load_plan(sparse_plan(tmp_path))
    assert "ir_op = ir.ops.gelu_and_mul_sparse" in render_plugin(plan)
    rec = integration.check_route(plan, CELL, route, examples=2)
    assert rec.status == Status.PASSED and rec.kernel_calls >= 2, rec.reason
