"""Benchmarks: per regime and GPU, is the kernel faster than what vLLM runs without it: its native code eager
("native": op.native, what vLLM runs without the custom op in the activation dtype, else the reference), the same
under torch.compile ("compiled", Inductor), vLLM's in-tree kernel ("vllm") and any other kernel the plan names
as a baseline (`benchmark.baselines: [{liger: liger_wrapper:rms_norm}]`, called like the kernel; with `prepare`,
its inputs mapped once per input set outside the timed region, e.g. weights dequantized for cuBLAS)?

One item per benchmark shape (the plan's benchmark token counts x its sizes) x dtype x graph mode on
this machine's SM, e.g. `bench[decode-bf16-eager-sm90-t64-hidden4096]`; a worker runs it as a `BenchTask`
(harness.runtime.tasks: the parsed plan and the shape). Each implementation is timed as
harness.runtime.timing says (device time, warm-up, cold L2 by rotating input sets, launches per call); then:

- Each implementation's outputs are checked against the reference after its timing loop: a wrong kernel
  fails the item; a baseline that differs keeps its timing and is reported as differing (`differs`). A
  baseline that raises (a reference that syncs the host cannot be captured in a CUDA graph) is not run
  there, with its error, and the item still times the others; the kernel raising fails the item.
- A named baseline whose package is not installed on this machine is recorded as not run, with why; so is one
  on a shape or dtype outside its contract (`{name: {path: ..., contract: {...}}}`). A shape outside the
  kernel's own contract (op.contract) is not timed at all.
- A speedup whose interval (q20/q80 bounds, widened by NOISE_FLOOR for run-to-run drift) spans 1.0
  is "no difference".
- Every figure is set against its physical bound, measured in the same run (harness.decisions.bounds): a kernel
  timed faster than it fails the item as a broken timing; a baseline timed faster than it is kept out of the
  speedups, with why.

On a CPU machine the kernel runs in Triton's interpreter, whose speed says nothing: the kernel is not
timed there (the item is skipped with that reason), while native versus compiled is still timed with
the host clock (`timer: host`).

The item hands the kernel's device samples to pytest-benchmark (harness.plugin.session), which stores
and compares them (`--benchmark-autosave`, `--benchmark-compare`, `--benchmark-compare-fail`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy
import torch

from harness.decisions.bounds import broken_timing, pct_of_bound, physical_bound
from harness.runtime.calls import first_line, kernel_outputs, reference_outputs
from harness.runtime.device import detect, inductor_settings, package_version
from harness.spec.expressions import evaluate
from harness.spec.hardware import Hardware
from harness.runtime.inputs import TORCH_DTYPES, Example, build_args, poison_value, sizes_fit
from harness.spec.matrix import Cell, bench_graph_modes, decide
from harness.runtime.numerics import Mismatch
from harness.runtime.resolve import named_baseline, resolve
from harness.spec.plan import Plan, PlanError
from harness.results.store import NOISE_FLOOR, WRONG_AFTER_TIMING, BenchRecord, ImplFigures, Speedup
from harness.runtime.runner import compare_judged, device_poisoned
from harness.runtime.tasks import BenchTask
from harness.runtime.timing import Timing, copy_bandwidth_gbps, count_launches, l2_cache_bytes, launch_floor_us, \
    read_bandwidth_gbps, rotation_count, tensor_peak_tflops, time_calls, working_set_bytes
from harness.runtime.timing_share import built_inputs, share_timing, shared_timing, timing_key
from harness.runtime.vllm_kernels import KernelUnavailable, load_kernel, vllm_kernel

IMPLS = ("kernel", "native", "compiled", "vllm")  # every record has these; named baselines follow them
CHECK_SEED = 20_251_101  # the seed of the inputs each implementation is checked on after its timing

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
    named: tuple[str, ...] = ()  # the plan's named baselines (not part of the id)

    @property
    def impls(self) -> tuple[str, ...]:
        """Every implementation a record of this shape holds: the kernel, the built-in baselines, the named ones."""
        return IMPLS + self.named

    @property
    def id(self) -> str:
        dims = "".join(f"-{name}{value}" for name, value in self.sizes)
        return f"{self.phase}-{self.dtype}-{self.graph_mode}-{self.sm}-t{self.num_tokens}{dims}"

    @property
    def sizes_dict(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def shape(self) -> tuple:
        """What the compiled reference specialises on: the shape's eager and CUDA-graph items share it."""
        return self.dtype, self.num_tokens, self.sizes

    def cell(self) -> Cell:
        return Cell(self.phase, self.dtype, 1, self.graph_mode, self.sm)


