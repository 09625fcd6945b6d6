"""A plan's code, resolved: its import paths imported, and checked against the plan's arguments.

Loading a plan (harness.plan.load) never imports the user's code, so `python -m harness report` writes
Markdown without torch. Resolving does: `resolve(plan)` imports the kernel, reference, fake and input
generator (and op.replaces, vllm.layer outside vLLM's package), checks that each is callable with the plan's
arguments as the harness passes them (by name; the fake in order), and that a `vllm:` kernel's schema takes
the plan's arguments in order. A failure is a PlanError at the field's line (`plan.yaml:4: op.kernel: ...`), except
code this machine cannot import (torch without CUDA, a CUDA-only package missing: `environment_error`): the run goes
on, and its cells are not run here, with why (`Resolved.unavailable`, raised as KernelUnavailable where used).

A reference, op.replaces or vllm.layer in vLLM's own package is imported where it is used (vLLM may not be
installed here), and named
benchmark baselines when timed (`named_baseline`: a package missing here is a baseline not run, never an
error). `python -m harness validate` resolves in a child process, `python -m harness.runtime.check_code PLAN...`,
as a user's import can crash or hang (`resolve_in_child`); the child also runs the native baseline's function
once on a tiny CPU example (harness.runtime.upcast).

Plain Python at import (importlib, inspect): torch comes with the user's modules.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from harness.plan.load import load_plan
from harness.plan.model import Plan, PlanError
from harness.plan.sections import Arg
from harness.vllm_facts.names import adapter_module, plugin_routes

# What says the machine lacks what the code needs (a CUDA build of torch, a driver, CUDA's runtime), not that the
# plan is wrong: a plan's code failing to import with one of these makes its cells "not run here", not an invalid plan.
ENVIRONMENT_ERRORS = ("Torch not compiled with CUDA enabled", "CUDA driver", "libcudart", "libcuda.so", "libnvrtc",
                      "libcublas", "Found no NVIDIA driver", "No CUDA GPUs are available",
                      "NVIDIA driver on your system")
# Packages that install (or import) only where CUDA is: a ModuleNotFoundError for one is this machine's.
CUDA_ONLY_PACKAGES = {"cuda", "cupy", "pycuda", "flash_attn", "flashinfer", "deep_gemm", "deep_ep", "xformers",
                      "tensorrt", "cutlass", "nvidia", "pynvml", "apex", "vllm_flash_attn", "sgl_kernel"}
OPTIONAL_PACKAGE = "vllm"  # paths into it are imported where they are used: it may not be installed here
# The fields whose path may lead into vLLM's package: a reference or native may be vLLM's forward_native, and the
# layer replaced is vLLM's.
MAY_BE_VLLM = ("op.reference", "op.native", "op.replaces", "vllm.layer")


def import_object(path: str) -> Any:
    """The object at an import path 'package.module:attribute' (attribute may be dotted)."""
    module_name, _, attr = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class KernelUnavailable(Exception):
    """The plan's kernel (vLLM's compiled one, or code that cannot be imported on this machine) cannot be loaded here:
    the cells of the plan are not run here, with this."""


ON_THIS_MACHINE = "{module} cannot be imported on this machine: "


def environment_error(exc: BaseException, module: str) -> str:
    """Why importing `module` failed for this machine's sake ("" for a mistake in the plan or its code): a CUDA-only
    package missing, or torch or a library saying CUDA is not here, anywhere in the exception's chain. A misspelt
    module or attribute is the plan's."""
    seen, walked = exc, set()
    while seen is not None and id(seen) not in walked:
        walked.add(id(seen))
        text = str(seen)
        missing = getattr(seen, "name", None) if isinstance(seen, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] in CUDA_ONLY_PACKAGES \
                or isinstance(seen, (ImportError, OSError, RuntimeError, AssertionError)) \
                and any(s in text for s in ENVIRONMENT_ERRORS):
            line = text.strip().splitlines()[0] if text.strip() else ""
            return f"{ON_THIS_MACHINE.format(module=module)}{type(seen).__name__}: {line}"
        seen = seen.__cause__ or seen.__context__
    return ""


