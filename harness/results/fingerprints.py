"""Per-record fingerprints: the plan fields a stored record rests on, and the implementation it ran, each as 12 hex
digits, so that a record is stale only when one of them changed (harness.results.checks), never on a comment, a
reformat, a description or another provider's edit.

`plan_fingerprint(plan, section, provider, dtype, route, sizes, phase)` hashes a canonical JSON dump (sort_keys) of
the parsed plan's sub-models a record depends on, per section:

- "cells" (a numerics cell of `provider`; "" is the kernel under test), the plan as that provider's cells run it
  (harness.cells.matrix.provider_view): op.args, outputs, mutates, sizes, paths, native, reference, fake, generate,
  accumulation, reduction, the provider's contract (op.contract for the kernel; an implementation's own
  otherwise), the tolerance actually used for the cell's dtype and for each output
  (harness.plan.tolerances: the plan's, else vLLM IR's, else the table's), numerics, quantization (with vLLM's
  max_step_fraction where it applies), tp, the token range of the cell's phase (it reads the benchmark's largest
  token count) and the CUDA-graph capture sizes; then the provider's own entry only: op.kernel for the kernel, a
  torch.ops kernel's name, args, signature, dtypes and max_step_fraction (`vllm`: implementations.vllm), a Python
  function's path, prepare and contract. Not: op.kernel for another provider, op.name, intent, description, replaces,
  the matrix, exclude and expect rules (applied at render), benchmark models and sizes, other providers' entries, words
  (a contract's or vLLM kernel's `why`, a baseline's `setting` and `title`, the switch's sentences), comments and
  formatting.
- "integration" (a vLLM item): op.name (the plugin's names), kernel, reference, replaces, native, fake, generate,
  args, outputs, mutates, sizes, contract, accumulation, the tolerances (as for cells), quantization, numerics, the
  phase's token range, matrix.dtype and matrix.sm (the plugin's supports_args is written from them) and the vllm
  section (route, layer, ir_op, custom_op, provider, adapter, in_tree_provider, kernel with its switch's kind and
  name, fusion), less its words (why_not_proven, the switch's runs_for, note, cpu_runs_native); and the route.
- "benchmarks" (one shape): the record's phase and sizes, the dtype's tolerance (each timing is re-checked against
  the reference), op.args, outputs, mutates, kernel, reference, native, generate and the kernel's contract (inputs,
  the re-check, what native and compiled time, shapes outside the contract), numerics.max_model_len (the batch's longest
  context), the built-in baselines listed, each named baseline's path, prepare and contract, implementations.vllm (the
  vllm baseline's call), and benchmark.bytes and benchmark.flops: a BenchRecord stores the bytes and flops its run
  computed from those models, and the report reads them from the record (harness.decisions.bounds), so a
  changed model stales the record. Not: benchmark.models (names), benchmark.sizes and the phases' token lists
  (whether a shape is still timed is decided at render: Benchmark.times), the named baselines' `setting` and
  `title`, which of them is the `default` (the decisions are made at render).

`implementation_fingerprint(plan, provider)` hashes what a record's implementation is, as source: the module of the
kernel's import path (provider ""), of a named baseline's path and prepare, of op.native or the reference
("native", "compiled"), each found without importing it (the plan's folder and its parents up to the repository,
then the import system's finders, which find a package's location without running it), its normalized source
(the AST without docstrings, so comments, docstrings and formatting do not count) and, transitively, the modules it
imports from its own top-level package or from the plan's repository (relative imports included; a third-party
package a local adapter imports is not followed: which version of it ran is the toolchain's, in the provenance);
for "vllm", vLLM's kernel's name and its schema as the harness pins it (harness.vllm_facts.kernels; the plan's
`signature` where the table lacks it, else the name alone), never the installed vLLM's version (a record's
provenance carries that). A module not found here (a third-party package not installed) gives
"unknown": the caller cannot tell, so the record is not stale for it. `benchmark_fingerprint(plan, implementations)`
gives the kernel's and every timed baseline's, pair by pair. The reference's source is in no fingerprint: it
shares the kernel's module in most plans, and at the module's grain it would stale every provider's cells on an
edit of the kernel.

Files are hashed once per (path, mtime, size) (functools.lru_cache), a module's closure is reused while none of its
files changed, and a plan's fingerprints are kept per (frozen) Plan object, so rendering many records stays fast.
Plain Python: nothing here imports torch or the user's code.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import weakref
from pathlib import Path
from typing import Any

from harness.results.code_hash import normalized_source
from harness.results.store import UNKNOWN
from harness.plan.dtypes import CELL_OF_TORCH, DTYPE
from harness.plan.implementations import BUILTIN, VLLM
from harness.cells.matrix import contract_of, provider_view
from harness.plan.model import Plan
from harness.plan.sections import Contract
from harness.plan.tolerances import DEFAULT_TOLERANCE, output_tolerance, tolerance_for
from harness.plan.vocabulary import PHASES
from harness.vllm_facts.kernels import kernel_schema

SECTIONS = ("cells", "integration", "benchmarks")
REPO_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")  # where the search for a plan's code stops


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _jsonable(value: Any) -> Any:
    """What json cannot dump as is: sets in a fixed order, models and anything else as their JSON form."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=lambda v: json.dumps(v, sort_keys=True, default=str))
    if hasattr(value, "model_dump"):
        return _dump(value)
    return str(value)


