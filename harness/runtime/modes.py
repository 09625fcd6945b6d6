"""Graph-mode runners: how one call of the kernel is made in each `graph_mode` cell.

- eager: the kernel as a plain Python call.
- torch_compile: the kernel wrapped as an opaque `torch.library.custom_op` (schema from the plan,
  fake implementation from the plan or derived from the reference), `opcheck`ed once, then called
  under `torch.compile(fullgraph=True)` with the token dimension unbacked, so one graph must serve
  every token count.
- cuda_graph: captured on static buffers at vLLM's capture sizes, in the example's layout,
  replayed with fresh data copied in and token counts padded up to the captured size, as vLLM's
  model runner does.

Each runner is called as `runner(values, example) -> returned` with the plan's keyword arguments;
outputs the op writes land in `values` as in eager mode, so the caller compares the same way.
"""

from __future__ import annotations

import re
from typing import Callable

import torch

from harness.runtime.calls import first_line
from harness.interpreter.unfaithful import unfaithful
from harness.runtime.inputs import Example, in_layout
from harness.runtime.numerics import Mismatch
from harness.runtime.resolve import given_to_reference, resolve
from harness.plan.model import Plan
from harness.plan.vocabulary import BUILTIN_SYMBOLS

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"torch.compile": 2, "cuda graph": 1}
# v2: a kernel that raises fails as in eager (its minimal example the smallest where it raises), not opcheck
FAILURES_ONLY = {"torch.compile": [2]}


class RaisedInEager(Exception):
    """A torch_compile cell's opcheck failed because the kernel itself raises: called eagerly on the same
    arguments it raised too (this exception's cause), so the cell fails as its eager twin does, not for the op's
    registration."""


class Eager:
    def __init__(self, plan: Plan, kernel: Callable, device: str):
        self.plan, self.kernel, self.facts = plan, kernel, {}

    def __call__(self, values: dict, example: Example):
        return self.kernel(**values)


# ---------------------------------------------------------------- torch.compile


# Ops defined in this process: (qualname, schema) -> (op, slot). torch cannot redefine an op name cleanly, so a
# later cell of the same plan reuses the op with its own kernel and fake in the slot.
_defined: dict[tuple[str, str], tuple[object, dict]] = {}


def as_custom_op(plan: Plan, kernel: Callable, fake: Callable | None = None):
    """The kernel as the opaque custom op `plan.op_qualname`, the way its vLLM plugin registers it."""
    names = [a.name for a in plan.args]
    returned = plan.returned_outputs
    if fake is None:
        reference = resolve(plan).reference
        returned_idx = [i for i, o in enumerate(plan.op.outputs) if o in returned]

        def fake(*args):
            if not returned:
                return None
            kwargs = {n: v for n, v in zip(names, args) if given_to_reference(reference, plan.arg(n))}
            ref = reference(**kwargs)  # runs on fake tensors: only metadata is computed
            ref = ref if isinstance(ref, tuple) else (ref,)
            outs = tuple(torch.empty_like(ref[i]) for i in returned_idx)
            return outs[0] if len(outs) == 1 else outs

    schema = plan.schema()
    known = _defined.get((plan.op_qualname, schema))
    if known is not None:
        known[1].update(kernel=kernel, fake=fake)
        return known[0]
    slot = {"kernel": kernel, "fake": fake}

    def impl(*args):
        out = slot["kernel"](**dict(zip(names, args)))
        if not returned:
            return None
        # A custom op may not return its inputs or a view of them: return fresh tensors.
        outs = out if isinstance(out, tuple) else (out,)
        return outs[0].clone() if len(returned) == 1 else tuple(o.clone() for o in outs)

    # Another plan of the same op name with another signature in this process (the harness's own tests only).
    others = sum(1 for qualname, _ in _defined if qualname == plan.op_qualname)
    name = f"{plan.op_qualname}_{others}" if others else plan.op_qualname
    op = torch.library.custom_op(name, impl, mutates_args=plan.written_args, schema=schema)
    op.register_fake(lambda *args: slot["fake"](*args))
    _defined[(plan.op_qualname, schema)] = (op, slot)
    return op


BATCH_SYMBOLS = set(BUILTIN_SYMBOLS) - {"num_tokens"}
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


class _Compiled:
    """The op under torch.compile(fullgraph=True), counting the graphs its backend compiles (with Dynamo's id of
    each, e.g. "0/3", which prefixes the reason Dynamo gives when that graph's guards fail)."""

    def __init__(self, op):
        self.compiles, self.compile_ids = 0, []
        self.graphs: dict[tuple, list[str]] = {}  # variant key -> ids of the graphs compiled for it

        def count_compiles(gm, example_inputs):
            from torch._inductor.compile_fx import compile_fx

            self.compiles += 1
            self.compile_ids.append(str(torch._guards.CompileContext.current_compile_id()))
            return compile_fx(gm, example_inputs)

        self.call = lambda *args: op(*args)
        self.fn = torch.compile(self.call, fullgraph=True, backend=count_compiles)

    def guard_failures(self) -> list:
        """Dynamo's reasons so far for not reusing a cached graph of this function, "<compile id>: <failed guard>"
        (torch._dynamo.utils.guard_failures, filled on every recompile; [] where this torch has none)."""
        return getattr(torch._dynamo.utils, "guard_failures", {}).get(self.call.__code__, [])