def stand_in_library(exc: BaseException) -> str:
    """The library a kernel failed on because it is a stand-in ("" if not): vLLM replaces triton with a placeholder
    module (vllm.triton_utils.importing.TritonPlaceholder, TritonLanguagePlaceholder) where Triton has no backend
    for this machine, and a kernel using it raises: an AttributeError on the stand-in (one of the placeholder's
    missing functions), or a TypeError in code whose globals hold one (a no-op `@triton.jit` kernel launched, a None
    `tl.*` called). A stand-in is a module of a class named *Placeholder*."""
    if not isinstance(exc, (AttributeError, TypeError)):
        return ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    found = [getattr(exc, "obj", None)] + (list(tb.tb_frame.f_globals.values()) if tb is not None else [])
    for obj in found:
        if isinstance(obj, ModuleType) and "Placeholder" in type(obj).__name__:
            return obj.__name__.split(".")[0]
    return ""


@dataclass
class Resolved:
    """A plan's callables, imported once (a reference in vLLM's package on first use)."""

    plan: Plan
    objects: dict[str, Any] = field(default_factory=dict)  # field (op.kernel, ...) -> what its path names
    warnings: list[str] = field(default_factory=list)  # file:line: field: what the run leaves out, though it runs
    unavailable: dict[str, str] = field(default_factory=dict)  # field -> why its code cannot be imported here

    def _get(self, field_name: str, path: str | None) -> Any:
        if path is None:
            return None
        if field_name in self.unavailable:
            raise KernelUnavailable(self.unavailable[field_name])
        if field_name not in self.objects:
            self.objects[field_name] = import_object(path)
        return self.objects[field_name]

    @property
    def kernel(self) -> Callable:
        return self._get("op.kernel", self.plan.op.kernel)

    @property
    def reference(self) -> Callable:
        return self._get("op.reference", self.plan.op.reference)

    @property
    def native(self) -> Callable:
        """What the `native` and `compiled` baselines time: op.native, else the reference."""
        return self._get("op.native", self.plan.op.native) if self.plan.op.native else self.reference

    @property
    def fake(self) -> Callable | None:
        """torch.compile's fake implementation, None where the plan names none (it is derived from the reference)."""
        return self._get("op.fake", self.plan.op.fake)

    @property
    def generate(self) -> Callable | None:
        """The plan's own input generator (op.generate), None where it has none."""
        return self._get("op.generate", self.plan.op.generate)


def plan_folder_on_import_path(plan: Plan) -> None:
    """A plan's own modules import from the plan's folder, as a script's do from its own: the folder goes on the
    import path (last, so it never shadows an installed package)."""
    folder = str(Path(plan.path).resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)


_resolved: dict[int, tuple[Plan, Resolved]] = {}  # id(plan) -> (plan, its code): the plan kept, so ids stay unique


def resolve(plan: Plan) -> Resolved:
    """The plan's code, imported and checked once per Plan; PlanError at the field's line where it does not fit."""
    hit = _resolved.get(id(plan))
    if hit and hit[0] is plan:
        return hit[1]
    plan_folder_on_import_path(plan)
    resolved = Resolved(plan)
    callables = [("op.kernel", plan.op.kernel), ("op.reference", plan.op.reference),
                 ("op.native", plan.op.native), ("op.fake", plan.op.fake), ("op.generate", plan.op.generate)]
    for field_name, path in callables + [("op.replaces", plan.op.replaces), ("vllm.layer", plan.vllm.layer)]:
        if path is None or field_name in MAY_BE_VLLM and path.split(".")[0] == OPTIONAL_PACKAGE:
            continue
        try:
            obj = resolved._get(field_name, path)
        except Exception as exc:  # any import-time failure is a plan error here, not a crash ...
            why = environment_error(exc, path.partition(":")[0])
            if not why:
                raise plan.error(field_name, f"an importable object ({type(exc).__name__}: {exc})", path) from None
            # ... unless it is this machine's: the run goes on, and the cells say so
            resolved.unavailable[field_name] = why
            resolved.warnings.append(f"{plan.path}:{plan.where(field_name)}: {field_name}: {why}: its cells are "
                                     "not run here")
            continue
        if not callable(obj) and (field_name, path) in callables:
            raise plan.error(field_name, "a function (callable)", f"{path}, a {type(obj).__name__}")
        if (field_name, path) in callables and is_triton_kernel(obj):
            raise plan.error(field_name, TRITON_KERNEL_EXPECTED.get(field_name, TRITON_KERNEL_ELSE),
                             f"{path}, a Triton {type(obj).__name__}")
    names = [a.name for a in plan.args]
    _check_signature(resolved, "op.kernel", names)
    for field_name in ("op.reference", "op.native"):  # the native is called exactly like the reference
        fn = resolved.objects.get(field_name)
        _check_signature(resolved, field_name, [a.name for a in plan.args if given_to_reference(fn, a)])
    _check_returns(resolved, "op.reference")
    _check_returns(resolved, "op.native")
    _check_signature(resolved, "op.fake", names, positional=True)
    _check_signature(resolved, "op.generate", ["values"], positional=True, keywords=GENERATE_KEYWORDS)
    _check_named_baselines(plan)
    # an op's vLLM side that lacks what its routes call fails their integration items, not its cells: a warning
    resolved.warnings += _pinned_optional_arguments(resolved) + _vllm_adapter_warnings(plan)
    _resolved[id(plan)] = (plan, resolved)
    return resolved


