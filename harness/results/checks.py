"""The checks that make records, each with a version, and what a record is stamped with.

A record is stale only when it could now come out differently: a check it ran has a higher version now, the plan
fields it rests on changed, or the implementation it ran changed (harness.results.fingerprints). Comments,
refactors, moves and other providers' edits stale nothing; a check added later reads "not checked for X yet" on the
records it would apply to, and their verdicts rest on the checks that did run.

Each check declares its version beside its code: a `CHECK_VERSIONS = {name: version}` literal in the module named
here, read from that module's source, never imported (no torch here), and, where a rise changed only what a failure
says or shrinks to, a `FAILURES_ONLY = {name: [version, ...]}` literal: records that did not fail stand across it.
A committed manifest keeps the versions honest (harness/results/checks_manifest.json,
tests/test_checks_manifest.py): it holds, per check, a hash of the comment-stripped code of the module's import
closure inside harness/; a change to that code fails the test until the version rises (results may differ) or the
manifest is rewritten (`python -m harness manifest`: a refactor, results stand).

Plain Python.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HARNESS_DIR = Path(__file__).resolve().parents[1]
SECTIONS = ("cells", "integration", "benchmarks")


@dataclass(frozen=True)
class Subject:
    """What a check's applicability is decided on: the record's section and axes, and the plan's facts it needs."""

    section: str  # cells, integration or benchmarks
    sm: str
    dtype: str
    tp: int = 1
    graph_mode: str = "eager"
    route: str = ""  # integration items: ir, custom_op, quantization, plugin, attention_backend, fusion, engine
    quantized: bool = False  # the plan quantizes an output
    returns: bool = False  # the op returns outputs it allocates
    fp32_accumulation: bool = False  # op.accumulation: fp32
    faulted: bool = False  # the kernel crashed its worker or the device, and the input was shrunk after it
    failed: bool = False  # the record is of a failure (failed, or an expected failure)
    token_rows: bool = False  # an input has a num_tokens dimension: vLLM pads it (harness.plan.token_rows)
    batch_invariance: bool = False  # the op's token rows are independent and the plan has the probe on


@dataclass(frozen=True)
class Check:
    """One check: its name, the module that declares its version and holds its code, and when it applies."""

    name: str
    module: str  # relative to harness/
    applies: Callable[[Subject], bool]
    what: str  # in words, for the page

    @property
    def version(self) -> int:
        return declared_versions(self.module)[self.name]

    @property
    def failures_only(self) -> tuple[int, ...]:
        """The versions whose rise changed what a failure says or shrinks to, and nothing of a record that did not
        fail (the module's FAILURES_ONLY literal): such a record stands across them."""
        return tuple(declared_versions(self.module, literal="FAILURES_ONLY").get(self.name, ()))


def _cells(s: Subject) -> bool:
    return s.section == "cells"


def _routes(s: Subject) -> bool:
    return s.section == "integration" and s.route not in ("fusion", "engine", "attention_backend")


def _sanitizer_lanes(s: Subject) -> bool:
    return _cells(s) and s.graph_mode == "memcheck" and s.sm.startswith("sm")


