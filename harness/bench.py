"""Benchmarks: per regime and GPU, is the kernel faster than the reference eager ("native"), the reference
under torch.compile ("compiled", Inductor) and vLLM's in-tree kernel ("vllm")?

One item per benchmark shape (the plan's benchmark token counts x its sizes) x dtype x graph mode on
this machine's SM, e.g. `bench[decode-bf16-eager-sm90-t64-hidden4096]`. How a GPU is timed:

- Device time only. `eager`: CUDA events around each plain call; before each batch of calls the GPU
  is parked on a short sleep kernel so the host queues the whole batch ahead of it, so host launch
  overhead stays out of the figure. `cuda_graph`: K calls captured in one graph, replays timed with
  events, each sample is replay time / K (how vLLM runs decode batches).
- Warm-up before timing (compilation, autotuning, graph upload), then a median and q20/q80 over
  samples worth about TARGET_MS of device time.
- Cold L2: when one call's tensors are smaller than twice the L2 cache, enough input sets are built
  that their total exceeds 2x L2, and calls rotate over them (`rotated_sets` in the results).
- Each implementation's outputs are checked against the reference after its timing loop.
- Launches per call: the device operations (kernels, memsets, copies) in a CUDA graph capturing one call.
- A speedup whose interval (q20/q80 bounds, widened by NOISE_FLOOR for run-to-run drift) spans 1.0
  is "no difference".

On a CPU machine the kernel runs in Triton's interpreter, whose speed says nothing: the kernel is not
timed there (the item is skipped with that reason), while native versus compiled is still timed with
the host clock (`timer: host`).

pytest-benchmark stores every timed implementation (`--benchmark-save`, `--benchmark-compare`,
`--benchmark-compare-fail`): each item hands it the device samples through its `timer=` hook (a clock
that advances by one measured sample per round), so its statistics are device time, not host time.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import re
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pytest
import torch

from .inputs import Example, build_args
from .matrix import Cell, decide
from .modes import returned_outputs
from .numerics import Mismatch, Stats, compare, tolerance_for
from .plan import Plan, PlanError
from .runner import reference_outputs

IMPLS = ("kernel", "native", "compiled", "vllm")
BENCH_GRAPH_MODES = ("eager", "cuda_graph")

# Device time spent on timed samples per implementation, and on warm-up (triton.testing.do_bench's defaults).
TARGET_MS, WARMUP_MS = 100.0, 25.0
EAGER_SAMPLES = (50, 1000)  # (fewest, most) timed calls
GRAPH_SAMPLES = (20, 200)  # (fewest, most) timed replays
# A captured graph holds at least this much work (and every rotated set), so replay launch costs amortise.
GRAPH_REPLAY_MS = 2.0
# Calls queued behind one sleep kernel; well under CUDA's launch queue (about 1000 entries).
HOST_AHEAD_BATCH = 64
# On a CPU machine (host clock, native vs compiled only).
CPU_TARGET_MS, CPU_SAMPLES = 300.0, (5, 200)
# Run-to-run drift seen on one GPU beyond a single run's q20/q80 spread; speedups inside it are noise.
NOISE_FLOOR = 0.02
CHECK_SEED = 20_251_101

CPU_KERNEL_REASON = ("not timed on a CPU machine: the kernel runs in Triton's interpreter there, whose speed says "
                     "nothing about a GPU")


# ---------------------------------------------------------------- what is benchmarked


@dataclass(frozen=True)
class BenchSpec:
    phase: str
    dtype: str
    graph_mode: str
    sm: str
    num_tokens: int
    sizes: tuple[tuple[str, int], ...] = ()

    @property
    def id(self) -> str:
        dims = "".join(f"-{name}{value}" for name, value in self.sizes)
        return f"{self.phase}-{self.dtype}-{self.graph_mode}-{self.sm}-t{self.num_tokens}{dims}"

    @property
    def sizes_dict(self) -> dict[str, int]:
        return dict(self.sizes)

    def cell(self) -> Cell:
        return Cell(self.phase, self.dtype, 1, self.graph_mode, self.sm)


def bench_specs(plan: Plan, sm: str) -> list[BenchSpec]:
    """Every benchmark shape of the plan on one SM: phase token counts x sizes x dtype x graph mode."""
    modes = [m for m in BENCH_GRAPH_MODES if m in plan.matrix["graph_mode"]] or ["eager"]
    names = list(plan.sizes)
    specs = []
    for phase, counts in plan.benchmark.shapes().items():
        for n in counts:
            for values in itertools.product(*(plan.sizes[s] for s in names)):
                for dtype in plan.matrix["dtype"]:
                    for mode in modes:
                        specs.append(BenchSpec(phase, dtype, mode, sm, n, tuple(zip(names, values))))
    return specs


# ---------------------------------------------------------------- byte and flop models

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expr: str, names: dict[str, float]) -> float:
    """Value of a plain arithmetic expression over `names` (numbers, names, + - * / // % **, parentheses).

    Nothing else is evaluated: no calls, attributes or subscripts. Raises ValueError saying what is wrong.
    """
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression ({exc.msg})") from None

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"unknown name {node.id!r}; known: {', '.join(sorted(names))}")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError(f"exponent {right} is too large")
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ValueError(f"{ast.unparse(node)!r} is not allowed: use numbers, size names and + - * / // % ** ( )")

    return value(tree.body)


def _plan_line(plan: Plan, text: str) -> int | None:
    return next((i + 1 for i, line in enumerate(plan.raw_text.splitlines()) if text in line), None)


def model_names(plan: Plan, dtype: str, num_tokens: int, sizes: dict[str, int]) -> dict[str, float]:
    """Names a byte or flop expression may use: the plan's sizes, num_tokens, act_bytes (activation element size)."""
    return {**sizes, "num_tokens": num_tokens, "act_bytes": _itemsize(dtype)}


def _model(plan: Plan, field_name: str, expr: str, names: dict) -> float:
    try:
        return float(evaluate(expr, names))
    except ValueError as exc:
        raise PlanError(str(plan.path), _plan_line(plan, expr), field_name,
                        f"an arithmetic expression over {', '.join(sorted(names))} ({exc})", expr) from None


def _itemsize(dtype: str) -> int:
    from .inputs import TORCH_DTYPES

    return TORCH_DTYPES[dtype].itemsize


def bytes_moved(plan: Plan, dtype: str, num_tokens: int, sizes: dict[str, int], returned_bytes: int = 0) -> int:
    """Fewest bytes one call must move: the plan's benchmark.bytes, else every tensor input read once, every
    output written once, mutated arguments read and written; `returned_bytes` for outputs the op returns."""
    names = model_names(plan, dtype, num_tokens, sizes)
    if plan.benchmark.bytes:
        return int(_model(plan, "benchmark.bytes", plan.benchmark.bytes, names))
    total = 0
    for arg in plan.tensor_args:
        numel = math.prod(num_tokens if d.symbol == "num_tokens" else d.size(sizes) for d in arg.shape)
        nbytes = numel * _itemsize(dtype if arg.dtype == "act" else arg.dtype)
        total += 2 * nbytes if arg.name in plan.mutates else nbytes
    return total + returned_bytes


def flops_done(plan: Plan, dtype: str, num_tokens: int, sizes: dict[str, int]) -> float | None:
    if not plan.benchmark.flops:
        return None
    return _model(plan, "benchmark.flops", plan.benchmark.flops, model_names(plan, dtype, num_tokens, sizes))


def check_models(plan: Plan) -> None:
    """Raise PlanError now if the plan's byte or flop expression cannot be evaluated on its sizes."""
    sizes = {name: values[0] for name, values in plan.sizes.items()}
    for dtype in plan.matrix["dtype"]:
        bytes_moved(plan, dtype, 1, sizes)
        flops_done(plan, dtype, 1, sizes)


# ---------------------------------------------------------------- inputs


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
            base.fill_(float("nan") if t.dtype.is_floating_point else torch.iinfo(t.dtype).max)
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


def working_set_bytes(values: dict) -> int:
    return sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor))