# ---------------------------------------------------------------- the plan's fields


# op's fields as each section reads them (the others: name, intent, description, replaces, kernel are per section).
_CELL_OP = ("args", "outputs", "mutates", "sizes", "paths", "native", "reference", "fake", "generate", "accumulation",
            "reduction")
_INTEGRATION_OP = ("name", "kernel", "reference", "replaces", "native", "fake", "generate", "args", "outputs",
                   "mutates", "sizes", "accumulation")
_BENCH_OP = ("args", "outputs", "mutates", "kernel", "reference", "native", "generate")


def _dump(model: Any, **options: Any) -> Any:
    """A model as JSON values (tuples as lists). Without serializer warnings: fields held in another form than their
    annotation's (a tuple for a list, a parsed form of a union) dump as what they hold."""
    return model.model_dump(mode="json", warnings=False, **options)


# The hazard checks' settings (harness.runtime.batch_invariance, determinism), added after records were made: left
# out at their defaults, so that a record made before they existed keeps its fingerprint (it reads "not checked for
# batch invariance yet" instead), and left out of the vLLM items, whose records no such check makes.
HAZARD_NUMERICS = ("batch_invariance", "determinism")


def _numerics(numerics: Any, hazards: bool = True) -> dict:
    out = _dump(numerics)
    for name in HAZARD_NUMERICS:
        if not hazards or out[name] == type(numerics).model_fields[name].default:
            del out[name]
    return out


def _contract(contract: Contract | None) -> dict:
    return _dump(contract or Contract(), exclude={"why"})


def _op(plan: Plan, fields: tuple[str, ...]) -> dict:
    """op's fields, its arguments as parsed (one form for `layout: strided` and `layout: [strided]`), without the
    line each is on."""
    out = _dump(plan.op, include=set(fields) - {"args"})
    if "args" in fields:
        # `ignorable` is validate's (which wrong kernels it accepts): no record depends on it
        out["args"] = [_dump(a, exclude={"line", "ignorable"}) for a in plan.args]
    return out


def _tolerances(plan: Plan, dtype: str | None) -> dict:
    """The tolerances a comparison in `dtype` uses (every matrix dtype's where None): the cell's, and each output's.
    An output's own dtype is known where it is an argument of a fixed dtype; a returned output may be of any dtype
    (scales in fp32), so every table dtype's tolerance is counted for it unless the plan sets one for it."""
    out = {}
    for d in (dtype,) if dtype else plan.matrix["dtype"]:
        outputs = {}
        for name in plan.op.outputs:
            if name in plan.output_tolerance:
                outputs[name] = plan.output_tolerance[name]
            elif plan.has_arg(name) and plan.arg(name).dtype != "act":
                cell = _cell_dtype(plan.arg(name).dtype)
                outputs[name] = output_tolerance(plan, d, name, cell)
            elif not plan.has_arg(name):  # returned: its dtype is the reference's, known only at run time
                outputs[name] = {other: output_tolerance(plan, d, name, other) for other in DEFAULT_TOLERANCE}
        out[d] = {"cell": tolerance_for(plan, d), "outputs": outputs}
    return out


