"""Graph-mode runners: how one call of the kernel is made in each `graph_mode` cell.

- eager: the kernel as a plain Python call.
- torch_compile: the kernel wrapped as an opaque `torch.library.custom_op` (schema from the plan,
  fake implementation from the plan or derived from the reference), `opcheck`ed once, then called
  under `torch.compile(fullgraph=True)` with the token dimension unbacked, so one graph must serve
  every token count.
- cuda_graph: captured on static buffers at vLLM's capture sizes, replayed with fresh data copied
  in and token counts padded up to the captured size, as vLLM's model runner does.

Each runner is called as `runner(values, example) -> returned` with the plan's keyword arguments;
outputs the op writes land in `values` as in eager mode, so the caller compares the same way.
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch

from .inputs import Example
from .numerics import Mismatch
from .plan import Plan, import_object

_op_ids = itertools.count()


def returned_outputs(plan: Plan) -> tuple[str, ...]:
    """Outputs the op returns (the rest are written into arguments)."""
    arg_names = {a.name for a in plan.args}
    return tuple(o for o in plan.outputs if o not in arg_names)


def written_args(plan: Plan) -> tuple[str, ...]:
    return tuple(a.name for a in plan.args if a.role == "output") + tuple(plan.mutates)


def token_dim(plan: Plan, name: str) -> int | None:
    arg = plan.arg(name)
    return next((i for i, d in enumerate(arg.shape or ()) if d.symbol == "num_tokens"), None)


class Eager:
    def __init__(self, plan: Plan, kernel: Callable, device: str):
        self.plan, self.kernel, self.facts = plan, kernel, {}

    def __call__(self, values: dict, example: Example):
        return self.kernel(**values)


# ---------------------------------------------------------------- torch.compile


def _schema(plan: Plan) -> str:
    written = set(written_args(plan))
    params = []
    for i, a in enumerate(plan.args):
        if a.is_tensor:
            params.append(f"Tensor(a{i}!) {a.name}" if a.name in written else f"Tensor {a.name}")
        else:
            kind = {bool: "bool", int: "int", float: "float", str: "str"}[type(a.value)]
            params.append(f"{kind} {a.name}")
    n_ret = len(returned_outputs(plan))
    ret = "()" if n_ret == 0 else "Tensor" if n_ret == 1 else "(" + ", ".join(["Tensor"] * n_ret) + ")"
    return f"({', '.join(params)}) -> {ret}"


def as_custom_op(plan: Plan, kernel: Callable, fake: Callable | None = None):
    """The kernel as an opaque custom op, the way a vLLM integration registers it."""
    names = [a.name for a in plan.args]
    returned = returned_outputs(plan)
    qualname = f"harness::{plan.name}_{next(_op_ids)}"

    def impl(*args):
        out = kernel(**dict(zip(names, args)))
        if not returned:
            return None
        # A custom op may not return its inputs or a view of them: return fresh tensors.
        outs = out if isinstance(out, tuple) else (out,)
        return outs[0].clone() if len(returned) == 1 else tuple(o.clone() for o in outs)

    op = torch.library.custom_op(qualname, impl, mutates_args=written_args(plan), schema=_schema(plan))
    if fake is None:
        reference = plan.load_reference()
        arg_names = {a.name for a in plan.args}
        returned_idx = [i for i, o in enumerate(plan.outputs) if o not in arg_names]

        def fake(*args):
            if not returned:
                return None
            kwargs = {n: v for n, v in zip(names, args) if plan.arg(n).role != "output"}
            ref = reference(**kwargs)  # runs on fake tensors: only metadata is computed
            ref = ref if isinstance(ref, tuple) else (ref,)
            outs = tuple(torch.empty_like(ref[i]) for i in returned_idx)
            return outs[0] if len(outs) == 1 else outs

    op.register_fake(fake)
    return op


class TorchCompile:
    """Compiled once per cell; the token dimension is unbacked so a new token count must not recompile."""

    def __init__(self, plan: Plan, kernel: Callable, device: str, fake: Callable | None = None):
        import torch._dynamo

        self.plan, self.names = plan, [a.name for a in plan.args]
        self.op = as_custom_op(plan, kernel, fake)
        torch._dynamo.reset()
        torch._dynamo.config.cache_size_limit = 1024  # never fall back to eager silently
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 1024
        self.compiles, self.seen_keys, self.opcheck_failure = 0, set(), None
        self.facts = {"compiles": 0, "shapes": 0, "opcheck": None}

        def count_compiles(gm, example_inputs):
            from torch._inductor.compile_fx import compile_fx

            self.compiles += 1
            return compile_fx(gm, example_inputs)

        op = self.op
        self.compiled = torch.compile(lambda *args: op(*args), fullgraph=True, backend=count_compiles)

    def __call__(self, values: dict, example: Example):
        args = [values[n] for n in self.names]
        if self.opcheck_failure is None:  # opcheck once: schema (declared mutations), fake tensor, aot dispatch
            try:
                torch.library.opcheck(self.op, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
                self.opcheck_failure = ""
            except Exception as exc:
                self.opcheck_failure = f"torch.library.opcheck failed: {_first_line(exc)}"
            self.facts["opcheck"] = "failed" if self.opcheck_failure else "passed"
        if self.opcheck_failure:  # every example fails alike, so hypothesis's replay sees the same failure
            raise Mismatch(self.opcheck_failure)
        for n in self.names:
            dim = token_dim(self.plan, n) if self.plan.arg(n).is_tensor else None
            if dim is not None:
                torch._dynamo.decorators.mark_unbacked(values[n], dim)
        before, key = self.compiles, example.shape_key()
        out = self.compiled(*args)
        self.facts["compiles"] = self.compiles
        if key in self.seen_keys and self.compiles > before:
            raise Mismatch(f"torch.compile recompiled for num_tokens={example.num_tokens} on a shape it had "
                           f"compiled before ({self.compiles} compilations for {len(self.seen_keys)} shapes): "
                           "the token dimension must stay dynamic")
        self.seen_keys.add(key)
        self.facts["shapes"] = len(self.seen_keys)
        return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


# ---------------------------------------------------------------- CUDA graphs


def vllm_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default cudagraph capture sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)."""
    largest = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
    return [s for s in sizes if s <= largest]