def bench_specs(plan: Plan, sm: str) -> list[BenchSpec]:
    """Every benchmark shape of the plan on one SM: phase token counts x sizes x dtype x graph mode. The sizes are
    the plan's benchmark.sizes, else every combination of op.sizes their constraints allow (not a rotary_dim above
    head_size)."""
    modes = bench_graph_modes(plan)
    names = list(plan.sizes)
    named = tuple(name for name, _ in plan.benchmark.named)
    specs = []
    combos = [tuple(v for _, v in combo) for combo in plan.benchmark.sizes] or [
        values for values in itertools.product(*(plan.sizes[s] for s in names))
        if sizes_fit(plan, dict(zip(names, values)))]
    for phase, counts in plan.benchmark.shapes().items():
        for n in counts:
            for values in combos:
                for dtype in plan.matrix["dtype"]:
                    for mode in modes:
                        specs.append(BenchSpec(phase, dtype, mode, sm, n, tuple(zip(names, values)), named))
    return specs


# ---------------------------------------------------------------- byte and flop models

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
    return TORCH_DTYPES[dtype].itemsize


def bytes_moved(plan: Plan, dtype: str, num_tokens: int, sizes: dict[str, int], returned_bytes: int = 0,
                values: dict | None = None) -> int:
    """Fewest bytes one call must move: the plan's benchmark.bytes, else every tensor argument of the call
    (`values`, as built) read once, outputs written once, mutated arguments read and written; `returned_bytes`
    for outputs the op returns."""
    if plan.benchmark.bytes:
        names = model_names(plan, dtype, num_tokens, sizes)
        return int(_model(plan, "benchmark.bytes", plan.benchmark.bytes, names))
    total = 0
    for arg in plan.tensor_args:
        t = (values or {}).get(arg.name)
        if t is None:
            continue
        nbytes = t.numel() * t.element_size()
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
        if plan.benchmark.bytes:
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


# ---------------------------------------------------------------- implementations


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


def outside_contract(plan: Plan, name: str, spec: BenchSpec) -> str:
    """Why a benchmark shape is outside the contract of the kernel or of a named baseline ("" when it is not):
    that one is not timed on it."""
    contract = plan.contract if name == "kernel" else plan.benchmark.contract(name)
    why = contract.outside(plan.args, spec.sizes_dict, spec.dtype) if contract else ""
    return f"outside {'the kernel' if name == 'kernel' else name}'s contract: {why}" if why else ""


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
        else:
            fn = vllm_kernel(plan)
            impls[name] = fn if isinstance(fn, str) else kernel_call(plan, fn)
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


# Processes that compile the benchmark shapes side by side before the first item is timed (precompile).
PRECOMPILE_PROCESSES = 8
PRECOMPILE_TIMEOUT_S = 300.0


def _precompile_shape(plan: Plan, spec: BenchSpec, device: str) -> str | None:
    """One shape's compiled reference and kernel, compiled and run once (in a precompile process). Returns what
    raised, in one line (None: it compiled): the exception itself need not pickle back to the pool's owner (on an
    H200, Dynamo's error for a raising reference held a module, and the pool reported only that)."""
    values = input_sets(plan, spec, device)[0]
    try:
        if "compiled" in plan.benchmark.baselines:
            reference_call(plan, compiled_reference(resolve(plan).native, spec.shape))(values)
        if device == "cuda" and not outside_contract(plan, "kernel", spec):  # the kernel is timed on GPUs only
            kernel_call(plan, load_kernel(plan))(values)
            torch.cuda.synchronize()
        return None
    except Exception as error:
        return first_line(error)
    finally:
        del values
        if device == "cuda":  # a process compiles many shapes: what one kept cached would starve the others
            torch.cuda.empty_cache()


