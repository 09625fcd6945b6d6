"""What a worker is handed: a task holding the parsed plan and what to run of it.

The pytest process loads and validates the plan once (harness.plugin.session); every call into a
worker (harness.runtime.workers), a rank of a tensor-parallel group, a precompile process or the
process under compute-sanitizer gets a task that carries the `Plan` itself, pickled over the
worker's pipe (or, for a process started with a command line, in a file: `write_task`/`read_task`).
So no worker reads the plan file again, and every one of them runs on the plan the run was started
with, even when the file is edited meanwhile. `CellTask.load` reads a plan file and a cell id as a
person types them (tests, scripts), the one place here that parses either.

The tasks need only that a `Plan` pickles: here it is frozen dataclasses of strings, numbers, tuples,
dicts and a Path, pickled as is (tests/test_tasks.py checks every bundled plan round-trips equal).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from pathlib import Path

from harness.cells.matrix import Cell, provider_view
from harness.plan.load import load_plan
from harness.plan.model import Plan
from harness.runtime.bench.specs import BenchSpec
from harness.runtime.inputs import Example


@dataclass(frozen=True)
class RunSettings:
    """How many hypothesis examples a cell draws, under which profile, with which example database."""

    examples: int
    profile: str = "dev"  # dev | ci | nightly
    database: str | None = ".hypothesis/examples"


@dataclass(frozen=True)
class CellTask:
    """One numerics cell: its examples drawn and checked (harness.runtime.runner.run_cell, tp.run_cell_on_rank,
    memcheck). `replay`: check this one example instead of drawing any (replaying a fault on a smaller input)."""

    plan: Plan
    cell: Cell
    run: RunSettings
    replay: Example | None = None
    fault_replay: bool = False  # the replay confirms a crash of `replay`'s own call (no check's calls at other sizes)

    def replaying(self, example: Example) -> CellTask:
        """The same cell, checking only `example` (harness.runtime.shrinking.Replays)."""
        return replace(self, replay=example, fault_replay=True)

    @classmethod
    def load(cls, plan_path: str | Path, cell_id: str, run: RunSettings) -> CellTask:
        """A cell named as a person names it: a plan file and a cell id (`decode-bf16-tp1-eager-cpu`, or a provider's
        `decode-bf16-tp1-eager-cpu-vllm`), the plan as that cell runs it."""
        cell = Cell.from_id(cell_id)
        return cls(provider_view(load_plan(plan_path), cell.provider), cell, run)


@dataclass(frozen=True)
class BenchTask:
    """One benchmark item: every implementation timed on one shape (harness.runtime.bench.measure.run_benchmark)."""

    plan: Plan
    spec: BenchSpec


@dataclass(frozen=True)
class IntegrationTask:
    """One vLLM integration item: the kernel registered through `route`, vLLM's layer called on drawn inputs
    (harness.vllm.routes.run_integration_item)."""

    plan: Plan
    cell: Cell
    route: str
    run: RunSettings


def write_task(task: object, path: str | Path) -> None:
    """A task for a process started with a command line (the cell under compute-sanitizer): pickled to `path`."""
    Path(path).write_bytes(pickle.dumps(task))


def read_task(path: str | Path) -> object:
    """The task `write_task` left at `path` (written by this run's own pytest process, so trusted as pickle)."""
    return pickle.loads(Path(path).read_bytes())
