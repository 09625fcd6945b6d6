"""What the items of one plan's run share (a Session, kept in pytest's config stash), the GPU turn benchmark runs
take one after another, and the memcheck runs started as soon as collection ends."""

from __future__ import annotations

import fcntl
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.decisions.verdicts import SmVerdict
from harness.plugin.progress import Progress
from harness.results.store import Recorder
from harness.runtime.memcheck import run_memcheck, sanitizer
from harness.runtime.runner import RunSettings
from harness.runtime.workers import Worker, WorkerGroup
from harness.cells.matrix import Cell, provider_view
from harness.plan.model import Plan


@dataclass
class Session:
    """What the items of one run share."""

    plan: Plan
    plan_path: Path
    profile: str
    examples: int
    op_dir: Path
    isolation: str
    max_cpu_ranks: int
    database: str
    cells: str = "all"  # all | sampled | retry | stale (--cells)
    bench: bool = False  # benchmark items collected: --bench, or --cells stale on a GPU
    recorder: Recorder | None = None
    workers: dict = field(default_factory=dict)  # "kernels" / "vllm" -> Worker; tp size -> WorkerGroup
    memchecks: dict[str, Future] = field(default_factory=dict)  # cell id -> its memcheck run, started early
    memcheck_pool: ThreadPoolExecutor | None = None
    # (phase, tp) -> the examples earlier cells' faults shrank to: a later cell's fault is often the same one
    fault_minimals: dict[tuple, list] = field(default_factory=dict)
    precompiled: str = ""  # precompile's line, once the first benchmark item has run it
    gpu_turn: object = None  # the open lock file while this run holds the GPU (HARNESS_GPU_TURN)
    report_path: Path | None = None
    report_problems: list = field(default_factory=list)
    verdict: str = ""  # the report's verdict line, and per SM
    verdicts: list[SmVerdict] = field(default_factory=list)
    stale: str = ""  # how many records could now come out differently, said at the end (Merged.stale_summary)
    plan_warnings: list[str] = field(default_factory=list)  # file:line: what the plan leaves idle, said at the end
    # Whether the kernel killed its worker in every numerics cell so far, and per vLLM route the first item whose
    # worker it killed: such a kernel's later items of that route are not run (each would cost a worker and vLLM's
    # import, to crash again), so a plan whose kernel faults everywhere costs about what a passing one does.
    cells_killed: int = 0
    cells_survived: int = 0
    route_faults: dict[str, str] = field(default_factory=dict)
    # The cells deselected when collection ended, as (cell, status, reason): not run here, excluded, sampled out.
    left_out: list[tuple[Cell, str, str]] = field(default_factory=list)
    progress: Progress | None = None  # the numerics cells' elapsed time and estimate (harness.plugin.progress)
    # --replay: the cell whose saved failure this run checks again, that failure (harness.plugin.replay) and its
    # example; what the replay said, for the terminal summary. A replay records nothing.
    replay: str = ""
    replay_data: dict | None = None
    replay_example: object = None
    replay_said: str = ""
    # The --reports-dir given on the command line, as a reproduce command repeats it ("" for the default)
    reports_option: str = ""

    def run_settings(self, examples: int | None = None) -> RunSettings:
        return RunSettings(examples=examples or self.examples, profile=self.profile, database=self.database)

    def worker(self, key) -> Worker | WorkerGroup:
        if key not in self.workers:
            self.workers[key] = WorkerGroup(key) if isinstance(key, int) else Worker()
        return self.workers[key]

    def record(self, section: str, key: str, rec, defer: bool = False) -> None:
        if self.replay:  # one example checked again is not a run of the cell: its record stays as it was
            return
        rec.finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.recorder.record(section, key, rec, defer)

    def stop_workers(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        if self.memcheck_pool:  # memcheck runs not started yet are dropped; running ones end by their time limit
            self.memcheck_pool.shutdown(wait=False, cancel_futures=True)


SESSION_KEY = pytest.StashKey[Session]()

# A lock file the benchmark runs of several plans take turns on (scripts/gpu_run.sh bench starts the next plan while
# one is timed): a run holds it from its first benchmark item to its last record, so no other process times on the
# GPU meanwhile, while the next run's start (interpreter, collection, its timing process's CUDA context and vLLM's
# library) and the last run's report overlap the timed items. Unset: a run times whenever it gets there.
GPU_TURN_ENV = "HARNESS_GPU_TURN"


def take_gpu_turn(s: Session) -> None:
    path = os.environ.get(GPU_TURN_ENV)
    if path and s.gpu_turn is None:
        s.gpu_turn = open(path, "a")  # released when closed, or when the process ends in any way
        fcntl.flock(s.gpu_turn, fcntl.LOCK_EX)


def session_of(config) -> Session:
    return config.stash[SESSION_KEY]


def xdist_worker(config) -> str | None:
    """This process's xdist worker id (not the environment variable: a pytest started from a worker inherits it)."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else None


# Memcheck runs side by side with the other cells: each is a process of its own under compute-sanitizer, which
# spends most of its time starting up and instrumenting, so they overlap well with each other and with the worker.
MEMCHECK_PARALLEL = 3


def memcheck_args(s: Session, cell: Cell) -> tuple[Plan, Cell, float]:
    return provider_view(s.plan, cell.provider), cell, 10 * s.plan.numerics.timeout_s


def start_memchecks(s: Session, items: list) -> None:
    """Start the run's memcheck cells when collection ends; each memcheck item then waits for its own result."""
    todo = [i.cell for i in items if i.cell.graph_mode == "memcheck"]
    if not todo or sanitizer() is None:  # without the tool each item reports that itself, at once
        return
    s.memcheck_pool = ThreadPoolExecutor(max_workers=min(len(todo), MEMCHECK_PARALLEL))
    for cell in todo:
        s.memchecks[cell.id] = s.memcheck_pool.submit(run_memcheck, *memcheck_args(s, cell))
