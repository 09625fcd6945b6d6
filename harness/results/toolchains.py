"""Records per toolchain: a result replaced by one of another torch, Triton or vLLM on the same GPU is kept beside it
(the results file's `earlier`, harness.results.store.Results.put), so that a user upgrading Triton can see what
changed (`python -m harness diff`, the page's section), and a run on an older toolchain never stands for a newer one.

Plain Python, and no record types here (harness.results.store imports this module): records are read by their fields.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable

from harness.cells.status import Status
from harness.plan.implementations import VLLM

# Per record key and GPU, the toolchains whose results are kept, the latest's included: the two a diff compares and
# one before them, so that a file holds at most three records per key and machine however often it is upgraded.
TOOLCHAINS_KEPT = 3


def version_key(version: str) -> tuple[int, ...]:
    """A version's numbers, to order two versions of a package: `2.11.0+cu130` -> (2, 11, 0) (the local build after
    "+" names no newer version)."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0]))


def runs_vllm(rec) -> bool:
    """Whether vLLM's own code made a record: a route into vLLM, vLLM's kernel audited or timed. Only there is vLLM's
    version part of its toolchain: the plan's kernel runs alike with vLLM installed or not."""
    stamp = getattr(rec, "stamp", None)
    return hasattr(rec, "route") or VLLM in (getattr(rec, "impls", None) or {}) \
        or getattr(stamp, "provider", "") == VLLM


def toolchain(prov, rec) -> tuple[str | None, str | None, str | None]:
    """The versions a record's numerics and speed hang on besides the kernel's own code, of its run (a Provenance):
    torch, Triton, and vLLM where vLLM's code made it (None: not installed, or not vLLM's record)."""
    return prov.torch, prov.triton, prov.vllm if runs_vllm(rec) else None


def newer_toolchain(a, b, rec) -> bool:
    """Whether run `a` (a Provenance) had a newer toolchain than run `b` on the same GPU for the record `rec` of
    them: each of torch, Triton and (for vLLM's records) vLLM at the same version or a newer one, and one newer. A
    package installed on one machine only, or two builds of one version, order neither: which came after the other
    is then not known."""
    if a is None or b is None or a.gpu != b.gpu or a.sm != b.sm:
        return False
    pairs = list(zip(toolchain(a, rec), toolchain(b, rec)))
    if any((x is None) != (y is None) for x, y in pairs):
        return False
    keys = [(version_key(x), version_key(y)) for x, y in pairs if x is not None]
    return all(x >= y for x, y in keys) and any(x > y for x, y in keys)


def is_result(prov, rec) -> bool:
    """Whether a record is a result of the machine that made it (its run's Provenance `prov`): made on its own SM, and
    neither "not run here" nor the plan's exclusion (a benchmark: some implementation timed). Only results are worth
    keeping for a toolchain."""
    if prov is None or prov.sm != rec.sm:
        return False
    impls = getattr(rec, "impls", None)  # a benchmark's
    if impls is not None:
        return any(impl.timed for impl in impls.values())
    return rec.status not in (Status.NOT_RUN, Status.EXCLUDED)


def slot(prov, rec) -> tuple | None:
    """What a record is kept per besides its key: the GPU and the toolchain of its run."""
    return None if prov is None else (prov.gpu, *toolchain(prov, rec))


def toolchain_order(new_prov, new, old_prov, old) -> bool | None:
    """Whether record `new` wins over `old` for its toolchain: both results of one GPU, the newer toolchain's does;
    None where that decides nothing."""
    if is_result(new_prov, new) and is_result(old_prov, old):
        if newer_toolchain(new_prov, old_prov, new):
            return True
        if newer_toolchain(old_prov, new_prov, new):
            return False
    return None


def take(records: dict, earlier: dict, key: str, rec, source: Callable, wins: Callable) -> bool:
    """Take a record into a section's records and its earlier ones (harness.results.store.Results.put): the key's
    latest where it wins over the one there (`wins`), and the record that lost kept where it is a result of another
    GPU or toolchain than the latest; of the same, it is dropped, as it always was. `source`: a record's run. Returns
    whether `rec` was kept."""
    old = records.get(key)
    lost = old if old is None or wins(rec, old) else rec
    records[key] = old if lost is rec else rec
    latest = slot(source(records[key]), records[key])
    kept = [e for e in earlier.pop(key, []) if slot(source(e), e) != latest]  # the latest's toolchain has none
    if lost is not None:
        kept = with_earlier(kept, lost, records[key], source, wins)
    if kept:
        earlier[key] = kept
    return records[key] is rec or any(e is rec for e in kept)


def with_earlier(kept: list, rec, latest, source: Callable, wins: Callable) -> list:
    """A key's earlier records (newest first) with `rec`, a record that lost to `latest`, taken in where it is a result
    of another GPU or toolchain than the latest's: in place of its slot's record where it wins over it, then each
    GPU's newest up to TOOLCHAINS_KEPT with the latest."""
    where = slot(source(rec), rec)
    if not is_result(source(rec), rec) or where == slot(source(latest), latest):
        return kept
    same = next((e for e in kept if slot(source(e), e) == where), None)
    if same is not None and not wins(rec, same):
        return kept
    ordered = sorted([e for e in kept if e is not same] + [rec], key=lambda e: (e.finished, e.run), reverse=True)
    per_gpu = Counter([source(latest).gpu] if is_result(source(latest), latest) else [])
    bounded = []
    for e in ordered:
        gpu = source(e).gpu
        if per_gpu[gpu] < TOOLCHAINS_KEPT:
            bounded.append(e)
            per_gpu[gpu] += 1
    return bounded
