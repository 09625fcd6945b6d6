"""The vLLM ops the harness knows, as data: one description per op, and every name derived from it.

Each description says where the op lives in vLLM (its layer class and CustomOp registry name, its
vLLM IR op, its in-tree `torch.ops._C` kernel and that kernel's schema), which tolerances vLLM IR
checks it with, and how one kernel call maps onto a call of vLLM's layer. The plugin that ships a kernel for
it is generated from its template (harness/rendering/plugin_templates/<op>.py.tmpl, filled by
harness.rendering.python_source). Adding a vLLM op means adding one description here and one template there.

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
from typing import Callable

from harness.spec.plan import Plan, Tolerance
from harness.spec.vllm_defaults import INDUCTOR_OFF, INDUCTOR_ON, switch_setting, vllm_default
from harness.spec.vllm_schemas import VLLM_KERNELS, VllmKernel, mismatches


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
    in_tree: str  # torch.ops._C.<in_tree>, described in harness.spec.vllm_schemas
    # kernel args (in call order) -> (layer constructor kwargs, layer tensors, layer.forward args)
    layer_call: Callable
    # vLLM IR's tolerance for the op where it differs from the IR defaults (harness.spec.tolerances.ir_tolerance)
    tolerance_overrides: dict[str, Tolerance] = field(default_factory=dict)
    # per kernel arg (in call order), the template's supports_args parameter vLLM passes it as; None: not passed
    # (an output the plugin allocates). The contract's checks are written on these
    # (harness.rendering.python_source.contract_checks).
    supports_params: tuple[str | None, ...] = ()

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
    def in_tree_schema(self) -> str:
        """The in-tree kernel's schema, as vLLM registers it."""
        return VLLM_KERNELS[self.in_tree].schema


# Where an op's vLLM IR tolerance differs from IR's defaults (harness.spec.tolerances.IR_DEFAULT_TOLERANCE).
_NORM_FP16 = {"fp16": Tolerance(1e-2, 2e-3)}  # 1 ulp where the weight product rounds

VLLM_OPS = {op.name: op for op in (
    VllmOp("rms_norm", "vllm.model_executor.layers.layernorm:RMSNorm", "rms_norm", "rms_norm", "rms_norm",
           _rms_norm_layer, _NORM_FP16, supports_params=(None, "x", "weight", "epsilon")),
    VllmOp("fused_add_rms_norm", "vllm.model_executor.layers.layernorm:RMSNorm", "rms_norm", "fused_add_rms_norm",
           "fused_add_rms_norm", _fused_add_rms_norm_layer, _NORM_FP16,
           supports_params=("x", "x_residual", "weight", "epsilon")),
    VllmOp("silu_and_mul", "vllm.model_executor.layers.activation:SiluAndMul", "silu_and_mul", None,
           "silu_and_mul", _silu_and_mul_layer, supports_params=(None, "x")),
)}


def vllm_op(plan: Plan) -> VllmOp | None:
    """The vLLM op the plan's kernel replaces: by its IR op, its own name, then its CustomOp name."""
    for key in (plan.vllm.ir_op, plan.name, plan.vllm.custom_op):
        if key in VLLM_OPS:
            return VLLM_OPS[key]
    return None


def unsupported(plan: Plan) -> str:
    """Why the harness cannot put this plan's kernel into vLLM ("" when it can)."""
    if plan.vllm_kernel:
        return (f"the kernel is vLLM's own {VLLM_KERNELS[plan.vllm_kernel].call}, already in vLLM: no plugin, no "
                "integration items")
    op = vllm_op(plan)
    if op is None:
        return (f"the harness drives vLLM's {', '.join(sorted(VLLM_OPS))} only; the plan names none of them "
                f"(vllm.ir_op, op.name, vllm.custom_op)")
    if plan.vllm.layer and plan.vllm.layer != op.layer:
        return f"vllm.layer names {plan.vllm.layer}; the harness drives {op.layer} for this op"
    return ""


def vllm_kernel_for(plan: Plan) -> VllmKernel | None:
    """vLLM's compiled kernel for the plan's op: the one `op.kernel: vllm:<name>` names, else the one of the op's name
    (or of the vLLM op it replaces)."""
    if plan.vllm_kernel:
        return VLLM_KERNELS[plan.vllm_kernel]
    op = vllm_op(plan)
    return next((k for k in VLLM_KERNELS.values() if plan.name in (k.name, k.in_tree)
                 or op is not None and op.in_tree == k.in_tree), None)


def baseline_unsupported(plan: Plan) -> str:
    """Why vLLM's kernel cannot be the plan's `vllm` baseline ("" when it can): no kernel for the op, or the plan's
    arguments do not map onto the kernel's schema through its adapter (VllmKernel.args)."""
    kernel = vllm_kernel_for(plan)
    if kernel is None:
        return (f"vLLM has no compiled kernel the harness knows for {plan.name} (harness.spec.vllm_schemas: "
                f"{', '.join(sorted(k.name for k in VLLM_KERNELS.values()))})")
    if plan.vllm_kernel:
        return f"the kernel is vLLM's own {kernel.call}"
    missing = [n for n in kernel.args if not plan.has_arg(n)]
    if missing:
        return (f"{kernel.call} takes ({', '.join(kernel.args)}) from the plan's arguments; the plan has no "
                f"{', '.join(missing)}")
    bad = mismatches(kernel, [plan.arg(n) for n in kernel.args], plan.written_args)
    if bad:
        index, expected, found = bad[0]
        where = "its arguments" if index is None else f"'{kernel.args[index]}'"
        return f"the plan's {where} cannot be {kernel.call}'s: expected {expected}; found {found}"
    return ""


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


def is_vllm_default(inductor: bool, use: str, plan: Plan | None = None, sm: str = "") -> bool:
    """Whether vLLM already does this in the profile: native under Inductor, its own kernel without it; for a plan
    whose kernel is vLLM's own, what harness.spec.vllm_defaults says vLLM does with it on that SM's platform."""
    if plan is not None and plan.vllm_kernel:
        default = vllm_default(plan.vllm_kernel, sm, INDUCTOR_ON if inductor else INDUCTOR_OFF)
        return default is not None and default.on == (use == "kernel")
    return use == ("native" if inductor else "vllm")


def profile_setting(plan: Plan, inductor: bool, use: str) -> str:
    """The vLLM setting that makes the op's layer run `use` (USES) in a profile with or without Inductor; "" where
    the harness cannot put the plan's kernel into vLLM (`unsupported`). The `kernel` settings need the plan's
    plugin installed; the `vllm` and `native` settings assume it is not (its CustomOp would take the layer). Where
    the plan's kernel is vLLM's own, `kernel` turns vLLM's switch for it on and the others turn it off
    (harness.spec.vllm_defaults)."""
    if use not in USES:
        raise ValueError(f"use must be one of {', '.join(USES)}; got {use!r}")
    if plan.vllm_kernel:  # the kernel is vLLM's own: enabling it is turning vLLM's switch for it on
        return switch_setting(plan.vllm_kernel, use == "kernel", inductor)
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
