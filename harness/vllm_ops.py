"""The vLLM ops the harness knows, as data: one description per op, and every name derived from it.

Each description says where the op lives in vLLM (its layer class and CustomOp registry name, its
vLLM IR op, its in-tree `torch.ops._C` kernel and that kernel's schema), which tolerances vLLM IR
checks it with, how one kernel call maps onto a call of vLLM's layer, and which plugin template
(`harness/vllm_plugins/<op>.py`, a real Python module) ships a kernel for it. Adding a vLLM op means
adding one description here and one template there.

The names a deployment types come from here too, so the report, the generated plugin and the
integration items cannot disagree:
- `+<custom_op>` in `compilation_config.custom_ops` turns on vLLM's own kernel for the layer;
- `+<LayerClass>` turns on an out-of-tree replacement (`CustomOp.register_oot` renames it to the
  in-tree class name, so `+<custom_op>` no longer reaches it);
- the IR provider name goes into `--ir-op-priority`.

`profile_setting` gives the setting for each decision the report makes, per vLLM profile: with Inductor
(vLLM's default: forward_native compiled by Inductor, IR priority `["native"]`, custom_ops `none`) and
without it (vLLM's default: vLLM's own kernels, IR priority `["vllm_c", "native"]`, custom_ops `all`).

Plain Python: nothing here imports torch or vLLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .plan import Plan, Tolerance

TEMPLATES = Path(__file__).parent / "vllm_plugins"


def _rms_norm_layer(out, x, weight, eps):
    return {"hidden_size": x.shape[-1], "eps": eps, "dtype": weight.dtype}, {"weight": weight}, (x,)


def _fused_add_rms_norm_layer(x, residual, weight, eps):
    return {"hidden_size": x.shape[-1], "eps": eps, "dtype": weight.dtype}, {"weight": weight}, (x, residual)


def _silu_and_mul_layer(out, x):
    return {}, {}, (x,)


@dataclass(frozen=True)
class VllmOp:
    """One vLLM op whose in-tree kernel follows the calling convention of the plan's kernel."""

    name: str
    layer: str  # vLLM's layer class that runs it, as an import path
    custom_op: str  # the layer's in-tree CustomOp registry name
    ir_op: str | None  # its vllm.ir op, None where vLLM has none
    in_tree: str  # torch.ops._C.<in_tree>
    in_tree_schema: str  # that kernel's schema, as vLLM registers it (csrc/torch_bindings.cpp)
    # kernel args (in call order) -> (layer constructor kwargs, layer tensors, layer.forward args)
    layer_call: Callable
    # vLLM IR's tolerance for the op where it differs from the IR defaults (ir_tolerance below)
    tolerance_overrides: dict[str, Tolerance] = field(default_factory=dict)

    @property
    def layer_class(self) -> str:
        return self.layer.rpartition(":")[2]

    @property
    def in_tree_flag(self) -> str:
        """The custom_ops entry that turns on vLLM's own kernel for the layer."""
        return f"+{self.custom_op}"

    @property
    def oot_flag(self) -> str:
        """The custom_ops entry that turns on an out-of-tree replacement (renamed to the layer class)."""
        return f"+{self.layer_class}"

    @property
    def template(self) -> Path:
        return TEMPLATES / f"{self.name}.py"


# vLLM IR's default tolerances per dtype (vllm/ir/op.py); ops may override some.
IR_DEFAULT_TOLERANCE = {"fp32": Tolerance(1e-5, 1.3e-6), "fp16": Tolerance(1e-3, 1e-3), "bf16": Tolerance(1e-3, 1.6e-2)}
_NORM_FP16 = {"fp16": Tolerance(1e-2, 2e-3)}  # 1 ulp where the weight product rounds

