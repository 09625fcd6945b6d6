"""The plan's route into vLLM, and every name a deployment types, derived from the plan's `vllm:` section.

Everything op-specific lives beside the op: the plan names the route kind, the vLLM layer and IR op, and the
module holding the op's vLLM side (the adapter: how vLLM's calls map onto the kernel's arguments, by default the
kernel's own module). Here are only the route kinds and the names that follow from the plan, so the report, the
generated plugin and the integration items cannot disagree:
- `+<custom_op>` in `compilation_config.custom_ops` turns on vLLM's own kernel for the layer;
- `+<LayerClass>` turns on an out-of-tree replacement (`CustomOp.register_oot` renames it to the
  in-tree class name, so `+<custom_op>` no longer reaches it);
- the IR provider name goes into `--ir-op-priority`.

`profile_setting` gives the setting for each decision the report makes, per vLLM profile: with Inductor
(vLLM's default: forward_native compiled by Inductor, IR priority `["native"]`, custom_ops `none`) and
without it (vLLM's default: vLLM's own kernels, IR priority `[<in-tree provider>, "native"]`, custom_ops `all`).

Plain Python: nothing here imports torch or vLLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.vllm_facts.attention_layout import ROUTE as ATTENTION_ROUTE
from harness.vllm_facts.kernels import args_problem, kernel_schema, parse_schema

if TYPE_CHECKING:  # type hints only: the plan's checks import these facts, never the other way
    from harness.plan.model import Plan


@dataclass(frozen=True)
class RouteKind:
    """One way into vLLM, for one kind of op: what it registers, and whether this harness drives it."""

    name: str
    words: str  # what the route is, as a page says it
    driven: bool  # the harness has a plugin template and integration items for it
    not_driven_why: str = ""  # why not, where it is not
    enable: str = ""  # a decision to run the kernel, in words, where not "enable the custom op"


ROUTE_KINDS = {k.name: k for k in (
    RouteKind("ir", "vLLM IR provider (`register_impl`)", True),
    RouteKind("custom_op", "out-of-tree CustomOp (`CustomOp.register_oot`)", True),
    RouteKind("quantization", "quantization method (a `QuantizationConfig` registered with "
                              "`register_quantization_config` and a `LinearMethodBase` whose `apply` calls the kernel)",
              True),
    RouteKind("attention_backend", "attention backend (`register_backend(AttentionBackendEnum.CUSTOM, ...)`, "
                                   "selected with `--attention-backend CUSTOM`)", True,
              enable="enable the custom backend"),
    RouteKind("attention", "attention backend", False,
              "the harness drives attention backends through the attention_backend route"),
    RouteKind("fusion", "vLLM's fusion passes (a pattern that replaces the unfused ops with the kernel)", False,
              "the harness does not drive vLLM's fusion passes yet"),
)}


def layer_class(plan: Plan) -> str | None:
    """The class name of the vLLM layer the plan's kernel serves (`RMSNorm`), None where it names none."""
    return plan.vllm.layer.rpartition(":")[2].rpartition(".")[2] if plan.vllm.layer else None


def oot_flag(plan: Plan) -> str:
    """The custom_ops entry that turns on an out-of-tree replacement (renamed to the layer class)."""
    return f"+{layer_class(plan)}"


def in_tree_flag(plan: Plan) -> str | None:
    """The custom_ops entry that turns on vLLM's own kernel for the layer, where the plan names its CustomOp."""
    return f"+{plan.vllm.custom_op}" if plan.vllm.custom_op else None


def adapter_module(plan: Plan) -> str:
    """The module holding the op's vLLM side: the plan's `vllm.adapter`, else the kernel's own module."""
    return plan.vllm.adapter or plan.op.kernel.partition(":")[0]


def plugin_routes(plan: Plan) -> tuple[str, ...]:
    """The routes the plan's plugin registers through: its own, and the out-of-tree CustomOp for the layer an IR
    provider's op serves (every vLLM IR op's layer is a CustomOp)."""
    route = plugin_route(plan)
    if route is None:
        return ()
    return ("ir", "custom_op") if route == "ir" else (route,)


def integration_routes(plan: Plan) -> tuple[str, ...]:
    """The routes a plan's integration items take: each route its plugin registers through, then the plugin itself
    loaded by vLLM's plugin loader. None where the harness cannot drive the plan's route (the page says why)."""
    routes = plugin_routes(plan)
    if routes == (ATTENTION_ROUTE,):  # its one item loads the plugin through vLLM's plugin loader itself
        return routes
    return (*routes, "plugin") if routes else ()


def unsupported(plan: Plan) -> str:
    """Why the harness cannot put this plan's kernel into vLLM ("" when it can)."""
    route = plan.vllm.route
    if route is None:
        return "the plan names no route into vLLM (vllm.route)"
    kind = ROUTE_KINDS[route]
    if not kind.driven:
        return plan.vllm.why_not_proven or kind.not_driven_why
    return ""