def _compile_in(pool, tasks: list[tuple[Plan, BenchSpec]], device: str) -> tuple[list, bool]:
    """What each task raised, in one line (None: it compiled) in `pool`, in task order, and whether a shape hung (the
    pool's processes are then killed)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    outcome = lambda f: first_line(f.exception()) if f.exception() else f.result()  # raised: the process died
    futures = [pool.submit(_precompile_shape, plan, spec, device) for plan, spec in tasks]
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=PRECOMPILE_TIMEOUT_S, return_when=FIRST_COMPLETED)
        if not done:  # a kernel that hangs: the executor has no public way to end a running task
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.kill()
            return [outcome(f) if f.done() else "TimeoutError: still compiling" for f in futures], True
    return [outcome(f) for f in futures], False


def precompile(plan: Plan, specs: list[BenchSpec], device: str = "cuda",
               processes: int = PRECOMPILE_PROCESSES) -> str:
    """Compile every benchmark shape's reference under Inductor, and the kernel under Triton, in `processes`
    processes side by side before any item is timed, so that each item's own compilation finds Inductor's and
    Triton's on-disk caches warm. plan.yaml on an H200: its 84 shapes' compiles took 51 s of the items' 123 s one
    after another (8 s from warm caches); precompiled in 20.8 s, the run took 120 s against 128 s
    (docs/performance.md). Returns a line for the run's log."""
    return precompile_plans([(plan, specs)], device, processes)[0]


