"""Result records and the results file: what every item ended in, and where and with what it ran.

The records are dataclasses, written to and read from JSON here and nowhere else, by pydantic (which checks each
field's type on reading). One file per machine kind under `reports/<op>/results/` (`cpu.json`,
`sm90-nvidia-h200.json`, ...). A run folds its records into that file after every item, through a temporary file
that atomically replaces the old one, so an interrupted run (Ctrl-C, SIGTERM, SIGKILL) leaves a valid file holding
every finished item. xdist workers write files of their own, folded in at the end of the run (or by the next run or
`python -m harness report`). Merging across files: per record, the latest wins, except that another SM's "not run
here" never replaces a real result; one of another toolchain is kept beside it (`earlier`: harness.results.toolchains).

Plain Python: no torch, so the report can read results anywhere.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import TypeAdapter, ValidationError

from harness.results.toolchains import take, toolchain_order
from harness.plan.model import Tolerance
from harness.cells.status import Status

FORMAT = "harness-results"
VERSION = 2
# Version 1 files have the same layout (records were untyped dicts); they are read as they are. Optional fields
# added since (CellRecord.passing, CellRecord.more_failures, the bounds of BenchRecord, every record's stamp, the
# file's `earlier` records) keep the version: a harness without them skips them (from_json, load).
READABLE_VERSIONS = (1, 2)


class ResultsError(Exception):
    """A results file that cannot be merged: named, with why."""


# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class Provenance:
    """Where and with what a run happened."""

    sm: str
    device: str
    gpu: str
    device_count: int
    cpu_count: int
    host: str = "?"
    torch: str | None = None
    triton: str | None = None
    vllm: str | None = None
    cuda: str | None = None
    python: str | None = None
    triton_interpreter: bool = False
    commit: str | None = None  # the plan file's repository's commit (None: in none); in older records, the run root's
    date: str = "?"
    cells: str | None = None  # which runnable cells the run ran: "a pairwise sample of 9 of 54 runnable cells"
    harness: str | None = None  # the harness's version and commit
    plan: str | None = None  # the plan file, relative to the run's root: which plan's results these are
    # The commit of the repository holding the harness package (the tool), beside the plan's: a user's plan lives in
    # a repository of its own. None in records from before it was recorded.
    tool_commit: str | None = None

    def commit_words(self, prefix: str = "commit ", unknown: str = "?") -> str:
        """The commits that made the run, each named where they differ: `commit abc` (one repository, or a record from
        before tool_commit), else `harness commit abc, plan commit def` (the plan in a repository of its own)."""
        if self.tool_commit is None or self.tool_commit == self.commit:
            return f"{prefix}{self.commit or unknown}"
        return f"harness commit {self.tool_commit}, plan commit {self.commit or 'none (not in a git repository)'}"

    @property
    def machine_key(self) -> str:
        """The results file's name: `cpu`, or the SM and the GPU's name (`sm90-nvidia-h200`)."""
        if self.sm == "cpu":
            return "cpu"
        return f"{self.sm}-" + re.sub(r"[^a-z0-9]+", "-", self.gpu.lower()).strip("-")


@dataclass(frozen=True)
class ErrorStats:
    """Worst errors over an item's examples; non-finite values are kept as their text ("nan", "inf")."""

    max_abs: float | str | None = 0.0
    max_rel: float | str | None = 0.0
    max_ulp: int | None = None
    output: str = ""


ALIGNMENTS = (16, 8, 4, 2, 1)


def alignment(n: int) -> int:
    """A size's alignment class: the largest of ALIGNMENTS dividing it."""
    return next(a for a in ALIGNMENTS if n % a == 0)


