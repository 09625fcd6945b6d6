"""The trade-offs of the plan's route into vLLM: what the custom op costs or leaves unproven, from the plan and the
machines that ran it. Plain Python, no Markdown: harness.rendering.conclusions words them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.results.merge import Merged
from harness.vllm_facts.names import plugin_route


# In the page's order: "opaque" (torch.compile cannot fuse across the op), "fusion" (Inductor may fuse the native
# ops too), "graph padding", "TP-trivial", "sharded", the route the plugin takes ("ir", "custom_op", "quantization") or
# "unproven route", and "CPU interpreter" (capped token counts).
TradeOffKind = Literal["opaque", "fusion", "graph padding", "TP-trivial", "sharded", "ir", "custom_op", "quantization",
                       "unproven route", "CPU interpreter"]


@dataclass(frozen=True)
class TradeOff:
    kind: TradeOffKind
    padded_rows: int = 0  # graph padding: the most rows of work a decode batch is padded by per call
    largest_capture: int = 0  # graph padding: the largest capture size; above it the pass runs without a full graph


def tradeoffs(res: Merged) -> list[TradeOff]:
    plan = res.plan
    out = [TradeOff("opaque")]
    if plan.op.intent == "fusion":
        out.append(TradeOff("fusion"))
    if "cuda_graph" in plan.matrix["graph_mode"]:
        sizes = plan.cuda_graph_sizes()
        pad = max((b - a - 1 for a, b in zip(sizes, sizes[1:])), default=0)
        out.append(TradeOff("graph padding", padded_rows=pad, largest_capture=sizes[-1]))
    if max(plan.matrix["tp"]) > 1:
        out.append(TradeOff("TP-trivial" if plan.tp.kind == "trivial" else "sharded"))
    route = plugin_route(plan)
    if route in ("ir", "custom_op", "quantization"):
        out.append(TradeOff(route))
    elif plan.vllm.route:
        out.append(TradeOff("unproven route"))
    if any(c.sm == "cpu" and c.id in res.records and res.records[c.id].facts.get("token_cap") for c in res.cells):
        out.append(TradeOff("CPU interpreter"))
    return out
