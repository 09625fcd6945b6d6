"""Validation tested as a class: a plan that validates never runs silently wrong.

Every field of every bundled plan (plan.yaml and kernels/plans/*.yaml) is
mutated systematically, from the parsed YAML (every key path walked): two values swapped, a range or a relation
reversed, a number scaled by 100 and by 0.01 and negated, a boolean flipped, a field dropped, its key misspelt,
an import path pointed at a sibling of another kind (the module's @triton.jit function instead of its launcher,
the reference instead of the kernel, a module-level constant, a module), a dtype or unit changed, a one-item list
written as its item. The mutated plan is written with yaml beside the others in tmp_path (the bundled plans'
imports are absolute, `kernels.…`) and validated as `python -m harness validate` does, in-process: load_plan,
then resolve and the code warnings (harness.runtime.check_code). Each mutation must end in one of

- error: a `file:line: field: expected …` PlanError;
- warning: a `file:line:` warning the unmutated plan does not give, saying what the run will not check;
- unchanged: the same Plan as before (a default written out or dropped, a form the schema normalises);
- allowed: on ALLOWED below, with a one-line reason why the run still checks what the plan says.

A mutation that validates silently and is not allowed fails the test, and so does a traceback, an error or
warning without a line, and an ALLOWED entry no mutation uses. Validation only: no cell runs.

With WRITE_VALIDATION_DOC=1 the test writes its per-field table to docs/validation.md (DOC_COMMAND).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
import yaml

from harness.runtime.check_code import plan_code_warnings
from harness.runtime.resolve import OPTIONAL_PACKAGE
from harness.plan.load import load_plan
from harness.plan.model import PlanError
from harness.plan.sections import Op

ROOT = Path(__file__).resolve().parents[1]
PLANS = ("plan.yaml", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "kernels" / "plans").glob("*.yaml")))
DOC = ROOT / "docs" / "validation.md"

# ---------------------------------------------------------------- field patterns

# Mappings whose keys are the plan's own names (arguments, size symbols, outputs, ...): in a field's pattern the
# key is the kind of name, so `op.args.x.dtype` and `op.args.weight.dtype` are one field, `op.args.<arg>.dtype`.
NAMED = {"op.args": "<arg>", "op.sizes": "<sym>", "op.paths": "<path>", "tolerance": "<dtype>",
         "tolerance.outputs": "<out>", "quantization.outputs": "<out>", "tp.inputs": "<arg>", "tp.outputs": "<out>",
         "numerics.cpu_sizes": "<sym>", "benchmark.models": "<sizes>", "implementations": "<impl>",
         "benchmark.sizes[]": "<sym>"}
NAMED_SUFFIXES = {"contract.row_stride_multiple_of": "<arg>", "contract.multiple_of": "<sym>",
                  "contract.at_least": "<sym>", "contract.at_most": "<sym>"}


def pattern(loc: tuple) -> str:
    """A location as its field's pattern: op.args.<arg>.shape[], tolerance.<dtype>.atol."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += "[]"
            continue
        named = NAMED.get(out) or next((v for k, v in NAMED_SUFFIXES.items() if out.endswith(k)), None)
        if named and not (out == "tolerance" and part == "outputs"):
            part = named
        out = f"{out}.{part}" if out else str(part)
    return out


# Fields holding an import path 'module:attribute', and the one holding a module.
IMPORT_FIELDS = ("op.kernel", "op.reference", "op.native", "op.fake", "op.generate", "op.replaces", "vllm.layer",
                 "implementations.<impl>.path", "implementations.<impl>.prepare")
MODULE_FIELDS = ("vllm.adapter",)
RELATIONS = ("divides", "at_most")  # op.sizes.<sym>.divides: <other>: reversed, <other> gets the relation
ARG_DTYPE_CHANGE = {"act": "float32", "float32": "bfloat16", "fp8": "int8", "int8": "fp8", "int32": "int64",
                    "int64": "int32", "float16": "float32", "bfloat16": "float32"}
CELL_DTYPE_CHANGE = {"fp16": "bf16", "bf16": "fp32", "fp32": "fp16"}
GRANULARITY_CHANGE = {"per_token": "per_tensor", "per_tensor": "per_token", "per_channel": "per_token",
                      "per_group": "per_token"}


def unit_change(pat: str, value: Any) -> tuple[str, Any] | None:
    """A dtype or unit changed: (kind, new value), None where the field has none."""
    if pat == "op.args.<arg>.dtype" and value in ARG_DTYPE_CHANGE:
        return "dtype", ARG_DTYPE_CHANGE[value]
    if pat in ("matrix.dtype", "matrix.dtype[]", "op.contract.dtypes[]", "op.contract.dtypes", "exclude[].dtype",
               "exclude[].dtype[]", "expect[].dtype", "expect[].dtype[]") and value in CELL_DTYPE_CHANGE:
        return "dtype", CELL_DTYPE_CHANGE[value]
    if pat == "quantization.outputs.<out>.granularity" and value in GRANULARITY_CHANGE:
        return "unit", GRANULARITY_CHANGE[value]
    return None


# ---------------------------------------------------------------- mutations


@dataclasses.dataclass(frozen=True)
class Mutation:
    plan: str  # the bundled plan, relative to the repository
    loc: tuple  # where in its data
    kind: str
    detail: str  # what changed, in words
    data: Any = dataclasses.field(repr=False, compare=False)

    @property
    def pattern(self) -> str:
        return pattern(self.loc)


def _get(data: Any, loc: tuple) -> Any:
    for part in loc:
        data = data[part]
    return data


