"""What a record is stamped with when it is made, and whether it is still current.

A stamp holds the checks the record ran with their versions (harness.results.checks), a fingerprint of the plan
fields it rests on and one of the implementation it ran (harness.results.fingerprints). A record is stale when it
could now come out differently: a check's version rose ("accumulation v1 → v2"), its plan fields changed, or its
implementation's source did. A check added since is not staleness: the record reads "not checked for X yet".

Plain Python.
"""

from __future__ import annotations

from harness.results.checks import Subject, applicable, not_checked, version_changes
from harness.results.fingerprints import benchmark_fingerprint, implementation_fingerprint, plan_fingerprint
from harness.results.store import FAULT_SHRUNK, Stamp, implementation_changed
from harness.plan.model import Plan
from harness.cells.status import Status
from harness.plan.token_rows import batch_invariance_probed, token_inputs

UNSTAMPED = "made before records were stamped per check"


def section_of(rec) -> str:
    """A record's section of the results file, by its fields (store.py's record classes)."""
    if hasattr(rec, "impls"):
        return "benchmarks"
    return "integration" if hasattr(rec, "route") else "cells"


def subject(plan: Plan, rec) -> Subject:
    """What decides which checks apply to a record."""
    return Subject(section_of(rec), rec.sm, rec.dtype, getattr(rec, "tp", 1), rec.graph_mode,
                   getattr(rec, "route", ""), quantized=bool(plan.quantization.outputs),
                   returns=bool(plan.returned_outputs), fp32_accumulation=plan.op.accumulation == "fp32",
                   faulted=FAULT_SHRUNK in (getattr(rec, "facts", None) or {}),
                   failed=getattr(rec, "status", None) in (Status.FAILED, Status.XFAIL),
                   token_rows=bool(token_inputs(plan)), batch_invariance=batch_invariance_probed(plan))


def _fingerprints(plan: Plan, rec, provider: str) -> tuple[str, str]:
    section = section_of(rec)
    if section == "benchmarks":
        return (plan_fingerprint(plan, section, dtype=rec.dtype, sizes=rec.sizes, phase=rec.phase),
                benchmark_fingerprint(plan, tuple(rec.impls)))
    route = getattr(rec, "route", None)
    return (plan_fingerprint(plan, section, provider, dtype=rec.dtype, route=route, phase=rec.phase),
            implementation_fingerprint(plan, provider))


def stamp(plan: Plan, rec, provider: str = "") -> Stamp:
    """The stamp of a record made now, by the current checks, on the plan and implementation as they are."""
    plan_fp, impl_fp = _fingerprints(plan, rec, provider)
    return Stamp(applicable(subject(plan, rec)), plan_fp, impl_fp, provider)


def staleness(plan: Plan, rec) -> str:
    """Why a record could now come out differently ("" where it could not). A cell not run here or excluded holds
    no result to go stale: what decides it (the machine, the plan's rules) is decided again at each run."""
    if getattr(rec, "status", None) in (Status.EXCLUDED, Status.NOT_RUN):
        return ""
    made: Stamp | None = getattr(rec, "stamp", None)
    if made is None:
        return UNSTAMPED
    why = version_changes(made.checks, subject(plan, rec))
    plan_fp, impl_fp = _fingerprints(plan, rec, made.provider)
    if plan_fp != made.plan:
        why.append("the plan fields it rests on changed")
    if implementation_changed(made.implementation, impl_fp):
        who = "an implementation it timed" if section_of(rec) == "benchmarks" else \
            f"{made.provider}'s source" if made.provider else "the kernel's source"
        why.append(f"{who} changed")
    return "; ".join(why)


def unchecked(plan: Plan, rec) -> list[str]:
    """The checks that apply to a record now and that it did not run (added since it was made)."""
    made: Stamp | None = getattr(rec, "stamp", None)
    if made is None or getattr(rec, "status", None) in (Status.EXCLUDED, Status.NOT_RUN):
        return []
    return not_checked(made.checks, subject(plan, rec))
