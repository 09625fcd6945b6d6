"""Timing one call on a device: calibrated CUDA-event and CUDA-graph timers, cold L2 by rotating input sets,
the copy bandwidth GB/s are measured against, and launches per call (harness.runtime.bench times its items
with these; scripts/ time kernel variants with them).

- Device time only. `eager`: CUDA events around each plain call; before each batch of calls the GPU
  is parked on a short sleep kernel so the host queues the whole batch ahead of it, so host launch
  overhead stays out of the figure ("back-to-back"). Eager items also time isolated calls (LAUNCH_SAMPLES)
  on an idle GPU, from an event to the call's end, the host's launch cost included ("launch-inclusive":
  what a host-bound eager decode step sees); the report shows both where they differ by over 3%.
  `cuda_graph`: K calls captured in one graph, replays timed with events, each sample is replay time / K
  (how vLLM runs decode batches).
- Warm-up before timing (compilation, autotuning, graph upload), then a median and q20/q80 over
  samples worth about TARGET_MS of device time (GRAPH_TARGET_MS of graph replays).
- Cold L2: when one call's tensors are smaller than twice the L2 cache, enough input sets are built
  that their total exceeds 2x L2, and calls rotate over them (`rotated_sets` in the results), up to
  MAX_ROTATED_SETS: a call smaller than 2x L2 / MAX_ROTATED_SETS (about 120 KB on an H200: decode sizes)
  finds part of its data in L2, as in a decode step, whose input the previous op has just written.
- Launches per call: the device operations (kernels, memsets, copies) in a CUDA graph capturing one call.
- The bounds every figure is set against, measured once per run with the same timers: the copy bandwidth (one
  large device-to-device copy; beside it the read bandwidth, one large tensor read, which a read-heavy call can
  reach), the dense matrix-multiply peak of each dtype (one large cuBLAS GEMM) and the
  launch floor (an empty kernel, in each graph mode).
- On a CPU machine: the host clock (`timer: host`).

triton.testing.do_bench is not used because it starts every call from an L2 flushed by a 256 MB memset
(colder than a decode step, which finds part of its input in L2), times a callable of no arguments
rather than calls rotating over input sets or replays of a captured graph of them, and has neither the
launch-inclusive samples nor a host clock for CPU machines; scripts/bench_trust_check.py compares its
figures with these on a GPU.
"""

from __future__ import annotations

import itertools
import math
import re
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy
import torch

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"timing": 1}

# Device time spent on timed samples per implementation, and on warm-up. triton.testing.do_bench spends 100 and
# 25 ms; the intervals come from the q20/q80 spread, which 100+ samples estimate as well as 1000 do (on an H200
# the intervals' median width stayed 4.0-4.2%, and plan.yaml's 168 items took 128 s against 200 s:
# docs/performance.md). Fewer moved the figures of large calls, not only the widths: 3 ms of warm-up, or eager
# timings stopped after 20 calls once their spread was inside the noise floor, put the kernel's eager time at
# 32768 x 8192 about 11% above what this budget measures (docs/performance.md, "Tried and not adopted").
TARGET_MS, WARMUP_MS = 30.0, 10.0
EAGER_SAMPLES = (100, 400)  # (fewest, most) timed calls
# A slow call (a prefill-sized fp32 GEMM of 17 ms on an H200) needs no 100 samples: its clocks are up after the
# first and its spread is a fraction of a percent. Its fewest timed calls are those worth SLOW_CALL_MS of device
# time, at least SLOW_CALL_SAMPLES, so calls under SLOW_CALL_MS / 100 (3 ms) keep the 100.
SLOW_CALL_MS, SLOW_CALL_SAMPLES = 300.0, 5
# A call this long or longer is sized from one run (a shorter one from ESTIMATE_RUNS, since one says little); one
# longer than WARMUP_MS is warm after that run. Paged attention's 140 ms fp32 chunked-prefill baselines took 20
# calls an eager timing, 10 of them samples, where 8 do now.
LONG_CALL_MS, ESTIMATE_RUNS = 1.0, 5
GRAPH_SAMPLES = (5, 100)  # (fewest, most) timed replays; each is the mean of many calls
# Replays get half the eager budget: each is the mean of at least GRAPH_REPLAY_MS of calls, so their q20/q80
# spread sat inside the noise floor at every one of plan.yaml's 252 CUDA-graph speedups on an H200, where the
# floor, not the sample count, sets an interval's width.
GRAPH_TARGET_MS = TARGET_MS / 2
# Input sets a call rotates over at most. A CUDA graph holds one call per set; 10 000 sets of a one-token
# RMSNorm made each decode item capture and replay 60 000 nodes per baseline, several seconds an item.
MAX_ROTATED_SETS = 1024
# Isolated eager calls, launch cost included (ImplFigures.launch_us): about LAUNCH_MS of device time, within
# (fewest, most). Where a call's device time dwarfs its launch cost the two figures agree within a few samples.
LAUNCH_MS, LAUNCH_SAMPLES = 5.0, (10, 50)
# A captured graph holds at least this much work (and every rotated set), so replay launch costs amortise.
GRAPH_REPLAY_MS = 2.0
# Calls queued behind one sleep kernel; well under CUDA's launch queue (about 1000 entries).
HOST_AHEAD_BATCH = 64
# Batches queued again, with a sleep sized to what the host really took, where the host fell behind the GPU.
AHEAD_RETRIES = 8
# On a CPU machine (host clock, native vs compiled only).
CPU_TARGET_MS, CPU_SAMPLES = 300.0, (5, 200)


