"""The go / no-go verdict per SM and the plan's verdict, by the rules of docs/report.md: blocked (a failed or
unexpected-pass cell), no results, numerics only (a CPU machine), incomplete, then go or no-go per regime from the
recommendations. Plain Python, no Markdown."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

from harness.decisions.reasons import by_reason, n_cells
from harness.decisions.recommendations import VLLM_PROFILES, Recommendation, recommendations, undecided
from harness.decisions.speedups import REGIMES
from harness.results.merge import Merged
from harness.spec.status import Status

BLOCKED, EXCLUDED, NO_RESULTS, NUMERICS_ONLY, INCOMPLETE = ("blocked", "excluded", "no results", "numerics only",
                                                            "incomplete")
GO, NO_GO = "go", "no-go"
# The order SMs are listed in: a speed verdict (go, no-go, mixed: None here) after blocked, then those still short
# of one, then those that cannot give one.
RANK = (BLOCKED, None, INCOMPLETE, NUMERICS_ONLY, NO_RESULTS, EXCLUDED)


@dataclass(frozen=True)
class Verdict:
    word: str  # blocked | incomplete | go | no-go | go for ... (mixed) | numerics only | no results | excluded
    rule: str


@dataclass(frozen=True)
class SmVerdict:
    sm: str
    word: str
    rule: str


def go_phrase(recs: list[Recommendation]) -> str:
    """go / no-go per regime from the decided recommendations of one SM, naming the profiles (and dtypes) that
    enable the op where not all of them do: "go for decode-sized (Inductor off); no-go for prefill-sized"."""
    per_regime = []  # (regime, GO | NO_GO, qualifier)
    for reg in REGIMES:
        decided = [r for r in recs if r.regime == reg and r.choice]
        if not decided:
            continue
        if not any(r.go for r in decided):
            per_regime.append((reg, NO_GO, ""))
            continue
        quals = []
        for profile, _ in VLLM_PROFILES:
            mine = [r for r in decided if r.profile == profile]
            on = [r.dtype for r in mine if r.go]
            if on:
                quals.append(profile if len(on) == len(mine) else f"{profile}: {', '.join(on)}")
        everywhere = all(r.go for r in decided)
        per_regime.append((reg, GO, "" if everywhere else f" ({'; '.join(quals)})"))
    if not per_regime:
        return ""
    if len({(word, qual) for _, word, qual in per_regime}) == 1:
        return per_regime[0][1] + per_regime[0][2]
    parts = []
    for (word, qual), items in itertools.groupby(per_regime, key=lambda t: (t[1], t[2])):
        parts.append(f"{word} for {', '.join(reg for reg, _, _ in items)}{qual}")
    return "; ".join(parts)


def sm_verdicts(res: Merged, recs: list[Recommendation] | None = None) -> list[SmVerdict]:
    """One verdict per SM of the plan, by the rules in docs/report.md."""
    recs = recommendations(res) if recs is None else recs
    plan = res.plan
    out = []
    for sm in plan.matrix["sm"]:
        cells = [c for c in res.cells if c.sm == sm]
        failed = [c for c in cells if res.status(c) == Status.FAILED]
        xpass = [c for c in cells if res.status(c) == Status.XPASS]
        # vLLM integration items count too: a kernel vLLM cannot reach, or that differs inside vLLM, does not ship
        integration = [r for r in res.integration.values() if r.sm == sm and r.status in (Status.FAILED, Status.XPASS)]
        if failed or xpass or integration:
            items = (f", {len(integration)} vLLM integration items failed", " or integration item") if integration \
                else ("", "")
            out.append(SmVerdict(sm, BLOCKED, f"{len(failed)} failed, {len(xpass)} unexpectedly passing{items[0]}; any "
                                              f"failed or unexpected-pass cell{items[1]} blocks the integration on "
                                              "this SM"))
            continue
        mine = [r for r in recs if r.sm == sm]
        required = [c for c in cells if not res.excluded_by_plan(c)]
        if sm not in res.covered:
            if not required:
                out.append(SmVerdict(sm, EXCLUDED, "the plan excludes every cell of this SM"))
                continue
            if not any(r.choice for r in mine):
                out.append(SmVerdict(sm, NO_RESULTS, f"no results from a machine of this SM yet "
                                                     f"({n_cells(len(required))}): run pytest --plan "
                                                     f"{res.plan_display()} on one"))
                continue
        not_run = [c for c in cells if res.status(c) == Status.NOT_RUN or
                   (sm in res.covered and res.status(c) is None) or
                   (sm not in res.covered and c in required)]
        reasons = by_reason(res, [c for c in not_run if c.id in res.records])
        unrecorded = [c for c in not_run if c.id not in res.records]
        if unrecorded:
            reasons.append(("no result recorded" if sm in res.covered else "no cell results from this SM",
                            unrecorded))
        not_run_text = f"{n_cells(len(not_run))} not run" + (
            f" ({'; '.join(f'{len(cs)}: {reason}' for reason, cs in reasons[:3])}"
            f"{'; …' if len(reasons) > 3 else ''})" if reasons else "")
        if sm == "cpu":
            passed = sum(1 for c in cells if res.status(c) == Status.PASSED)
            xfail = sum(1 for c in cells if res.status(c) == Status.XFAIL)
            parts = [f"{passed} of {n_cells(len(cells))} passed"] + ([f"{xfail} failed as expected"] if xfail else [])
            if not_run:
                parts.append(not_run_text)
            out.append(SmVerdict(sm, NUMERICS_ONLY, "; ".join(parts) + "; a CPU machine runs the kernel in "
                                                                       "Triton's interpreter, so its results never "
                                                                       "give a speed verdict"))
            continue
        decided = [r for r in mine if r.choice]
        pending = undecided(res, sm, mine)
        if not_run or pending:
            parts = [not_run_text] if not_run else []
            if pending:
                by_regime = defaultdict(list)
                for dtype, reg in pending:
                    by_regime[reg].append(dtype)
                parts.append("no benchmark decision yet for " + "; ".join(
                    f"{reg} {', '.join(by_regime[reg])}" for reg in REGIMES if reg in by_regime))
            if decided:
                parts.append(f"benchmarks so far: {go_phrase(decided)}")
            out.append(SmVerdict(sm, INCOMPLETE, "; ".join(parts)))
            continue
        if not decided:  # every cell ran, and the plan times nothing on this SM
            why = ("the plan has no benchmark shapes (benchmark.decode, benchmark.prefill)" if
                   not plan.benchmark.shapes() else "the plan's benchmarks do not run on this SM (excluded or "
                                                    "expected to fail)")
            out.append(SmVerdict(sm, INCOMPLETE, f"{why}: nothing decides go or no-go"))
            continue
        out.append(SmVerdict(sm, go_phrase(decided), "go where a decision is to enable the custom op (in either "
                                                     "vLLM profile), no-go elsewhere"))
    return out


def verdict_rank(v: SmVerdict) -> int:
    """SMs with a speed verdict first, then those still short of one, then those that cannot give one."""
    return RANK.index(v.word) if v.word in RANK else 1


def verdict(res: Merged, recs: list[Recommendation] | None = None,
            per_sm: list[SmVerdict] | None = None) -> Verdict:
    """The plan's verdict: the per-SM verdicts, SMs with the same verdict named together."""
    per_sm = sm_verdicts(res, recs) if per_sm is None else per_sm
    groups: dict[str, list[str]] = {}
    for v in sorted(per_sm, key=verdict_rank):
        groups.setdefault(v.word, []).append(v.sm)
    word = " · ".join(f"{', '.join(sms)}: {w}" for w, sms in groups.items())
    return Verdict(word, "per SM: blocked, then no results, then numerics only on a CPU machine, then incomplete, "
                         "then go or no-go per regime (docs/report.md)")


def grouped_verdicts(per_sm: list[SmVerdict]) -> list[tuple[list[str], SmVerdict]]:
    """SMs with the same verdict and reason together, in plan order of their first SM."""
    groups: dict[tuple[str, str], list[str]] = {}
    for v in sorted(per_sm, key=verdict_rank):  # stable: plan order within a rank
        groups.setdefault((v.word, v.rule), []).append(v.sm)
    return [(sms, SmVerdict(sms[0], word, rule)) for (word, rule), sms in groups.items()]
