"""Measuring one benchmark item (run_benchmark): each implementation is timed as harness.runtime.timing says
(device time, warm-up, cold L2 by rotating input sets, launches per call); then:

- Each implementation's outputs are checked against the reference after its timing loop: a wrong kernel
  fails the item; a baseline that differs keeps its timing and is reported as differing (`differs`). A
  baseline that raises (a reference that syncs the host cannot be captured in a CUDA graph) is not run
  there, with its error, and the item still times the others; the kernel raising fails the item.
- A named baseline whose package is not installed on this machine is recorded as not run, with why; so is one
  on a shape or dtype outside its contract (`{name: {path: ..., contract: {...}}}`). A shape outside the
  kernel's own contract (op.contract) is not timed at all.
- The record holds what was measured: each implementation's device-time samples summarised (median, q20, q80),
  its launches per call, and the terms of the call's physical bound measured in the same run (bytes and flops of
  the plan's models, copy and read bandwidth, matrix-multiply peak, launch floor). Throughput, bounds, speedups
  and broken timings are harness.decisions' (the item fails a kernel timed faster than its bound).

On a CPU machine the kernel runs in Triton's interpreter, whose speed says nothing: the kernel is not
timed there (the item is skipped with that reason), while native versus compiled is still timed with
the host clock (`timer: host`).

The item hands the kernel's device samples to pytest-benchmark (harness.plugin.session), which stores
and compares them (`--benchmark-autosave`, `--benchmark-compare`, `--benchmark-compare-fail`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy
import torch

from harness.runtime.calls import chain_text, first_line, reference_outputs
from harness.runtime.device import detect, memory_held_elsewhere
from harness.runtime.inputs import TORCH_DTYPES
from harness.runtime.numerics import Mismatch
from harness.runtime.resolve import resolve
from harness.plan.model import Plan
from harness.results.store import WRONG_AFTER_TIMING, BenchRecord, ImplFigures, steps_over
from harness.cells.matrix import step_allowance
from harness.runtime.runner import compare_judged, device_poisoned
from harness.runtime.tasks import BenchTask
from harness.runtime.timing import Timing, copy_bandwidth_gbps, count_launches, l2_cache_bytes, launch_floor_us, \
    read_bandwidth_gbps, rotation_count, tensor_peak_tflops, time_calls, working_set_bytes
from harness.runtime.bench.implementations import Prepared, implementations, input_sets, timed_functions
from harness.runtime.bench.models import bytes_moved, flops_done
from harness.runtime.bench.records import base_record
from harness.runtime.bench.specs import BenchSpec

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"bench recheck": 1}

CHECK_SEED = 20_251_101  # the seed of the inputs each implementation is checked on after its timing


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


def check(plan: Plan, spec: BenchSpec, call: Callable[[dict], dict], inputs: CheckInputs) -> tuple[str | None,
                                                                                                  float | None]:
    """The mismatch message (None: none) of one call on the item's fresh inputs, in the spec's graph mode,
    judged as a numerics cell judges it (the same tolerance and fp64 tie-break), and the largest fraction of a
    quantized output's elements one step from the reference (None: no quantized output). That fraction is not judged
    here: each implementation has its own allowance (its max_step_fraction), which the record's readers apply
    (harness.results.merge). The call already ran outside a capture (its timing loop compiled, autotuned and initialised
    it)."""
    values = inputs.fresh()
    run, arg = call.timed([values]) if isinstance(call, Prepared) else (call, [values])  # prepared outside a capture
    actual = _captured(run, arg[0]) if spec.graph_mode == "cuda_graph" else run(arg[0])
    measuring = plan.model_copy(update={"quantization": plan.quantization.model_copy(
        update={"max_step_fraction": 1.0})}) if plan.quantization.outputs else plan
    fractions = []
    try:
        for name in plan.op.outputs:
            fraction = compare_judged(measuring, resolve(plan).reference, spec.dtype, None, name, actual[name],
                                      inputs.expected[name], values, False)
            fractions += [] if fraction is None else [fraction]
    except Mismatch as exc:
        return f"{WRONG_AFTER_TIMING}: {exc}", None
    return None, max(fractions, default=None)


# ---------------------------------------------------------------- figures


def significant(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def figures(timing: Timing, launches: int | None) -> ImplFigures:
    return ImplFigures(
        median_us=round(timing.median_us, 3), q20_us=round(timing.q20_us, 3), q80_us=round(timing.q80_us, 3),
        launches=launches, samples=len(timing.samples_us),
        launch_us=round(float(numpy.median(timing.launch_samples_us)), 3) if timing.launch_samples_us else None)


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
    """The terms of the call's physical bound, measured in this run with the items' timers (on a GPU; a CPU machine
    times no kernel and records the byte and flop counts alone)."""
    rec.bytes, rec.flops = nbytes, flops
    if device != "cuda":
        return
    read_bw = read_bandwidth_gbps(device)
    rec.read_bw_gbps = significant(read_bw) if read_bw else None
    peak = tensor_peak_tflops(device, TORCH_DTYPES[rec.dtype]) if flops else None  # a flop model to set it against
    rec.peak_tflops = significant(peak) if peak else None
    rec.launch_floor_us = round(launch_floor_us(device, graph), 3)


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
    for name, call in implementations(plan, device, spec).items():
        if isinstance(call, str):
            rec.impls[name] = ImplFigures(not_run=call)
            continue
        timed_sets = sets
        try:
            # A prepared baseline's inputs are mapped before its timing loop (dequantized, prepacked), outside it.
            timed, timed_sets = call.timed(sets) if isinstance(call, Prepared) else (call, sets)
            timing = time_calls(timed, timed_sets, device, graph)
            # The reference eager on the check's inputs is what it is checked against: nothing to check there.
            mismatch, steps = check(plan, spec, call, inputs) if name != "native" or graph or plan.op.native \
                else (None, None)
        except Exception as exc:  # one implementation failing must not hide the others' figures
            elsewhere = memory_held_elsewhere(chain_text(exc))
            if elsewhere:  # this machine's memory, not the implementation's fault: not run here, said so
                rec.impls[name] = ImplFigures(not_run=elsewhere)
                continue
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
        if device == "cuda" and key not in _launches:
            run, first = call.timed(sets[:1]) if isinstance(call, Prepared) else (call, sets[:1])
            _launches[key] = count_launches(run, first[0])
        launches = _launches.get(key)
        rec.impls[name] = figures(timing, launches)
        rec.impls[name].step_fraction = steps
        rec.timer = timing.timer
        outcome.timings[name] = timing
        over = steps_over(steps, *step_allowance(plan, name)) if name == "kernel" else None
        if (mismatch or over) and name == "kernel":
            rec.impls[name].error = mismatch  # the fraction is the record's observation, judged where it is read
            outcome.failures[name] = mismatch or over
        elif mismatch:
            # A baseline is what a deployment runs instead (Inductor fuses away the reference's intermediate
            # roundings): its timing stands, and the report says where its outputs differ.
            rec.impls[name].differs = mismatch
    del sets, inputs
    if device == "cuda":
        torch.cuda.empty_cache()
    return outcome