# ---------------------------------------------------------------- cold L2


def working_set_bytes(values: dict) -> int:
    return sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor))


def rotation_count(working_set: int, l2_bytes: int | None) -> int:
    """Input sets whose total exceeds 2x L2, so every timed call starts with its data out of the cache."""
    if not l2_bytes:
        return 1
    return min(2 * l2_bytes // max(working_set, 1) + 1, MAX_ROTATED_SETS)


def l2_cache_bytes(device: str) -> int | None:
    return torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else None


# ---------------------------------------------------------------- timing


@dataclass
class Timing:
    samples_us: list[float]
    timer: str  # cuda_events | cuda_graph_replay | host
    calls_per_sample: int = 1
    launch_samples_us: list[float] = field(default_factory=list)  # eager only: isolated, launch-inclusive calls

    def quantile(self, q: float) -> float:
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
    """Device µs of `count` runs, each between two events; the GPU sleeps while the host queues each batch.

    A batch the host took longer to queue than the GPU had work for (the sleep and the calls queued before the
    last) is timed again with a longer sleep (at most AHEAD_RETRIES times): the GPU may have run out of queued
    calls, and its later samples then hold launch gaps (on an H200, 5 µs vLLM kernels whose q80 read 30-50 µs,
    which turned 4-7x speedups into "no difference")."""
    samples = []
    # One batch's events, recorded again in every batch (each batch ends in a synchronize).
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(min(HOST_AHEAD_BATCH, count))]
    retries = 0
    while len(samples) < count:
        events = pairs[: count - len(samples)]
        sleep_s = min(1.5 * len(events) * host_s_per_run + 20e-6, 0.5)
        torch.cuda._sleep(int(sleep_s * _sleep_cycles_per_second()))
        queued = time.perf_counter()
        for start, end in events:
            start.record()
            run()
            end.record()
        queued = time.perf_counter() - queued
        torch.cuda.synchronize()
        batch = [start.elapsed_time(end) * 1e3 for start, end in events]
        # The GPU had the sleep and every call but the last to run while the host queued (each at least the
        # fastest sample long): a host slower than that may have left it idle between calls.
        if queued > sleep_s + (len(batch) - 1) * min(batch) * 1e-6 and sleep_s < 0.5 and retries < AHEAD_RETRIES:
            retries += 1
            host_s_per_run = queued / len(events)  # the events' own recording included
            continue
        samples += batch
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


def _sized(run: Callable[[], object]) -> tuple[float, float]:
    """(device ms, host seconds) per run: from one run for a long call, else from ESTIMATE_RUNS."""
    estimate_ms, host_s = _estimate(run, 1)
    return (estimate_ms, host_s) if estimate_ms >= LONG_CALL_MS else _estimate(run, ESTIMATE_RUNS)


def _warm_up(run: Callable[[], object], estimate_ms: float, most: int) -> None:
    """About WARMUP_MS of device time in runs before the samples; a call as long as that was warmed up by the run
    that sized it."""
    if estimate_ms < WARMUP_MS:
        for _ in range(_clamp(WARMUP_MS / estimate_ms, (1, most))):
            run()


def _time_eager(call, sets) -> Timing:
    rotation = itertools.cycle(sets)

    def run():
        call(next(rotation))

    run()  # compilation, autotuning, lazy initialisation
    torch.cuda.synchronize()
    estimate_ms, host_s = _sized(run)
    _warm_up(run, estimate_ms, 10_000)
    fewest = max(SLOW_CALL_SAMPLES, min(EAGER_SAMPLES[0], math.ceil(SLOW_CALL_MS / estimate_ms)))
    samples = _events_host_ahead(run, _clamp(TARGET_MS / estimate_ms, (fewest, EAGER_SAMPLES[1])), host_s)
    # A call of a millisecond or more is hundreds of times its launch cost: 3 isolated calls show that, and one
    # shows it for a call as long as the whole warm-up.
    fewest = LAUNCH_SAMPLES[0] if estimate_ms < LONG_CALL_MS else 3 if estimate_ms < WARMUP_MS else 1
    launches = _isolated_calls(run, _clamp(LAUNCH_MS / estimate_ms, (fewest, LAUNCH_SAMPLES[1])))
    return Timing(samples, "cuda_events", launch_samples_us=launches)