def _cell_dtype(arg_dtype: str) -> str | None:
    """The cell dtype of an argument's fixed dtype (float32 -> fp32), None where none is."""
    row = DTYPE.get(arg_dtype)
    return CELL_OF_TORCH.get(row.torch) if row else None


def _own(plan: Plan, name: str) -> dict | None:
    """An implementation's entry as it runs (not its words: a contract's or its own `why`, its `setting` and
    `title`, its switch): a Python function's path, prepare and contract; a torch.ops kernel's name, args,
    signature, dtypes and step allowance."""
    e = plan.implementation(name)
    if e is None:
        return None
    if e.path is not None:
        return {"path": e.path, "prepare": e.prepare, "contract": _contract(e.contract)}
    if e.name is not None:
        return {"name": e.name, "args": e.args, "signature": e.signature, "max_step_fraction": e.max_step_fraction,
                "dtypes": list(e.contract.dtypes) if e.contract and e.contract.dtypes is not None else None,
                **({"library": e.library} if e.library else {})}
    return {}


def _vllm_switched(plan: Plan) -> dict | None:
    """vLLM's kernel as its integration items read it: as it runs, and its switch's kind and name."""
    kernel = plan.vllm_kernel
    if kernel is None:
        return None
    switch = kernel.switch.model_dump(mode="json", include={"kind", "name"}) if kernel.switch else None
    return {**_own(plan, VLLM), "switch": switch}


def _phases(plan: Plan, phase: str | None) -> dict:
    return {p: list(plan.token_range(p)) for p in ((phase,) if phase in PHASES else PHASES)}  # engine items: "all"


def _cells(plan: Plan, provider: str, dtype: str | None, phase: str | None) -> dict:
    view = provider_view(plan, provider)
    if provider == "":
        own: Any = {"kernel": plan.op.kernel}
    else:  # keyed as when vLLM's kernel and the plan's own were declared apart
        own = {"vllm" if provider == VLLM else "named": _own(plan, provider)}
    return {
        "op": _op(view, _CELL_OP), "contract": _contract(contract_of(plan, provider)), "own": own,
        "tolerance": _tolerances(view, dtype), "numerics": _numerics(view.numerics),
        "quantization": _dump(view.quantization), "tp": _dump(view.tp),
        "tokens": _phases(view, phase), "capture_sizes": view.cuda_graph_sizes(),
    }


def _integration(plan: Plan, dtype: str | None, route: str | None, phase: str | None) -> dict:
    return {
        "route": route, "op": _op(plan, _INTEGRATION_OP), "contract": _contract(plan.contract),
        "tolerance": _tolerances(plan, dtype), "quantization": _dump(plan.quantization),
        "numerics": _numerics(plan.numerics, hazards=False), "tokens": _phases(plan, phase),
        "matrix": {"dtype": sorted(plan.matrix["dtype"]), "sm": sorted(plan.matrix["sm"])},
        "vllm": {**_dump(plan.vllm, exclude={"why_not_proven"}), "kernel": _vllm_switched(plan)},
    }


def _benchmarks(plan: Plan, dtype: str | None, sizes: dict | None, phase: str | None) -> dict:
    bench = plan.benchmark
    return {
        "phase": phase, "sizes": dict(sizes) if sizes is not None else {s: list(v) for s, v in plan.sizes.items()},
        "tolerance": _tolerances(plan, dtype), "op": _op(plan, _BENCH_OP), "contract": _contract(plan.contract),
        "max_model_len": plan.numerics.max_model_len, "baselines": [b for b in plan.baselines if b in BUILTIN],
        "named": {name: _own(plan, name) for name in plan.baselines if name not in BUILTIN},
        "vllm": _own(plan, VLLM) if VLLM in plan.baselines else None,
        "bytes": bench.bytes, "flops": bench.flops,
    }


# Per plan, its fingerprints by arguments: a plan is frozen once loaded, and a page asks the same question of many
# records (a cell's fingerprint is the same across its tp, graph_mode and sm). Dropped with the plan.
_memo: dict[int, dict] = {}