def rotation_count(working_set: int, l2_bytes: int | None) -> int:
    """Input sets whose total exceeds 2x L2, so every timed call starts with its data out of the cache."""
    if not l2_bytes:
        return 1
    return 2 * l2_bytes // max(working_set, 1) + 1


def l2_cache_bytes(device: str) -> int | None:
    return torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else None


# ---------------------------------------------------------------- timing


@dataclass
class Timing:
    samples_us: list[float]
    timer: str  # cuda_events | cuda_graph_replay | host
    calls_per_sample: int = 1

    def quantile(self, q: float) -> float:
        import numpy

        return float(numpy.quantile(self.samples_us, q))

    @property
    def median_us(self) -> float:
        return self.quantile(0.5)

    @property
    def q20_us(self) -> float:
        return self.quantile(0.2)

    @property
    def q80_us(self) -> float:
        return self.quantile(0.8)


def _clamp(x: float, bounds: tuple[int, int]) -> int:
    return int(min(max(x, bounds[0]), bounds[1]))


def time_calls(call: Callable[[dict], object], sets: list[dict], device: str, graph: bool = False) -> Timing:
    """Time `call(values)`, rotating over `sets`: CUDA events, CUDA-graph replay, or the host clock on a CPU."""
    if device != "cuda":
        return _time_host(call, sets)
    return _time_graph(call, sets) if graph else _time_eager(call, sets)