# Compiled callers per (op, kernel, fake), kept for the life of the process: a later cell of the same op (another
# phase, a dtype seen before) reuses the graphs earlier cells compiled, and compiles only what it is the first to see.
# Compiling afresh in every cell (4 graphs through dynamo and Inductor) cost about 0.5 s a cell on a 2-core CPU
# machine; the recompile check stays per cell (a shape the cell has seen must not compile again).
_compiled: dict[tuple, _Compiled] = {}


class TorchCompile:
    """The token dimension is unbacked, so a new token count must not recompile (a cell fails if it does)."""

    def __init__(self, plan: Plan, kernel: Callable, device: str, fake: Callable | None = None):
        import torch._dynamo

        self.plan, self.names, self.kernel = plan, [a.name for a in plan.args], kernel
        self.op = as_custom_op(plan, kernel, fake)
        torch._dynamo.config.cache_size_limit = 1024  # never fall back to eager silently
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 1024
        # variant key -> the token counts seen with it (harness.runtime.modes.variant_key)
        self.compiles, self.seen, self.opcheck_failure = 0, {}, None
        self.facts = {"compiles": 0, "shapes": 0, "opcheck": None}
        # A derived fake is a new function per call: the reference and outputs it is derived from identify it.
        key = (plan.op_qualname, plan.schema(), kernel, fake or (plan.op.reference, tuple(plan.op.outputs)))
        if key not in _compiled:
            _compiled[key] = _Compiled(self.op)
        self.compiled = _compiled[key]

    def __call__(self, values: dict, example: Example):
        args = [values[n] for n in self.names]
        if self.opcheck_failure is None:  # opcheck once: schema (declared mutations), fake tensor, aot dispatch
            # torch's schema check compares written arguments with ops fp8 lacks: there it is left out, and said.
            fp8_written = any(values[n].is_floating_point() and values[n].element_size() == 1
                              for n in self.plan.written_args)
            utils = [u for u in OPCHECK_UTILS if not (fp8_written and u == "test_schema")]
            self.facts["opcheck_utils"] = ", ".join(utils)
            try:
                torch.library.opcheck(self.op, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args),
                                      test_utils=utils)
                self.opcheck_failure = ""
            except Exception as exc:
                if unfaithful(exc):  # the interpreter's limit, not the registration's: the cell is inconclusive
                    raise unfaithful(exc) from None
                try:  # opcheck calls the kernel: where it raises called plainly too, that is the cell's failure
                    self.kernel(**{n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in values.items()})
                except Exception as raised:
                    raise RaisedInEager() from raised  # opcheck not judged: the next example runs it again
                self.opcheck_failure = f"torch.library.opcheck failed: {first_line(exc)}"
                if not self.plan.op.fake and "data-dependent" in str(exc).lower():
                    self.opcheck_failure += (" (the fake was derived from the reference, which reads tensor values: "
                                             "give op.fake, a function that only allocates the outputs)")
            self.facts["opcheck"] = "failed" if self.opcheck_failure else "passed"
        if self.opcheck_failure:  # every example fails alike, so hypothesis's replay sees the same failure
            raise Mismatch(self.opcheck_failure)
        for n in self.names:
            arg = self.plan.arg(n)
            for d, size in enumerate(arg.shape or ()):  # a batch's sequences and blocks vary per call too
                if d != self.plan.token_dim(n) and size.names & BATCH_SYMBOLS:
                    torch._dynamo.decorators.mark_unbacked(values[n], d)
                    base = values[n]._base  # a view: Dynamo guards on its buffer's sizes too (block_tables' rows)
                    if base is not None and base.dim() == values[n].dim():
                        torch._dynamo.decorators.mark_unbacked(base, d)
            dim = self.plan.token_dim(n) if arg.is_tensor else None
            if dim is not None:
                torch._dynamo.decorators.mark_unbacked(values[n], dim)
                if values[n]._base is not None:  # a strided view: Dynamo guards on its buffer's size too
                    torch._dynamo.decorators.mark_unbacked(values[n]._base, dim)
        key = variant_key(values, example)
        before, failures_before = self.compiled.compiles, len(self.compiled.guard_failures())
        out = self.compiled.fn(*args)
        compiled_now = self.compiled.compiles - before
        self.compiles += compiled_now
        self.facts["compiles"] = self.compiles
        graphs, tokens = self.compiled.graphs.setdefault(key, []), self.seen.setdefault(key, [])
        graphs += self.compiled.compile_ids[len(self.compiled.compile_ids) - compiled_now:]
        if tokens and compiled_now:  # a graph for this very variant existed: only the token count was new to it
            # Dynamo tried each cached graph: the reason one of this variant's gave is the one that matters
            reasons = [str(r) for r in self.compiled.guard_failures()[failures_before:]]
            reasons = [r for r in reasons if r.split(":")[0] in graphs] or [r for r in reasons if r[:1].isalpha()]
            raise Mismatch(self._recompiled(example, tokens, reasons))
        if example.num_tokens not in tokens:
            tokens.append(example.num_tokens)
        self.facts["shapes"] = len(self.seen)
        return out

    def _recompiled(self, example: Example, tokens: list[int], reasons: list[str]) -> str:
        """Why the cell fails: the token counts of the variant, and Dynamo's reason for not reusing its graph."""
        batch = any(d.names & BATCH_SYMBOLS for a in self.plan.tensor_args for d in a.shape)
        changed = "num_tokens and the batch's sequences and blocks" if batch else "num_tokens"
        earlier = ", ".join(map(str, tokens[-5:][::-1])) + (", …" if len(tokens) > 5 else "")
        text = (f"torch.compile recompiled when only {changed} changed ({example.num_tokens}, after {earlier}): "
                f"the token dimension must stay dynamic ({self.compiles} compilations for {len(self.seen)} "
                "input variants in this cell)")
        reason = next(iter(reasons), "").split("\n")[0].split("  #")[0].strip()
        reason = re.sub(r"^\d+/\d+: ", "", reason)
        reason = re.sub(r"(?:L\[')?args(?:'\])?\[(\d+)\]", lambda m: self.names[int(m.group(1))], reason)
        return text + (f"; Dynamo's guard that failed: {reason[:300]}" if reason else "")


