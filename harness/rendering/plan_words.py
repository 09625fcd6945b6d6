"""The plan and sets of its cells in words, as several sections of the page state them: the names the op goes by,
its answers on tensor parallelism and the vLLM route, its rules and contracts, and a set of cells as a product of
axis values."""

from __future__ import annotations

import itertools
import json

from harness.rendering.markdown import code, md
from harness.plan.implementations import NATIVE, title
from harness.cells.matrix import Cell
from harness.plan.model import Plan
from harness.plan.vocabulary import AXES
from harness.cells.status import Status
from harness.vllm_facts.kernels import PINNED_VLLM, SCHEMAS
from harness.vllm_facts.names import ROUTE_KINDS, oot_flag, plugin_routes, provider_name, route_lacking, unsupported

INTENTS = {
    "drop-in": "drop-in replacement: the numerics of the op it replaces, faster",
    "fusion": "fusion: several existing ops in one kernel, fewer launches and memory round trips",
    "new-algorithm": "new algorithm for an existing op",
    "quantization": "new quantization scheme",
}


def custom_op_name(plan: Plan) -> str:
    return f"torch.ops.{plan.op_namespace}.{plan.op.name}"


def layer_path(plan: Plan) -> str | None:
    return plan.vllm.layer or plan.op.replaces


def layer_class(plan: Plan) -> str:
    path = layer_path(plan)
    return path.split(":")[-1].split(".")[-1] if path else "the model layer"


def implementation_title(name: str, entry) -> str:
    """How a page names one of the plan's implementations: by its entry's title, else its kind's words (vLLM's
    kernel), else its name."""
    return md(title(name, entry))


def _vllm_words(name: str, kernel) -> str:
    if kernel.signature:
        return f"vLLM's own kernel {code(kernel.call)}, {code(kernel.signature)} (as the plan states it)"
    if kernel.name in SCHEMAS:
        return f"vLLM's own kernel {code(kernel.call)}, {code(SCHEMAS[kernel.name])} (as vLLM {PINNED_VLLM} " \
               "registers it)"
    return f"vLLM's own kernel {code(kernel.call)} (called as the vLLM that ran it registers it)"


# What a page says each kind of implementation is (harness.plan.implementations.KINDS), given its name and entry.
KIND_WORDS = {
    "native": lambda name, e: f"{md(name)}, the native code (op.native, else the reference), eager",
    "compiled": lambda name, e: f"{md(name)}, the native code under torch.compile",
    "vllm": _vllm_words,
    "import": lambda name, e: f"the named baseline {md(name)}, {code(e.path)}",
    "torch_ops": lambda name, e: f"{md(name)}, {code(e.call)}" + (f" (registered by {code(e.library)})"
                                                                  if e.library else ""),
}


def _native_words(plan: Plan) -> str:
    return f"{code(plan.op.native)} (op.native: what vLLM runs without the custom op)" if plan.op.native else \
        f"the reference {code(plan.op.reference)}"


def _imported_timed(plan: Plan, e) -> str:
    return code(e.path) + (f", on inputs prepared once per input set by {code(e.prepare)}, outside the timed region"
                           if e.prepare else "")


# What each kind of implementation times, for the page's line of baselines.
TIMED_WORDS = {
    "native": lambda plan, e: f"{_native_words(plan)}, eager",
    "compiled": lambda plan, e: f"{'the same' if NATIVE in plan.baselines else _native_words(plan)} under "
                                "torch.compile (Inductor)",
    "vllm": lambda plan, e: "vLLM's own compiled kernel for the op",
    "import": _imported_timed,
    "torch_ops": lambda plan, e: code(e.call) + (f" (registered by {code(e.library)})" if e.library else ""),
}


def timed_words(plan: Plan, name: str) -> str:
    """What one of the plan's baselines times, in words."""
    e = plan.implementation(name)
    return TIMED_WORDS[e.kind](plan, e)


def provider_words(plan: Plan, provider: str) -> str:
    """One of the plan's implementations as a page names it, with what it runs: vLLM's kernel with its schema, a
    named baseline with its import path, a library's torch.ops kernel."""
    e = plan.implementation(provider)
    return KIND_WORDS[e.kind](provider, e)


def capture_sizes(plan: Plan) -> list[int]:
    return plan.cuda_graph_sizes()


def axis_value(axis: str, value) -> str:
    return f"tp{value}" if axis == "tp" else str(value)


def describe(plan: Plan, cells: list[Cell]) -> str:
    """A set of cells as `phase · dtype · tp · graph mode · sm` (a product of axis values, with at most a few
    exceptions named), else their ids."""
    if not cells:
        return ""
    values = {axis: [v for v in plan.matrix[axis] if any(getattr(c, axis) == v for c in cells)] for axis in AXES}
    present = {tuple(c.axes().values()) for c in cells}  # a provider's cells are described as the kernel's are
    absent = [Cell(*vs).id for vs in itertools.product(*values.values()) if vs not in present]
    if len(absent) > 8:
        ids = [c.id for c in cells]
        return ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
    parts = []
    for axis in AXES:
        vs = values[axis]
        if len(vs) == len(plan.matrix[axis]) and len(vs) > 1:
            parts.append(f"every {axis.replace('_', ' ')}")
        else:
            parts.append(", ".join(axis_value(axis, v) for v in vs))
    return " · ".join(parts) + (f" except {', '.join(absent)}" if absent else "")


