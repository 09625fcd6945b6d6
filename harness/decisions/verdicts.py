"""The go / no-go verdict per SM and TP size and the plan's verdict, by the rules of docs/report.md: blocked (a failed
or unexpected-pass cell), no results, numerics only (a CPU machine), not run here (a TP size this SM's machines had too
few GPUs for), incomplete, then go or no-go per regime from the recommendations; any of these resting on records other
checks made is "stale: re-run" instead. Plain Python, no Markdown."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from harness.decisions.reasons import by_reason, n_cells, n_records
from harness.decisions.recommendations import ENABLE, VLLM_PROFILES, Recommendation, choice_words, pairs_text, \
    recommendations, undecided
from harness.decisions.speedups import REGIMES
from harness.results.merge import Merged
from harness.cells.status import Status

BLOCKED, EXCLUDED, NO_RESULTS, NUMERICS_ONLY, INCOMPLETE, NOT_RUN_HERE, STALE = (
    "blocked", "excluded", "no results", "numerics only", "incomplete", "not run here", "stale: re-run")
GO, NO_GO = "go", "no-go"
# The order verdicts are listed in: a speed verdict (go, no-go, mixed: None here) after blocked, then those still
# short of one, then those this SM's machines could not give, then those that cannot give one.
RANK = (BLOCKED, None, STALE, INCOMPLETE, NOT_RUN_HERE, NUMERICS_ONLY, NO_RESULTS, EXCLUDED)


@dataclass(frozen=True)
class Verdict:
    word: str  # blocked | incomplete | not run here | go | no-go | go for ... (mixed) | numerics only | no results |
    # excluded
    rule: str


@dataclass(frozen=True)
class SmVerdict:
    sm: str
    word: str
    rule: str
    tps: tuple[int, ...] = ()  # the TP sizes it holds for; () for the whole SM

    @property
    def where(self) -> str:
        """"sm90", or "sm90 tp2, tp4" for a verdict on some TP sizes."""
        return self.sm if not self.tps else f"{self.sm} " + ", ".join(f"tp{t}" for t in self.tps)


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
    """The verdicts of every SM of the plan, by the rules in docs/report.md: one per SM, or, on a GPU SM whose TP
    sizes differ (a one-GPU machine decides tp1 while its tp2 and up are not run here), one per TP size."""
    recs = recommendations(res) if recs is None else recs
    plan = res.plan
    out = []
    for sm in plan.matrix["sm"]:
        cells = [c for c in res.cells if c.sm == sm]
        mine = [r for r in recs if r.sm == sm]
        required = [c for c in cells if not res.excluded_by_plan(c)]
        if sm not in res.covered and not _blocking(res, cells):
            if not required:
                out.append(SmVerdict(sm, EXCLUDED, "the plan excludes every cell of this SM"))
                continue
            if not any(r.choice for r in mine):
                out.append(SmVerdict(sm, NO_RESULTS, f"no results from a machine of this SM yet "
                                                     f"({n_cells(len(required))}): run pytest --plan "
                                                     f"{res.plan_display()} on one"))
                continue
        if sm == "cpu":  # numerics only, whatever the TP size: one verdict
            out.append(SmVerdict(sm, *_unless_stale(res, sm, cells, _cpu_verdict(res, cells))))
            continue
        per_tp = []
        for tp in plan.matrix["tp"]:
            tp_cells = [c for c in cells if c.tp == tp]
            per_tp.append((tp, _unless_stale(res, sm, tp_cells, _tp_verdict(res, sm, tp_cells, mine))))
        if len({word_rule for _, word_rule in per_tp}) == 1:  # the same at every TP size: one verdict for the SM
            out.append(SmVerdict(sm, *per_tp[0][1]))
            continue
        groups: dict[tuple[str, str], list[int]] = {}
        for tp, word_rule in per_tp:
            groups.setdefault(word_rule, []).append(tp)
        out += [SmVerdict(sm, word, rule, tuple(tps)) for (word, rule), tps in groups.items()]
    return out


def _blocking(res: Merged, cells: list) -> tuple[list, list, list]:
    """The failed and the unexpectedly passing cells among `cells`, and the failed vLLM integration items of their
    SM (a kernel vLLM cannot reach, or that differs inside vLLM, does not ship); empty: nothing blocks."""
    failed = [c for c in cells if res.status(c) == Status.FAILED]
    xpass = [c for c in cells if res.status(c) == Status.XPASS]
    sms = {c.sm for c in cells}
    integration = [r for r in res.integration.values() if r.sm in sms and r.status in (Status.FAILED, Status.XPASS)]
    return (failed, xpass, integration) if failed or xpass or integration else ()


def _blocked_rule(failed: list, xpass: list, integration: list, where: str) -> str:
    items = f", {len(integration)} vLLM integration items failed" if integration else ""
    return (f"{len(failed)} failed, {len(xpass)} unexpectedly passing{items}; any failed or unexpected-pass cell"
            f"{' or integration item' if integration else ''} blocks the integration {where}")


def _not_run(res: Merged, sm: str, cells: list) -> tuple[list, str]:
    """The cells without a pass or fail that the verdict waits for, and the text that says why, by reason."""
    required = [c for c in cells if not res.excluded_by_plan(c)]
    not_run = [c for c in cells if res.status(c) == Status.NOT_RUN or
               (sm in res.covered and res.status(c) is None) or
               (sm not in res.covered and c in required)]
    reasons = by_reason(res, [c for c in not_run if c.id in res.records])
    unrecorded = [c for c in not_run if c.id not in res.records]
    if unrecorded:
        reasons.append(("no result recorded" if sm in res.covered else "no cell results from this SM", unrecorded))
    text = f"{n_cells(len(not_run))} not run" + (
        f" ({'; '.join(f'{len(cs)}: {reason}' for reason, cs in reasons[:3])}"
        f"{'; …' if len(reasons) > 3 else ''})" if reasons else "")
    return not_run, text


def _cpu_verdict(res: Merged, cells: list) -> tuple[str, str]:
    blocking = _blocking(res, cells)
    if blocking:
        return BLOCKED, _blocked_rule(*blocking, "on this SM")
    not_run, not_run_text = _not_run(res, "cpu", cells)
    passed = sum(1 for c in cells if res.status(c) == Status.PASSED)
    xfail = sum(1 for c in cells if res.status(c) == Status.XFAIL)
    parts = [f"{passed} of {n_cells(len(cells))} passed"] + ([f"{xfail} failed as expected"] if xfail else [])
    if not_run:
        parts.append(not_run_text)
    return NUMERICS_ONLY, ("; ".join(parts) + "; a CPU machine runs the kernel in Triton's interpreter, so its "
                                              "results never give a speed verdict")


def _tp_verdict(res: Merged, sm: str, cells: list, mine: list[Recommendation]) -> tuple[str, str]:
    """(word, rule) for the cells of one GPU SM at one TP size. The benchmarks time one GPU, so the SM's decisions
    decide every TP size whose cells all ran; a TP size none of whose cells this SM's machines could run (too few
    GPUs) is "not run here", with why, and holds no other TP size back."""
    plan = res.plan
    blocking = _blocking(res, cells)
    if blocking:
        return BLOCKED, _blocked_rule(*blocking, "on this SM and TP size")
    required = [c for c in cells if not res.excluded_by_plan(c) and res.status(c) != Status.EXCLUDED]
    if not required:
        return EXCLUDED, "the plan excludes every cell of this TP size"
    not_run, not_run_text = _not_run(res, sm, cells)
    # Not run here: each of them tried by a machine of this SM, which could not run it (another SM's machine
    # saying "needs sm90" is no attempt)
    if sm in res.covered and all(res.status(c) == Status.NOT_RUN and res.source_sm(res.records[c.id]) == sm
                                 for c in required):
        return NOT_RUN_HERE, f"{not_run_text}; a machine that can run them decides"
    decided = [r for r in mine if r.choice]
    pending = undecided(res, sm, mine)
    if not_run or pending:
        parts = [not_run_text] if not_run else []
        if pending:
            parts.append(f"no benchmark decision yet for {pairs_text(pending)}")
        if decided:
            parts.append(f"benchmarks so far: {go_phrase(decided)}")
        return INCOMPLETE, "; ".join(parts)
    if not decided:  # every cell ran, and the plan times nothing on this SM
        why = ("the plan has no benchmark shapes (benchmark.decode, benchmark.prefill)" if
               not plan.benchmark.shapes() else "the plan's benchmarks do not run on this SM (excluded or "
                                                "expected to fail)")
        return INCOMPLETE, f"{why}: nothing decides go or no-go"
    return go_phrase(decided), (f"go where a decision is to {choice_words(plan, ENABLE)} (in either vLLM profile), "
                                "no-go elsewhere")


def _unless_stale(res: Merged, sm: str, cells: list, word_rule: tuple[str, str]) -> tuple[str, str]:
    """A verdict resting on records other checks made (Merged.stale_checks) is no current verdict: "stale: re-run",
    saying what those records would give. It rests on the blocking records where something blocks (a failure the
    current checks made blocks whatever else is stale); else on the SM's results among `cells` and, where the
    benchmarks decide (go, no-go, incomplete), on the SM's benchmarks."""
    word, rule = word_rule
    if word in (EXCLUDED, NO_RESULTS):
        return word_rule  # rests on no record
    blocking = _blocking(res, cells)
    if blocking:
        failed, xpass, integration = blocking
        basis = [res.records[c.id] for c in failed + xpass] + integration
        if not all(res.stale_checks(r) for r in basis):
            return word_rule
    else:
        basis = [res.records[c.id] for c in cells if c.id in res.records]
        if word not in (NOT_RUN_HERE, NUMERICS_ONLY):
            basis += [r for _, r in res.benchmarks if r.sm == sm]
    stale = [r for r in basis if res.stale_checks(r)]
    if not stale:
        return word_rule
    why = sorted({res.stale_checks(r) for r in stale})
    return STALE, (f"{n_records(stale)} could now come out differently ({'; '.join(why[:3])}"
                   f"{f'; and {len(why) - 3} more' if len(why) > 3 else ''}): re-run them; until then they give: "
                   f"{word} ({rule})")