@dataclass
class InputsSeen:
    """The inputs of a cell's examples that passed, in brief: what the kernel was seen to accept."""

    examples: int = 0
    num_tokens: list[int] | None = None  # [lowest, highest]
    sizes: dict[str, list[int]] = field(default_factory=dict)  # size symbol -> [lowest, highest]
    alignments: dict[str, list[int]] = field(default_factory=dict)  # size symbol -> the alignment classes seen
    layouts: dict[str, list[str]] = field(default_factory=dict)  # tensor input -> contiguous and/or strided
    row_strides: dict[str, list[int]] = field(default_factory=dict)  # strided input -> its row strides' alignments

    def add(self, num_tokens: int, sizes: dict[str, int], layouts: dict[str, tuple[str, int | None]]) -> None:
        """One passing example: its token count, size symbols, and per tensor input (layout, row stride or None)."""
        self.examples += 1
        low, high = self.num_tokens or (num_tokens, num_tokens)
        self.num_tokens = [min(low, num_tokens), max(high, num_tokens)]
        for sym, v in sizes.items():
            low, high = self.sizes.get(sym, (v, v))
            self.sizes[sym] = [min(low, v), max(high, v)]
            self.alignments[sym] = sorted({*self.alignments.get(sym, ()), alignment(v)})
        for name, (layout, stride) in layouts.items():
            self.layouts[name] = sorted({*self.layouts.get(name, ()), layout})
            if stride is not None:
                self.row_strides[name] = sorted({*self.row_strides.get(name, ()), alignment(stride)})

    def merge(self, other: "InputsSeen") -> "InputsSeen":
        """Both records' inputs in one (for a summary over cells)."""
        out = InputsSeen(self.examples + other.examples)
        ranges = [r for r in (self.num_tokens, other.num_tokens) if r]
        out.num_tokens = [min(r[0] for r in ranges), max(r[1] for r in ranges)] if ranges else None
        for sym in {*self.sizes, *other.sizes}:
            both = [r for r in (self.sizes.get(sym), other.sizes.get(sym)) if r]
            out.sizes[sym] = [min(r[0] for r in both), max(r[1] for r in both)]
        for name in ("alignments", "layouts", "row_strides"):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(out, name, {k: sorted({*mine.get(k, ()), *theirs.get(k, ())}) for k in {*mine, *theirs}})
        return out


@dataclass
class Failure:
    """One distinct failure of a cell: why, and the smallest input found for it."""

    reason: str
    minimal_example: str | None = None


MORE_FAILURES = "; and {n} more distinct failure{s}: "  # how a record's reason goes on to its other failures


def more_failures_words(failures: list[Failure]) -> str:
    """What a failed cell's reason adds after its leading failure: `; and 2 more distinct failures: [2] <reason>
    (minimal example: ...); [3] ...`, each reason on one line."""
    listed = "; ".join(f"[{i}] {' '.join(f.reason.split())}" + (f" (minimal example: {f.minimal_example})"
                                                               if f.minimal_example else "")
                       for i, f in enumerate(failures, start=2))
    return MORE_FAILURES.format(n=len(failures), s="s" if len(failures) > 1 else "") + listed


def lead_reason(rec: "CellRecord") -> str:
    """A failed record's reason without what `more_failures_words` added: its leading failure's (records made before
    the words were added, a provider's, are as they were)."""
    if not rec.more_failures:
        return rec.reason
    n = len(rec.more_failures)
    marker = MORE_FAILURES.format(n=n, s="s" if n > 1 else "")
    return rec.reason.split(marker, 1)[0]


@dataclass(frozen=True)
class Stamp:
    """What made a record (harness.results.stamps): the checks it ran (name -> version), and fingerprints of the plan
    fields and of the implementation it rests on (`provider`: "" the kernel under test, else the plan's provider the
    cell ran)."""

    checks: dict[str, int] = field(default_factory=dict)
    plan: str = ""
    implementation: str = ""
    provider: str = ""


UNKNOWN = "unknown"  # a fingerprint that cannot be taken here (a package not installed): never stale for it


def implementation_changed(made: str, now: str) -> bool:
    """Whether an implementation fingerprint changed: one for a cell's implementation, `name=fp` pairs for a
    benchmark's; one that cannot be taken here ("unknown") on either side changes nothing."""
    def parts(text: str) -> dict[str, str]:
        return dict(p.split("=", 1) for p in text.split()) if "=" in text else {"": text}

    before, after = parts(made), parts(now)
    return any(before[k] != after[k] for k in before.keys() & after.keys() if UNKNOWN not in (before[k], after[k]))