def names_parameter(fn: Any, name: str) -> bool:
    """Whether `fn`'s signature names a parameter `name` that a keyword can fill (True where it has no Python
    signature: a builtin or an op is given every argument)."""
    try:
        params = _parameters(fn)
    except TypeError:  # an unhashable callable: not cached
        params = _parameters.__wrapped__(fn)
    return params is None or name in params


@functools.lru_cache(maxsize=256)
def _parameters(fn: Any) -> frozenset[str] | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def given_to_reference(fn: Any, arg: Arg) -> bool:
    """Whether the reference (or native) `fn` is given `arg`: every input, but a `name: null` only where `fn`'s
    signature names it; otherwise it is an argument only the kernel takes (passed None), which the plan states."""
    return arg.role != "output" and (not arg.is_null or names_parameter(fn, arg.name))


def _pinned_optional_arguments(resolved: Resolved) -> list[str]:
    """The kernel's optional arguments (default None) the plan pins to null where the reference takes them too, leaves
    out, or always passes a tensor: no cell ever passes them a value (a per-token quant ignoring scale_ub passes), or
    never None (the kernel's path without one is never run). Warned, as the run itself stays right. A `name: null`
    the reference's signature does not name states an argument only the kernel takes: not warned."""
    kernel, plan = resolved.objects.get("op.kernel"), resolved.plan
    reference = resolved.objects.get("op.reference")  # None: in vLLM's package, not imported here
    try:
        params = inspect.signature(kernel).parameters if kernel is not None else {}
    except (TypeError, ValueError):
        return []
    out = []
    draw = "give it a shape and `optional: true` to draw it with and without one"
    for a in plan.args:
        p = params.get(a.name)
        field_name = f"op.args.{a.name}"
        kernel_only = reference is not None and not names_parameter(reference, a.name)
        if p is not None and p.default is None and a.is_null and not kernel_only:
            why = "the reference takes it too" if reference is not None else "the reference, vLLM's, may take it too"
            out.append(f"{plan.path}:{plan.where(field_name)}: {field_name}: the kernel's optional argument is pinned "
                       f"to null and {why}, so no cell passes the op a value: {draw} (`null` states an argument "
                       "only the kernel takes, one the reference's signature does not name)")
        elif p is not None and p.default is None and a.is_tensor and a.role != "output" and not a.optional:
            out.append(f"{plan.path}:{plan.where(field_name)}: {field_name}: the kernel's optional argument (default "
                       f"None) is always passed a tensor, so no cell runs the kernel without one: add `optional: "
                       "true` to draw it with and without one")
    for name, p in params.items():
        if p.default is None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and not plan.has_arg(name):
            out.append(f"{plan.path}:{plan.where('op.args')}: op.args: the kernel's optional argument {name} (default "
                       f"None) is not among the plan's arguments, so no cell passes it a value: add it to op.args "
                       f"with a shape and `optional: true`, or as `{name}: null` if only the kernel takes it (which "
                       "says so: the kernel is passed None, the reference is not given it, and this warning is "
                       "silenced)")
    return out