def _time_host(call, sets) -> Timing:
    rotation = itertools.cycle(sets)
    call(next(rotation))  # compilation, first-touch allocation
    start = time.perf_counter()
    call(next(rotation))
    estimate_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    samples = []
    for _ in range(_clamp(CPU_TARGET_MS / estimate_ms, CPU_SAMPLES)):
        values = next(rotation)
        start = time.perf_counter()
        call(values)
        samples.append((time.perf_counter() - start) * 1e6)
    return Timing(samples, "host")


@lru_cache(maxsize=1)
def _sleep_cycles_per_second() -> float:
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1e-3)


def _events_host_ahead(run: Callable[[], object], count: int, host_s_per_run: float) -> list[float]:
    """Device µs of `count` runs, each between two events; the GPU sleeps while the host queues each batch."""
    samples = []
    while len(samples) < count:
        n = min(HOST_AHEAD_BATCH, count - len(samples))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        sleep_s = min(1.5 * n * host_s_per_run + 20e-6, 0.5)
        torch.cuda._sleep(int(sleep_s * _sleep_cycles_per_second()))
        for start, end in events:
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        samples += [start.elapsed_time(end) * 1e3 for start, end in events]
    return samples


def _estimate(run: Callable[[], object], n: int) -> tuple[float, float]:
    """(device ms, host seconds) per run, over n runs."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(n):
        run()
    end.record()
    host = (time.perf_counter() - host) / n
    end.synchronize()
    return max(start.elapsed_time(end) / n, 1e-4), host


def _time_eager(call, sets) -> Timing:
    rotation = itertools.cycle(sets)

    def run():
        call(next(rotation))

    run()  # compilation, autotuning, lazy initialisation
    torch.cuda.synchronize()
    estimate_ms, host_s = _estimate(run, 5)
    for _ in range(_clamp(WARMUP_MS / estimate_ms, (1, 10_000))):
        run()
    samples = _events_host_ahead(run, _clamp(TARGET_MS / estimate_ms, EAGER_SAMPLES), host_s)
    return Timing(samples, "cuda_events")


def _time_graph(call, sets) -> Timing:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and initialise outside the capture, as torch.cuda.graph asks
        for values in sets[:3]:
            call(values)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    rotation = itertools.cycle(sets)
    eager_ms, _ = _estimate(lambda: call(next(rotation)), 5)
    # Whole rotations (every set equally often), a power of two of them so that a noisy estimate
    # rarely changes the graph's length.
    rotations = 2 ** math.ceil(math.log2(max(1.0, GRAPH_REPLAY_MS / eager_ms / len(sets))))
    calls = len(sets) * rotations
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(sets[i % len(sets)])
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    estimate_ms, host_s = _estimate(graph.replay, 2)
    for _ in range(_clamp(WARMUP_MS / estimate_ms, (1, 100))):
        graph.replay()
    replays = _events_host_ahead(graph.replay, _clamp(TARGET_MS / estimate_ms, GRAPH_SAMPLES), host_s)
    del graph
    return Timing([t / calls for t in replays], "cuda_graph_replay", calls)


@lru_cache(maxsize=None)
def copy_bandwidth_gbps(device: str) -> float:
    """This machine's measured copy bandwidth (bytes read + written) over one large tensor copy, once per run."""
    nbytes = (1 << 30) if device == "cuda" else (1 << 26)
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timing = time_calls(lambda v: v["dst"].copy_(v["src"]), [{"src": src, "dst": dst}], device)
    return 2 * nbytes / (timing.median_us * 1e-6) / 1e9


