"""vLLM in the loop: the kernel registered the way its plugin registers it, and vLLM's own layer reaching it.

Integration items (`vllm-ir[decode-bf16-cpu]`, `vllm-custom_op[...]`, `vllm-quantization[...]`,
`vllm-plugin[...]`), for the routes the plan's `vllm:` section names: the kernel is registered as an IR
provider, as an out-of-tree CustomOp or as a quantization method, or through the generated
`vllm.general_plugins` plugin loaded by vLLM's own loader; vLLM's layer is then called on drawn
inputs and must call the kernel (counted) and match the reference. Before that the route is checked against
the installed vLLM (`missing_in_vllm`), and a registration that leaves vLLM on its own path fails with the
reason vLLM took it.

What is op-specific comes from the op's adapter module (the plan's `vllm.adapter`, by default the kernel's
module): `vllm_layer` builds vLLM's layer for one call, `vllm_forward_inputs` / `vllm_ir_inputs` /
`vllm_create_weights` + `vllm_apply_inputs` map vLLM's calls onto the kernel's arguments.
A failure says whose code raised: the kernel's, the op's adapter's, the generated plugin's (the harness's) or
vLLM's.

vLLM is optional: it is imported here only when an item runs (`vllm_missing()` says whether it can
be). Every name a deployment types comes from harness.vllm_facts.names.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from hypothesis import given
from hypothesis.errors import FlakyFailure

from harness.runtime.calls import first_line, reference_outputs
from harness.runtime.device import detect, memory_held_elsewhere, package_version
from harness.runtime.inputs import build_args, examples as example_strategy
from harness.cells.matrix import Cell
from harness.runtime.numerics import Mismatch, Stats
from harness.runtime.resolve import import_object, resolve
from harness.plan.dtypes import CELL_DTYPES, DTYPE
from harness.plan.model import Plan, Tolerance
from harness.results.store import IntegrationRecord, Status

from harness.runtime.runner import RunSettings, compare_judged, hypothesis_settings
from harness.runtime.tasks import IntegrationTask
from harness.plan.tolerances import tolerance_for
from harness.runtime.vllm_compiled import vllm_missing
from harness.vllm_facts.names import adapter_module, layer_class, plugin_module_name, plugin_route, provider_name, \
    unsupported
from harness.vllm.plugin_source import render_plugin

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"vllm route": 1}

ROUTES = ("ir", "custom_op", "plugin")  # every route an item may take; a plan's own: vllm_ops.integration_routes
# The layers take floating-point activations; quantized dtypes belong to other vLLM ops.
LAYER_DTYPES = tuple(name for name in CELL_DTYPES if DTYPE[name].kind == "float")  # fp32, fp16, bf16
# Drawn examples per integration item: each proves dispatch and compares, the numerics cells do the rest.
MAX_EXAMPLES = 3


def vllm_version() -> str | None:
    return package_version("vllm")


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


def adapter_function(plan: Plan, name: str) -> Callable:
    """A function of the op's adapter module (vllm_layer, vllm_forward_inputs, vllm_ir_inputs)."""
    module = adapter_module(plan)
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise Failure(f"the op's adapter module {module} (vllm.adapter) has no {name}: {first_line(exc)}; "
                      "docs/adding-an-op.md says what it defines") from None


def build_layer(plan: Plan, values: dict, config, quant_config=None):
    """vLLM's layer for one call, built by the op's adapter (`vllm_layer`) inside a config context, as vLLM builds its
    layers, and the arguments of its forward. A quantization method's config goes to `quant_config`."""
    from vllm.config import set_current_vllm_config

    make = adapter_function(plan, "vllm_layer")
    params = list(inspect.signature(make).parameters)[1:]  # after the layer class: the plan's arguments it names
    given = {**values, "quant_config": quant_config}
    # Under the device the model loader builds vLLM's layers under (vllm/model_executor/model_loader): parameters
    # an adapter creates with torch.empty land where the kernel runs.
    with set_current_vllm_config(config), torch.device(detect().device):
        try:
            return make(import_object(plan.vllm.layer), **{name: given[name] for name in params if name in given})
        except Exception as exc:
            raise Failure(f"the op's adapter {adapter_module(plan)}.vllm_layer raised {first_line(exc)} "
                          f"({_origin(exc)})") from None


