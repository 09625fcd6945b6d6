"""The statuses a cell, benchmark or integration item ends in: the plan's `expect` rules name them too."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    """How one item ended. `str` so records compare and serialise as their plain names."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_RUN = "not_run"  # this machine cannot run it (another SM, too few GPUs, no CUDA)
    EXCLUDED = "excluded"  # the plan's exclude rule
    XFAIL = "xfail"  # failed, as the plan's expect rule says
    XPASS = "xpass"  # passed although the plan expects a failure (strict: fails the run)

    def __str__(self) -> str:
        return self.value


RAN = (Status.PASSED, Status.FAILED, Status.XFAIL, Status.XPASS)