_GRAPH_NODE_TYPE = re.compile(r'label="\{\s*([A-Z_]+)')  # cudaGraphDebugDotPrint: label="{KERNEL | ..."
DEVICE_NODE_TYPES = ("KERNEL", "MEMSET", "MEMCPY")


def graph_launches(dot_text: str) -> int:
    """Device operations in a CUDA graph printed by cudaGraphDebugDotPrint (CUDAGraph.debug_dump)."""
    return sum(t in DEVICE_NODE_TYPES for t in _GRAPH_NODE_TYPE.findall(dot_text))


def count_launches(call: Callable[[dict], object], values: dict) -> int | None:
    """Device operations (kernels, memsets, copies) one call enqueues; None when it cannot be told.

    Counted as the nodes of a CUDA graph capturing the call. torch.profiler is the fallback only: in a
    process that has used CUDA graphs torch leaves CUPTI attached after profiling (TEARDOWN_CUPTI=0).
    """
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)  # keeps the captured graph so it can be printed
    except TypeError:  # torch before keep_graph: debug mode keeps it
        graph = torch.cuda.CUDAGraph()
        graph.enable_debug_mode()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch announces debug dumps with warnings
            with torch.cuda.graph(graph):
                call(values)
            with tempfile.TemporaryDirectory() as tmp:
                dot = Path(tmp) / "call.dot"
                graph.debug_dump(str(dot))
                nodes = graph_launches(dot.read_text())
    except Exception:  # not capturable, or no graph printed
        nodes = 0
    return nodes or _profiled_launches(call, values)  # a GPU call does launch something: 0 means not counted


def _profiled_launches(call: Callable[[dict], object], values: dict) -> int | None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    try:
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle": one cycle here
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                call(values)
                torch.cuda.synchronize()
            return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    except Exception:
        return None


# ---------------------------------------------------------------- implementations


def kernel_style(plan: Plan, fn: Callable) -> Callable[[dict], dict]:
    """A call with the plan's arguments that writes outputs into output arguments or returns them."""
    returned = returned_outputs(plan)

    def call(values: dict) -> dict:
        out = fn(**values)
        got = out if isinstance(out, tuple) else (out,)
        return {name: got[returned.index(name)] if name in returned else values[name] for name in plan.outputs}

    return call


def reference_style(plan: Plan, fn: Callable) -> Callable[[dict], dict]:
    """A functional reference: takes the inputs, returns plan.outputs in order."""
    inputs = [a.name for a in plan.args if a.role != "output"]

    def call(values: dict) -> dict:
        out = fn(**{name: values[name] for name in inputs})
        return dict(zip(plan.outputs, out if isinstance(out, tuple) else (out,)))

    return call


def vllm_implementation(plan: Plan) -> Callable | str:
    """vLLM's in-tree kernel as a kernel-style call, or the reason it cannot run here."""
    try:
        from .vllm_support import vllm_baseline
    except ImportError as exc:
        return f"vLLM baseline not available here ({exc})"
    try:
        fn = vllm_baseline(plan)
    except Exception as exc:  # a broken vLLM install must not stop the other timings
        return f"vLLM baseline could not be loaded ({type(exc).__name__}: {exc})"
    if fn is None:
        return "vLLM (or its kernel for this op) is not available on this machine"
    if isinstance(fn, str):
        return fn
    return kernel_style(plan, fn)