# A Triton kernel (@triton.jit, @triton.autotune, @triton.heuristics) is launched with a grid, `kernel[grid](...)`:
# called as the plan calls its functions, it raises at the first cell, and its signature (*args, **kwargs) binds
# anything. Told by its class's module (a JITFunction, an Autotuner, ...) without importing Triton here.
TRITON_KERNEL_EXPECTED = {"op.kernel": "the Python function that launches the kernel (kernel[grid](...)), not "
                                       "the @triton.jit function itself"}
TRITON_KERNEL_ELSE = "a Python function, not a @triton.jit kernel (which is launched with a grid, kernel[grid](...))"


def is_triton_kernel(obj: Any) -> bool:
    return any(c.__module__.split(".")[0] == "triton" for c in type(obj).__mro__)


def _returns_none(obj: Any) -> bool:
    """Whether a function is annotated to return None (`-> None`, also as the string a postponed annotation is)."""
    try:
        returns = inspect.signature(obj).return_annotation
    except (TypeError, ValueError):
        return False
    return returns is None or returns == "None"


# op.generate's call (harness.runtime.inputs): fn(values, *, plan, cell, example, sizes, generator, device)
GENERATE_KEYWORDS = ("plan", "cell", "example", "sizes", "generator", "device")


def _check_returns(resolved: Resolved, field_name: str) -> None:
    """A reference (or native) returns the outputs: one annotated to return None is an in-place function, such as
    the kernel itself named where the reference belongs."""
    obj = resolved.objects.get(field_name)
    if obj is not None and _returns_none(obj):
        path = functools.reduce(getattr, field_name.split("."), resolved.plan)
        raise resolved.plan.error(field_name, "a function returning the op's outputs (op.outputs, in order): this one "
                                  "is annotated to return None, as an in-place kernel is", f"{path} -> None")


def _check_named_baselines(plan: Plan) -> None:
    """A named baseline whose package is installed here must resolve: a typo in its module or function is the
    plan's error, not a baseline silently "not run". Where its package is not installed, it is timed where it is."""
    for name, entry in plan.implementations.items():
        if entry.path is None:
            continue
        field_name = f"implementations.{name}"
        for what, at, where in (("baseline", entry.path, f"{field_name}.path"), ("prepare", entry.prepare,
                                                                             f"{field_name}.prepare")):
            top = at.split(":")[0].split(".")[0] if at else ""
            try:
                installed = bool(top) and importlib.util.find_spec(top) is not None
            except (ImportError, ValueError):
                installed = False
            if not installed:
                continue
            found = named_baseline(plan, at)
            if isinstance(found, str) and not found.startswith(ON_THIS_MACHINE.format(module=at.split(":")[0])):
                raise plan.error(where, f"a callable {what} ({top} is installed here)", found)
            if isinstance(found, str):
                continue
            if is_triton_kernel(found):
                raise plan.error(where, TRITON_KERNEL_ELSE, f"{at}, a Triton {type(found).__name__}")
            # a prepare, and a baseline without one, are called with the kernel's arguments by name; a baseline with a
            # prepare takes what its prepare returns, known only when it runs
            if what == "prepare" or entry.prepare is None:
                names = [a.name for a in plan.args]
                problem = _binds(found, names)
                if problem:
                    raise plan.error(where, f"a {what} taking the kernel's arguments by name ({', '.join(names)}): "
                                     f"{problem}", f"{at}{inspect.signature(found)}")
            if what == "prepare" and _returns_none(found):
                raise plan.error(where, "a prepare returning the baseline's arguments by name (a dict): this one is "
                                 "annotated to return None", f"{at} -> None")