@contextlib.contextmanager
def plugin_on_path(plan: Plan, text: str | None = None):
    """The plugin written to a temporary folder as an installed distribution (module + entry point) on sys.path."""
    name = plugin_module_name(plan)
    with tempfile.TemporaryDirectory(prefix="vllm-plugin-") as tmp:
        root = Path(tmp)
        (root / f"{name}.py").write_text(text if text is not None else render_plugin(plan))
        dist = root / f"{name}-0.0.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")
        (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{plan.op.name} = {name}:register\n")
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
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    old = os.environ.get("VLLM_PLUGINS")
    os.environ["VLLM_PLUGINS"] = plan.op.name  # only this plugin, not others installed here
    try:
        plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    finally:
        if old is None:
            os.environ.pop("VLLM_PLUGINS")
        else:
            os.environ["VLLM_PLUGINS"] = old
    if plan.op.name not in plugins:
        try:  # vLLM logs the failure and carries on: surface the cause
            importlib.import_module(plugin_module_name(plan))
        except Exception as exc:
            raise Failure(f"vLLM's plugin loader could not load the plugin: {type(exc).__name__}: {exc}") from None
        raise Failure(f"vLLM's plugin loader did not find the vllm.general_plugins entry point '{plan.op.name}'")
    plugins[plan.op.name]()
    plugins[plan.op.name]()  # vLLM may call a general plugin more than once per process: it must not fail
    return sys.modules[plugin_module_name(plan)]


# ---------------------------------------------------------------- proving vLLM reaches the kernel


class Failure(AssertionError):
    """An integration check that failed, with the cause in words."""


class Raised(Failure):
    """Code the item wraps (the kernel, the op's adapter) raised: says whose code it was."""


class Watched:
    """Stands in for one function of the plugin module (its `kernel`, the op's `adapter` functions): counts the calls
    vLLM makes into it, and tells an exception it raises from one raised by the code around it."""

    def __init__(self, fn: Callable, who: str):
        self.fn, self.who, self.calls = fn, who, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        try:
            return self.fn(*args, **kwargs)
        except Raised:
            raise
        except Exception as exc:
            raise Raised(f"{self.who} raised {first_line(exc)} ({_origin(exc)})") from exc


class WatchedModule:
    """The op's adapter module as the plugin sees it, with each of its functions Watched, and what it maps vLLM's
    calls onto checked against the kernel's inputs (the plugin calls run_kernel with them)."""

    def __init__(self, module, who: str, inputs: list[str]):
        self._module, self._who, self._inputs = module, who, inputs

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if not callable(value):
            return value
        watched = Watched(value, f"{self._who}.{name}")

        def checked(*args, **kwargs):
            got = watched(*args, **kwargs)
            if got is not None and name.endswith("_inputs") and set(got) != set(self._inputs):
                raise Raised(f"{self._who}.{name} returned the arguments {', '.join(sorted(got))}; the kernel's "
                             f"inputs are {', '.join(self._inputs)} (the plan's names)")
            return got

        return checked


def run_drawn(test: Callable, plan: Plan, cell: Cell, device: str, run: RunSettings, route: str,
              rec: IntegrationRecord, raised: Callable[[BaseException], str]) -> None:
    """An item's check `test(example)` over hypothesis's draws for the cell, its outcome in `rec`: a failure's words
    (once: where the same input passed on hypothesis's replay), memory other processes held as not run, and anything
    else the item's code raised as `raised(exc)` says it."""
    test.__name__ = test.__qualname__ = re.sub(r"\W", "_", f"{plan.op.name}__vllm_{route}_{cell.id}")
    drawn = hypothesis_settings(run)(given(example_strategy(plan, cell, device))(test))
    once = ""
    try:
        try:
            drawn()
        except FlakyFailure as flaky:  # judged by the failure itself, said to have passed on replay
            once = " (once: the same input passed when hypothesis replayed it)"
            raise flaky.exceptions[0] from None
    except Exception as exc:
        held = memory_held_elsewhere(str(exc))  # out of memory others hold: the machine's, not run
        rec.status = Status.NOT_RUN if held else Status.FAILED
        rec.reason = held or (str(exc) if isinstance(exc, (Failure, Mismatch)) else raised(exc)) + once


def _origin(exc: BaseException) -> str:
    """Where an exception was raised: the innermost frame's file:line."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def _raised_in(exc: BaseException, path: str | None) -> bool:
    """Whether the innermost frame of an exception is in the file `path`."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames and path and Path(frames[-1].filename) == Path(path))


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
        self.plan, self.route, self.module = plan, route, module
        self.layer_class = layer_class(plan)
        self.kind = plugin_route(plan) if route == "plugin" else route
        self.counter = Watched(module.kernel, f"the kernel {plan.op.kernel}")
        module.kernel = self.counter  # the plugin's functions look `kernel` and `adapter` up when called
        module.adapter = WatchedModule(module.adapter, f"the op's adapter {adapter_module(plan)}",
                                       [a.name for a in plan.args if a.role != "output"])
        self.priority = self.custom_ops = self.quant_config = None
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

            self.ir_op = getattr(ir.ops, plan.vllm.ir_op)
            self.priority = list(priority) if priority is not None else [provider_name(plan), "native"]
            registered = sorted(self.ir_op.impls)
            missing = [p for p in self.priority if p not in self.ir_op.impls]
            if missing:
                raise Failure(f"the IR priority list {self.priority} names '{missing[0]}', which is not registered "
                              f"for vllm.ir.ops.{plan.vllm.ir_op} (registered: {', '.join(registered)})")
            self.stack.enter_context(self.ir_op.set_priority(self.priority))
            self._watch_dispatch()
            self.config = vllm_config()
        elif self.kind == "quantization":
            from vllm.model_executor.layers.quantization import get_quantization_config

            self.config = vllm_config()
            _single_rank_model_parallel(self.config)  # vLLM's linear layers ask their tensor-parallel group
            # the config as vLLM makes it for --quantization <name>: looked up by name, built from its config dict
            self.quant_config = get_quantization_config(provider_name(plan)).from_config({})
        else:
            self.custom_ops = list(custom_ops) if custom_ops is not None else ["none", f"+{self.layer_class}"]
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
        """vLLM's layer on one call's inputs, outputs in plan.op.outputs order; Failure if it did not call the kernel,
        saying whose code raised where one did."""
        layer, forward_args = build_layer(self.plan, values, self.config, self.quant_config)
        before, self.seen_dispatch[:] = self.counter.calls, []
        try:
            out = layer(*forward_args)
        except Raised:
            raise
        except Exception as exc:
            if _raised_in(exc, getattr(self.module, "__file__", None)):
                raise Failure(f"the generated plugin {plugin_module_name(self.plan)} raised {first_line(exc)} "
                              f"({_origin(exc)}): the harness's code, not the kernel's or vLLM's") from None
            raise Failure(f"vLLM's {self.layer_class} raised {first_line(exc)} ({_origin(exc)})") from None
        if self.counter.calls == before:
            raise Failure(self.why_not_called(layer, forward_args))
        return out if isinstance(out, tuple) else (out,)

    def why_not_called(self, layer, forward_args) -> str:
        name = self.layer_class
        head = f"vLLM's {name} did not call the kernel"
        if self.kind == "quantization":
            method = type(getattr(layer, "quant_method", None)).__name__
            return f"{head}: its quant_method is {method}, not the plugin's PluginLinearMethod"
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
            return (f"{head}: it dispatched to {method}, which fell back to forward_native (the op's adapter or "
                    f"the plugin's supports turned down {rejected})")
        provider = provider_name(self.plan)
        ir_name = f"vllm.ir.ops.{self.plan.vllm.ir_op}"
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


def _single_rank_model_parallel(config) -> None:
    """vLLM's distributed state for one rank (gloo), once per process: what a one-GPU deployment has."""
    import socket

    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1)


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
    """Undo whatever the plugin module registered (IR providers, out-of-tree classes, its torch.library op)."""
    from vllm.ir.op import IrOp
    from vllm.model_executor.custom_op import op_registry_oot

    module = plugin_module_name(plan)
    loaded = sys.modules.get(module)
    for value in vars(loaded).values() if loaded else ():
        if isinstance(value, torch._library.custom_ops.CustomOpDef):
            value._lib._destroy()  # the next load defines it again (torch has no public undo)
    for ir_op in IrOp.registry.values():
        for provider in [p for p, impl in ir_op.impls.items() if getattr(impl.impl_fn, "__module__", "") == module]:
            del ir_op.impls[provider]
    for name in [n for n, cls in op_registry_oot.items() if cls.__module__ == module]:
        del op_registry_oot[name]
    from vllm.model_executor.layers import quantization

    for name in [n for n, cls in quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.items() if cls.__module__ == module]:
        del quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG[name]
        quantization.QUANTIZATION_METHODS.remove(name)


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
    return vllm_missing() or unsupported(plan)


