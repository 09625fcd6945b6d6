"""The one resolver: an implementation of the plan, the kernel under test ("") or an entry of its `implementations`
(harness.plan.implementations: the kinds), as a call with the plan's keyword arguments, or why it cannot run here.
Numerics cells, TP ranks and benchmarks load through it; a new kind of implementation is one entry of RESOLVERS.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from harness.plan.implementations import KINDS
from harness.plan.model import Implementation, Plan
from harness.runtime.resolve import KernelUnavailable, environment_error, named_baseline, resolve
from harness.runtime.vllm_compiled import compiled_op

__all__ = ["KernelUnavailable", "Loaded", "load_implementation", "loaded"]  # KernelUnavailable: what callers catch


@dataclass(frozen=True)
class Loaded:
    """An implementation loaded: `fn` called with the plan's arguments by name (after `prepare`, where it has one,
    maps them once per input set), `functional` where it returns the op's outputs as the reference does rather
    than writing them into the plan's output arguments."""

    fn: Callable
    prepare: Callable | None = None
    functional: bool = False

    def __call__(self, **values):
        return self.fn(**(self.prepare(**values) if self.prepare else values))


def _by_args(op: Callable, entry: Implementation) -> Callable:
    """A torch.ops kernel called with the plan arguments its `args` picks, in its schema's order. No guard: the
    cells must find what it gets wrong."""
    def kernel(**values):
        return op(*[values[n] for n in entry.args])

    kernel.__name__ = entry.name
    return kernel


def _imported(plan: Plan, entry: Implementation, shape) -> Loaded | str:
    fn = named_baseline(plan, entry.path)
    prepare = named_baseline(plan, entry.prepare) if entry.prepare else None
    problem = next((x for x in (fn, prepare) if isinstance(x, str)), "")
    return problem or Loaded(fn, prepare)


def _vllm(plan: Plan, entry: Implementation, shape) -> Loaded | str:
    op = compiled_op(plan)
    return op if isinstance(op, str) else Loaded(_by_args(op, entry))


def _torch_ops(plan: Plan, entry: Implementation, shape) -> Loaded | str:
    """A library's torch.ops kernel: importing `library` registers it (FlashInfer's, say)."""
    if entry.library:
        try:
            importlib.import_module(entry.library)
        except Exception as exc:  # a library installed on another machine only: not run here, never a crash
            return environment_error(exc, entry.library) or \
                f"{entry.library} cannot be imported here: {type(exc).__name__}: {str(exc).strip()[:200]}"
    namespace, _, name = entry.name.partition("::")
    try:
        op = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return f"{entry.call} is not registered here" + (f" (after importing {entry.library})" if entry.library
                                                         else "")
    return Loaded(_by_args(op, entry))


def _native(plan: Plan, entry: Implementation, shape) -> Loaded:
    return Loaded(resolve(plan).native, functional=True)  # op.native, else the reference


def _compiled(plan: Plan, entry: Implementation, shape) -> Loaded:
    return Loaded(compiled_reference(resolve(plan).native, shape), functional=True)


RESOLVERS = {"native": _native, "compiled": _compiled, "vllm": _vllm, "import": _imported, "torch_ops": _torch_ops}
assert set(RESOLVERS) == set(KINDS), "every kind of implementation has its resolver"


def loaded(plan: Plan, name: str = "", shape: tuple | None = None) -> Loaded | str:
    """The kernel under test (""), or the plan's implementation `name`, loaded, or why it cannot run here (its
    package missing, the plan's code not importable on this machine). `shape`: what a compiled implementation
    specialises on (a benchmark's; None: dynamic)."""
    resolved = resolve(plan)
    if resolved.unavailable:  # some of the plan's code cannot be imported on this machine: nothing runs here
        return next(iter(resolved.unavailable.values()))
    if not name or name == "kernel":
        return Loaded(resolved.kernel)
    entry = plan.implementation(name)
    if entry is None:
        return f"the plan names no implementation {name} (implementations.{name})"
    return RESOLVERS[entry.kind](plan, entry, shape)


def load_implementation(plan: Plan, name: str = "") -> Callable:
    """What a cell runs, called with the plan's keyword arguments (the function itself where nothing is prepared
    first, so that a crash is found at its own line); raises KernelUnavailable where it cannot be loaded here."""
    found = loaded(plan, name)
    if isinstance(found, str):
        raise KernelUnavailable(found)
    return found.fn if found.prepare is None else found


_compiled_cache: dict = {}  # the compiled native code of the last shape benchmarked in this process


def compiled_reference(reference: Callable, shape: tuple | None) -> Callable:
    """The native code (op.native, else the reference) under torch.compile, specialised to one shape (Inductor at its
    best, as vLLM's compile_sizes get it). Items of one shape follow each other (eager, then cuda_graph), so they
    share one compilation; a new shape starts afresh (dynamo.reset), so dynamo's recompile limit never sends it to
    eager."""
    key = (reference, shape)
    if key not in _compiled_cache:
        _without_guard_latency_probe()
        torch._dynamo.reset()
        _compiled_cache.clear()
        _compiled_cache[key] = torch.compile(reference, fullgraph=True, dynamic=False)
    return _compiled_cache[key]


@functools.cache  # once per process
def _without_guard_latency_probe() -> None:
    """Dynamo times each new compile's guards for its logs (guards.profile_guard_manager, after flushing the CPU's
    caches; no setting turns it off): 21 ms a compile on an H200 machine, 1.7 s of plan.yaml's 84 shapes. Nothing
    here reads that figure, and the compiled code and its guards are the same without it."""
    from torch._dynamo import guards

    if getattr(guards, "profile_guard_manager", None) is not None:
        guards.profile_guard_manager = lambda *args, **kwargs: 0.0