def _check_signature(resolved: Resolved, field_name: str, names: list[str], positional: bool = False,
                     keywords: tuple[str, ...] = ()) -> None:
    """The callable accepts the plan's arguments as the harness passes them (by name, or in order; `keywords`: the
    names op.generate is also passed)."""
    obj = resolved.objects.get(field_name)
    if obj is None:  # none named, or a path into vLLM's package (checked where it is called)
        return
    problem = _binds(obj, names, positional, keywords)
    if problem:
        how = "in order" if positional else "by name"
        path = functools.reduce(getattr, field_name.split("."), resolved.plan)
        takes = f"a function taking ({', '.join(names)}, *, {', '.join(keywords)})" if keywords else \
            f"a function taking the plan's arguments {how} ({', '.join(names)})"
        raise resolved.plan.error(field_name, f"{takes}: {problem}", f"{path}{inspect.signature(obj)}") from None


def _binds(obj: Any, names: list[str], positional: bool = False, keywords: tuple[str, ...] = ()) -> str:
    """Why `obj` cannot be called with `names` (in order, or by name) and `keywords` by name ("" where it can, or
    where it has no Python signature: a builtin or an op, checked when called)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    try:
        if positional:
            sig.bind(*names, **{k: None for k in keywords})
        else:
            sig.bind(**{n: None for n in names}, **{k: None for k in keywords})
    except TypeError as exc:
        return str(exc)
    return ""


# What the op's adapter module defines for each route its plugin takes (docs/adding-an-op.md).
ADAPTER_FUNCTIONS = {"custom_op": ("vllm_layer", "vllm_forward_inputs"), "ir": ("vllm_ir_inputs",),
                     "quantization": ("vllm_layer", "vllm_create_weights", "vllm_apply_inputs"),
                     "attention_backend": ()}  # vLLM's tensors map onto the kernel's by the plan's shapes


def _vllm_adapter_warnings(plan: Plan) -> list[str]:
    """Where the op's vLLM side (the plan's vllm.adapter, else the kernel's module) does not define what its routes
    call, in words (a kernel swapped for a variant in another module keeps its cells, and its vLLM items fail)."""
    routes = plugin_routes(plan)
    if not routes:
        return []
    module = adapter_module(plan)
    field_name = "vllm.adapter" if plan.vllm.adapter else "vllm.route"
    where = f"{plan.path}:{plan.where(field_name)}: {field_name}"
    try:
        found = importlib.import_module(module)
    except Exception as exc:
        return [f"{where}: the op's vLLM side, {module}, does not import ({type(exc).__name__}: {exc}): its vLLM "
                "integration items will fail"]
    needed = [name for route in routes for name in ADAPTER_FUNCTIONS[route]]
    missing = [name for name in needed if not callable(getattr(found, name, None))]
    if missing:
        return [f"{where}: the op's vLLM side, {module}, defines no {', '.join(missing)} (its routes call "
                f"{', '.join(needed)}; docs/adding-an-op.md): its vLLM integration items will fail; name the module "
                "that has them in vllm.adapter"]
    out = []
    for name in dict.fromkeys(needed):
        problem = _adapter_call_problem(plan, name, getattr(found, name))
        if problem:
            out.append(f"{where}: {module}.{name} {problem}: its vLLM integration items will fail "
                       "(docs/adding-an-op.md)")
    return out


# How the generated plugin calls the adapter's functions: the positional arguments vLLM's linear method passes on
# (exactly these), and for a layer's forward and an IR op, the layer then the call's own arguments (at least these).
ADAPTER_CALLS = {"vllm_create_weights": ("layer", "input_size_per_partition", "output_partition_sizes", "input_size",
                                         "output_size", "params_dtype"),
                 "vllm_apply_inputs": ("layer", "x", "bias")}
ADAPTER_LEAST = {"vllm_forward_inputs": ("layer", "the forward's first argument"),
                 "vllm_ir_inputs": ("the IR op's first argument",)}


def _adapter_call_problem(plan: Plan, name: str, fn: Any) -> str:
    """Why an adapter function cannot take the call made to it ("" where it can): `vllm_layer(layer_class, **named)`
    gets the layer class, then each of its parameters that names a plan argument (or quant_config); the others
    (harness.vllm.routes, the plugin templates) get vLLM's positional arguments."""
    if is_triton_kernel(fn):
        return "is a @triton.jit kernel, not a Python function"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ""
    if name == "vllm_layer":
        given = {a.name for a in plan.args} | {"quant_config"}
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            return "takes no layer class first (it is called vllm_layer(layer_class, **the plan's arguments it names))"
        unmet = [p.name for p in params[1:] if p.name not in given and p.default is p.empty
                 and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return f"needs {', '.join(unmet)}, none of the plan's arguments (it gets the layer class, then the plan's " \
               f"arguments it names)" if unmet else ""
    if name in ADAPTER_LEAST:
        least = ADAPTER_LEAST[name]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < len(least) and not any(p.kind == p.VAR_POSITIONAL for p in params):
            return f"takes {len(positional)} positional arguments; it is called with at least {len(least)} " \
                   f"({', '.join(least)})"
        return ""
    problem = _binds(fn, list(ADAPTER_CALLS[name]), positional=True)
    return f"cannot take the {len(ADAPTER_CALLS[name])} positional arguments it is called with " \
           f"({', '.join(ADAPTER_CALLS[name])}): {problem}" if problem else ""


def named_baseline(plan: Plan, path: str) -> Callable | str:
    """A named benchmark baseline's callable, or why it cannot run here (its package missing, not callable)."""
    plan_folder_on_import_path(plan)
    try:
        fn = import_object(path)
    except Exception as exc:  # a package installed on another machine only: reported, never a crash
        text = str(exc).strip()
        return environment_error(exc, path.partition(":")[0]) or \
            f"{path} cannot be imported here: {type(exc).__name__}: {text.splitlines()[0] if text else ''}"
    if not callable(fn):
        return f"{path} is not callable ({type(fn).__name__})"
    return fn


# ---------------------------------------------------------------- resolving in a child process

# The child's module: resolve.main with the warnings that run the plan's code (a module name here, not an import:
# this one imports no torch).
CHILD_MODULE = "harness.runtime.check_code"
RESOLVE_TIMEOUT_S = 300.0  # per plan: importing a kernel module compiles nothing, but torch's import takes seconds
_ANSWER = "harness-resolve: "  # marks the child's answers among whatever the user's modules print


def resolve_in_child(paths: list[str], timeout_s: float = RESOLVE_TIMEOUT_S,
                     warnings: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Each plan's code resolved in a child process: path -> "" (it resolves) or why not; `warnings`, where given,
    gets each plan's resolve-time warnings. A child that crashes or hangs on a plan is that plan's answer; the plans
    after it are resolved in a fresh child."""
    answers: dict[str, str] = {}
    root = str(Path(__file__).resolve().parents[2])  # where harness is, for the child's `-m`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    while len(answers) < len(paths):
        todo = [p for p in paths if p not in answers]
        proc = subprocess.Popen([sys.executable, "-m", CHILD_MODULE, *todo], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env)
        lines: queue.Queue = queue.Queue()
        stderr: list[str] = []
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()
        for path in todo:
            try:
                line = lines.get(timeout=timeout_s)
                while line is not None and not line.startswith(_ANSWER):
                    line = lines.get(timeout=timeout_s)
            except queue.Empty:
                proc.kill()
                answers[path] = f"importing its code did not finish in {timeout_s:.0f} s"
                break
            if line is None:  # the child ended before answering for this plan
                proc.wait()
                last = "".join(stderr).strip().splitlines()[-1:] or ["no output"]
                answers[path] = f"the process importing its code ended with exit status {proc.returncode}: {last[0]}"
                break
            answer = json.loads(line.removeprefix(_ANSWER))
            answers[answer["path"]] = answer["error"]
            if warnings is not None:
                warnings[answer["path"]] = answer.get("warnings", [])
        proc.wait()
    return answers


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def main(argv: list[str], warnings_of: Callable[[Plan], list[str]] | None = None) -> int:
    """One answer line per plan: {"path": ..., "error": "" or why its code does not resolve, "warnings": [...]}, the
    warnings from `warnings_of` where given (harness.runtime.check_code's, which run the plan's code), else
    resolve's."""
    status = 0
    for path in argv:
        warned: list[str] = []
        try:
            plan = load_plan(path)
            warned = (warnings_of or (lambda p: resolve(p).warnings))(plan)
            error = ""
        except PlanError as exc:
            error, status = str(exc), 1
        print(_ANSWER + json.dumps({"path": path, "error": error, "warnings": warned}), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