def verdict_rank(v: SmVerdict) -> int:
    """SMs with a speed verdict first, then those still short of one, then those that cannot give one."""
    return RANK.index(v.word) if v.word in RANK else 1


def places(verdicts: list[SmVerdict]) -> str:
    """Where a group of verdicts holds, each SM once with its TP sizes: "sm90 tp2, tp4, tp8, sm100"."""
    by_sm: dict[str, list[int] | None] = {}
    for v in verdicts:
        if not v.tps:
            by_sm[v.sm] = None
        elif by_sm.get(v.sm, []) is not None:
            by_sm[v.sm] = by_sm.get(v.sm, []) + list(v.tps)
    return ", ".join(sm if tps is None else f"{sm} " + ", ".join(f"tp{t}" for t in sorted(tps))
                     for sm, tps in by_sm.items())


def verdict(res: Merged, recs: list[Recommendation] | None = None,
            per_sm: list[SmVerdict] | None = None) -> Verdict:
    """The plan's verdict: the per-SM (and per-TP-size) verdicts, those with the same verdict named together."""
    per_sm = sm_verdicts(res, recs) if per_sm is None else per_sm
    groups: dict[str, list[SmVerdict]] = {}
    for v in sorted(per_sm, key=verdict_rank):
        groups.setdefault(v.word, []).append(v)
    word = " · ".join(f"{places(vs)}: {w}" for w, vs in groups.items())
    return Verdict(word, "per SM and TP size: blocked, then no results, then numerics only on a CPU machine, then "
                         "not run here (a TP size that needs more GPUs), then incomplete, then go or no-go per "
                         "regime; stale: re-run where one rests on records other checks made (docs/report.md)")


def grouped_verdicts(per_sm: list[SmVerdict]) -> list[tuple[str, SmVerdict]]:
    """Verdicts with the same word and reason together, in plan order of their first SM, each with where it holds
    (`places`)."""
    groups: dict[tuple[str, str], list[SmVerdict]] = {}
    for v in sorted(per_sm, key=verdict_rank):  # stable: plan order within a rank
        groups.setdefault((v.word, v.rule), []).append(v)
    return [(places(vs), vs[0]) for vs in groups.values()]