def missing_in_vllm(plan: Plan, route: str) -> str:
    """What the route needs that the installed vLLM lacks ("" when it has it all): the IR op and the in-tree provider
    the plan names, the layer, a CustomOp. A plan naming a route vLLM lacks fails its items with this reason."""
    kind = plugin_route(plan) if route == "plugin" else route
    here = f"vLLM {vllm_version()}"
    try:
        layer = import_object(plan.vllm.layer)
    except Exception as exc:
        return f"{here} has no {plan.vllm.layer} (vllm.layer): {first_line(exc)}"
    if kind == "ir":
        from vllm import ir

        if not hasattr(ir.ops, plan.vllm.ir_op):
            return f"{here} has no vllm.ir.ops.{plan.vllm.ir_op} (vllm.ir.ops: {_ir_ops()}): no IR route for this op"
        provider = plan.vllm.in_tree_provider
        if provider and provider not in getattr(ir.ops, plan.vllm.ir_op).impls:
            return (f"{here} registers no provider '{provider}' (vllm.in_tree_provider) for vllm.ir.ops."
                    f"{plan.vllm.ir_op} (registered: {', '.join(sorted(getattr(ir.ops, plan.vllm.ir_op).impls))})")
    from vllm.model_executor.custom_op import CustomOp

    if kind == "custom_op" and not (isinstance(layer, type) and issubclass(layer, CustomOp)):
        return f"{here}'s {plan.vllm.layer} is not a CustomOp: no out-of-tree CustomOp route for it"
    from vllm.model_executor.layers.linear import LinearBase

    if kind == "quantization" and not (isinstance(layer, type) and issubclass(layer, LinearBase)):
        return f"{here}'s {plan.vllm.layer} is not a linear layer (LinearBase): no quantization method serves it"
    return ""