def tp_answer(plan: Plan) -> str:
    sizes = ", ".join(str(t) for t in plan.matrix["tp"])
    tp = plan.tp
    if tp.kind == "trivial":
        text = "TP-trivial: every rank runs on the full, replicated inputs"
    else:
        shards = [f"{code(n)} sharded on dim {d}" + (f" ({m} merged parts)" if m > 1 else "") for n, d, m in tp.shard]
        combines = [f"{code(n)} " + (f"all-gathered on dim {d}" if how == "gather" else
                                     "all-reduced (sum)" if how == "sum" else "replicated")
                    for n, how, d in tp.combine]
        text = "sharded: " + ", ".join(shards) + ("; outputs: " + ", ".join(combines) if combines else "")
    if tp.sequence_parallel:
        text += "; sequence parallel (tokens split across ranks)"
    return f"{text}; sizes {sizes}"


def route_words(plan: Plan) -> str:
    """The plan's route into vLLM in words, naming only what the plan names (the proof is `route_proof`'s)."""
    route = plan.vllm.route
    if route is None:
        return "none named (the plan has no `vllm.route`)"
    words = ROUTE_KINDS[route].words
    if route == "ir":
        return f"{words}: provider {code(provider_name(plan))} for {code('vllm.ir.ops.' + plan.vllm.ir_op)}"
    if route == "custom_op":
        return f"{words} replacing {code(plan.vllm.layer)}, enabled by {code(oot_flag(plan))} in `custom_ops`"
    return words + (f" for {code(plan.vllm.layer)}" if plan.vllm.layer else "")


def route_proof(plan: Plan, integration: dict | None) -> str:
    """Whether the route was proven: on which vLLM, by how many integration items (calls counted, outputs compared),
    or why not."""
    why = unsupported(plan)
    if why:
        return f"not proven here: {md(why)}"
    routes = (*plugin_routes(plan), "plugin")
    items = {k: r for k, r in sorted((integration or {}).items()) if r.route in routes}
    failed = {k: r for k, r in items.items() if r.status in (Status.FAILED, Status.XPASS)}
    passed = {k: r for k, r in items.items() if r.status == Status.PASSED}
    if failed:
        first = next(iter(failed.values()))
        on = f" on vLLM {first.vllm}" if first.vllm else ""
        return f"FAILED{on} in {len(failed)} of {len(items)} integration items: {md(first.reason)}"
    if passed:  # per vLLM build and machine: a GPU's proof beside the CPU build's
        groups = {}
        for r in passed.values():
            where = r.sm if r.sm == "cpu" else f"cuda, {r.sm}"
            groups.setdefault((r.vllm or "?", where), []).append(r)
        proofs = [f"on vLLM {version} ({where}): {len(recs)} integration items passed"
                  for (version, where), recs in sorted(groups.items(), key=lambda g: (g[0][1] == "cpu", g[0]))]
        return f"proven {'; '.join(proofs)}, vLLM's layer called the kernel and matched the reference"
    reasons = sorted({r.reason for r in items.values() if r.reason})
    return f"not proven here: {md(reasons[0])}" if reasons else "not proven here: no integration item has run yet"


def vllm_answer(plan: Plan, integration: dict | None = None) -> str:
    lacking = route_lacking(plan, integration)
    if lacking:  # name nothing of a route that vLLM lacks, beyond what its item says is missing
        return f"{md(plan.vllm.target)}; the plan's route {code(plan.vllm.route)} does not exist there: {md(lacking)}"
    return f"{md(plan.vllm.target)}; {route_words(plan)}; {route_proof(plan, integration)}"


def contract_text(contract, line: int | None) -> str:
    """A contract in words, with its reason and where the plan states it."""
    why = f": {contract.why}" if contract.why else ""
    return md(f"{contract.describe()}{why} (plan line {line})")


def quantization_text(q) -> str:
    """The plan's quantization in words: "none", or each quantized output with its scales and granularity."""
    outputs = getattr(q, "outputs", None)
    if outputs is None:  # plain data
        return "none" if q in ("none", None) else json.dumps(q, sort_keys=True)
    if not outputs:
        return "none"
    parts = [f"{name}: {o.granularity.replace('_', ' ')} scales in {o.scale}" for name, o in outputs.items()]
    return "; ".join(parts) + f"; at most {q.max_step_fraction:g} of elements one quantization step off"


def rule_text(rule) -> str:
    return " · ".join(", ".join(axis_value(axis, v) for v in values) for axis, values in rule.match)