VLLM_OPS = {op.name: op for op in (
    VllmOp("rms_norm", "vllm.model_executor.layers.layernorm:RMSNorm", "rms_norm", "rms_norm", "rms_norm",
           "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()", _rms_norm_layer,
           _NORM_FP16),
    VllmOp("fused_add_rms_norm", "vllm.model_executor.layers.layernorm:RMSNorm", "rms_norm", "fused_add_rms_norm",
           "fused_add_rms_norm",
           "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()",
           _fused_add_rms_norm_layer, _NORM_FP16),
    VllmOp("silu_and_mul", "vllm.model_executor.layers.activation:SiluAndMul", "silu_and_mul", None,
           "silu_and_mul", "silu_and_mul(Tensor! result, Tensor input) -> ()", _silu_and_mul_layer),
)}


def vllm_op(plan: Plan) -> VllmOp | None:
    """The vLLM op the plan's kernel replaces: by its IR op, its own name, then its CustomOp name."""
    for key in (plan.vllm.ir_op, plan.name, plan.vllm.custom_op):
        if key in VLLM_OPS:
            return VLLM_OPS[key]
    return None


def unsupported(plan: Plan) -> str:
    """Why the harness cannot put this plan's kernel into vLLM ("" when it can)."""
    op = vllm_op(plan)
    if op is None:
        return (f"the harness drives vLLM's {', '.join(sorted(VLLM_OPS))} only; the plan names none of them "
                f"(vllm.ir_op, op.name, vllm.custom_op)")
    if plan.vllm.layer and plan.vllm.layer != op.layer:
        return f"vllm.layer names {plan.vllm.layer}; the harness drives {op.layer} for this op"
    return ""


def ir_tolerance(plan: Plan, dtype: str) -> Tolerance | None:
    """The tolerance vLLM IR checks this op with in `dtype`, or None where vLLM has no IR op for it."""
    op = vllm_op(plan)
    if op is None or op.ir_op is None or dtype not in IR_DEFAULT_TOLERANCE:
        return None
    return op.tolerance_overrides.get(dtype, IR_DEFAULT_TOLERANCE[dtype])


# ---------------------------------------------------------------- the plugin and its names


def provider_name(plan: Plan) -> str:
    """The IR provider name the plugin registers and a deployment lists in --ir-op-priority."""
    return plan.vllm.provider or re.sub(r"\W", "_", plan.name.lower()) + "_kernel"


def plugin_module_name(plan: Plan) -> str:
    return re.sub(r"\W", "_", plan.name.lower()) + "_vllm_plugin"


def plugin_route(plan: Plan) -> str:
    """The route the plugin registers through: the plan's, except that ops without an IR op take custom_op."""
    op = vllm_op(plan)
    return "ir" if plan.vllm.route == "ir" and (op is None or op.ir_op) else "custom_op"


def plugin_entry_point(plan: Plan) -> str:
    """The pyproject.toml lines that make vLLM load the plugin in every process."""
    return f'[project.entry-points."vllm.general_plugins"]\n{plan.name} = "{plugin_module_name(plan)}:register"\n'


# vLLM IR's provider names (vllm/ir/op.py reserves "native"; vllm/kernels/vllm_c.py registers vLLM's own kernels
# as "vllm_c" for these ops, as of vLLM 0.32).
NATIVE_PROVIDER, VLLM_C_PROVIDER = "native", "vllm_c"
VLLM_C_IR_OPS = ("rms_norm", "fused_add_rms_norm")
# What a deployment runs for the layer: the plan's kernel (through its plugin), vLLM's own kernel, forward_native.
USES = ("kernel", "vllm", "native")
VLLM_DEFAULT = "vLLM's default"


def _ir_priority(ir_op: str, providers: list[str]) -> str:
    return f"""--ir-op-priority '{{"{ir_op}": [{", ".join(f'"{p}"' for p in providers)}]}}'"""


def _custom_ops(entries: list[str]) -> str:
    return f"""--compilation-config '{{"custom_ops": [{", ".join(f'"{e}"' for e in entries)}]}}'"""


def is_vllm_default(inductor: bool, use: str) -> bool:
    """Whether vLLM already does this in the profile: native under Inductor, its own kernel without it."""
    return use == ("native" if inductor else "vllm")