def _ir_ops() -> str:
    from vllm.ir.op import IrOp

    return ", ".join(sorted(IrOp.registry))


@dataclass
class IntegrationOutcome:
    record: IntegrationRecord
    fatal: bool = False  # never set: integration items run on the host's default path; kept for the worker protocol


def check_route(plan: Plan, cell: Cell, route: str, examples: int = MAX_EXAMPLES, profile: str = "ci",
                database: str | None = None, plugin_text: str | None = None, priority: list[str] | None = None,
                custom_ops: list[str] | None = None) -> IntegrationRecord:
    """One integration item: register through `route`, call vLLM's layer on drawn inputs, count kernel calls,
    compare."""
    start = time.monotonic()
    device = detect().device
    tol = tolerance_for(plan, cell.dtype)
    reference = resolve(plan).reference
    stats, count = Stats(), 0
    rec = IntegrationRecord(route=route, **cell.axes(), status=Status.PASSED)
    with contextlib.ExitStack() as stack:
        try:
            missing = missing_in_vllm(plan, route)
            if missing:
                raise Failure(missing)
            r = open_route(plan, route, stack, plugin_text, priority, custom_ops)
        except Failure as exc:
            r, rec.status, rec.reason = None, Status.FAILED, str(exc)
        except Exception as exc:  # a plugin that raises while loading or registering
            r, rec.status = None, Status.FAILED
            rec.reason = f"registering through the {route} route raised {type(exc).__name__}: {exc}"
        if r is not None:
            rec.registered_as = (
                {"ir_op": plan.vllm.ir_op, "provider": provider_name(plan), "priority": r.priority} if r.kind == "ir"
                else {"layer": r.layer_class, "quantization": provider_name(plan)} if r.kind == "quantization"
                else {"layer": r.layer_class, "custom_ops": r.custom_ops})

            def test(ex):
                nonlocal count
                count += 1
                values = build_args(plan, cell, ex, device)
                try:
                    expected = reference_outputs(plan, reference, values)
                except Mismatch:
                    raise
                except Exception as exc:
                    raise Failure(f"the reference {plan.op.reference} raised {first_line(exc)} "
                                  f"({_origin(exc)})") from None
                drawn = {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in values.items()}
                got = r.call(values)
                if len(got) != len(plan.op.outputs):
                    raise Failure(f"vLLM's {r.layer_class} returned {len(got)} values; op.outputs names "
                                  f"{len(plan.op.outputs)} ({', '.join(plan.op.outputs)})")
                for name, actual in zip(plan.op.outputs, got):  # quantized outputs in their domain, as the cells
                    compare_judged(plan, reference, cell.dtype, stats, name, actual, expected[name], drawn, False)

            run = RunSettings(examples=examples, profile=profile, database=database)
            run_drawn(test, plan, cell, device, run, route, rec,
                      lambda exc: f"the harness raised {first_line(exc)[:500]} ({_origin(exc)}) around vLLM's "
                                  f"{r.layer_class}: the harness's code, not the kernel's or vLLM's")
            rec.kernel_calls = r.counter.calls
    rec.examples, rec.duration_s = count, round(time.monotonic() - start, 3)
    rec.tolerance, rec.error, rec.vllm = Tolerance(tol.atol, tol.rtol), stats.record(), vllm_version()
    return rec


def run_integration_item(task: IntegrationTask) -> IntegrationOutcome:
    """An integration item as a worker runs it: not-runnable routes come back as NOT_RUN records."""
    plan, cell, route, run = task.plan, task.cell, task.route, task.run
    why = why_not_runnable(plan, route)
    if why:
        return IntegrationOutcome(IntegrationRecord(route=route, **cell.axes(), status=Status.NOT_RUN, reason=why))
    return IntegrationOutcome(check_route(plan, cell, route, run.examples, run.profile, run.database))
