"""Small reproducers after faults: a call that crashed its worker (or poisoned the device) named the example in
flight (harness.runtime.workers); `shrink_fault` replays smaller inputs (the task's `replaying(example)`), each in a
process of its own, within a budget (SHRINK_REPLAYS replays, SHRINK_BUDGET_S seconds), and returns the smallest
that still faults."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from harness.results.store import FAULT_SHRUNK
from harness.runtime.workers import CallProgress, Fault, Worker, describe_example

# The checks whose code is here and in the workers it drives, with their versions (harness.results.checks): raise
# one when its results may differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"fault isolation": 2}

# Shrinking after a crash or a device fault: at most this many replays, or this many seconds, whichever first.
SHRINK_REPLAYS = 20
SHRINK_BUDGET_S = 60.0


def faulted(value: Any) -> bool:
    """A call that hypothesis could not shrink inside its worker: it crashed the process (a Fault of kind
    "crashed"), or returned a value whose `device_fault` attribute is true (the CUDA context is unusable,
    so every later example in that worker failed for the wrong reason)."""
    if isinstance(value, Fault):
        return value.kind == "crashed"
    return bool(getattr(value, "device_fault", False))


def fault_example(value: Any, progress: CallProgress | None) -> Any:
    """The example that faulted: the one in flight when the process died, or the first after which the device
    was unusable (every later one failed for that reason)."""
    if isinstance(value, Fault):
        return value.example
    return (progress.first_faulted or progress.first_failed) if progress else None


class Replays:
    """`reproduces(example)` for a shrinker: the faulted call replayed on `example`, within a budget of replays
    and seconds (spent: every further candidate counts as not reproducing). No process serves two replays (one
    that corrupted memory without crashing must not decide the next): a worker's replays run in workers of their
    own, the next started while one runs; a TP group is restarted, every rank fresh."""

    def __init__(self, worker, fn: Callable, task: Any, timeout_s: float, fault: Any,
                 max_replays: int = SHRINK_REPLAYS, budget_s: float = SHRINK_BUDGET_S):
        self.worker, self.fn, self.task, self.timeout_s, self.fault = worker, fn, task, timeout_s, fault
        self.max_replays, self.budget_s = max_replays, budget_s
        self.started = time.monotonic()
        self.count = 0
        self.spent = False  # the budget ran out before the shrinker was done
        self.spare: Worker | None = None  # the next replay's worker, starting

    def _fresh(self) -> Worker:
        worker, self.spare = self.spare or Worker(), Worker()
        worker.start()
        if self.count < self.max_replays:
            self.spare.start()
        return worker

    def close(self) -> None:
        if self.spare is not None:
            self.spare.stop(kill=True)
            self.spare = None

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def __call__(self, example: Any) -> bool:
        if self.count >= self.max_replays or self.left_s() <= 0:
            self.spent = True
            return False
        self.count += 1
        limit = min(self.timeout_s, self.left_s())
        if isinstance(self.worker, Worker):
            worker = self._fresh()
            try:
                value = worker.call(self.fn, self.task.replaying(example), limit)
            finally:
                worker.stop(kill=True)
        else:
            self.worker.stop(kill=True)  # restarted by the call, every rank in a fresh process
            value = self.worker.call(self.fn, self.task.replaying(example), limit)
        # A crash in a check's call of another example (a larger batch probed for invariance) is not this one's
        return self.same_fault(value) and getattr(value, "example", None) in (None, example)

    def same_fault(self, value: Any) -> bool:
        """The replay faulted as the original call did: the same crash (same exit), or a device fault again."""
        if isinstance(self.fault, Fault):
            return isinstance(value, Fault) and value.kind == "crashed" and value.reason == self.fault.reason
        return faulted(value) and not isinstance(value, Fault)


@dataclass
class Shrunk:
    """The smallest reproducing example found after a fault, and what finding it cost."""

    example: Any
    first: Any
    replays: int
    seconds: float
    spent: bool

    @property
    def facts(self) -> dict:
        budget = f"{SHRINK_REPLAYS} replays or {SHRINK_BUDGET_S:g} s"
        return {FAULT_SHRUNK: {"replays": self.replays, "seconds": round(self.seconds, 1),
                                           "from": describe_example(self.first), "to": describe_example(self.example),
                                           "budget": budget + (" (spent)" if self.spent else "")}}


def shrink_fault(worker, fn: Callable, task: Any, timeout_s: float, value: Any,
                 shrink: Callable[[Any, Callable[[Any], bool]], Any], known: list | None = None) -> Shrunk | None:
    """After a call that `faulted`: `shrink(first, reproduces)` walks toward smaller examples, replaying each
    in a fresh worker; None when the call did not fault or named no example. `known`: the examples earlier cells of
    the same phase, TP size and provider shrank their faults to (no larger than the first in tokens), tried first:
    a kernel that faults in one dtype or graph mode usually faults alike in the next, and the first of them that
    reproduces is already as small as a walk finds (its own walk ended there), so it is taken as it is, in one
    replay, where a walk from it cost the whole budget again (45-65 s a cell of vLLM's kernel on an H100). The
    smallest found is added to `known`."""
    first = fault_example(value, worker.progress)
    if not faulted(value) or first is None:
        return None
    known = [] if known is None else known
    replays = Replays(worker, fn, task, timeout_s, value)
    try:
        smaller = [k for k in known if k != first and k.num_tokens <= first.num_tokens
                   and k.decode_tokens <= first.decode_tokens]
        smallest = next((k for k in smaller if replays(k)), None) or shrink(first, replays)
    finally:
        replays.close()
    if smallest not in known:
        known.append(smallest)
    return Shrunk(smallest, first, replays.count, time.monotonic() - replays.started, replays.spent)