def precompile_plans(work: list[tuple[Plan, list[BenchSpec]]], device: str = "cuda",
                     processes: int = PRECOMPILE_PROCESSES) -> list[str]:
    """precompile for several plans in one pool (scripts/precompile.py, before a nightly's plans run one by one):
    the processes start and import once for all of them. One line per plan.

    Their autotuning shared the GPU, so the launch configurations Inductor's autotuner picked in them are deleted
    again: each item's first call still autotunes, alone on the GPU, as it would without this step. A shape that
    fails here, or that is still compiling when no shape has finished for PRECOMPILE_TIMEOUT_S, compiles in its own
    item, which reports any error. The processes are spawned (a CUDA context of their own each). Once all of a
    plan's shapes compiled, a stamp file in Inductor's cache (named by _compile_key) lets later runs of the same
    shapes skip the step."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    lines, todo = [""] * len(work), []
    for index, (plan, specs) in enumerate(work):
        shapes = list({spec.shape: spec for spec in specs}.values())
        stamp = Path(cache_dir()) / "harness-precompiled" / _compile_key(plan, [spec.shape for spec in shapes])
        if not shapes:
            lines[index] = "precompiled: nothing to compile"
        elif stamp.exists():
            lines[index] = (f"precompile skipped: an earlier run compiled these {len(shapes)} shapes into Inductor's "
                            f"cache ({stamp})")
        else:
            todo.append((index, plan, shapes, stamp))
    owners = [index for index, _, shapes, _ in todo for _ in shapes]  # the plan of each task, by its index in work
    tasks = [(plan, spec) for _, plan, shapes, _ in todo for spec in shapes]
    if not tasks:
        return lines
    start = time.time()
    processes = min(processes, len(tasks))
    # Each process compiles one kernel at a time: the parallelism is across shapes, not Inductor's own pool per process.
    saved = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    try:  # a spawning executor starts all its processes at the first submit, with this environment
        pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
        errors, hung = _compile_in(pool, tasks, device)
    finally:
        if saved is None:
            del os.environ["TORCHINDUCTOR_COMPILE_THREADS"]
        else:
            os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = saved
    # Shapes that failed side by side get one more try once the rest are done (on an H200, 9 of 45 paged-attention
    # shapes failed among 16 processes); a pool a crash broke takes nothing more.
    again = [i for i, error in enumerate(errors) if error is not None]
    if again and not hung:
        try:
            retried, hung = _compile_in(pool, [tasks[i] for i in again], device)
            for i, error in zip(again, retried):
                errors[i] = error
        except BrokenProcessPool:
            pass
    pool.shutdown(wait=True, cancel_futures=True)
    for path in Path(cache_dir()).rglob("*.best_config"):
        try:
            if path.stat().st_mtime >= start:
                path.unlink()
        except FileNotFoundError:  # another run sharing the cache removed it first
            pass
    seconds = time.time() - start
    for index, plan, shapes, stamp in todo:
        mine = [error for owner, error in zip(owners, errors) if owner == index]
        compiled = mine.count(None)
        lines[index] = f"precompiled {compiled} of {len(shapes)} shapes in {seconds:.1f} s ({processes} processes)"
        if compiled == len(shapes):
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(f"{plan.path}: {len(shapes)} shapes\n")
        else:
            lines[index] += f"; left to their items, the first failing with {next(filter(None, mine))}"
    return lines


def _compile_key(plan: Plan, shapes: list[tuple]) -> str:
    """What the compiled references depend on: the plan, the reference's source file, the shapes, the software, the
    GPU and Inductor's settings. The kernel is left out: a kernel being edited compiles in its items (seconds), while
    the unchanged references stay compiled (precompiling warm caches still costs 15-20 s of process starts)."""
    try:
        source = Path(inspect.getsourcefile(resolve(plan).native) or "").read_text()
    except (TypeError, OSError):  # a builtin, or no file
        source = ""
    digest = hashlib.sha256()
    for part in (plan.raw_text, source, repr(sorted(shapes)), torch.__version__,
                 package_version("triton"), detect().sm, detect().gpu, inductor_settings()):
        digest.update(f"{part}\0".encode())
    return digest.hexdigest()[:32]


def _captured(call: Callable[[dict], dict], values: dict) -> dict:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = call(values)
    graph.replay()
    torch.cuda.synchronize()
    return outs


@dataclass
class CheckInputs:
    """One item's fresh inputs (never timed on) and the reference's outputs on them, shared by its implementations."""
    values: dict
    expected: dict

    @classmethod
    def build(cls, plan: Plan, spec: BenchSpec, device: str) -> CheckInputs:
        values = input_sets(plan, spec, device, 1, seed=CHECK_SEED)[0]
        return cls(values, reference_outputs(plan, resolve(plan).reference, values))

    def fresh(self) -> dict:
        """A copy of the inputs for one implementation (kernels may write into them)."""
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.values.items()}


def check(plan: Plan, spec: BenchSpec, call: Callable[[dict], dict], inputs: CheckInputs,
          warmed: bool = True) -> str | None:
    """The mismatch message (None: none) of one call on the item's fresh inputs, in the spec's graph mode,
    judged as a numerics cell judges it (the same tolerance and fp64 tie-break). `warmed`: the call already ran
    outside a capture (its timing loop compiled, autotuned and initialised it), else it runs once before one."""
    if spec.graph_mode == "cuda_graph" and not warmed:  # its timing was another plan's (timing_share)
        run, arg = call.timed([inputs.fresh()]) if isinstance(call, Prepared) else (call, [inputs.fresh()])
        run(arg[0])
    values = inputs.fresh()
    run, arg = call.timed([values]) if isinstance(call, Prepared) else (call, [values])  # prepared outside a capture
    actual = _captured(run, arg[0]) if spec.graph_mode == "cuda_graph" else run(arg[0])
    try:
        for name in plan.outputs:
            compare_judged(plan, resolve(plan).reference, spec.dtype, None, name, actual[name],
                           inputs.expected[name], values, False)
    except Mismatch as exc:
        return f"{WRONG_AFTER_TIMING}: {exc}"
    return None


# ---------------------------------------------------------------- figures


def speedup(baseline: ImplFigures, kernel: ImplFigures, noise_floor: float = NOISE_FLOOR) -> Speedup:
    """Baseline time over kernel time (> 1: the kernel is faster), with an interval from the q20/q80 spreads.

    The interval is at least +-noise_floor around the value; a speedup whose interval spans 1.0 is
    "no difference".
    """
    value = baseline.median_us / kernel.median_us
    low = min(baseline.q20_us / kernel.q80_us, value / (1 + noise_floor))
    high = max(baseline.q80_us / kernel.q20_us, value * (1 + noise_floor))
    verdict = "faster" if low > 1 else "slower" if high < 1 else "no difference"
    return Speedup(round(value, 3), round(low, 3), round(high, 3), verdict)


def significant(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def figures(timing: Timing, nbytes: int, flops: float | None, copy_bw: float | None, launches,
            bound_us: float | None = None) -> ImplFigures:
    seconds = timing.median_us * 1e-6
    gbps = nbytes / seconds / 1e9
    pct = pct_of_bound(bound_us, timing.median_us)
    return ImplFigures(
        median_us=round(timing.median_us, 3), q20_us=round(timing.q20_us, 3), q80_us=round(timing.q80_us, 3),
        gbps=significant(gbps), pct_copy_bw=significant(100 * gbps / copy_bw) if copy_bw else None,
        tflops=significant(flops / seconds / 1e12) if flops is not None else None,
        launches=launches, samples=len(timing.samples_us),
        launch_us=round(float(numpy.median(timing.launch_samples_us)), 3) if timing.launch_samples_us else None,
        pct_of_bound=significant(pct) if pct is not None else None)


def base_record(spec: BenchSpec) -> BenchRecord:
    return BenchRecord(spec.phase, spec.dtype, spec.sm, spec.graph_mode, spec.num_tokens, spec.sizes_dict)


def not_run_record(spec: BenchSpec, reason: str) -> BenchRecord:
    """The record of an item this machine does not run: every implementation and speedup says why."""
    rec = base_record(spec)
    rec.impls = {name: ImplFigures(not_run=reason) for name in spec.impls}
    rec.speedup = {name: Speedup(not_run=reason) for name in spec.impls[1:]}
    return rec


@dataclass
class BenchOutcome:
    record: BenchRecord
    timings: dict[str, Timing] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    fatal: bool = False  # the device context is unusable: the worker is replaced


# Launches per call, per (plan, implementation, shape): the same in both graph modes, so counted once.
_launches: dict[tuple, int | None] = {}


def prepare_benchmarks(plan: Plan) -> None:
    """What a benchmark process loads before its first item, while other work goes on (Worker.start): the CUDA
    context, the kernel's module, vLLM's ops library (about 7 s on an H200 machine) and torch.compile's."""
    implementations(plan, detect().device)