class CudaGraph:
    """Capture per (capture size, shape) on static buffers; each example copies its data in and replays."""

    def __init__(self, plan: Plan, kernel: Callable, device: str):
        self.plan, self.kernel = plan, kernel
        self.sizes = sorted(plan.capture_sizes or vllm_capture_sizes(plan.numerics.max_num_seqs))
        self.graphs: dict = {}
        self.facts = {"capture_safe": None, "captures": 0, "replays": 0, "beyond_largest_capture": 0}

    def capture_size(self, n: int) -> int:
        size = next((s for s in self.sizes if s >= n), None)
        if size is None:  # vLLM runs these eagerly; capture them too, rounded up, so prefill cells test capture
            self.facts["beyond_largest_capture"] += 1
            size = -(-n // 256) * 256
        return size

    def _static(self, values: dict, size: int) -> dict:
        static = {}
        for name, v in values.items():
            dim = token_dim(self.plan, name) if isinstance(v, torch.Tensor) else None
            if dim is None:
                static[name] = v.clone() if isinstance(v, torch.Tensor) else v
                continue
            shape = list(v.shape)
            shape[dim] = size
            pad = v.stride(dim - 1) - v.shape[-1] if v.dim() > 1 and dim != v.dim() - 1 else 0
            full = torch.randn(shape[:-1] + [shape[-1] + max(pad, 0)], device=v.device).to(v.dtype)
            static[name] = full[..., : shape[-1]]
        return static

    def _capture(self, static: dict):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.kernel(**static)  # compiles the Triton kernel outside capture
            torch.cuda.set_sync_debug_mode("error")
            try:
                self.kernel(**static)
            except RuntimeError as exc:
                self.facts["capture_safe"] = False
                raise Mismatch("the kernel synchronizes with the host (e.g. reads a device value with .item()): "
                               f"it cannot be captured in a CUDA graph ({_first_line(exc)})") from None
            finally:
                torch.cuda.set_sync_debug_mode(0)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out = self.kernel(**static)
        except Exception as exc:
            self.facts["capture_safe"] = False
            raise Mismatch(f"CUDA graph capture failed: {_first_line(exc)} (a host sync, a data-dependent "
                           "allocation or a CPU tensor in the kernel's launch path cannot be captured)") from None
        self.facts["captures"] += 1
        if self.facts["capture_safe"] is None:
            self.facts["capture_safe"] = True
        return graph, out

    def __call__(self, values: dict, example: Example):
        n = example.num_tokens
        size = self.capture_size(n)
        key = (size, example.shape_key())
        if key not in self.graphs:
            static = self._static(values, size)
            self.graphs[key] = (static, *self._capture(static))
        static, graph, out = self.graphs[key]
        for name, v in values.items():  # fresh data into the real rows; padded rows keep stale data
            if isinstance(v, torch.Tensor):
                self._rows(name, static[name], n).copy_(v)
        graph.replay()
        self.facts["replays"] += 1
        for name, v in values.items():  # what the op wrote (or should not have) back into the caller's tensors
            if isinstance(v, torch.Tensor):
                v.copy_(self._rows(name, static[name], n))
        if out is None:
            return None
        outs = out if isinstance(out, tuple) else (out,)
        sliced = tuple(o.narrow(0, 0, n).clone() if o.dim() else o.clone() for o in outs)
        return sliced if isinstance(out, tuple) else sliced[0]

    def _rows(self, name: str, t: torch.Tensor, n: int) -> torch.Tensor:
        dim = token_dim(self.plan, name)
        return t if dim is None else t.narrow(dim, 0, n)


RUNNERS = {"eager": Eager, "torch_compile": TorchCompile, "cuda_graph": CudaGraph}


def make_runner(mode: str, plan: Plan, kernel: Callable, device: str):
    if mode == "torch_compile":
        return TorchCompile(plan, kernel, device, import_object(plan.fake) if plan.fake else None)
    return RUNNERS[mode](plan, kernel, device)
