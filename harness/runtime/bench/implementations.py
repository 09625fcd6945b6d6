"""The implementations a benchmark item times, each as a call on one argument set: the kernel, the built-in
baselines (native eager, the same under torch.compile, vLLM's in-tree kernel) and the plan's named baselines (a
Prepared one maps its inputs once per set, outside the timed region), or why one is not run here. Also the input
sets they rotate over (input_sets) and the compiled reference, compiled once per shape (compiled_reference).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from harness.runtime.calls import kernel_outputs, reference_outputs
from harness.runtime.inputs import Example, build_args, poison_value
from harness.runtime.resolve import named_baseline, resolve
from harness.plan.model import Plan
from harness.runtime.providers import KernelUnavailable, load_kernel
from harness.vllm.names import baseline_unsupported
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


def named_call(plan: Plan, name: str, path: str) -> Callable[[dict], dict] | str:
    """A named baseline as a kernel-style call (a Prepared one where it has a `prepare`), or why it cannot run here
    (its package missing, a bad path)."""
    fn = named_baseline(plan, path)
    if isinstance(fn, str):
        return fn
    if plan.benchmark.prepare(name) is None:
        return kernel_call(plan, fn)
    prepare = named_baseline(plan, plan.benchmark.prepare(name))
    return prepare if isinstance(prepare, str) else Prepared(plan, prepare, fn)


def timed_functions(plan: Plan) -> dict[str, str]:
    """What each baseline of the plan times, by import path (recorded with every benchmark, so a page tells which
    function a figure came from after the plan changed)."""
    out = {name: plan.native_path for name in ("native", "compiled") if name in plan.benchmark.baselines}
    for name, path in plan.benchmark.named:
        prepare = plan.benchmark.prepare(name)
        out[name] = f"{path}; prepared by {prepare}" if prepare else path
    return out


def implementations(plan: Plan, device: str, spec: BenchSpec | None = None) -> dict[str, Callable | str]:
    """Each implementation as a call, or the reason it is not run: the kernel, the built-in baselines, then the
    plan's named baselines in plan order. With `spec`, the kernel and named baselines whose contract that shape is
    outside are not run (the others are)."""
    native = resolve(plan).native  # op.native, else the reference
    try:
        kernel = kernel_call(plan, load_kernel(plan)) if device == "cuda" else CPU_KERNEL_REASON
    except KernelUnavailable as exc:  # the plan tests vLLM's own kernel, which cannot be loaded here
        kernel = str(exc)
    impls: dict[str, Callable | str] = {"kernel": kernel}
    for name in ("native", "compiled", "vllm"):
        if name not in plan.benchmark.baselines:
            impls[name] = "not in the plan's benchmark.baselines"
        elif name == "native":
            impls[name] = reference_call(plan, native)
        elif name == "compiled":
            impls[name] = reference_call(plan, compiled_reference(native, spec.shape if spec else None))
        else:  # vLLM's kernel, as the plan's `vllm` provider calls it
            try:
                impls[name] = baseline_unsupported(plan) or kernel_call(plan, load_kernel(plan, "vllm"))
            except KernelUnavailable as exc:
                impls[name] = str(exc)
    for name, path in plan.benchmark.named:
        impls[name] = named_call(plan, name, path)
    for name in ("kernel", *(n for n, _ in plan.benchmark.named)):
        impls[name] = (outside_contract(plan, name, spec) if spec else "") or impls[name]
    return impls


_compiled: dict = {}  # the compiled reference of the last shape benchmarked in this process


def compiled_reference(reference: Callable, shape: tuple) -> Callable:
    """The native code (op.native, else the reference) under torch.compile, specialised to one shape (Inductor at its
    best, as vLLM's compile_sizes get it). Items of one shape follow each other (eager, then cuda_graph), so they
    share one compilation; a new shape starts afresh (dynamo.reset), so dynamo's recompile limit never sends it to
    eager."""
    key = (reference, shape)
    if key not in _compiled:
        _without_guard_latency_probe()
        torch._dynamo.reset()
        _compiled.clear()
        _compiled[key] = torch.compile(reference, fullgraph=True, dynamic=False)
    return _compiled[key]


@functools.cache  # once per process
def _without_guard_latency_probe() -> None:
    """Dynamo times each new compile's guards for its logs (guards.profile_guard_manager, after flushing the CPU's
    caches; no setting turns it off): 21 ms a compile on an H200 machine, 1.7 s of plan.yaml's 84 shapes. Nothing
    here reads that figure, and the compiled code and its guards are the same without it."""
    from torch._dynamo import guards

    if getattr(guards, "profile_guard_manager", None) is not None:
        guards.profile_guard_manager = lambda *args, **kwargs: 0.0
