"""What a numerics cell runs: the kernel under test, or one of the plan's providers (`providers`: vLLM's own compiled
kernel for the op, a named baseline), each called with the plan's keyword arguments."""

from __future__ import annotations

from typing import Callable

from harness.runtime.resolve import KernelUnavailable, named_baseline, resolve
from harness.vllm.compiled import compiled_op
from harness.plan.model import Plan

__all__ = ["KernelUnavailable", "load_kernel"]  # KernelUnavailable: what callers catch from here


def load_kernel(plan: Plan, provider: str = "") -> Callable:
    """What a cell runs, called with the plan's keyword arguments: the kernel under test (""), or a provider of the
    plan (`providers`): vLLM's own compiled kernel for the op, or a named baseline (its `prepare` applied first).
    Raises KernelUnavailable where it, or the plan's code, cannot be loaded here."""
    resolved = resolve(plan)
    if resolved.unavailable:  # some of the plan's code cannot be imported on this machine: no cell runs here
        raise KernelUnavailable(next(iter(resolved.unavailable.values())))
    if not provider:
        return resolved.kernel
    if provider == "vllm":
        spec = plan.vllm.kernel
        op = compiled_op(plan)
        if isinstance(op, str):
            raise KernelUnavailable(op)

        def kernel(**values):  # no guard: the cells must find what vLLM's kernel gets wrong
            return op(*[values[n] for n in spec.args])

        kernel.__name__ = spec.name
        return kernel
    fn = named_baseline(plan, dict(plan.benchmark.named)[provider])
    prepare = named_baseline(plan, plan.benchmark.prepare(provider)) if plan.benchmark.prepare(provider) else None
    for loaded in (fn, prepare):
        if isinstance(loaded, str):
            raise KernelUnavailable(loaded)
    return fn if prepare is None else lambda **values: fn(**prepare(**values))