def implementation_unsupported(plan: Plan, name: str = "vllm") -> str:
    """Why an implementation called through a torch.ops schema (vLLM's kernel, a library's torch.ops kernel) cannot
    take the plan's arguments ("" when it can, or where it is called otherwise): the plan names none, or its
    arguments do not map onto the schema through the entry's `args` (where the schema is known before the run:
    harness.vllm_facts.kernels, or the entry's `signature`)."""
    kernel = plan.implementation(name)
    if kernel is None:
        return ("the plan names no vLLM kernel for the op (implementations.vllm: its torch.ops._C name and the plan "
                "argument passed for each of its parameters)")
    if kernel.args is None:
        return ""
    missing = [n for n in kernel.args if not plan.has_arg(n)]
    if missing:
        return (f"{kernel.call} takes ({', '.join(kernel.args)}) from the plan's arguments; the plan has no "
                f"{', '.join(missing)}")
    schema = kernel_schema(kernel)
    if not schema:  # checked against the registered schema when it runs (harness.runtime)
        return ""
    return args_problem(kernel, parse_schema(schema)[1], [plan.arg(n) for n in kernel.args], plan.written_args)


# ---------------------------------------------------------------- the plugin and its names


def provider_name(plan: Plan) -> str:
    """The name the plugin registers the kernel under: the IR provider a deployment lists in --ir-op-priority, or
    the quantization method it passes to --quantization."""
    return plan.vllm.provider or re.sub(r"\W", "_", plan.op.name.lower()) + "_kernel"


def plugin_module_name(plan: Plan) -> str:
    return re.sub(r"\W", "_", plan.op.name.lower()) + "_vllm_plugin"


# How an integration item says the installed vLLM lacks what the plan's route needs (harness.vllm.routes
# .missing_in_vllm): "vLLM 0.32.0 has no vllm.ir.ops.x", "... registers no provider", "vLLM 0.32.0's X is not a ...".
LACKS_ROUTE = re.compile(r"^vLLM \S+?( has no | registers no |'s \S+ is not )")


def route_lacking(plan: Plan, integration: dict | None) -> str:
    """Why the vLLM the plan's integration items ran against lacks its route ("" where none says so): a page then
    draws and prints nothing of the route, so it names no symbol that vLLM lacks."""
    routes = (*plugin_routes(plan), "plugin")
    return next((r.reason for _, r in sorted((integration or {}).items())
                 if r.route in routes and LACKS_ROUTE.match(r.reason or "")), "")


def plugin_route(plan: Plan) -> str | None:
    """The route the plan's plugin registers through, None where the harness cannot drive the plan's route."""
    return None if unsupported(plan) else plan.vllm.route


def plugin_entry_point(plan: Plan) -> str:
    """The pyproject.toml lines that make vLLM load the plugin in every process."""
    return f'[project.entry-points."vllm.general_plugins"]\n{plan.op.name} = "{plugin_module_name(plan)}:register"\n'


# How a deployment selects the plugin's attention backend (on a CPU machine loading the plugin selects it: vLLM's CPU
# platform loads CPU_ATTN whatever is selected, and the plugin registers over it).
ATTENTION_SETTING = "--attention-backend CUSTOM"
# vLLM IR's provider name for the reference it wraps (vllm/ir/op.py reserves "native").
NATIVE_PROVIDER = "native"
# What a deployment runs for the layer: the plan's kernel (through its plugin), vLLM's own kernel, forward_native.
USES = ("kernel", "vllm", "native")
VLLM_DEFAULT = "vLLM's default"


def ir_priority(ir_op: str, providers: list[str]) -> str:
    """The `--ir-op-priority` setting that gives an IR op these providers, in order."""
    return f"""--ir-op-priority '{{"{ir_op}": [{", ".join(f'"{p}"' for p in providers)}]}}'"""


def custom_ops(entries: list[str]) -> str:
    """The `--compilation-config` setting of a `custom_ops` list."""
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
    if unsupported(plan):
        return ""
    ir_op, in_tree = plan.vllm.ir_op, plan.vllm.in_tree_provider
    if plugin_route(plan) == "quantization":  # a quantization method is chosen per deployment, not per layer
        return f"--quantization {provider_name(plan)}" if use == "kernel" else VLLM_DEFAULT
    if plugin_route(plan) == ATTENTION_ROUTE:  # an attention backend too, whatever the profile
        return ATTENTION_SETTING if use == "kernel" else VLLM_DEFAULT
    if plugin_route(plan) == "ir":
        if use == "kernel":
            # without Inductor, calls the kernel rejects (supports_args) fall back to vLLM's kernel, not native
            fallback = [NATIVE_PROVIDER] if inductor or not in_tree else [in_tree, NATIVE_PROVIDER]
            return ir_priority(ir_op, [provider_name(plan), *fallback])
        if use == "vllm":
            return ir_priority(ir_op, [in_tree, NATIVE_PROVIDER]) if in_tree else VLLM_DEFAULT
        return ir_priority(ir_op, [NATIVE_PROVIDER])
    base = "none" if inductor else "all"
    if use == "kernel":
        return custom_ops([base, oot_flag(plan)])
    if use == "vllm":
        return custom_ops([base, in_tree_flag(plan)]) if in_tree_flag(plan) else VLLM_DEFAULT
    if inductor or not plan.vllm.custom_op:
        return custom_ops([base])
    return custom_ops([base, f"-{plan.vllm.custom_op}"])


def enable_setting(plan: Plan) -> str:
    """How a deployment selects the kernel once the plugin is loaded (vLLM does not select it by itself)."""
    if plugin_route(plan) == "quantization":
        return f"--quantization {provider_name(plan)}"
    if plugin_route(plan) == ATTENTION_ROUTE:
        return ATTENTION_SETTING
    if plugin_route(plan) == "ir":
        return f"""--ir-op-priority '{{"{plan.vllm.ir_op}": ["{provider_name(plan)}", "native"]}}'"""
    return f"""--compilation-config '{{"custom_ops": ["none", "{oot_flag(plan)}"]}}'"""