def profile_setting(plan: Plan, inductor: bool, use: str) -> str:
    """The vLLM setting that makes the op's layer run `use` (USES) in a profile with or without Inductor; "" where
    the harness cannot put the plan's kernel into vLLM (`unsupported`). The `kernel` settings need the plan's
    plugin installed; the `vllm` and `native` settings assume it is not (its CustomOp would take the layer)."""
    if use not in USES:
        raise ValueError(f"use must be one of {', '.join(USES)}; got {use!r}")
    op = vllm_op(plan)
    if op is None or unsupported(plan):
        return ""
    if plugin_route(plan) == "ir":
        has_vllm_c = op.ir_op in VLLM_C_IR_OPS
        if use == "kernel":
            # without Inductor, calls the kernel rejects (supports_args) fall back to vLLM's kernel, not native
            fallback = [NATIVE_PROVIDER] if inductor or not has_vllm_c else [VLLM_C_PROVIDER, NATIVE_PROVIDER]
            return _ir_priority(op.ir_op, [provider_name(plan), *fallback])
        if use == "vllm":
            return _ir_priority(op.ir_op, [VLLM_C_PROVIDER, NATIVE_PROVIDER]) if has_vllm_c else VLLM_DEFAULT
        return _ir_priority(op.ir_op, [NATIVE_PROVIDER])
    base = "none" if inductor else "all"
    if use == "kernel":
        return _custom_ops([base, op.oot_flag])
    if use == "vllm":
        return _custom_ops([base, op.in_tree_flag])
    return _custom_ops([base] if inductor else [base, f"-{op.custom_op}"])


def enable_setting(plan: Plan) -> str:
    """How a deployment selects the kernel once the plugin is loaded (vLLM does not select it by itself)."""
    op = vllm_op(plan)
    if plugin_route(plan) == "ir":
        return f"""--ir-op-priority '{{"{op.ir_op}": ["{provider_name(plan)}", "native"]}}'"""
    return f"""--compilation-config '{{"custom_ops": ["none", "{op.oot_flag}"]}}'"""


# Lines of a template that rendering rewrites, by the marker comment that ends them.
_MARKED = re.compile(r"^(?P<lhs>.*?)\s*# harness: (?P<what>\w+)$", re.M)


def render_plugin(plan: Plan) -> str:
    """The plan's vLLM general plugin: its op's template with the kernel, op name, provider and route filled in."""
    why = unsupported(plan)
    if why:
        raise ValueError(f"{plan.path}: no vLLM plugin for this plan: {why}")
    op = vllm_op(plan)
    text = op.template.read_text()
    module, _, attr = plan.kernel.partition(":")
    values = {
        "kernel": (f"from {module} import {attr} as kernel" if "." not in attr
                   else f"import {module}  # noqa: E402\nkernel = {module}.{attr}"),
        "op": f'OP = "{plan.op_qualname}"',
        "provider": f'PROVIDER = "{provider_name(plan)}"',
        "route": f'ROUTE = "{plugin_route(plan)}"',
    }
    text = _MARKED.sub(lambda m: values[m["what"]], text)
    note = "" if plugin_route(plan) == plan.vllm.route else \
        f"\n(vllm.route is {plan.vllm.route}, but vLLM has no IR op for {plan.name}: the CustomOp route is used.)\n"
    entry = plugin_entry_point(plan).strip().replace("\n", "\n    ")
    doc = (f'"""vLLM general plugin: {op.layer_class} runs {plan.kernel} as {plan.op_qualname}.\n\n'
           f"Generated from {plan.path.name} by the vllm-op-plan harness. vLLM loads it in every process\n"
           f"through this entry point (pyproject.toml of the package that ships it):\n\n    {entry}\n\n"
           f"Loading registers the kernel; a deployment selects it with\n    {enable_setting(plan)}\n{note}\"\"\"")
    return re.sub(r'\A""".*?"""', lambda _: doc, text, count=1, flags=re.S)
