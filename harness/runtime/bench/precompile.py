"""Precompiling: every benchmark shape's compiled reference (Inductor) and kernel (Triton) compiled in a pool of
spawned processes side by side before the first item is timed, so that each item's own compilation finds the
on-disk caches warm; a stamp file per plan and shapes (_compile_key) lets a later run skip the step.
"""

from __future__ import annotations

import hashlib
import inspect
import multiprocessing
import os
import time
from pathlib import Path

import torch

from harness.runtime.calls import first_line
from harness.runtime.device import detect, inductor_settings, package_version
from harness.runtime.resolve import resolve
from harness.plan.model import Plan
from harness.plan.implementations import COMPILED
from harness.runtime.implementations import compiled_reference, load_implementation
from harness.runtime.bench.implementations import input_sets, kernel_call, reference_call
from harness.runtime.bench.specs import BenchSpec, outside_contract


# Processes that compile the benchmark shapes side by side before the first item is timed (precompile).
PRECOMPILE_PROCESSES = 8
PRECOMPILE_TIMEOUT_S = 300.0


def _precompile_shape(plan: Plan, spec: BenchSpec, device: str) -> str | None:
    """One shape's compiled reference and kernel, compiled and run once (in a precompile process). Returns what
    raised, in one line (None: it compiled): the exception itself need not pickle back to the pool's owner (on an
    H200, Dynamo's error for a raising reference held a module, and the pool reported only that)."""
    values = input_sets(plan, spec, device)[0]
    try:
        if COMPILED in plan.baselines:
            reference_call(plan, compiled_reference(resolve(plan).native, spec.shape))(values)
        if device == "cuda" and not outside_contract(plan, "kernel", spec):  # the kernel is timed on GPUs only
            kernel_call(plan, load_implementation(plan))(values)
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
    for part in (plan.source.text, source, repr(sorted(shapes)), torch.__version__,
                 package_version("triton"), detect().sm, detect().gpu, inductor_settings()):
        digest.update(f"{part}\0".encode())
    return digest.hexdigest()[:32]