def _walk(data: Any, loc: tuple = ()):
    """Every location of the data, parents before children."""
    yield loc
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _walk(value, loc + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _walk(value, loc + (i,))


def _typo(key: str) -> str:
    """A misspelt key: its last letter dropped (or doubled, for a short one)."""
    return key[:-1] if len(key) > 3 else key + key[-1]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scaled(value: int | float, factor: float) -> int | float:
    """value * factor, an integer where an integer stays whole (4096 * 0.01 -> 41; 12 * 0.01 -> 0.12)."""
    out = value * factor
    if isinstance(value, int) and (factor >= 1 or abs(value) >= 100):
        return int(round(out))
    return out


def _kind_of(obj: Any) -> str:
    if any(c.__module__.split(".")[0] == "triton" for c in type(obj).__mro__):
        return "jit"
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "function"
    return "constant"


def _params(obj: Any) -> tuple | None:
    try:
        return tuple(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return None


def siblings(path: str, others: tuple[str, ...]) -> dict[str, str]:
    """The import path's siblings of other kinds in its module: kind -> path. "function": one whose parameters
    differ (the plan's own other functions in that module first: the reference for the kernel, and back)."""
    module_name, _, attr = path.partition(":")
    if module_name.split(".")[0] == OPTIONAL_PACKAGE:  # imported where used, never when validating (seconds)
        return {}
    try:
        module = importlib.import_module(module_name)
        original = getattr(module, attr)
    except Exception:
        return {}
    found: dict[str, str] = {}
    candidates = [o.partition(":")[2] for o in others if o.partition(":")[0] == module_name] + sorted(vars(module))
    for name in candidates:
        obj = getattr(module, name, None)
        if name.startswith("__") or name == attr or obj is None:
            continue
        kind = _kind_of(obj)
        if kind == "function" and (getattr(obj, "__module__", None) != module_name
                                   or _params(obj) == _params(original)):
            continue
        if kind == "class" and getattr(obj, "__module__", None) != module_name:
            continue
        if kind == "constant" and not isinstance(obj, (int, float, str)):
            continue
        found.setdefault(kind, f"{module_name}:{name}")
    return found


def _module_sibling(module_name: str) -> str | None:
    """Another module of the same package (kernels.rms_norm -> kernels.host)."""
    package, _, _ = module_name.rpartition(".")
    for candidate in ("host", "fp8_quant"):
        name = f"{package}.{candidate}" if package else candidate
        if name != module_name and importlib.util.find_spec(name) is not None:
            return name
    return None


def mutations_of(plan: str, data: dict) -> list[Mutation]:
    out: list[Mutation] = []

    def add(loc: tuple, kind: str, detail: str, change) -> None:
        new = copy.deepcopy(data)
        change(new)
        out.append(Mutation(plan, loc, kind, detail, new))

    def setter(loc: tuple, value: Any):
        def change(new):
            _get(new, loc[:-1])[loc[-1]] = value
        return change

    imports = tuple(v for v in (_get(data, ("op",)).get(k) for k in ("kernel", "reference", "native")) if v)
    for loc in _walk(data):
        if not loc:
            continue
        value, parent, key = _get(data, loc), _get(data, loc[:-1]), loc[-1]
        pat = pattern(loc)
        if isinstance(parent, dict):
            add(loc, "drop", f"{key} dropped", lambda new, loc=loc: _get(new, loc[:-1]).pop(loc[-1]))
            if isinstance(key, str):
                typo = _typo(key)

                def rename(new, loc=loc, typo=typo):
                    holder = _get(new, loc[:-1])
                    items = [(typo if k == loc[-1] else k, v) for k, v in holder.items()]
                    holder.clear()
                    holder.update(items)
                add(loc, "rename", f"{key} -> {typo}", rename)
        if isinstance(value, list) and len(value) >= 2 and len({repr(v) for v in value}) > 1:
            if len(value) == 2:
                add(loc, "reverse", f"{value} -> {value[::-1]}", setter(loc, value[::-1]))
            else:
                i, j = 0, next(j for j in range(1, len(value)) if repr(value[j]) != repr(value[0]))
                swapped = list(value)
                swapped[i], swapped[j] = swapped[j], swapped[i]
                add(loc, "swap", f"[{i}] <-> [{j}]", setter(loc, swapped))
        if isinstance(value, list) and len(value) == 1:
            add(loc, "scalar", f"{value} -> {value[0]!r}", setter(loc, value[0]))
        if isinstance(value, dict) and len(value) >= 2:
            keys = list(value)
            for a, b in zip(keys, keys[1:]):  # two values swapped: adjacent keys whose values are alike
                va, vb = value[a], value[b]
                alike = (_is_number(va) and _is_number(vb)) or type(va) is type(vb) and not _is_number(va)
                if alike and repr(va) != repr(vb):
                    add(loc, "swap", f"{a} <-> {b}", lambda new, loc=loc, a=a, b=b: _swap(_get(new, loc), a, b))
            if pat == "op.args":  # the call order
                a, b = keys[0], keys[1]
                add(loc, "reorder", f"{a} and {b} in the other order",
                    lambda new, loc=loc, a=a, b=b: _reorder(_get(new, loc), a, b))
        if _is_number(value):
            for factor, kind in ((100, "x100"), (0.01, "x0.01")):
                scaled = _scaled(value, factor)
                if scaled != value:
                    add(loc, kind, f"{value!r} -> {scaled!r}", setter(loc, scaled))
            if value != 0:
                add(loc, "negate", f"{value!r} -> {-value!r}", setter(loc, -value))
        if isinstance(value, bool):
            add(loc, "not", f"{value} -> {not value}", setter(loc, not value))
        if isinstance(value, str):
            changed = unit_change(pat, value)
            if changed:
                add(loc, changed[0], f"{value} -> {changed[1]}", setter(loc, changed[1]))
            if pat in IMPORT_FIELDS and ":" in value:
                for kind, sibling in siblings(value, tuple(i for i in imports if i != value)).items():
                    add(loc, f"import:{kind}", f"{value} -> {sibling}", setter(loc, sibling))
            if pat in MODULE_FIELDS:
                sibling = _module_sibling(value)
                if sibling:
                    add(loc, "import:module", f"{value} -> {sibling}", setter(loc, sibling))
            if len(loc) == 4 and loc[:2] == ("op", "sizes") and key in RELATIONS:
                add(loc, "relation", f"{loc[2]} {key} {value} -> {value} {key} {loc[2]}",
                    lambda new, loc=loc, value=value: _reverse_relation(new, loc, value))
    return out


def _swap(mapping: dict, a: str, b: str) -> None:
    mapping[a], mapping[b] = mapping[b], mapping[a]


def _reorder(mapping: dict, a: str, b: str) -> None:
    items = list(mapping.items())
    i, j = list(mapping).index(a), list(mapping).index(b)
    items[i], items[j] = items[j], items[i]
    mapping.clear()
    mapping.update(items)


def _reverse_relation(data: dict, loc: tuple, other: str) -> None:
    """`a: {divides: b}` -> `b: {divides: a}`."""
    sizes, sym, key = _get(data, loc[:2]), loc[2], loc[3]
    sizes[sym].pop(key)
    target = sizes.get(other)
    if not isinstance(target, dict):
        target = sizes[other] = {"values": target if isinstance(target, list) else [target]}
    target[key] = sym


DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def read(plan: str) -> dict:
    return yaml.load((ROOT / plan).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def all_mutations() -> tuple[list[Mutation], int]:
    """Every plan's mutations, each distinct one once: one that makes the same change to the same value within the
    same surroundings (the field's parent) as a plan before it did (the matrix and its exclude rule are alike in
    every bundled plan) is validated in the first plan only. Returns them and how many there were in all."""
    seen, out, total = set(), [], 0
    for plan in PLANS:
        for m in mutations_of(plan, read(plan)):
            total += 1
            parent = m.loc[:-1]
            key = (m.pattern, m.kind, m.detail, repr(_get(read_cached(m.plan), parent)) if parent else m.plan)
            if key not in seen:
                seen.add(key)
                out.append(m)
    return out, total


_read: dict[str, dict] = {}


def read_cached(plan: str) -> dict:
    if plan not in _read:
        _read[plan] = read(plan)
    return _read[plan]


# ---------------------------------------------------------------- outcomes


@dataclasses.dataclass(frozen=True)
class Outcome:
    mutation: Mutation
    outcome: str  # error, warning, unchanged, allowed; failures: silent, crash, unlocated
    message: str = ""


IGNORED_FIELDS = {"line"}  # an argument's line: where the plan states it
# Models held in the file's forms, by what the runtime reads of them (a dim of -1 is the last: the same split).
RUNTIME_VIEW = {"Plan": ("op", "args", "sizes", "matrix", "exclude", "expect", "tolerance", "output_tolerance",
                         "numerics", "benchmark", "tp", "quantization", "vllm", "cuda_graph", "contract",
                         "implementations", "baselines", "providers"),
                "Op": tuple(n for n in Op.model_fields if n != "args"),  # the runtime reads the plan's args parsed
                "TensorParallel": ("kind", "shard", "combine", "sequence_parallel", "units", "replicate",
                                   "merged_outputs"),
                "Benchmark": ("decode", "prefill", "chunked_prefill", "sizes", "bytes", "flops", "models")}


def canon(value: Any) -> Any:
    """A loaded plan as plain data, without where it came from (path, text, lines)."""
    if isinstance(value, BaseModel):  # its fields, not where the plan states it (a rule's private line)
        names = RUNTIME_VIEW.get(type(value).__name__) or [n for n in type(value).model_fields
                                                           if n not in IGNORED_FIELDS]
        return (type(value).__name__,) + tuple((name, canon(getattr(value, name))) for name in names)
    if isinstance(value, dict):
        return tuple((k, canon(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(canon(v) for v in value)
    return value


def _unlocated(text: str, path: Path) -> str | None:
    """A warning without its `file:line: ` (None where it has no line)."""
    prefix = f"{path}:"
    if not text.startswith(prefix):
        return None
    line, sep, rest = text[len(prefix):].partition(": ")
    return rest if sep and line.isdigit() else None


def validate(path: Path) -> tuple[Any, list[str]]:
    """What `python -m harness validate` checks, in-process: (the Plan, its warnings); PlanError where invalid."""
    plan = load_plan(path)
    return plan, [*plan.warnings, *plan_code_warnings(plan)]


def write(folder: Path, name: str, data: Any) -> Path:
    path = folder / name
    path.write_text(yaml.dump(data, Dumper=DUMPER, sort_keys=False, width=10_000))
    return path


def classify(mutation: Mutation, path: Path, baseline: tuple[Any, set[str]]) -> Outcome:
    try:
        plan, warnings = validate(path)
    except PlanError as exc:
        located = exc.line is not None and str(exc).startswith(f"{path}:{exc.line}: ")
        return Outcome(mutation, "error" if located else "unlocated", str(exc).replace(str(path), mutation.plan))
    except Exception as exc:  # validation must say what is wrong, never raise
        return Outcome(mutation, "crash", f"{type(exc).__name__}: {exc}")
    new = []
    for w in warnings:
        text = _unlocated(w, path)
        if text is None:
            return Outcome(mutation, "unlocated", w)
        if text not in baseline[1]:
            new.append(w.replace(str(path), mutation.plan))
    if new:
        return Outcome(mutation, "warning", new[0])
    if canon(plan) == baseline[0]:
        return Outcome(mutation, "unchanged")
    reason = allowed(mutation)
    return Outcome(mutation, "allowed", reason) if reason else Outcome(mutation, "silent")


def classify_all(mutations: list[Mutation], folder: Path) -> list[Outcome]:
    baselines = {}
    for plan in PLANS:
        path = write(folder, f"{Path(plan).stem}.yaml", read(plan))
        loaded, warnings = validate(path)
        baselines[plan] = (canon(loaded), {_unlocated(w, path) for w in warnings})
    out = []
    for i, m in enumerate(mutations):
        path = write(folder, f"{Path(m.plan).stem}-{i}.yaml", m.data)
        out.append(classify(dataclasses.replace(m, data=None), path, baselines[m.plan]))  # its data no longer kept
        path.unlink()
    return out


# ---------------------------------------------------------------- mutations that do not change what is checked

ORDER = "order only: every value is still used (the first is only the simplest draw, or listed first)"
TIMED = ("what the benchmarks time, not what a cell checks: the page shows the shapes, baselines and models timed, "
         "and every timed call is re-checked against the reference")
WORDS = "words on the page: nothing is checked against them"
SCALAR = "a scalar argument: kernel and reference get the same value, and are compared as before"
SAME_INPUTS = ("an input's values, dtype or shape: kernel and reference get the same tensors, and an output unlike "
               "the reference's (shape, dtype, values) fails the cell")
ARGS_SWAP = ("two arguments' specs exchanged: kernel and reference get the same tensors; one either cannot take, or "
             "an output unlike the reference's, fails the cell")
CALL_ORDER = ("the call order: kernel and reference are called by name; what takes arguments in the plan's order "
              "(op.fake, a vllm: kernel's schema) is checked against it")
DRAWN = ("what is drawn (examples, layouts, value scales, awkward sizes, token and context ranges): more or fewer "
         "draws of the same comparison, recorded per cell")
SIZES = ("a size the op takes: drawn as listed, held to the contract and the relations (a relation no size meets, a "
         "CPU size over the element budget and a TP split no size meets are errors or warnings)")
CPU_SIZES = ("the sizes a CPU machine draws instead of the plan's: the page says what the CPU run sampled, and a size "
             "over the element budget is warned")
RELATION_MET = ("a constraint dropped that the listed sizes meet anyway (awkward sizes are off): the same sizes are "
                "drawn; awkward ones breaking it fail where the kernel cannot take them")
OPT = ("a check the plan opts into (int32 overflow, a path's example, the accumulation check's kind): turning it off "
       "is the plan's statement, and each cell's record lists what it checked")
LABEL = "a label: the name the page gives a path or a baseline"
DEFAULT_TOL = ("vLLM's own tolerance for the dtype then applies (the page names its source), what vLLM's kernel "
               "tests hold such outputs to: a kernel outside it fails")
STRICTER = "a stricter tolerance: a kernel outside it fails its cells, loudly"
TOL_SWAP = ("atol and rtol exchanged: both stay within 100x vLLM's defaults for the dtype (looser is warned), "
            "tolerances the harness cannot tell from what the author meant")
MORE_CELLS = "more cells run (an exclude rule gone): each checks as much; one that cannot pass fails, loudly"
EXCLUDE = "which cells a rule excludes: the page lists every excluded cell with the rule's why"
NOT_RUN_HERE = "TP sizes no machine here has: their cells are 'not run here', with the reason, never passed"
TP_LOUD = ("how ranks split inputs and combine outputs: a split the op does not compute alike recombines to an "
           "output unlike the unsharded reference's, failing the tp cells")
TP_GONE = ("no tp section: every rank runs the whole op on replicated inputs (kind trivial), as the page states; "
           "the tp cells then check the op unsharded")
VLLM_NAMES = ("vLLM's names (its IR op, CustomOp and providers) for the page's settings and the integration items: "
              "a wrong one fails the items run against vLLM, or they say vLLM lacks it; one left out leaves the "
              "page's setting at vLLM's default")
NO_ROUTE = "no vllm section: no route into vLLM, the page says so, and the numerics cells are unchanged"
NO_PROVIDERS = ("no provider runs through the cells: vLLM's kernel is not audited beside the kernel (still timed as "
                "its vllm baseline); the kernel's own cells check as much as before")
VLLM_PATH = ("a path into vLLM's package, imported where it is used (vLLM may be absent where plans are validated, "
             "and its import takes seconds): a reference there that is not the op's fails every cell")
VLLM_SWITCH = ("how a deployment turns vLLM's own kernel on, in words and settings on the cross-op page beside vLLM's "
               "default (a plan without one gets no row there): nothing a cell or item checks")
VLLM_KERNEL_ARGS = ("which plan argument vLLM's kernel takes for each parameter: checked against its schema's kinds; "
                    "two of one kind exchanged give outputs unlike the reference's, failing vLLM's cells, loudly")
VLLM_KERNEL_DTYPES = ("the dtypes vLLM's kernel takes: outside them its cells fail, loudly, as findings about vLLM's "
                      "kernel, never the kernel's verdict")
FUSION_GONE = ("no fusion: vLLM's pass is not checked and the page shows no fusion section; the numerics cells and "
               "vLLM's kernel's cells are unchanged")
FUSION_LAYERS = ("which of vLLM's layer sequences the fusion items build: the page names the kernel the fused node "
                 "calls (or that nothing matched), beside the one the plan names")
PREPARED = ("a baseline with a prepare takes what the prepare returns, known only when it runs: one that cannot take "
            "it is reported not run, with what it raised, and one that computes otherwise is marked 'differs' at its "
            "re-check against the reference")
UNPREPARED = ("without its prepare the baseline takes the kernel's arguments, which it binds (checked): one that "
              "needs them prepared is reported not run, with what it raised, or marked 'differs' at its re-check")

# (field pattern, mutation kind, what changed, why the run still checks what the plan says): `*` matches anything.
# Mutations that validate with no error and no new warning, to the same Plan, need none. Every entry must be used.
ALLOWED: list[tuple[str, str, str, str]] = [
    ("implementations", "drop", "*", TIMED + "; " + NO_PROVIDERS),
    ("implementations", "swap", "*", ORDER),
    ("implementations.<impl>", "drop", "*", TIMED + "; " + NO_PROVIDERS),
    ("implementations.<impl>", "rename", "*", LABEL),
    ("implementations.<impl>.role", "drop", "*", NO_PROVIDERS),
    ("implementations.<impl>.role", "reverse", "*", ORDER),
    ("implementations.<impl>.path", "import:function", "*", PREPARED),
    ("implementations.<impl>.prepare", "drop", "*", UNPREPARED),
    ("implementations.<impl>.setting", "drop", "*", WORDS),
    ("implementations.<impl>.title", "drop", "*", WORDS),
    ("benchmark", "drop", "*", TIMED),
    ("benchmark.bytes", "drop", "*", TIMED),
    ("benchmark.flops", "drop", "*", TIMED),
    ("benchmark.models*", "*", "*", WORDS),
    ("benchmark.*", "drop", "*", TIMED),
    ("benchmark.*", "reverse", "*", ORDER),
    ("benchmark.*", "swap", "*", ORDER),
    ("benchmark.*[]", "x*", "*", TIMED),
    ("exclude", "drop", "*", MORE_CELLS),
    ("exclude", "reverse", "*", ORDER),
    ("exclude[].*", "drop", "*", EXCLUDE),
    ("exclude[].dtype", "reverse", "*", ORDER),
    ("exclude[].dtype[]", "dtype", "*", EXCLUDE),
    ("matrix.*", "swap", "*", ORDER),
    ("matrix.tp[]", "x100", "*", NOT_RUN_HERE),
    ("numerics", "drop", "*", DRAWN),
    ("numerics", "swap", "examples <-> max_model_len", DRAWN),
    ("numerics.cpu_sizes*", "*", "*", CPU_SIZES),
    ("numerics.examples", "drop", "*", DRAWN),
    ("numerics.examples", "x100", "*", DRAWN),
    ("numerics.max_model_len", "drop", "*", DRAWN),
    ("numerics.max_model_len", "x*", "*", DRAWN),
    ("numerics.max_num_batched_tokens", "x100", "*", DRAWN),
    ("numerics.int32_overflow", "drop", "*", OPT),
    ("numerics.int32_overflow", "not", "*", OPT),
    ("op", "swap", "reference <-> replaces", VLLM_PATH),
    ("op.args", "reorder", "*", CALL_ORDER),
    ("op.args", "swap", "*", ARGS_SWAP),
    ("op.args.<arg>", "negate", "*", SCALAR),
    ("op.args.<arg>", "not", "*", SCALAR),
    ("op.args.<arg>", "x*", "*", SCALAR),
    ("op.args.<arg>.dtype", "drop", "*", SAME_INPUTS),
    ("op.args.<arg>.dtype", "dtype", "*", SAME_INPUTS),
    ("op.args.<arg>.init", "drop", "*", SAME_INPUTS),
    ("op.args.<arg>.init.*", "x*", "*", SAME_INPUTS),
    ("op.args.<arg>.init.*", "negate", "*", SAME_INPUTS),
    ("op.args.<arg>.shape", "reverse", "*", SAME_INPUTS),
    ("op.args.<arg>.shape[]", "x*", "*", SAME_INPUTS),
    ("op.args.<arg>.layout", "drop", "*", DRAWN),
    ("op.args.<arg>.layout", "reverse", "*", ORDER),
    ("op.args.<arg>.value_scales", "drop", "*", DRAWN),
    ("op.args.<arg>.value_scales", "swap", "*", ORDER),
    ("op.description", "drop", "*", WORDS),
    ("op.mutates", "reverse", "*", ORDER),
    ("op.outputs", "reverse", "*", ORDER + "; outputs in arguments are compared by name, returned ones by position, "
                                           "the kernel's and the reference's alike"),
    ("op.paths", "drop", "*", OPT),
    ("op.paths.<path>", "drop", "*", OPT),
    ("op.paths.<path>", "rename", "*", LABEL),
    ("op.reduction", "drop", "*", OPT),
    ("op.replaces", "drop", "*", WORDS + " (op.replaces names the layer the kernel replaces)"),
    ("op.sizes.<sym>", "reverse", "*", ORDER),
    ("op.sizes.<sym>", "swap", "*", ORDER),
    ("op.sizes.<sym>.values", "reverse", "*", ORDER),
    ("op.sizes.<sym>.values", "swap", "*", ORDER),
    ("op.sizes.<sym>.awkward", "drop", "*", DRAWN),
    ("op.sizes.<sym>.awkward", "not", "*", DRAWN),
    ("op.sizes.<sym>.*", "drop", "*", RELATION_MET),
    ("op.sizes.<sym>.even", "not", "*", RELATION_MET),
    ("op.sizes.<sym>*[]", "x*", "*", SIZES),
    ("tolerance", "drop", "*", DEFAULT_TOL),
    ("tolerance.<dtype>", "drop", "*", DEFAULT_TOL),
    ("tolerance.outputs", "drop", "*", DEFAULT_TOL),
    ("tolerance.outputs.<out>", "drop", "*", DEFAULT_TOL),
    ("tolerance.<dtype>", "swap", "atol <-> rtol", TOL_SWAP),
    ("tolerance.outputs.<out>", "swap", "atol <-> rtol", TOL_SWAP),
    ("tolerance.*", "x0.01", "*", STRICTER),
    ("tolerance.<dtype>.atol_of", "drop", "*", "the same atol, absolute instead of a fraction of the output's "
                                               "largest magnitude: looser only where that is below 1 (the fp32 one, "
                                               "over 100x vLLM's default, is warned)"),
    ("tolerance.<dtype>.atol", "x100", "2e-05 -> 0.002", "2e-3 of the largest magnitude on fp32: what TF32 dot "
                                                         "products need (paged attention's fp32 allows 5e-3)"),
    ("tolerance.outputs.<out>.rtol", "x100", "1e-06 -> *", "1e-4 relative on fp32 scales: within 100x vLLM's fp32 "
                                                           "default, a tolerance a scale's computation may need"),
    ("tp", "drop", "*", TP_GONE),
    ("tp.*", "drop", "*", TP_LOUD),
    ("tp.*", "not", "*", TP_LOUD),
    ("vllm", "drop", "*", NO_ROUTE),
    ("vllm", "swap", "*", VLLM_NAMES),
    ("vllm.adapter", "drop", "*", "the default, the kernel's own module, which is where these plans' adapters are "
                                  "(and which is checked to define what the routes call)"),
    ("vllm.custom_op", "drop", "*", VLLM_NAMES),
    ("vllm.in_tree_provider", "drop", "*", VLLM_NAMES),
    ("vllm.provider", "drop", "*", VLLM_NAMES + " (the default name is <op>_kernel)"),
    ("vllm.why_not_proven", "drop", "*", WORDS + " (why a route is not proven; the route kind's own words stand in)"),
    ("implementations.<impl>.switch*", "*", "*", VLLM_SWITCH),
    ("implementations.<impl>.args", "swap", "*", VLLM_KERNEL_ARGS),
    ("implementations.<impl>.max_step_fraction", "drop", "*", STRICTER + " (the plan's "
                                                              "quantization.max_step_fraction)"),
    ("implementations.<impl>.max_step_fraction", "x0.01", "*", STRICTER),
    ("implementations.<impl>.contract", "drop", "*", VLLM_KERNEL_DTYPES),
    ("implementations.<impl>.contract.dtypes", "drop", "*", VLLM_KERNEL_DTYPES),
    ("implementations.<impl>.contract.dtypes", "reverse", "*", ORDER),
    ("implementations.<impl>.contract.why", "drop", "*", WORDS + " (why vLLM's kernel takes those dtypes only)"),
    ("vllm.fusion", "drop", "*", FUSION_GONE),
    ("vllm.fusion.ir_ops", "drop", "*", VLLM_NAMES),
    ("vllm.fusion.residual", "*", "*", FUSION_LAYERS),
]


def _matches(pattern_: str, text: str) -> bool:
    """`*` matches anything; every other character itself (a field pattern's [] and <> included)."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern_.split("*")), text, re.S) is not None


def allowed(mutation: Mutation) -> str | None:
    """The reason of the first ALLOWED entry matching the mutation (its field, kind and what changed), else None."""
    return next((reason for pat, kind, detail, reason in ALLOWED if _matches(pat, mutation.pattern)
                 and _matches(kind, mutation.kind) and _matches(detail, mutation.detail)), None)


# ---------------------------------------------------------------- the table


OUTCOMES = ("error", "warning", "unchanged", "allowed")
FAILURES = ("silent", "crash", "unlocated")


def table(outcomes: list[Outcome]) -> str:
    """Per field: the mutations validated and how each ended."""
    rows: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        rows[o.mutation.pattern][o.outcome] += 1
    head = ["| field | mutations | errors | warnings | unchanged | allowed | failed |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    total: Counter = Counter()
    body = []
    for pat in sorted(rows):
        c = rows[pat]
        total.update(c)
        body.append(f"| `{pat}` | {sum(c.values())} | " + " | ".join(str(c[k]) for k in OUTCOMES)
                    + f" | {sum(c[k] for k in FAILURES)} |")
    foot = (f"| **all {len(rows)} fields** | **{sum(total.values())}** | "
            + " | ".join(f"**{total[k]}**" for k in OUTCOMES) + f" | **{sum(total[k] for k in FAILURES)}** |")
    return "\n".join(head + body + [foot])


def allow_list(outcomes: list[Outcome]) -> str:
    """Each allowed reason, with the fields and how many mutations it covers."""
    used: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        if o.outcome == "allowed":
            used[o.message][f"`{o.mutation.pattern}` {o.mutation.kind}"] += 1
    lines = []
    for reason, fields in sorted(used.items(), key=lambda kv: -sum(kv[1].values())):
        lines.append(f"- {reason} ({sum(fields.values())}): " + ", ".join(sorted(fields)))
    return "\n".join(lines)


DOC_HEAD = """# Validation, tested as a class

A plan that validates never runs silently wrong. `tests/test_plan_mutations.py` mutates every field of every bundled
plan (`plan.yaml`, `kernels/plans/*.yaml`), from the parsed YAML: two values
swapped, a range or a relation reversed, a number scaled by 100 and by 0.01 and negated, a boolean flipped, a field
dropped, its key misspelt, an import path pointed at a sibling of another kind (the module's `@triton.jit` function,
a function of other parameters such as the reference for the kernel, a module-level constant, a module), a dtype or
a quantization granularity changed, a one-item list written as its item. Each mutated plan is validated as `python -m
harness validate` validates it (load_plan, then resolve and the code warnings, in-process), and must end in

- **error**: `file:line: field: expected …; found …`;
- **warning**: a new `file:line:` warning saying what the run will not check, or does instead;
- **unchanged**: the same plan (a default written out or dropped, a one-item list the schema normalises);
- **allowed**: on the test's `ALLOWED` list, with its reason (below).

Anything else (a silent change, a traceback, an error or warning without its line) fails the test. A mutation that
makes the same change to the same value in the same surroundings as one in an earlier plan is validated once (the
matrix and its exclude rule are alike in every bundled plan). Paths into vLLM's package (`op.replaces`, `vllm.layer`)
get no sibling mutations: the harness imports them only where they are used.

Produced by `{command}` ({total} mutations generated, {distinct} distinct, validated in {seconds:.0f} s on a 2-core
CPU machine):

"""


# The hand-written sections between the table and the allow list (the checks that exercise a plan), kept as written.
KEPT_FROM = "## Mistakes about meaning"


def document(outcomes: list[Outcome], total: int, seconds: float) -> str:
    text = DOC.read_text() if DOC.exists() else ""
    kept = text[text.index(KEPT_FROM):text.index("## Allowed, and why")] if KEPT_FROM in text else ""
    return (DOC_HEAD.format(command=DOC_COMMAND, total=total, distinct=len(outcomes), seconds=seconds)
            + table(outcomes) + "\n\n" + kept + "## Allowed, and why\n\n" + allow_list(outcomes) + "\n")


DOC_COMMAND = "WRITE_VALIDATION_DOC=1 .venv/bin/pytest -p no:cacheprovider tests/test_plan_mutations.py -k silently"


# ---------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def validated(tmp_path_factory) -> tuple[list[Outcome], int, float]:
    """Every distinct mutation of every bundled plan, validated: (the outcomes, how many were made, seconds)."""
    start = time.perf_counter()
    mutations, total = all_mutations()
    outcomes = classify_all(mutations, tmp_path_factory.mktemp("plans"))
    return outcomes, total, time.perf_counter() - start


def test_a_plan_that_validates_never_runs_silently_wrong(validated):
    outcomes, total, seconds = validated
    print(f"\n{len(outcomes)} mutations of {len(PLANS)} plans ({total} before deduplication) in {seconds:.1f} s\n"
          + table(outcomes))
    if os.environ.get("WRITE_VALIDATION_DOC"):
        DOC.write_text(document(outcomes, total, seconds))
    failed = [o for o in outcomes if o.outcome in FAILURES]
    assert not failed, f"{len(failed)} mutations validate silently or badly:\n" + "\n".join(
        f"{o.outcome}: {o.mutation.plan}: {o.mutation.pattern} {o.mutation.kind} ({o.mutation.detail}) {o.message}"
        for o in failed[:60])


def test_every_allowed_entry_covers_a_mutation(validated):
    outcomes, _, _ = validated
    used = {next(i for i, (pat, kind, detail, reason) in enumerate(ALLOWED) if reason == o.message
                 and _matches(pat, o.mutation.pattern) and _matches(kind, o.mutation.kind)
                 and _matches(detail, o.mutation.detail))
            for o in outcomes if o.outcome == "allowed"}
    unused = [ALLOWED[i][:3] for i in range(len(ALLOWED)) if i not in used]
    assert not unused, f"ALLOWED entries no mutation needs (remove them): {unused}"


def test_every_kind_of_mutation_is_made():
    kinds = {m.kind for m in all_mutations()[0]}
    assert {"swap", "reverse", "relation", "x100", "x0.01", "negate", "not", "drop", "rename", "import:jit",
            "import:function", "import:constant", "import:module", "dtype", "unit", "scalar"} <= kinds, kinds


def test_every_bundled_plan_validates_the_same_written_back_by_yaml(tmp_path):
    """The mutated plans are written with yaml: the unmutated plans, written so, are the plans as the files say."""
    for plan in PLANS:
        original = load_plan(ROOT / plan)
        written, warnings = validate(write(tmp_path, Path(plan).name, read(plan)))
        assert canon(written) == canon(original), plan
        assert not warnings and not original.warnings, (plan, warnings)


# ---------------------------------------------------------------- the checks the mutations called for

# (what, plan, [(old, new), ...], error or warning, field, a text on the field's line, words the message must contain)
CHECKS = [
    ("a @triton.jit kernel as op.kernel", "plan.yaml",
     [("kernel: kernels.rms_norm:rms_norm ", "kernel: kernels.rms_norm:_rms_norm_kernel ")], "error", "op.kernel",
     "_rms_norm_kernel", "the Python function that launches the kernel (kernel[grid](...)), not the @triton.jit"),
    ("a @triton.jit kernel as op.reference", "plan.yaml",
     [("reference: kernels.rms_norm:rms_norm_ref", "reference: kernels.rms_norm:_rms_norm_kernel")], "error",
     "op.reference", "_rms_norm_kernel", "a Python function, not a @triton.jit kernel"),
    ("a @triton.jit kernel as a named baseline", "kernels/plans/int8_linear_column.yaml",
     [("path: kernels.int8_linear:dequantized_linear", "path: kernels.int8_linear:_int8_linear_kernel")], "error",
     "implementations.cublas.path", "path: kernels.int8_linear:_int8", "a Python function, not a @triton.jit kernel"),
    ("the in-place kernel named as the reference", "kernels/plans/fused_add_rms_norm.yaml",
     [("reference: kernels.fused_add_rms_norm:fused_add_rms_norm_ref",
       "reference: kernels.fused_add_rms_norm:fused_add_rms_norm")], "error", "op.reference", "reference:",
     "annotated to return None"),
    ("a prepare that does not take the kernel's arguments", "kernels/plans/int8_linear_column.yaml",
     [("prepare: kernels.int8_linear:dequantize_weight", "prepare: kernels.int8_linear:dequantized_linear")], "error",
     "implementations.cublas.prepare", "prepare: kernels.int8_linear:dequantized", "a prepare taking the kernel's "
     "arguments by name"),
    ("a prepare returning nothing (path and prepare swapped)", "kernels/plans/int8_linear_column.yaml",
     [("path: kernels.int8_linear_vllm:machete_linear\n    prepare: kernels.int8_linear_vllm:machete_prepack",
       "path: kernels.int8_linear_vllm:machete_prepack\n    prepare: kernels.int8_linear_vllm:machete_linear")],
     "error", "implementations.machete.prepare", "prepare: kernels.int8_linear_vllm:machete_linear",
     "annotated to return None"),
    ("a baseline that needs its prepare, without it", "kernels/plans/int8_linear_column.yaml",
     [("    prepare: kernels.int8_linear:dequantize_weight\n", "")], "error", "implementations.cublas.path",
     "path: kernels.int8_linear:dequantized_linear",
     "a baseline taking the kernel's arguments by name"),
    ("an input generator that cannot take its call", "plan.yaml",
     [("  accumulation: fp32\n", "  accumulation: fp32\n  generate: tests.plans:any_call\n")], "error",
     "op.generate", "generate:", "a function taking (values, *, plan, cell, example, sizes, generator, device)"),
    ("divides written the wrong way round", "kernels/plans/paged_attention.yaml",
     [("num_heads: {values: [32, 8], awkward: false}", "num_heads: {values: [32, 8], divides: num_kv_heads, "
       "awkward: false}"), ("divides: num_heads, ", "")], "error", "op.sizes.num_heads.divides", "num_heads:",
     "num_heads 32 meets it with none, so it is never drawn (is the relation the wrong way round"),
    ("at_most written the wrong way round", "kernels/plans/rotary_embedding.yaml",
     [("head_size: {values: [128, 64], awkward: false}", "head_size: {values: [128, 64], at_most: rotary_dim, "
       "awkward: false}"), ("at_most: head_size, ", "")], "error", "op.sizes.head_size.at_most", "head_size: {values",
     "rotary_dim 32 meets it with none"),
    ("an integer range of one value", "kernels/plans/int8_linear_column.yaml",
     [("{integers: [-127, 128]}", "{integers: [127, 128]}")], "error", "op.args.weight.init.integers", "weight:",
     "at least two integers"),
    ("an integer range past the dtype's values", "kernels/plans/int8_linear_column.yaml",
     [("{integers: [-127, 128]}", "{integers: [-12700, 12800]}")], "error", "op.args.weight.init.integers", "weight:",
     "within int8's values [-128, 128)"),
    ("a rotary base below 1", "kernels/plans/rotary_embedding.yaml", [("{base: 10000}", "{base: -10000}")], "error",
     "op.args.cos_sin_cache.init.cos_sin_cache.base", "base:", "a rotary base above 1"),
    ("a granularity the scale tensor's shape cannot hold", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
     [("granularity: per_token", "granularity: per_tensor")], "error", "quantization.outputs.out.granularity",
     "granularity:", "shape [num_tokens, 1] has (per_tensor: one value"),
    ("a step fraction given as a percentage", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
     [("granularity: per_token}\n", "granularity: per_token}\n  max_step_fraction: 1\n")], "error",
     "quantization.max_step_fraction", "max_step_fraction:", "a fraction of the elements in [0, 0.5] (0.01 is 1%)"),
    ("a step fraction above one half", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
     [("granularity: per_token}\n", "granularity: per_token}\n  max_step_fraction: 0.6\n")], "error",
     "quantization.max_step_fraction", "max_step_fraction:", "in [0, 0.5]"),
    ("atol_of: max that an all-zero output meets", "kernels/plans/int8_linear_column.yaml",
     [("bf16: {atol: 1.6e-2, rtol: 1.6e-2, atol_of: max}", "bf16: {atol: 1.0, rtol: 1.6e-2, atol_of: max}")],
     "error", "tolerance.bf16", "bf16: {atol: 1.0", "accepts an all-zero output everywhere"),
    ("an rtol that an all-zero output meets", "kernels/plans/rotary_embedding.yaml",
     [("bf16: {atol: 1.6e-2, rtol: 1.6e-2}", "bf16: {atol: 1.6e-2, rtol: 1.6}")], "error", "tolerance.bf16",
     "rtol: 1.6}", "accepts an all-zero output everywhere"),
    ("a TP split whose units are not of the dimension split", "kernels/plans/paged_attention.yaml",
     [("query: {shard: 1, units: num_heads}", "query: {shard: 2, units: num_heads}")], "error",
     "tp.inputs.query.units", "query: {shard: 2", "a symbol of the dimension split (query's dimension 2: head_size)"),
    ("units of the inner factor of a product", "kernels/plans/rotary_embedding.yaml",
     [("query: {shard: 1, units: num_heads}", "query: {shard: 1, units: head_size}")], "error",
     "tp.inputs.query.units", "query: {shard: 1, units: head_size}", "the outermost factor of the dimension split"),
    ("a tolerance 100x vLLM's default", "plan.yaml",
     [("fp16: {atol: 1.0e-2, rtol: 2.0e-3}", "fp16: {atol: 1.0e-2, rtol: 0.2}")], "warning", "tolerance.fp16",
     "fp16: {atol",
     "within 100x vLLM's default for fp16 (atol 0.001, rtol 0.001; this one passes a kernel 200x as far off"),
    ("atol_of: max above a tenth", "kernels/plans/paged_attention.yaml",
     [("fp16: {atol: 5.0e-3, rtol: 2.0e-3, atol_of: max}", "fp16: {atol: 0.5, rtol: 2.0e-3, atol_of: max}")],
     "warning", "tolerance.fp16", "fp16: {atol", "atol at most 0.1 with atol_of: max"),
    ("fp16's tolerance looser than bf16's", "kernels/plans/rotary_embedding.yaml",
     [("fp16: {atol: 2.0e-3, rtol: 2.0e-3}", "fp16: {atol: 2.0e-2, rtol: 1.6e-2}")], "warning", "tolerance.fp16",
     "fp16: {atol", "a tolerance for fp16 tighter than bf16's (atol 0.016, rtol 0.016)"),
    ("vLLM's names without a route", "plan.yaml",
     [("  route: ir\n", "")], "warning", "vllm.route", "vllm:",
     "a vllm.route for vllm.layer, vllm.ir_op"),
    ("a quantized output compared as numbers", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
     [("quantization:\n  outputs:\n    out: {scale: scales, granularity: per_token}\n", "quantization: none\n")],
     "warning", "op.args.out.dtype", "out: {shape", "out is compared as numbers"),
    ("KV heads a TP size never draws without replicate", "kernels/plans/rotary_embedding.yaml",
     [("key: {shard: 1, units: num_kv_heads, replicate: true}     #", "key: {shard: 1, units: num_kv_heads}     #"),
      ("key: {gather: 1, units: num_kv_heads, replicate: true}", "key: {gather: 1, units: num_kv_heads}")],
     "warning", "tp.inputs.key", "key: {shard: 1, units: num_kv_heads}", "num_kv_heads 2 is never drawn there"),
    ("a merged split no size meets", "kernels/plans/silu_and_mul.yaml",
     [("x: {shard: 1, merged: 2}", "x: {shard: 1, merged: 200}")], "warning", "tp.inputs.x", "x: {shard",
     "needs intermediate a multiple of 200"),
    ("CPU examples over the element budget, without cpu_sizes", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
     [("sizes: {hidden: [4096, 8192, 14336]}", "sizes: {hidden: [4096, 8192, 131072]}")], "warning", "op.sizes",
     "sizes: {hidden", "one token of 131072 elements"),
    ("a kernel's optional argument left out", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
     [("    scale_ub: {shape: [1], dtype: float32, init: {uniform: [0.5, 4.0]}, optional: true}", ""),
      ("    role: [baseline, audited]\n", "    role: [baseline]\n"),
      ("args: [out, x, scales, scale_ub]", "args: [out, x, scales]\n    signature: \"dynamic_per_token_scaled_fp8_quant"
                                           "(Tensor! result, Tensor input, Tensor! scale) -> ()\"")],
     "warning",
     "op.args", "  args:", "the kernel's optional argument scale_ub (default None) is not among the plan's arguments"),
    ("a kernel's optional argument never None", "kernels/plans/dynamic_per_token_fp8_quant.yaml",
     [("[0.5, 4.0]}, optional: true}", "[0.5, 4.0]}}")], "warning", "op.args.scale_ub", "scale_ub:",
     "is always passed a tensor, so no cell runs the kernel without one"),
]


def _changed(tmp_path: Path, plan: str, changes: list[tuple[str, str]], at: str) -> tuple[Path, int]:
    text = (ROOT / plan).read_text()
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / Path(plan).name
    path.write_text(text)
    return path, next(i for i, line in enumerate(text.splitlines(), 1) if at in line)


@pytest.mark.parametrize("what, plan, changes, outcome, field, at, words", CHECKS, ids=[c[0] for c in CHECKS])
def test_a_check_the_mutations_called_for(tmp_path, what, plan, changes, outcome, field, at, words):
    """Each fails without its check: the change validates silently there (the unmutated plans give no warning)."""
    path, line = _changed(tmp_path, plan, changes, at)
    if outcome == "error":
        with pytest.raises(PlanError) as err:
            validate(path)
        assert str(err.value).startswith(f"{path}:{line}: {field}: expected "), str(err.value)
        assert words in str(err.value), str(err.value)
        return
    warned = [w for w in validate(path)[1] if w.startswith(f"{path}:{line}: {field}: ")]
    assert len(warned) == 1 and words in warned[0], validate(path)[1]


def test_an_input_generator_taking_its_call_validates(tmp_path):
    path, _ = _changed(tmp_path, "plan.yaml", [("  accumulation: fp32\n", "  accumulation: fp32\n  generate: "
                                                                         "tests.plans:ones_for_x\n")], "generate:")
    assert validate(path)[1] == []


ADAPTER = """
def vllm_layer(layer_class, x, weight, eps, bias):
    return layer_class()


def vllm_ir_inputs():
    return {}


def vllm_forward_inputs(layer):
    return {}
"""


def test_adapter_functions_that_cannot_take_their_calls_are_warned_about(tmp_path):
    name = f"adapter_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(ADAPTER)
    path, line = _changed(tmp_path, "plan.yaml", [("adapter: kernels.rms_norm ", f"adapter: {name} ")], "adapter:")
    warned = validate(path)[1]
    assert [w.partition(": its vLLM")[0] for w in warned] == [
        f"{path}:{line}: vllm.adapter: {name}.vllm_ir_inputs takes 0 positional arguments; it is called with at least "
        "1 (the IR op's first argument)",
        f"{path}:{line}: vllm.adapter: {name}.vllm_layer needs bias, none of the plan's arguments (it gets the layer "
        "class, then the plan's arguments it names)",
        f"{path}:{line}: vllm.adapter: {name}.vllm_forward_inputs takes 1 positional arguments; it is called with at "
        "least 2 (layer, the forward's first argument)"], warned


# A list of names or numbers takes one, alone (normalised to a one-item list); a pair, a shape and a list of mappings
# (rules, size combinations) do not.
ONE_FOR_A_LIST = [
    ("op.args.<arg>.layout", "value_cache: {shape: [num_blocks, block_size, num_kv_heads, head_size], dtype: act}",
     "value_cache: {shape: [num_blocks, block_size, num_kv_heads, head_size], dtype: act, layout: strided}",
     "value_cache: {shape: [num_blocks, block_size, num_kv_heads, head_size], dtype: act, layout: [strided]}"),
    ("op.args.<arg>.value_scales", "value_scales: [normal, tiny, outliers, zero_rows]}\n    key_cache",
     "value_scales: tiny}\n    key_cache", "value_scales: [tiny]}\n    key_cache"),
    ("op.outputs", "outputs: [out]", "outputs: out", "outputs: [out]"),
    ("matrix.phase", "phase: [prefill, decode, chunked_prefill]", "phase: decode", "phase: [decode]"),
    ("exclude[].dtype", "dtype: [fp16, fp32], why", "dtype: fp16, why", "dtype: [fp16], why"),
    ("numerics.cpu_sizes.<sym>", "head_size: [32]}", "head_size: 32}", "head_size: [32]}"),
    ("benchmark.decode", "decode: [1, 64, 256]", "decode: 64", "decode: [64]"),
    ("op.sizes.<sym>.values", "block_size: {values: [16]", "block_size: {values: 16", "block_size: {values: [16]"),
]
NOT_ONE_FOR_A_LIST = [
    ("op.args.<arg>.shape", "seq_lens: {shape: [num_seqs]", "seq_lens: {shape: num_seqs", "a list of sizes"),
    ("numerics.prefill_tokens", "numerics: {examples: 8,", "numerics: {prefill_tokens: 128, examples: 8,",
     "[min, max] token counts"),
    ("exclude", "exclude:\n  - {graph_mode", "exclude:\n  {graph_mode", "a list of rules"),
]


@pytest.mark.parametrize("field, old, one, listed", ONE_FOR_A_LIST, ids=[c[0] for c in ONE_FOR_A_LIST])
def test_one_value_where_a_list_of_them_is_meant_is_that_list(tmp_path, field, old, one, listed):
    alone = canon(load_plan(_changed(tmp_path, "kernels/plans/paged_attention.yaml", [(old, one)], one[:8])[0]))
    assert alone == canon(load_plan(_changed(tmp_path, "kernels/plans/paged_attention.yaml", [(old, listed)],
                                             listed[:8])[0])), field


@pytest.mark.parametrize("field, old, one, words", NOT_ONE_FOR_A_LIST, ids=[c[0] for c in NOT_ONE_FOR_A_LIST])
def test_one_value_where_a_pair_a_shape_or_rules_are_meant_is_refused(tmp_path, field, old, one, words):
    with pytest.raises(PlanError) as err:
        load_plan(_changed(tmp_path, "kernels/plans/paged_attention.yaml", [(old, one)], one[:8])[0])
    assert err.value.field.startswith(field.split(".<")[0].split("[")[0]) and words in str(err.value), str(err.value)


def test_yaml_that_is_not_a_plan_is_explained_in_pyyaml_words(tmp_path):
    """Plans parse with libyaml where PyYAML has it, and an error is still PyYAML's own sentence, at its line."""
    path = tmp_path / "plan.yaml"
    path.write_text("op:\n  name: x\n\tintent: drop-in\n")
    with pytest.raises(PlanError) as err:
        load_plan(path)
    assert str(err.value) == f"{path}:3: (yaml): expected valid YAML; found \"found character '\\\\t' that cannot " \
                             "start any token\"", str(err.value)
