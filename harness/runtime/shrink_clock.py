"""A failing cell's shrinking, capped in wall time on a CPU machine.

After a cell's first failing example, hypothesis shrinks it: it replays hundreds of smaller candidates, each a
full check, and on a CPU machine each runs in Triton's interpreter (seconds for attention), up to hypothesis's own
limit of five minutes per failure: six failing paged-attention cells took 18.6 minutes, most of it shrinking.
Hypothesis has no setting for the shrink phase's time, so the cell's test function keeps the clock: past
SHRINK_CAP_CPU_S after the first failure, every candidate that did not fail before is rejected unchecked
(hypothesis.reject: not a failure, so the shrinker keeps the smallest failure it has and ends at once), and the
cell's reason says the example may not be minimal. With a provider's several failures, hypothesis looks for more
for 10 s after the first (its own rule), so the cap is in effect the shrink phase's. On a GPU nothing is capped.
"""

from __future__ import annotations

import time

from hypothesis import reject

SHRINK_CAP_CPU_S = 60.0


class ShrinkClock:
    """The time a cell's examples may take after its first failure: `admit` before each example, `failed` after one
    fails; `stopped` once a candidate was rejected for time."""

    def __init__(self, device: str, cap_s: float | None = None):
        self.cap_s = (SHRINK_CAP_CPU_S if cap_s is None else cap_s) if device == "cpu" else None
        self.first_failure: float | None = None
        self.failed_on: set[str] = set()  # the examples that failed: hypothesis replays its minimal one to raise it
        self.stopped = False

    def admit(self, ex) -> None:
        """Reject `ex` unchecked where the cap is spent and it did not fail before."""
        if self.cap_s is None or self.first_failure is None or ex.describe() in self.failed_on:
            return
        if time.monotonic() - self.first_failure > self.cap_s:
            self.stopped = True
            reject()

    def failed(self, ex) -> None:
        self.failed_on.add(ex.describe())
        if self.first_failure is None:
            self.first_failure = time.monotonic()

    def note(self) -> str:
        """What the cell's reason says where the cap stopped shrinking."""
        return f"shrinking stopped after {self.cap_s:g} s on this CPU machine: the example may not be minimal"