def measure_bounds(rec: BenchRecord, device: str, graph: bool, nbytes: int, flops: float | None) -> None:
    """The record's physical bound, measured in this run with the items' timers (on a GPU; a CPU machine times no
    kernel and records the byte and flop counts alone)."""
    rec.bytes, rec.flops = nbytes, flops
    if device != "cuda":
        return
    read_bw = read_bandwidth_gbps(device)
    rec.read_bw_gbps = significant(read_bw) if read_bw else None
    peak = tensor_peak_tflops(device, TORCH_DTYPES[rec.dtype]) if flops else None  # a flop model to set it against
    rec.peak_tflops = significant(peak) if peak else None
    rec.launch_floor_us = round(launch_floor_us(device, graph), 3)
    bound_us, rec.bound = physical_bound(nbytes, rec.copy_bw_gbps, flops, rec.peak_tflops, rec.launch_floor_us)
    rec.bound_us = round(bound_us, 3) if bound_us is not None else None


def run_benchmark(task: BenchTask) -> BenchOutcome:
    """Time every implementation of one benchmark item and check its result; returns the results record."""
    plan, spec, device = task.plan, task.spec, detect().device
    graph = spec.graph_mode == "cuda_graph"
    sizes = spec.sizes_dict
    copy_bw = copy_bandwidth_gbps(device)
    l2 = l2_cache_bytes(device)
    inputs = CheckInputs.build(plan, spec, device)
    working_set = working_set_bytes(inputs.values)
    sets = input_sets(plan, spec, device, rotation_count(working_set, l2))
    rec = base_record(spec)
    rec.copy_bw_gbps, rec.l2_bytes, rec.working_set_bytes, rec.rotated_sets = \
        significant(copy_bw), l2, working_set, len(sets)
    rec.timed_functions = timed_functions(plan)
    outcome = BenchOutcome(rec)
    flops = flops_done(plan, spec.dtype, spec.num_tokens, sizes)
    returned = sum(t.numel() * t.element_size() for k, t in inputs.expected.items() if not plan.has_arg(k))
    nbytes = bytes_moved(plan, spec.dtype, spec.num_tokens, sizes, returned, sets[0])
    measure_bounds(rec, device, graph, nbytes, flops)
    built = built_inputs(sets)  # None unless this run shares timings between plans
    for name, call in implementations(plan, device, spec).items():
        if isinstance(call, str):
            rec.impls[name] = ImplFigures(not_run=call)
            continue
        timed_sets = sets
        shared_key = timing_key(plan, name, spec.graph_mode, built, len(sets))
        shared = shared_timing(shared_key)
        try:
            # A prepared baseline's inputs are mapped before its timing loop (dequantized, prepacked), outside it.
            if shared:
                timing = shared.timing
            else:
                timed, timed_sets = call.timed(sets) if isinstance(call, Prepared) else (call, sets)
                timing = time_calls(timed, timed_sets, device, graph)
            # The reference eager on the check's inputs is what it is checked against: nothing to check there.
            mismatch = check(plan, spec, call, inputs, warmed=not shared) \
                if name != "native" or graph or plan.native else None
        except Exception as exc:  # one implementation failing must not hide the others' figures
            message = first_line(exc)
            outcome.fatal = outcome.fatal or device_poisoned(message, device)
            if name == "kernel" or outcome.fatal:
                rec.impls[name] = ImplFigures(error=message)
                outcome.failures[name] = message
            else:  # a baseline that cannot run in this mode (e.g. a reference that syncs the host under capture)
                rec.impls[name] = ImplFigures(not_run=f"raised {message}")
            continue
        finally:
            del timed_sets
        key = (str(plan.path), name, spec.phase, spec.dtype, spec.num_tokens, spec.sizes)
        if shared:
            _launches[key] = shared.launches
        elif device == "cuda" and key not in _launches:
            run, first = call.timed(sets[:1]) if isinstance(call, Prepared) else (call, sets[:1])
            _launches[key] = count_launches(run, first[0])
        launches = _launches.get(key)
        rec.impls[name] = figures(timing, nbytes, flops, copy_bw, launches, rec.bound_us)
        if shared:
            rec.impls[name].timed_in = shared.origin
        else:
            share_timing(shared_key, timing, launches, f"{plan.name} {spec.id} {name}")
        rec.timer = timing.timer
        outcome.timings[name] = timing
        too_fast = broken_timing(rec, rec.impls[name])
        if (mismatch or too_fast) and name == "kernel":
            rec.impls[name].error = too_fast or mismatch
            outcome.failures[name] = too_fast or mismatch
        elif mismatch:
            # A baseline is what a deployment runs instead (Inductor fuses away the reference's intermediate
            # roundings): its timing stands, and the report says where its outputs differ.
            rec.impls[name].differs = mismatch
        if too_fast and name != "kernel":  # a figure no hardware allows says nothing about the baseline's speed
            rec.impls[name].broken = too_fast
    kernel = rec.impls["kernel"]
    for name in [n for n in rec.impls if n != "kernel"]:  # every baseline, named ones included
        base = rec.impls[name]
        if kernel.timed and base.timed and not base.broken:
            rec.speedup[name] = speedup(base, kernel)
        else:
            why = kernel.not_run or kernel.error or base.not_run or base.error or base.broken
            rec.speedup[name] = Speedup(not_run=f"{'kernel' if not kernel.timed else name}: {why}")
    del sets, inputs
    if device == "cuda":
        torch.cuda.empty_cache()
    return outcome


def skip_reason(plan: Plan, spec: BenchSpec, hw: Hardware, max_cpu_ranks: int = 4) -> str:
    """Why this machine does not time this spec ("" if it does)."""
    if spec.sm not in plan.matrix["sm"]:
        return f"the plan's matrix.sm does not list {spec.sm}"
    decision = decide(plan, spec.cell(), hw, max_cpu_ranks)
    if decision.expects_failure:
        return f"not timed: {decision.reason}"
    if not decision.runs:
        return decision.reason
    return outside_contract(plan, "kernel", spec)  # nothing to decide where the kernel cannot run