def outdates(new: Stamp | None, old: Stamp | None) -> bool:
    """Whether a record of stamp `new` was made by what has since replaced what made `old`'s: a check both ran at a
    higher version, other plan fields, another implementation, or `old` from before records were stamped."""
    if new is None:
        return False
    if old is None:
        return True
    return any(old.checks.get(name, version) < version for name, version in new.checks.items()) \
        or new.plan != old.plan or implementation_changed(old.implementation, new.implementation)


@dataclass
class CellRecord:
    """One numerics cell: its axes, status and reason, and what the run measured."""

    phase: str
    dtype: str
    tp: int
    graph_mode: str
    sm: str
    status: Status
    reason: str = ""
    examples: int | None = None
    duration_s: float | None = None
    tolerance: Tolerance | None = None  # the one a comparison used (harness.plan.tolerances)
    error: ErrorStats | None = None
    facts: dict = field(default_factory=dict)
    minimal_example: str | None = None
    passing: InputsSeen | None = None  # the inputs of the examples that passed
    more_failures: list[Failure] | None = None  # distinct failures besides the leading one (`reason` lists them too)
    readings: dict[str, float] | None = None  # each check statistic's largest value over the examples (calibration)
    repro: str | None = None
    expectation: str | None = None
    stamp: Stamp | None = None
    finished: str = ""
    run: str = ""


@dataclass
class ImplFigures:
    """One implementation's timing in a benchmark item, or why it has none."""

    median_us: float | None = None
    q20_us: float | None = None
    q80_us: float | None = None
    launches: int | None = None
    samples: int | None = None
    # Eager timings are back-to-back device time (calls queued behind each other); launch_us is the median of
    # isolated calls on an idle GPU, the host's launch cost included (what a host-bound decode step sees).
    launch_us: float | None = None
    error: str | None = None  # raised, or (the kernel) a wrong result after timing
    differs: str | None = None  # a baseline whose outputs differ from the reference after timing (timing kept)
    not_run: str | None = None
    # The fraction of quantized elements one step from the reference after timing (at most one step each; more is an
    # error or differs): an observation, judged against the implementation's allowance when a page is made
    # (harness.results.merge), so a changed allowance re-judges stored records without a run.
    step_fraction: float | None = None

    @property
    def timed(self) -> bool:
        return finite_number(self.median_us)


FAULT_SHRUNK = "shrunk after the fault"  # the fact of a cell whose kernel faulted (harness.runtime.shrinking)
WRONG_AFTER_TIMING = "wrong result after timing"  # how a check after timing starts its message (harness.runtime.bench)


def steps_over(fraction: float | None, allowed: float, field_name: str) -> str | None:
    """The after-timing check's words where the fraction of quantized elements one step off exceeds `allowed`."""
    if fraction is None or fraction <= allowed:
        return None
    return (f"{WRONG_AFTER_TIMING}: {fraction:.2%} of quantized elements are one step from the reference (at most "
            f"{allowed:.2%} allowed: {field_name})")

@dataclass
class BenchRecord:
    """One benchmark item as measured: the implementations' timings and what the same run measured to set them
    against (bandwidths, matrix-multiply peak, launch floor) with the call's byte and flop counts. What follows
    from them (throughput, the physical bound, speedups, broken timings) is harness.decisions'. Records from older
    harnesses also held those derived figures; they are skipped on reading."""

    phase: str
    dtype: str
    sm: str
    graph_mode: str
    num_tokens: int
    sizes: dict = field(default_factory=dict)
    copy_bw_gbps: float | None = None
    # The read bandwidth measured in the same run (one large tensor read, nothing written back): what a call that
    # mostly reads can reach, above a copy's. None in older results and on a CPU machine.
    read_bw_gbps: float | None = None
    # One call's bytes and flops (the plan's models) and, measured in the same run (harness.runtime.timing), the
    # dtype's dense matrix-multiply peak and the launch floor (an empty kernel under the same timer): the terms of
    # the call's physical bound (harness.decisions.bounds). Peak and floor are None on a CPU machine.
    bytes: int | None = None
    flops: float | None = None
    peak_tflops: float | None = None
    launch_floor_us: float | None = None
    # What each baseline timed: name -> its import path (native and compiled: op.native, else the reference; a named
    # baseline: its path, with its prepare after "; prepared by "). Older results lack it: native and compiled were
    # the reference then.
    timed_functions: dict | None = None
    l2_bytes: int | None = None
    working_set_bytes: int | None = None
    rotated_sets: int | None = None
    timer: str | None = None
    impls: dict[str, ImplFigures] = field(default_factory=dict)
    stamp: Stamp | None = None
    finished: str = ""
    run: str = ""

    def __post_init__(self):
        # Records written before `differs` existed kept a baseline's wrong result after timing in `error`: the same
        # fact, read as it is meant now (the baseline's timing stands).
        for name, impl in self.impls.items():
            if (name != "kernel" and impl.error and impl.error.startswith(WRONG_AFTER_TIMING) and impl.timed
                    and not impl.differs):
                impl.differs, impl.error = impl.error, None