def _memoized(plan: Plan) -> dict:
    key = id(plan)
    if key not in _memo:
        _memo[key] = {}
        weakref.finalize(plan, _memo.pop, key, None)
    return _memo[key]


def plan_fingerprint(plan: Plan, section: str, provider: str = "", dtype: str | None = None,
                     route: str | None = None, sizes: dict | None = None, phase: str | None = None) -> str:
    """12 hex digits over the plan fields a record of `section` ("cells", "integration", "benchmarks") rests on (the
    module's docstring lists them): a cell of `provider` in `dtype` and `phase`, a vLLM item of `route`, a benchmark
    shape of `phase` and `sizes`. dtype or phase None: every matrix dtype's tolerance, every phase's token range."""
    provider = "" if provider == "kernel" else provider
    key = (section, provider, dtype, route, json.dumps(sizes, sort_keys=True, default=str), phase)
    memo = _memoized(plan)
    if key not in memo:
        if section == "cells":
            payload = _cells(plan, provider, dtype, phase)
        elif section == "integration":
            payload = _integration(plan, dtype, route, phase)
        elif section == "benchmarks":
            payload = _benchmarks(plan, dtype, sizes, phase)
        else:
            raise ValueError(f"section: expected one of {', '.join(SECTIONS)}; found {section!r}")
        memo[key] = _digest({"section": section, **payload})
    return memo[key]


# ---------------------------------------------------------------- the implementation's source