def implementations(plan: Plan, device: str) -> dict[str, Callable | str]:
    """Each implementation as a call, or the reason it is not run."""
    reference = plan.load_reference()
    impls: dict[str, Callable | str] = {
        "kernel": kernel_style(plan, plan.load_kernel()) if device == "cuda" else CPU_KERNEL_REASON,
    }
    for name in ("native", "compiled", "vllm"):
        if name not in plan.benchmark.baselines:
            impls[name] = "not in the plan's benchmark.baselines"
        elif name == "native":
            impls[name] = reference_style(plan, reference)
        elif name == "compiled":
            import torch._dynamo

            torch._dynamo.reset()  # one shape per item: never hit dynamo's recompile limit and fall back to eager
            impls[name] = reference_style(plan, torch.compile(reference, fullgraph=True, dynamic=False))
        else:
            impls[name] = vllm_implementation(plan)
    return impls


def _captured(call: Callable[[dict], dict], values: dict) -> dict:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = call(values)
    graph.replay()
    torch.cuda.synchronize()
    return outs


def check(plan: Plan, spec: BenchSpec, call: Callable[[dict], dict], device: str) -> tuple[str | None, dict]:
    """(mismatch message or None, reference outputs) for one call on fresh inputs, in the spec's graph mode."""
    values = input_sets(plan, spec, device, 1, seed=CHECK_SEED)[0]
    expected = reference_outputs(plan, plan.load_reference(), values)
    actual = _captured(call, values) if spec.graph_mode == "cuda_graph" else call(values)
    tol = tolerance_for(plan, spec.dtype)
    try:
        for name in plan.outputs:
            compare(name, actual[name], expected[name], tol, Stats())
    except Mismatch as exc:
        return f"wrong result after timing: {exc}", expected
    return None, expected


# ---------------------------------------------------------------- figures


def speedup(baseline: dict, kernel: dict, noise_floor: float = NOISE_FLOOR) -> dict:
    """Baseline time over kernel time (> 1: the kernel is faster), with an interval from the q20/q80 spreads.

    The interval is at least +-noise_floor around the value; a speedup whose interval spans 1.0 is
    "no difference".
    """
    value = baseline["median_us"] / kernel["median_us"]
    low = min(baseline["q20_us"] / kernel["q80_us"], value / (1 + noise_floor))
    high = max(baseline["q80_us"] / kernel["q20_us"], value * (1 + noise_floor))
    verdict = "faster" if low > 1 else "slower" if high < 1 else "no difference"
    return {"value": round(value, 3), "low": round(low, 3), "high": round(high, 3), "verdict": verdict}