@dataclass
class FusionOutcome:
    """A fusion item: vLLM's fusion pass over vLLM's layer sequence under one profile (harness.vllm.fusion)."""

    profile: str  # harness.vllm_facts.fusion_cases.FusionProfile.id
    custom_ops: list[str] = field(default_factory=list)
    ir_priority: dict[str, list[str]] = field(default_factory=dict)
    pass_name: str = ""
    matched: int | None = None  # the pass's matched_count; None where it did not run
    fused_kernels: list[str] | None = None  # the ops new in the graph after the pass: what the fused nodes call
    ops_before: list[str] | None = None  # vLLM's (and plugins') ops in the graph before the pass
    ops_after: list[str] | None = None


@dataclass
class EngineOutcome:
    """An engine item: vLLM's engine serving requests with the plugins loaded (harness.vllm.engine)."""

    model: str = ""
    requests: int = 0
    ops: list[str] = field(default_factory=list)  # the plans whose plugins the engine loaded together
    calls: dict[str, int] = field(default_factory=dict)  # step kind (prefill, mixed, decode) -> the kernel's calls
    calls_outside_forward: int = 0
    cuda_graphs: bool = False
    tokens_compared: int = 0
    first_difference: str | None = None  # where greedy tokens first differ (within the other run's top candidates)
    start_s: float | None = None  # the engine's start with the plugins
    serve_s: float | None = None
    profile: str | None = None  # on a GPU: the vLLM profile, "Inductor on" or "Inductor off"
    # "profiler": the kernel's GPU launches, CUDA graph replays included; None: its Python calls (the probe)
    counted_by: str | None = None
    attention_backend: str | None = None  # set where the harness chose vLLM's attention backend


@dataclass
class IntegrationRecord:
    """One vLLM integration item: vLLM's own layer reaching the kernel through one route, vLLM's fusion pass over
    its layers (route "fusion"), or a running engine calling the kernel (route "engine")."""

    route: str
    phase: str
    dtype: str
    tp: int
    graph_mode: str
    sm: str
    status: Status
    reason: str = ""
    examples: int | None = None
    kernel_calls: int | None = None
    registered_as: dict | None = None
    tolerance: Tolerance | None = None  # the one a comparison used (harness.plan.tolerances)
    error: ErrorStats | None = None
    vllm: str | None = None
    duration_s: float | None = None
    fusion: FusionOutcome | None = None
    engine: EngineOutcome | None = None
    stamp: Stamp | None = None
    finished: str = ""
    run: str = ""


SECTIONS = {"cells": CellRecord, "benchmarks": BenchRecord, "integration": IntegrationRecord}
Record = CellRecord | BenchRecord | IntegrationRecord
FILE_KEYS = ("runs", *SECTIONS, "earlier")  # a results file's mappings


