"""The child process of `python -m harness validate`: each plan's code resolved (harness.runtime.resolve) and the
function its native baseline times run once on a tiny CPU example (harness.runtime.upcast), answering per plan on
stdout. Also what the pytest plugin asks when a run starts. In a process of its own, as a user's import can crash
or hang: `python -m harness.runtime.check_code PLAN...`."""

from __future__ import annotations

import sys

from harness.runtime.resolve import main, resolve
from harness.runtime.upcast import upcast_warnings
from harness.spec.plan import Plan


def plan_code_warnings(plan: Plan) -> list[str]:
    """Every warning about a plan's code: resolve's, and a native baseline computing in float32. Asked for where
    plans are checked, not in every worker that resolves a plan, as it runs the plan's code."""
    return [*resolve(plan).warnings, *upcast_warnings(plan)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], warnings_of=plan_code_warnings))
