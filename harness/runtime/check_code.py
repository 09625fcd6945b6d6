"""The child process of `python -m harness validate`: each plan's code resolved (harness.runtime.resolve), the
function its native baseline times run once on a tiny CPU example (harness.runtime.upcast), and the plan refused
where a wrong kernel made from its reference passes its comparison (harness.runtime.mutants), answering per plan on
stdout. The warnings are also what the pytest plugin asks when a run starts. In a process of its own, as a user's
import can crash or hang: `python -m harness.runtime.check_code PLAN...`."""

from __future__ import annotations

import sys

from harness.runtime.mutants import explained_blind_spots
from harness.runtime.preflight import ReferenceFails, preflight
from harness.runtime.resolve import main, resolve
from harness.runtime.upcast import upcast_warnings
from harness.plan.model import Plan, PlanError


def plan_code_warnings(plan: Plan) -> list[str]:
    """Every warning about a plan's code: resolve's, and a native baseline computing in float32. Asked for where
    plans are checked, not in every worker that resolves a plan, as it runs the plan's code."""
    return [*resolve(plan).warnings, *upcast_warnings(plan)]


class BlindPlan(PlanError):
    """A plan whose comparison passes a wrong kernel: it cannot fail for that mistake, so it is refused."""

    def __init__(self, plan: Plan, found: list[str]):
        super().__init__(str(plan.path), None, "", "", None)
        self.args = (f"{plan.path}: a plan that cannot fail is refused:\n  " + "\n  ".join(found),)


def validated_code_warnings(plan: Plan) -> list[str]:
    """plan_code_warnings, after refusing a plan whose reference cannot run as it says (ReferenceFails) or that
    cannot see a generated wrong kernel (BlindPlan), with those
    the plan explains (an input's `ignorable`) as warnings."""
    failing = preflight(plan)
    if failing:
        raise ReferenceFails(str(plan.path), failing)
    found, explained = explained_blind_spots(plan)
    if found:
        raise BlindPlan(plan, found)
    return [*explained, *plan_code_warnings(plan)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], warnings_of=validated_code_warnings))