def variant_key(values: dict, example: Example) -> tuple:
    """What one compiled graph may be specialised on, all of it drawn by the harness: the sizes and layouts, which
    optional inputs are None, each tensor's dtype, each Python scalar's type and value (Dynamo guards on every one).
    Not the token count, nor the batch's sizes: those are unbacked, and a compile for them alone fails the cell."""
    kinds = tuple(str(v.dtype) if isinstance(v, torch.Tensor) else (type(v).__name__, v) for v in values.values())
    return example.shape_key(), tuple(values), kinds


# ---------------------------------------------------------------- CUDA graphs


class CudaGraph:
    """Capture per (capture size, shape) on static buffers; each example copies its data in and replays."""

    def __init__(self, plan: Plan, kernel: Callable, device: str):
        self.plan, self.kernel = plan, kernel
        self.sizes = plan.cuda_graph_sizes()
        self.graphs: dict = {}
        self.facts = {"capture_safe": None, "captures": 0, "replays": 0, "beyond_largest_capture": 0}

    def capture_size(self, n: int) -> int:
        size = next((s for s in self.sizes if s >= n), None)
        if size is None:  # vLLM runs these eagerly; capture them too, rounded up, so prefill cells test capture
            self.facts["beyond_largest_capture"] += 1
            size = -(-n // 256) * 256
        return size

    def _static(self, values: dict, example: Example, size: int) -> dict:
        """Static buffers for one capture: token dims grown to `size`, each in the example's layout (strides and
        padding as drawn), padded rows poisoned until the first replay's data lands in them."""
        static = {}
        for name, v in values.items():
            dim = self.plan.token_dim(name) if isinstance(v, torch.Tensor) else None
            if dim is None:
                static[name] = v.clone() if isinstance(v, torch.Tensor) else v
                continue
            shape = list(v.shape)
            shape[dim] = size
            # Padded rows hold the plan's pad value (0 unless it says otherwise): valid positions, lengths, ids.
            buf = torch.full(shape, self.plan.arg(name).pad, device=v.device).to(v.dtype)
            static[name] = in_layout(buf, *example.layout(name))
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
                               f"it cannot be captured in a CUDA graph ({first_line(exc)})") from None
            finally:
                torch.cuda.set_sync_debug_mode(0)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out = self.kernel(**static)
        except Exception as exc:
            self.facts["capture_safe"] = False
            raise Mismatch(f"CUDA graph capture failed: {first_line(exc)} (a host sync, a data-dependent "
                           "allocation or a CPU tensor in the kernel's launch path cannot be captured)") from None
        self.facts["captures"] += 1
        if self.facts["capture_safe"] is None:
            self.facts["capture_safe"] = True
        return graph, out

    def __call__(self, values: dict, example: Example):
        n = example.num_tokens
        size = self.capture_size(n)
        # One graph per capture size and per shape of everything else (a batch's sequences and blocks too).
        key = (size, example.shape_key(), tuple(tuple(v.shape) for k, v in values.items()
                                                if isinstance(v, torch.Tensor) and self.plan.token_dim(k) is None))
        if key not in self.graphs:
            static = self._static(values, example, size)
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
        dim = self.plan.token_dim(name)
        return t if dim is None else t.narrow(dim, 0, n)


# memcheck cells call the kernel eagerly; compute-sanitizer around the process does the checking.
RUNNERS = {"eager": Eager, "torch_compile": TorchCompile, "cuda_graph": CudaGraph, "memcheck": Eager}


def make_runner(mode: str, plan: Plan, kernel: Callable, device: str):
    if mode == "torch_compile":
        return TorchCompile(plan, kernel, device, resolve(plan).fake)
    return RUNNERS[mode](plan, kernel, device)