def significant(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def figures(timing: Timing, nbytes: int, flops: float | None, copy_bw: float | None, launches) -> dict:
    seconds = timing.median_us * 1e-6
    gbps = nbytes / seconds / 1e9
    out = {"median_us": round(timing.median_us, 3), "q20_us": round(timing.q20_us, 3),
           "q80_us": round(timing.q80_us, 3), "gbps": significant(gbps),
           "pct_copy_bw": significant(100 * gbps / copy_bw) if copy_bw else None, "launches": launches,
           "samples": len(timing.samples_us)}
    if flops is not None:
        out["tflops"] = significant(flops / seconds / 1e12)
    return out


def base_record(spec: BenchSpec) -> dict:
    return {"phase": spec.phase, "dtype": spec.dtype, "sm": spec.sm, "graph_mode": spec.graph_mode,
            "num_tokens": spec.num_tokens, "sizes": spec.sizes_dict, "copy_bw_gbps": None, "l2_bytes": None,
            "working_set_bytes": None, "rotated_sets": None, "timer": None}


def not_run_record(spec: BenchSpec, reason: str) -> dict:
    """The record of an item this machine does not run: every implementation and speedup says why."""
    return {**base_record(spec), "impls": {name: {"not_run": reason} for name in IMPLS},
            "speedup": {name: {"not_run": reason} for name in IMPLS[1:]}}


@dataclass
class BenchOutcome:
    record: dict
    timings: dict[str, Timing] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def run_benchmark(plan: Plan, spec: BenchSpec, device: str) -> BenchOutcome:
    """Time every implementation of one benchmark item and check its result; returns the results record."""
    graph = spec.graph_mode == "cuda_graph"
    sizes = spec.sizes_dict
    copy_bw = copy_bandwidth_gbps(device)
    l2 = l2_cache_bytes(device)
    working_set = working_set_bytes(input_sets(plan, spec, device, 1)[0])
    sets = input_sets(plan, spec, device, rotation_count(working_set, l2))
    rec = {**base_record(spec), "copy_bw_gbps": significant(copy_bw), "l2_bytes": l2, "working_set_bytes": working_set,
           "rotated_sets": len(sets), "impls": {}, "speedup": {}}
    outcome = BenchOutcome(rec)
    flops = flops_done(plan, spec.dtype, spec.num_tokens, sizes)
    for name, call in implementations(plan, device).items():
        if isinstance(call, str):
            rec["impls"][name] = {"not_run": call}
            continue
        try:
            timing = time_calls(call, sets, device, graph)
            mismatch, expected = check(plan, spec, call, device)
        except Exception as exc:  # one implementation failing must not hide the others' figures
            message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            rec["impls"][name] = {"error": message}
            outcome.failures[name] = message
            continue
        arg_names = {a.name for a in plan.args}
        returned = sum(t.numel() * t.element_size() for k, t in expected.items() if k not in arg_names)
        nbytes = bytes_moved(plan, spec.dtype, spec.num_tokens, sizes, returned)
        launches = count_launches(call, sets[0]) if device == "cuda" else None
        rec["impls"][name] = figures(timing, nbytes, flops, copy_bw, launches)
        rec["timer"] = timing.timer
        outcome.timings[name] = timing
        if mismatch:
            rec["impls"][name]["error"] = mismatch
            outcome.failures[name] = mismatch
    kernel = rec["impls"]["kernel"]
    for name in IMPLS[1:]:
        base = rec["impls"][name]
        if "median_us" in kernel and "median_us" in base:
            rec["speedup"][name] = speedup(base, kernel)
        else:
            why = kernel.get("not_run") or kernel.get("error") or base.get("not_run") or base.get("error")
            rec["speedup"][name] = {"not_run": f"{'kernel' if 'median_us' not in kernel else name}: {why}"}
    del sets
    if device == "cuda":
        torch.cuda.empty_cache()
    return outcome


def table(benchmarks: dict) -> str:
    """A short text table of benchmark records (µs, GB/s, % of copy bandwidth, speedups)."""
    from tabulate import tabulate

    rows = []
    for bench_id, rec in sorted(benchmarks.items()):
        row = [bench_id]
        for name in IMPLS[:3]:
            f = rec["impls"].get(name, {})
            row.append(f"{f['median_us']:.2f} µs {f['gbps']:.0f} GB/s ({f['pct_copy_bw']}%)" if "median_us" in f
                       else "-")
        for name in IMPLS[1:3]:
            s = rec["speedup"].get(name, {})
            row.append(f"{s['value']:.2f}x [{s['low']:.2f},{s['high']:.2f}] {s['verdict']}" if "value" in s else "-")
        rows.append(row)
    return tabulate(rows, headers=["benchmark", "kernel", "native", "compiled", "vs native", "vs compiled"])


# ---------------------------------------------------------------- pytest items


def collect_bench_items(parent, plan: Plan, hw):
    """One BenchItem per benchmark spec on this machine's SM; a bad byte/flop model is a collection error."""
    try:
        check_models(plan)
    except PlanError as exc:
        raise parent.CollectError(f"invalid plan: {exc}") from None
    config = parent.config
    config.addinivalue_line("markers", "bench: benchmark items (collected with --bench)")
    for spec in bench_specs(plan, hw.sm):
        reason = skip_reason(plan, spec, hw, config.getoption("--max-cpu-ranks"))
        item = BenchItem.from_parent(parent, name=f"bench[{spec.id}]", spec=spec, skip_reason=reason)
        for marker in ("bench", spec.phase, spec.dtype, spec.graph_mode, spec.sm):
            item.add_marker(marker)
        yield item


def skip_reason(plan: Plan, spec: BenchSpec, hw, max_cpu_ranks: int = 4) -> str:
    """Why this machine does not time this spec ("" if it does)."""
    if spec.sm not in plan.matrix["sm"]:
        return f"the plan's matrix.sm does not list {spec.sm}"
    decision = decide(plan, spec.cell(), hw, max_cpu_ranks)
    if decision.kind == "xfail":
        return f"not timed: {decision.reason}"
    if decision.kind != "run":
        return decision.reason
    return ""


class BenchFailed(Exception):
    """An implementation raised or computed a wrong result while being benchmarked."""


class BenchItem(pytest.Item):
    def __init__(self, *, spec: BenchSpec, skip_reason: str, **kwargs):
        super().__init__(**kwargs)
        self.spec, self.skip_reason = spec, skip_reason
        # pytest-benchmark's --benchmark-skip and --benchmark-only select items by this attribute.
        self.fixturenames = ("benchmark",)

    def _record(self, rec: dict) -> None:
        from .plugin import record

        record(self.config, "benchmarks", self.spec.id, rec)

    def setup(self):
        if self.skip_reason:
            self._record(not_run_record(self.spec, self.skip_reason))
            pytest.skip(self.skip_reason)

    def runtest(self):
        from .hardware import detect
        from .plugin import _state

        outcome = run_benchmark(_state(self.config)["plan"], self.spec, detect().device)
        for name, timing in outcome.timings.items():
            store_in_pytest_benchmark(self, name, timing, outcome.record)
        self._record(outcome.record)
        if outcome.failures:
            raise BenchFailed("; ".join(f"{name}: {msg}" for name, msg in outcome.failures.items()))
        kernel = outcome.record["impls"]["kernel"]
        if "not_run" in kernel:
            pytest.skip(f"kernel {kernel['not_run']}; native vs compiled recorded ({outcome.record['timer']} timer)")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, BenchFailed):
            return f"benchmark {self.spec.id} failed: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}::{self.name}"


