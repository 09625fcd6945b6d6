"""Progress of a run's numerics cells in pytest's terminal: elapsed time and an estimate of what is left.

A numerics cell on a CPU machine takes seconds (a norm) to minutes (attention, a failing kernel's shrinking) in
Triton's interpreter, and pytest's own progress is a count of items, so a long run showed no sign of how long it
had left. Each finished cell's duration feeds an estimate for the cells still to run: the mean of the finished
cells of the same provider, graph mode and TP size (a tp2 cell runs two ranks, a torch_compile cell compiles),
else of the same provider, else of all; under xdist divided by the number of workers. Shown in `-v`'s line of each
cell, and at the default verbosity as a line of its own at most every PROGRESS_EVERY_S seconds; never with `-q`.
"""

from __future__ import annotations

import re
import time
from statistics import fmean

import pytest

from harness.plugin.summary import SUMMARY_STATUSES
from harness.cells.matrix import Cell

PROGRESS_EVERY_S = 30.0  # the default verbosity's progress lines: at most one per this many seconds


def duration(seconds: float) -> str:
    """`41.2 s`, `2m05s`, `1h02m`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


class Progress:
    """The numerics cells this run will run, those finished with their durations, and an estimate for the rest."""

    def __init__(self, started: float | None = None, parallel: int = 1):
        self.started = time.monotonic() if started is None else started
        self.parallel = max(1, parallel)  # cells run side by side (xdist workers)
        self.expected: set[Cell] = set()
        self.took: dict[Cell, float] = {}
        self.last_line = self.started  # when the default verbosity's last progress line was written

    def expect(self, cells) -> None:
        self.expected.update(cells)

    def finished(self, cell: Cell, seconds: float, now: float | None = None) -> str:
        """Count a finished cell; returns the run's progress in words: `41.2 s; 3 of 9 cells in 2m05s, about
        4m10s left`."""
        self.took[cell] = seconds
        self.expected.add(cell)
        now = time.monotonic() if now is None else now
        total = len(self.expected)
        words = f"{duration(seconds)}; {len(self.took)} of {total} cell{'s' if total > 1 else ''} in " \
                f"{duration(now - self.started)}"
        left = self.estimate()
        return words + (f", about {duration(left)} left" if left else "")

    def estimate(self) -> float | None:
        """Seconds the cells not finished yet will take, from the finished cells' durations (None: none finished)."""
        if not self.took:
            return None
        overall = fmean(self.took.values())
        by_group: dict[tuple, list[float]] = {}
        by_provider: dict[str, list[float]] = {}
        for cell, seconds in self.took.items():
            by_group.setdefault((cell.provider, cell.graph_mode, cell.tp), []).append(seconds)
            by_provider.setdefault(cell.provider, []).append(seconds)
        total = 0.0
        for cell in self.expected - self.took.keys():
            same = by_group.get((cell.provider, cell.graph_mode, cell.tp)) or by_provider.get(cell.provider)
            total += fmean(same) if same else overall
        return total / self.parallel

    def line_due(self, now: float | None = None) -> bool:
        """Whether the default verbosity writes a progress line now (and, if so, counts it as written)."""
        now = time.monotonic() if now is None else now
        if now - self.last_line < PROGRESS_EVERY_S:
            return False
        self.last_line = now
        return True


NODE_CELL = re.compile(r"::numerics\[(.+)\]$")  # a numerics cell's node id: plan.yaml::numerics[<cell id>]


class ProgressReporter:
    """The hooks that show a run's Progress: a plugin object of its own, registered with the plan's session (the
    run's terminal, in the process that has one: xdist's controller, which hears every worker's reports)."""

    def __init__(self, config, progress: Progress):
        self.config, self.progress = config, progress
        self.shown: tuple | None = None  # (the report being logged, its progress): for its -v line only
        self.nodes: set[str] = set()  # xdist's workers

    @pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown where xdist is not loaded
    def pytest_xdist_node_collection_finished(self, node, ids):
        """xdist's controller collects nothing itself: the cells to run are those its workers collected (each
        collects the same), run side by side on as many workers."""
        self.nodes.add(node.gateway.id)
        self.progress.parallel = len(self.nodes)
        self.progress.expect(Cell.from_id(m.group(1)) for m in map(NODE_CELL.search, ids) if m)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report):
        cell = getattr(report, "plan_cell", None)
        verbosity = self.config.get_verbosity()
        if cell is None or report.when != "call" or verbosity < 0:
            return (yield)
        words = self.progress.finished(Cell.from_id(cell), report.duration)
        self.shown = (report, words)
        try:
            result = yield  # the terminal writes the cell's letter, or its -v line with `words` (teststatus below)
        finally:
            self.shown = None
        terminal = self.config.pluginmanager.getplugin("terminalreporter")
        if verbosity == 0 and terminal is not None and self.progress.line_due():
            status = SUMMARY_STATUSES.get(getattr(report, "plan_status", ""), report.outcome)
            terminal.write_line(f"numerics[{cell}] {status} in {words}")
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report, config):
        result = yield
        if self.shown is None or self.shown[0] is not report or config.get_verbosity() < 1 or not result:
            return result
        category, letter, word = result
        if isinstance(word, tuple):
            return category, letter, (f"{word[0]} ({self.shown[1]})", word[1])
        return category, letter, f"{word} ({self.shown[1]})"