def _isolated_calls(run: Callable[[], object], count: int) -> list[float]:
    """Device µs from an event recorded on an idle GPU to the end of one call: the host's launch cost included."""
    samples = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(count):
        torch.cuda.synchronize()
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return samples


def _time_graph(call, sets) -> Timing:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and initialise outside the capture, as torch.cuda.graph asks
        for values in sets[:3]:
            call(values)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    rotation = itertools.cycle(sets)
    eager_ms, _ = _sized(lambda: call(next(rotation)))
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
    estimate_ms, host_s = _estimate(graph.replay, 1)
    _warm_up(graph.replay, estimate_ms, 100)
    replays = _events_host_ahead(graph.replay, _clamp(GRAPH_TARGET_MS / estimate_ms, GRAPH_SAMPLES), host_s)
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


triton = tl = None  # imported on first use: a CPU machine switches Triton's interpreter on before triton loads


@lru_cache(maxsize=1)
def _read_kernel():
    """A Triton kernel that reads a tensor and writes one float per program: the bytes it moves are reads."""
    global triton, tl
    import triton as _triton
    import triton.language as _tl

    triton, tl = _triton, _tl

    @triton.jit
    def read_and_sum(src, partial_sums, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        start = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(STEPS):
            offsets = start + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(src + offsets, mask=offsets < n, other=0.0)
        tl.store(partial_sums + tl.program_id(0), tl.sum(acc))

    return read_and_sum


@lru_cache(maxsize=None)
def read_bandwidth_gbps(device: str) -> float | None:
    """This machine's measured read bandwidth over one large tensor read and summed (a float written per 128 KiB
    read), once per run: a call that mostly reads moves its bytes faster than a copy, which writes as much as it
    reads (harness.decisions.bounds). None off CUDA, or where the probe does not run (its record then falls back
    to the copy bandwidth)."""
    if device != "cuda":
        return None
    n, block, steps = (1 << 30) // 4, 4096, 8  # 128 KiB of fp32 read per program
    try:
        read_and_sum = _read_kernel()
        src = torch.ones(n, dtype=torch.float32, device=device)
        sums = torch.empty(-(-n // (block * steps)), dtype=torch.float32, device=device)
        grid = (sums.numel(),)
        timing = time_calls(lambda v: read_and_sum[grid](v["src"], v["sums"], n, BLOCK=block, STEPS=steps,
                                                         num_warps=8), [{"src": src, "sums": sums}], device)
        if float(sums.sum()) != n:  # it read every element
            return None
    except Exception:  # the bound then rests on the copy bandwidth alone
        return None
    return 4 * n / (timing.median_us * 1e-6) / 1e9


# The dense GEMM a dtype's peak is measured on: large enough that cuBLAS runs at its peak on an H200.
PEAK_GEMM_SIZE = 8192


@lru_cache(maxsize=None)
def tensor_peak_tflops(device: str, dtype: torch.dtype) -> float | None:
    """This machine's measured dense matrix-multiply peak in `dtype` (TFLOP/s), over one large cuBLAS GEMM timed
    like the items, once per run: tensor cores for 16-bit dtypes; fp32 with TF32 off, its CUDA-core peak. None off
    CUDA (a CPU machine times no kernel) and for dtypes cuBLAS has no GEMM for."""
    if device != "cuda" or not dtype.is_floating_point or dtype.itemsize > 4:
        return None
    n = PEAK_GEMM_SIZE
    # Zeros, and the fastest sample: a GEMM's clocks depend on its data (random operands switch more bits and draw
    # more power), and on an H200 cuBLAS on dequantized int8 weights ran 13% above the median of a randn GEMM, so a
    # bound from random data is no bound.
    a = torch.zeros(n, n, device=device, dtype=dtype)
    b = torch.zeros(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as fp32: a TF32 peak would make fp32 kernels look slow
    try:
        timing = time_calls(lambda v: torch.mm(v["a"], v["b"], out=v["out"]), [{"a": a, "b": b, "out": out}], device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    del a, b, out
    return 2 * n ** 3 / (min(timing.samples_us) * 1e-6) / 1e12


@lru_cache(maxsize=None)
def launch_floor_us(device: str, graph: bool) -> float | None:
    """The device time of an empty kernel (one element incremented) under the items' timer, once per run and graph
    mode: no call that launches a kernel is faster. None off CUDA."""
    if device != "cuda":
        return None
    one = torch.zeros(1, device=device)
    return time_calls(lambda v: v["one"].add_(1), [{"one": one}], device, graph).median_us


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