class _ReplayClock:
    """pytest-benchmark's timer for times measured on the device: each round advances it by one sample."""

    def __init__(self, timing: Timing):
        self.__name__ = timing.timer  # what pytest-benchmark stores as the timer's name
        self.now = 0.0
        self._samples = iter(timing.samples_us)

    def __call__(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += next(self._samples) * 1e-6


def store_in_pytest_benchmark(item: pytest.Item, impl: str, timing: Timing, rec: dict) -> None:
    """Hand one implementation's device samples to pytest-benchmark (storage, --benchmark-compare[-fail])."""
    session = getattr(item.config, "_benchmarksession", None)
    if session is None:  # pytest-benchmark not installed, or -p no:benchmark
        return
    from pytest_benchmark.fixture import BenchmarkFixture
    from pytest_benchmark.utils import NameWrapper

    clock = _ReplayClock(timing)
    fixture = BenchmarkFixture(item, add_stats=session.benchmarks.append, logger=session.logger, warner=item.warn,
                               disabled=session.disabled,
                               **{**session.options, "timer": NameWrapper(clock), "group": item.name})
    fixture.name = f"{item.name[:-1]}-{impl}]"
    fixture.fullname = f"{item.nodeid[:-1]}-{impl}]"
    figs = rec["impls"][impl]
    fixture.extra_info.update({"impl": impl, "timer": timing.timer, "calls_per_sample": timing.calls_per_sample,
                               "gbps": figs["gbps"], "pct_copy_bw": figs["pct_copy_bw"],
                               "launches": figs["launches"], "rotated_sets": rec["rotated_sets"]})
    fixture.pedantic(clock.advance, rounds=len(timing.samples_us), iterations=1)


class PytestBenchmarkMachineInfo:
    """Adds the GPU and the software stack to pytest-benchmark's machine_info, so saved runs from different
    GPUs are told apart (pytest-benchmark warns when a comparison's machine_info differs)."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(self, config, machine_info):
        from .hardware import provenance

        prov = provenance(config.rootpath)
        machine_info["harness"] = {k: prov[k] for k in ("sm", "gpu", "device_count", "torch", "triton", "cuda",
                                                        "vllm", "triton_interpreter")}