def finite_number(v) -> bool:
    """A number that is neither NaN nor infinite (the results file keeps the others as their text)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


# ---------------------------------------------------------------- JSON <-> records


def to_json(obj: Any) -> Any:
    """A record as JSON data (pydantic's dump of the dataclass: None fields left out, statuses as their names), a
    number that is not finite as its text."""
    return _finite(_adapter(type(obj)).dump_python(obj, mode="json", exclude_none=True))


def _finite(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return str(data) if isinstance(data, float) and not finite_number(data) else data


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def from_json(cls: type, data: Any, where: str) -> Any:
    """A record of `cls` from JSON data, validated by pydantic (fields an older or newer harness wrote and this one
    does not know are skipped); ResultsError names the place when the data does not fit."""
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as exc:
        raise ResultsError(f"{where}{_misfit(exc)}") from None


def _misfit(exc: ValidationError) -> str:
    """A validation's first error: its place (`.cells.<key>.more_failures[0].reason`) and pydantic's words."""
    errors = exc.errors()
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in errors[0]["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {errors[0]['msg']}{more}"


# ---------------------------------------------------------------- the file


@dataclass
class Earlier:
    """Per section and key, the results of other toolchains or GPUs that the latest record replaced (Results.put),
    newest first, at most one per GPU and toolchain (harness.results.toolchains)."""

    cells: dict[str, list[CellRecord]] = field(default_factory=dict)
    benchmarks: dict[str, list[BenchRecord]] = field(default_factory=dict)
    integration: dict[str, list[IntegrationRecord]] = field(default_factory=dict)

    def section(self, name: str) -> dict[str, list]:
        return getattr(self, name)


@dataclass
class Results:
    """One results file, or several merged: the runs' provenance and every record, by section and key."""

    op: str
    runs: dict[str, Provenance] = field(default_factory=dict)
    cells: dict[str, CellRecord] = field(default_factory=dict)
    benchmarks: dict[str, BenchRecord] = field(default_factory=dict)
    integration: dict[str, IntegrationRecord] = field(default_factory=dict)
    earlier: Earlier = field(default_factory=Earlier)

    def section(self, name: str) -> dict:
        return getattr(self, name)

    def provenance(self, rec: Record) -> Provenance | None:
        return self.runs.get(rec.run)

    def on_own_sm(self, rec: Record) -> bool:
        """Whether a record was made on a machine of its own SM (not another machine's 'not run here')."""
        prov = self.provenance(rec)
        return prov is not None and prov.sm == rec.sm

    def put(self, section: str, key: str, rec: Record) -> bool:
        """Take a record: the key's latest where it wins (_replaces), else, or the latest it replaced, kept in
        `earlier` where it is a result of another toolchain (harness.results.toolchains). Whether `rec` was kept."""
        return take(self.section(section), self.earlier.section(section), key, rec, self.provenance,
                    lambda new, old: _replaces(self, new, old))

    def to_json(self, rendered: dict | None = None) -> dict:
        """The file's JSON data. With `rendered` (id -> (record, text), kept between calls), each record is
        converted once and kept as its compact text (results_text writes it as it is)."""
        def record(rec):
            if rendered is None:
                return to_json(rec)
            hit = rendered.get(id(rec))
            if hit is None or hit[0] is not rec:
                hit = rendered[id(rec)] = (rec, Rendered(_compact(to_json(rec))))
            return hit[1]
        data = {"format": FORMAT, "version": VERSION, "op": self.op,
                "runs": {k: to_json(v) for k, v in self.runs.items()},
                **{name: {k: record(v) for k, v in self.section(name).items()} for name in SECTIONS}}
        earlier = {name: {k: [record(r) for r in recs] for k, recs in self.earlier.section(name).items()}
                   for name in SECTIONS if self.earlier.section(name)}
        return {**data, "earlier": earlier} if earlier else data  # none: the file reads as it always did


def load(path: Path, op: str | None = None) -> Results:
    """Read and check one results file; ResultsError names the file and what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON (truncated or corrupt?): {exc}") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read: {exc.strerror}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ResultsError(f"{path}: not a harness results file (format {found!r})")
    if data.get("version") not in READABLE_VERSIONS:
        raise ResultsError(f"{path}: results format version {data.get('version')!r}; this harness reads versions "
                           f"{', '.join(map(str, READABLE_VERSIONS))} (a newer harness wrote it: update this one)")
    if op is not None and data.get("op") != op:
        raise ResultsError(f"{path}: results for op {data.get('op')!r}, not {op!r}")
    for key in FILE_KEYS:
        if not isinstance(data.get(key, {}), dict):
            raise ResultsError(f"{path}: missing or malformed '{key}'")
    try:  # the file as a whole through pydantic: records named by section and key where one does not fit
        return _adapter(Results).validate_python({k: data[k] for k in ("op", *FILE_KEYS) if k in data})
    except ValidationError as exc:
        raise ResultsError(f"{path}: {_misfit(exc)[1:]}") from None


class Rendered(str):
    """A record's JSON text, already compact (Results.to_json with `rendered`)."""


def _compact(value) -> str:
    return value if isinstance(value, Rendered) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def results_text(data: dict) -> str:
    """A results file's text: one record per line, so that a diff shows which records a run changed, and
    compact within it (indented JSON made a plan's results file a third larger)."""
    parts = []
    for key, value in sorted(data.items()):
        if key == "earlier":  # section -> key -> records: a key's records on a line, as in the sections
            sections = ",\n".join(f"  {json.dumps(name)}: {{\n" + ",\n".join(
                f"   {json.dumps(k)}: [{','.join(map(_compact, v))}]" for k, v in sorted(recs.items())) + "\n  }"
                for name, recs in sorted(value.items()))
            parts.append(f" {json.dumps(key)}: {{\n{sections}\n }}")
        elif isinstance(value, dict) and value and all(isinstance(v, (dict, Rendered)) for v in value.values()):
            rows = ",\n".join(f"  {json.dumps(k)}: {_compact(v)}" for k, v in sorted(value.items()))
            parts.append(f" {json.dumps(key)}: {{\n{rows}\n }}")
        else:
            parts.append(f" {json.dumps(key)}: {_compact(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_atomic(path: Path, results: Results, rendered: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(results_text(results.to_json(rendered)))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are shared files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fold(into: Results, other: Results) -> Results:
    """Merge `other` into `into`: runs are unioned; per record the latest result wins, except that "not run here"
    never replaces a real result: not from a machine of another SM, and not from one of the same SM that could not
    run it (vLLM's kernels not installed there, memory held by another process): that is the machine's, and the
    result another machine of the SM made stands. A result of another toolchain or GPU than the winner's is kept in
    `earlier` (Results.put), `other`'s earlier ones too."""
    into.runs.update(other.runs)
    for name in SECTIONS:
        for key, rec in other.section(name).items():
            into.put(name, key, rec)
        for key, recs in other.earlier.section(name).items():
            for rec in recs:
                into.put(name, key, rec)
    return into


def fold_files(reports: Path, source: Path) -> tuple[list[str], list[str]]:
    """Fold every results file under `source` (`<op>/results/<machine>.json` at any depth: a CI artifact, another
    checkout's reports/) into the file of that op and name under `reports`, record by record (fold). A copy would
    lose records: runs on two machines of one kind, or two runs of one machine, write one file name. Returns a line
    per file folded and the problems: a file that cannot be read is named and left as it is, source or destination,
    and the rest still folds."""
    done, problems = [], []
    for path in sorted(Path(source).glob("**/results/*.json")):
        if "." in path.stem:  # an xdist worker's own file: its run folds it into the machine's file
            continue
        op = path.parent.parent.name
        dest = Path(reports) / op / "results" / path.name
        try:
            incoming = load(path, op)
            ours = load(dest, op) if dest.exists() else Results(op)
        except ResultsError as exc:
            problems.append(str(exc))
            continue
        before = {(name, key): rec for name in SECTIONS for key, rec in ours.section(name).items()}
        fold(ours, incoming)
        taken = [(name, key) for name in SECTIONS for key, rec in ours.section(name).items()
                 if before.get((name, key)) != rec]
        new = sum(k not in before for k in taken)
        write_atomic(dest, ours)
        done.append(f"{dest}: {new} new and {len(taken) - new} newer records from {path}")
    return done, problems


def _replaces(results: Results, new: Record, old: Record) -> bool:
    """Whether a record wins over another of the same key: made on its own SM, then a result over "not run here" (a
    machine without vLLM does not erase what one with it found), then the latest. Both results of one GPU, one of a
    newer toolchain: that one (a run on an older Triton, made or folded later, never stands for a newer one). Both
    made on their own SM, one of them by what has since replaced what made the other (`outdates`): that one,
    whatever it says (the other is stale), in whichever order the files are folded."""
    newer = toolchain_order(results.provenance(new), new, results.provenance(old), old)
    if newer is not None:
        return newer
    if results.on_own_sm(new) and results.on_own_sm(old):
        if outdates(new.stamp, old.stamp):
            return True
        if outdates(old.stamp, new.stamp):
            return False

    def rank(rec):
        return results.on_own_sm(rec), getattr(rec, "status", None) is not Status.NOT_RUN, rec.finished

    return rank(new) >= rank(old)


def other_plans(directory: Path, op: str, plan: str) -> list[str]:
    """The plan files other than `plan` whose runs wrote results for `op` in `directory` (a copied op.name: the two
    plans would overwrite each other's page and records). Runs from before runs named their plan say nothing."""
    merged, _ = merge_dir(directory, op)
    return sorted({prov.plan for prov in merged.runs.values() if prov.plan and prov.plan != plan})


def merge_dir(directory: Path, op: str) -> tuple[Results, list[str]]:
    """Every results file of an op merged; problems with single files are returned, not swallowed."""
    merged, problems = Results(op), []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            fold(merged, load(path, op))
        except ResultsError as exc:
            problems.append(str(exc))
    return merged, problems


class Recorder:
    """The running pytest process's results file, rewritten atomically after every item that ran."""

    def __init__(self, directory: Path, op: str, provenance: Provenance, run_id: str, worker: str | None = None,
                 stamp: Callable[[str, Record], Stamp | None] | None = None):
        key = provenance.machine_key
        self.machine_file = Path(directory) / f"{key}.json"  # this machine's, where xdist workers' files fold in
        self.path = self.machine_file.with_suffix(f".{worker}.json") if worker else self.machine_file
        self.results = Results(op)
        if self.path.exists():
            try:
                self.results = load(self.path, op)
            except ResultsError:
                # Never overwrite what we cannot read: keep it beside, and start afresh.
                self.path.replace(self.path.with_suffix(".unreadable"))
        self.run_id = run_id
        self.stamp = stamp  # (key, record) -> what made it (harness.results.stamps), set on every record
        self.results.runs[run_id] = provenance
        self.unwritten = False  # records kept in memory only (record's `defer`)
        # Each record's text, made once: converting every record for every rewrite cost about 30 ms per item
        # (plan.yaml's results file holds some 900 records), 5 s of a 168-item benchmark run.
        self.rendered: dict[int, tuple[Record, Rendered]] = {}

    def describe_run(self, **fields) -> None:
        """Set fields of this run's provenance (written with the next record)."""
        self.results.runs[self.run_id] = dataclasses.replace(self.results.runs[self.run_id], **fields)

    def record(self, section: str, key: str, rec: Record, defer: bool = False) -> None:
        """Add a record and rewrite the file; `defer`: rewrite it with the next record or `flush` instead, for
        records that cost nothing to make again (a cell this machine cannot run; rewriting the file for each of
        the hundreds of those in a plan cost about 20 ms apiece), and for a benchmark item's record, written while
        the next item runs in its worker."""
        rec.run = self.run_id
        if self.stamp is not None:
            rec.stamp = self.stamp(key, rec)
        if not self.results.put(section, key, rec):
            return  # "not run here" where this machine made a result before, which stands (fold's rule)
        self.rendered.pop(id(rec), None)  # a record recorded again may have changed
        self.unwritten = defer
        if not defer:
            self._write()

    def _write(self) -> None:
        write_atomic(self.path, self.results, self.rendered)

    def flush(self) -> None:
        """Write deferred records."""
        if self.unwritten:
            self._write()
            self.unwritten = False

    def fold_worker_files(self) -> None:
        """Fold xdist workers' files (and those an interrupted run left) into this machine's file."""
        for path in sorted(self.path.parent.glob(f"{self.path.stem}.*.json")):
            try:
                fold(self.results, load(path, self.results.op))
            except ResultsError:
                continue  # reported by the report step, which reads every file
            self._write()
            path.unlink()