# Every check a record can be made by, in the order a cell runs them.
CHECKS = (
    Check("cell runner", "runtime/runner.py", _cells, "one cell's examples run and judged (hypothesis, shrinking)"),
    Check("fault isolation", "runtime/shrinking.py", lambda s: _cells(s) and s.faulted,
          "a kernel that crashes or faults the device fails its own cell, with the smallest input that still faults"),
    Check("inputs", "runtime/inputs.py", lambda s: s.section in ("cells", "integration"),
          "the examples drawn: token counts, sizes, layouts, value scales, poisoned outputs"),
    Check("values", "runtime/numerics.py", lambda s: s.section in ("cells", "integration"),
          "outputs against the reference: shape, dtype, values within tolerance, fp64 tie-break"),
    Check("nan origin", "runtime/numerics.py", lambda s: s.section in ("cells", "integration"),
          "NaN or Inf where the reference is finite, and where it came from (never written, the padding, computed)"),
    Check("unchanged inputs", "runtime/numerics.py", lambda s: _cells(s) and s.tp == 1,
          "inputs the op does not declare it mutates are unchanged; in-place outputs written in place"),
    Check("quantized steps", "runtime/numerics.py", lambda s: s.section in ("cells", "integration") and s.quantized,
          "quantized outputs at most one step from the reference, on a bounded fraction of elements"),
    Check("returned buffer", "runtime/runner.py", lambda s: _cells(s) and s.tp == 1 and s.returns,
          "a returned output still holds its result after the next call (no reused buffer)"),
    Check("accumulation", "runtime/accumulation.py",
          lambda s: _cells(s) and s.tp == 1 and s.sm != "cpu" and s.fp32_accumulation and s.dtype in ("fp16", "bf16"),
          "a 16-bit kernel accumulates in fp32 (its error against fp64 beside the reference's)"),
    Check("tf32", "runtime/tf32.py", lambda s: _cells(s) and s.dtype == "fp32",
          "what the kernel's fp32 dots compute in"),
    # vLLM's hazards no value comparison sees, on the cells that can show each once: eager tp1 cells for a call's
    # own properties (a graph replays the same launches; ranks run the same kernel), CUDA-graph cells for padding
    # (eager cells on a CPU machine, which runs no CUDA-graph cell: the padded launch is the same call).
    Check("determinism", "runtime/determinism.py", lambda s: _cells(s) and s.tp == 1 and s.graph_mode == "eager",
          "the same call twice (on a GPU, again on a second CUDA stream) gives bit-identical outputs"),
    Check("padding isolation", "runtime/padding.py",
          lambda s: _cells(s) and s.tp == 1 and s.token_rows and (
              s.graph_mode == "cuda_graph" or (s.graph_mode == "eager" and s.sm == "cpu")),
          "real rows bit-identical to an unpadded call when the CUDA-graph padding rows hold NaN or huge values"),
    Check("batch invariance", "runtime/batch_invariance.py",
          lambda s: _cells(s) and s.tp == 1 and s.graph_mode == "eager" and s.batch_invariance,
          "the same rows alone and at the front, middle and end of larger batches give the same bits"),
    Check("torch.compile", "runtime/modes.py", lambda s: _cells(s) and s.graph_mode == "torch_compile",
          "opcheck of the custom op, fullgraph compile with unbacked token counts, no recompile per token count"),
    Check("cuda graph", "runtime/modes.py", lambda s: _cells(s) and s.graph_mode == "cuda_graph",
          "capture at vLLM's sizes on static buffers, replay with fresh data and padded token counts"),
    Check("memcheck", "runtime/memcheck.py", lambda s: _cells(s) and s.graph_mode == "memcheck",
          "compute-sanitizer memcheck with PyTorch's caching allocator off"),
    # After a clean memcheck, the same examples under compute-sanitizer's other tools, on NVIDIA GPUs (the tools'
    # own): each a check of its own, so a lane added or changed stales no memcheck record.
    Check("racecheck", "runtime/memcheck.py", _sanitizer_lanes,
          "compute-sanitizer racecheck: shared-memory data races in the kernel's own code"),
    Check("initcheck", "runtime/memcheck.py", _sanitizer_lanes,
          "compute-sanitizer initcheck: the kernel's reads of device memory never written"),
    Check("synccheck", "runtime/memcheck.py", _sanitizer_lanes,
          "compute-sanitizer synccheck: invalid barrier use in the kernel's own code"),
    Check("tp recombination", "runtime/tp.py", lambda s: _cells(s) and s.tp > 1,
          "the op on N ranks over its shards, outputs recombined and compared with the unsharded reference"),
    Check("interpreter", "interpreter/faithful.py", lambda s: s.section in ("cells", "integration") and s.sm == "cpu",
          "Triton's CPU interpreter made to compute what a GPU computes, or the cell inconclusive"),
    Check("timing", "runtime/timing.py", lambda s: s.section == "benchmarks",
          "device timing: warm-up, rotated inputs, back-to-back and graph replay, launch counts, the bounds"),
    Check("bench recheck", "runtime/bench/measure.py", lambda s: s.section == "benchmarks",
          "every implementation re-checked against the reference after its timing"),
    Check("vllm route", "vllm/routes.py", _routes,
          "vLLM's own layer, called on drawn inputs, reaches the kernel through the route and matches the reference"),
    Check("fusion", "vllm/fusion.py", lambda s: s.section == "integration" and s.route == "fusion",
          "vLLM's fusion pass over vLLM's layer sequence: matched count, the fused node's kernel"),
    Check("engine", "vllm/engine.py", lambda s: s.section == "integration" and s.route == "engine",
          "vLLM's engine serving a tiny model with the plugin: the kernel's calls per step kind, greedy tokens"),
    Check("attention backend", "vllm/attention_backend.py",
          lambda s: s.section == "integration" and s.route == "attention_backend",
          "the plugin's attention backend, selected as CUSTOM, on vLLM's own KV cache and metadata against vLLM's "
          "own backend on the same batch, and the reference"),
    Check("attention backend cuda graph", "vllm/attention_backend.py",
          lambda s: s.section == "integration" and s.route == "attention_backend" and s.graph_mode == "cuda_graph",
          "the same step in a full CUDA graph, as vLLM's FULL_AND_PIECEWISE (decode) and FULL (mixed) modes replay it: "
          "the backend's declared CUDA-graph support, capture on a dummy batch, replay with the batch padded as vLLM "
          "pads it"),
)
BY_NAME = {c.name: c for c in CHECKS}


# The module-level literals a check's module declares its versions in (left out of its code's hash).
VERSION_LITERALS = ("CHECK_VERSIONS", "FAILURES_ONLY")


@functools.cache
def declared_versions(module: str, root: Path = HARNESS_DIR, literal: str = "CHECK_VERSIONS") -> dict:
    """The `CHECK_VERSIONS` literal (or another of VERSION_LITERALS) of a harness module (relative to harness/, or to
    `root`, a copy of it), read from its source; a FAILURES_ONLY the module leaves out is empty."""
    tree = ast.parse((root / module).read_text())
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == literal for t in targets):
                return ast.literal_eval(node.value)
    if literal != "CHECK_VERSIONS":
        return {}
    raise LookupError(f"harness/{module} declares no CHECK_VERSIONS")


def applicable(subject: Subject) -> dict[str, int]:
    """The checks that apply to a record of this subject, with their versions now: what a record made now ran."""
    return {c.name: c.version for c in CHECKS if c.applies(subject)}


def version_changes(ran: dict[str, int], subject: Subject) -> list[str]:
    """The checks a record ran whose version rose since ("accumulation v2 → v3"), of those that apply to it as it
    came out (a fault's shrinking acts on a cell whose kernel faulted only; a rise changing only failures, on a
    record that failed only); a check since removed is none."""
    now = {c.name: c for c in CHECKS if c.applies(subject)}
    out = []
    for name, v in ran.items():
        check = now.get(name)
        if check is None or check.version <= v:
            continue
        if not subject.failed and all(r in check.failures_only for r in range(v + 1, check.version + 1)):
            continue
        out.append(f"{name} v{v} → v{check.version}")
    return out


def not_checked(ran: dict[str, int], subject: Subject) -> list[str]:
    """The checks that apply to the record now and that it did not run (added since): "not checked for X yet"."""
    return [c.name for c in CHECKS if c.applies(subject) and c.name not in ran]