@functools.lru_cache(maxsize=4096)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[str, tuple[tuple[str, tuple[str, ...], int], ...]]:
    """(sha256 of the file's normalized source, its imports as (module, names imported from it, level)), once per
    (path, mtime, size). The normalized source is the AST without docstrings, dumped without positions
    (harness.results.code_hash.normalized_source): comments, docstrings and formatting change nothing."""
    try:
        tree = ast.parse(Path(path).read_bytes())
        normalized = normalized_source(path)
    except (SyntaxError, ValueError, UnicodeDecodeError):  # not Python this interpreter reads: its bytes as they are
        return hashlib.sha256(Path(path).read_bytes()).hexdigest(), ()
    imports = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(alias.name, (), 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports.append((node.module or "", tuple(alias.name for alias in node.names), node.level))
    return hashlib.sha256(normalized.encode()).hexdigest(), tuple(imports)


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _file_digest(path: str) -> tuple[str, tuple]:
    mtime_ns, size = _stat(path) or (0, 0)
    return _parsed(path, mtime_ns, size)


def _roots(plan: Plan) -> tuple[str, ...]:
    """Where the plan's own modules are looked for first: its folder (harness.runtime.resolve puts it on the import
    path) and the folders above it up to the repository's root (pytest's rootdir, on the path of a run). Once per
    plan (a plan's path does not change)."""
    memo = _memoized(plan)
    if "roots" not in memo:
        memo["roots"] = _find_roots(plan)
    return memo["roots"]


def _find_roots(plan: Plan) -> tuple[str, ...]:
    folder = Path(plan.path).resolve().parent
    roots = []
    for parent in (folder, *folder.parents):
        roots.append(str(parent))
        if any(os.path.exists(os.path.join(parent, marker)) for marker in REPO_MARKERS):
            break
    return tuple(roots)


def _in(base: str, parts: list[str]) -> str | None:
    """The file of module `parts` under `base`: parts.py, or parts/__init__.py (a package)."""
    target = os.path.join(base, *parts)
    for candidate in (target + ".py", os.path.join(target, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


@functools.lru_cache(maxsize=1024)
def _package_locations(top: str) -> tuple[tuple[str, ...], str | None]:
    """Where the import system finds top-level `top` (its search locations, its file), without running it; ((),
    None) where it finds none. Cached for the process: installed packages do not move during a report."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError, AttributeError):
        return (), None
    if spec is None:
        return (), None
    locations = tuple(spec.submodule_search_locations or ())
    origin = spec.origin if spec.origin and spec.origin.endswith(".py") else None
    return locations, origin


def _find(module: str, roots: tuple[str, ...], local_only: bool = False) -> tuple[str | None, bool]:
    """(the source file of `module`, whether it is the plan's own: found under `roots`), without importing it."""
    parts = module.split(".")
    if not all(parts):
        return None, False
    for root in roots:
        found = _in(root, parts)
        if found:
            return found, True
    if local_only:
        return None, False
    locations, origin = _package_locations(parts[0])
    if len(parts) == 1:
        return origin, False  # a package's own file is its __init__ (its origin); None for a namespace package
    for location in locations:
        found = _in(location, parts[1:])
        if found:
            return found, False
    return None, False


def _package_of(module: str, path: str) -> str:
    """The package a module's relative imports start from: itself where it is a package's __init__."""
    return module if os.path.basename(path) == "__init__.py" else module.rpartition(".")[0]


# (module, roots) -> (its closure, each file of it with its (mtime, size)): reused while none of those files changed.
_closures: dict[tuple[str, tuple[str, ...]], tuple[dict[str, str], tuple[tuple[str, tuple[int, int] | None], ...]]] = {}


def _closure(module: str, roots: tuple[str, ...]) -> dict[str, str] | None:
    """Module name -> digest of `module` and, transitively, the modules it imports from its own top-level package or
    from the plan's repository; None where `module` itself cannot be found."""
    hit = _closures.get((module, roots))
    if hit and all(_stat(path) == seen for path, seen in hit[1]):
        return hit[0]
    start, _ = _find(module, roots)
    if start is None:
        return None
    top = module.split(".")[0]
    seen: dict[str, str] = {}
    files: dict[str, tuple[int, int] | None] = {}
    todo = [(module, start)]
    while todo:
        name, path = todo.pop()
        if name in seen:
            continue
        files[path] = _stat(path)
        digest, imports = _file_digest(path)
        seen[name] = digest
        for imported, names, level in imports:
            if level:
                base = _package_of(name, path).split(".")
                base = base[:len(base) - (level - 1)] if level > 1 else base
                imported = ".".join([*base, imported] if imported else base)
            for candidate in [imported] + [f"{imported}.{n}" for n in names if n != "*"]:
                if not candidate or candidate in seen:
                    continue
                own = candidate.split(".")[0] == top
                found, local = _find(candidate, roots, local_only=not own)
                if found is not None and (own or local):
                    todo.append((candidate, found))
    _closures[(module, roots)] = (seen, tuple(files.items()))
    return seen


def _modules_digest(paths: list[str | None], roots: tuple[str, ...]) -> str:
    """One digest over the closures of the modules of these import paths ('pkg.module:attr'), "unknown" where one
    cannot be found."""
    closure: dict[str, str] = {}
    for path in paths:
        if not path:
            continue
        found = _closure(path.partition(":")[0], roots)
        if found is None:
            return UNKNOWN
        closure.update(found)
    return _digest(sorted(closure.items()))


def implementation_fingerprint(plan: Plan, provider: str = "") -> str:
    """12 hex digits over the source of what a record of `provider` ran: the kernel (""; "kernel" too), a Python
    function (its path and prepare), "native" or "compiled" (op.native, else the reference), or a torch.ops kernel
    (its name and pinned schema). "unknown" where its code is not found here, or the plan has no such provider."""
    roots = _roots(plan)
    if provider in ("", "kernel"):
        return _modules_digest([plan.op.kernel], roots)
    e = plan.implementation(provider)
    if e is None:
        return UNKNOWN
    if e.path is not None:
        return _modules_digest([e.path, e.prepare], roots)
    if e.name is not None:  # a compiled kernel: its version is the toolchain's, in the provenance
        return _digest({e.kind: e.name, "schema": kernel_schema(e)})
    return _modules_digest([plan.native_path], roots)


def benchmark_fingerprint(plan: Plan, implementations) -> str:
    """What a benchmark timed, as `name=fingerprint` pairs: the kernel and every baseline of `implementations` (a
    record's: "kernel", the built-in ones, the plan's own) the plan times. Compared pair by pair
    (harness.results.stamps): a baseline not installed where a page is made ("unknown" there) leaves the others'
    comparison standing."""
    parts = {"kernel": implementation_fingerprint(plan, "")}
    for name in implementations:
        if name != "kernel" and name in plan.baselines:
            parts[name] = implementation_fingerprint(plan, name)
    return " ".join(f"{name}={fp}" for name, fp in sorted(parts.items()))
