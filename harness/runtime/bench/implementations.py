"""The implementations a benchmark item times, each as a call on one argument set: the kernel, the built-in
baselines (native eager, the same under torch.compile, vLLM's in-tree kernel) and the plan's own (a Prepared one
maps its inputs once per set, outside the timed region), or why one is not run here. Also the input
sets they rotate over (input_sets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from harness.runtime.calls import kernel_outputs, reference_outputs
from harness.runtime.inputs import Example, build_args, poison_value
from harness.plan.implementations import BUILTIN, function_of
from harness.plan.model import Plan
from harness.runtime.implementations import loaded
from harness.runtime.bench.specs import BenchSpec, outside_contract

CPU_KERNEL_REASON = ("not timed on a CPU machine: the kernel runs in Triton's interpreter there, whose speed says "
                     "nothing about a GPU")


def input_sets(plan: Plan, spec: BenchSpec, device: str, count: int = 1, seed: int = 0) -> list[dict]:
    """`count` independent argument sets for one call (contiguous, normal-scale values, outputs poisoned).

    With several sets each tensor is a slice of one buffer, every slice starting 256-byte aligned so each
    set gets the same compiled code (Triton and Inductor specialise on pointer alignment).
    """
    first = build_args(plan, spec.cell(), Example(num_tokens=spec.num_tokens, sizes=spec.sizes_dict, seed=seed),
                       device)
    if count == 1:
        return [first]
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    slices = {}
    for arg in plan.tensor_args:
        t = first[arg.name]
        align = max(1, 256 // t.element_size())
        slot = -(-t.numel() // align) * align
        base = torch.empty(count, slot, dtype=t.dtype, device=device)
        if arg.role == "output":
            base.fill_(poison_value(t.dtype))
        elif not t.dtype.is_floating_point or arg.init == "zeros":
            base[:, : t.numel()] = t.reshape(1, -1)  # integers (indices, positions) stay valid as drawn
        else:
            if arg.init == "uniform":
                values = torch.rand(count, slot, generator=gen, device=device)
            else:
                values = torch.randn(count, slot, generator=gen, device=device)
                if arg.init == "around_one":  # norm weights sit near 1
                    values = values.mul_(0.1).add_(1.0)
            base.copy_(values)
            del values
        slices[arg.name] = [base[i, : t.numel()].view(t.shape) for i in range(count)]
    return [{k: slices[k][i] if k in slices else v for k, v in first.items()} for i in range(count)]


def kernel_call(plan: Plan, fn: Callable) -> Callable[[dict], dict]:
    """A call with the plan's arguments that writes outputs into output arguments or returns them."""
    return lambda values: kernel_outputs(plan, values, fn(**values))


def reference_call(plan: Plan, fn: Callable) -> Callable[[dict], dict]:
    """A functional reference (its inputs are not copied: timing measures the reference alone)."""
    return lambda values: reference_outputs(plan, fn, values, copy=False)


@dataclass(frozen=True)
class Prepared:
    """A named baseline with a `prepare`: the kernel's arguments mapped to the baseline's once per input set, before
    timing (weights dequantized, or prepacked for a GEMM library), so that only the call itself is timed."""

    plan: Plan
    prepare: Callable[..., dict]
    fn: Callable

    def timed(self, sets: list[dict]) -> tuple[Callable, list]:
        """The call to time and what it rotates over: (inputs, prepared arguments) pairs, prepared here."""
        return (lambda pair: kernel_outputs(self.plan, pair[0], self.fn(**pair[1]))), \
            [(values, self.prepare(**values)) for values in sets]

    def __call__(self, values: dict) -> dict:
        return kernel_outputs(self.plan, values, self.fn(**self.prepare(**values)))


def timed_functions(plan: Plan) -> dict[str, str]:
    """What each baseline of the plan times, by import path (recorded with every benchmark, so a page tells which
    function a figure came from after the plan changed)."""
    functions = {name: function_of(plan, name) for name in plan.baselines}
    return {name: path for name, path in functions.items() if path}


def implementations(plan: Plan, device: str, spec: BenchSpec | None = None) -> dict[str, Callable | str]:
    """Each implementation as a call, or the reason it is not run: the kernel, the built-in baselines, then the
    plan's own in plan order (harness.runtime.implementations loads each). With `spec`, one whose contract that
    shape is outside is not run (the others are)."""
    kernel = loaded(plan) if device == "cuda" else CPU_KERNEL_REASON
    impls: dict[str, Callable | str] = {"kernel": kernel if isinstance(kernel, str) else kernel_call(plan, kernel)}
    impls.update({name: "not in the plan's implementations as a baseline" for name in BUILTIN})
    for name in plan.baselines:
        found = loaded(plan, name, spec.shape if spec else None)
        if isinstance(found, str):
            impls[name] = found
        elif found.functional:
            impls[name] = reference_call(plan, found.fn)
        elif found.prepare is not None:
            impls[name] = Prepared(plan, found.prepare, found.fn)
        else:
            impls[name] = kernel_call(plan, found.fn)
    for name in ("kernel", *plan.baselines):
        impls[name] = (outside_contract(plan, name, spec) if spec else "") or impls[name]
    return impls
