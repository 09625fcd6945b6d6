"""The plan and sets of its cells in words, as several sections of the page state them: the names the op goes by,
its answers on tensor parallelism and the vLLM route, its rules and contracts, and a set of cells as a product of
axis values."""

from __future__ import annotations

import itertools
import json

from harness.rendering.markdown import code, md
from harness.spec.matrix import Cell
from harness.spec.plan import AXES, Plan
from harness.spec.vllm_ops import plugin_route, provider_name, vllm_op
from harness.spec.vllm_schemas import VLLM_KERNELS

INTENTS = {
    "drop-in": "drop-in replacement: the numerics of the op it replaces, faster",
    "fusion": "fusion: several existing ops in one kernel, fewer launches and memory round trips",
    "new-algorithm": "new algorithm for an existing op",
    "quantization": "new quantization scheme",
}


def custom_op_name(plan: Plan) -> str:
    return f"torch.ops.{plan.op_namespace}.{plan.name}"


def layer_path(plan: Plan) -> str | None:
    return plan.vllm.layer or plan.replaces


def layer_class(plan: Plan) -> str:
    path = layer_path(plan)
    return path.split(":")[-1].split(".")[-1] if path else "the model layer"


def ir_op(plan: Plan) -> str:
    return plan.vllm.ir_op or plan.name


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
    present = set(cells)
    absent = [c.id for c in (Cell(*vs) for vs in itertools.product(*values.values())) if c not in present]
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


def vllm_answer(plan: Plan) -> str:
    if plan.vllm_kernel:
        return f"none: the kernel is vLLM's own {code(VLLM_KERNELS[plan.vllm_kernel].call)}, in vLLM already"
    op = vllm_op(plan)
    if plugin_route(plan) == "ir":
        how = (f"vLLM IR provider {code(provider_name(plan))} for {code('vllm.ir.ops.' + ir_op(plan))} "
               "(`register_impl`)")
    else:
        how = f"CustomOp out-of-tree subclass of {code(layer_path(plan) or '?')} (`register_oot`)"
        if op:
            how += f", enabled by {code(op.oot_flag)} in `custom_ops`"
    return f"{md(plan.vllm.target)}; {how}"


def contract_text(contract) -> str:
    """A contract in words, with its reason and where the plan states it."""
    why = f": {contract.why}" if contract.why else ""
    return md(f"{contract.describe()}{why} (plan line {contract.line})")


def quantization_text(q) -> str:
    """The plan's quantization in words: "none", or each quantized output with its scales and granularity."""
    outputs = getattr(q, "outputs", None)
    if outputs is None:  # plain data
        return "none" if q in ("none", None) else json.dumps(q, sort_keys=True)
    if not outputs:
        return "none"
    parts = [f"{o.output}: {o.granularity.replace('_', ' ')} scales in {o.scale}" for o in outputs]
    return "; ".join(parts) + f"; at most {q.max_step_fraction:g} of elements one quantization step off"


def rule_text(rule) -> str:
    return " · ".join(", ".join(axis_value(axis, v) for v in values) for axis, values in rule.match)
