"""An op's token rows as vLLM treats them, from the plan alone: which inputs carry a num_tokens dimension (vLLM pads
them to a captured CUDA-graph size) and whether each token's rows are computed independently of the others (so the
same row run alone and inside any batch can be compared bit for bit). Read by the checks' registry, to say which
records the padding-isolation and batch-invariance checks apply to, and by the checks themselves.

Plain Python.
"""

from __future__ import annotations

from harness.plan.model import Plan

# Inputs describing the batch's sequences as a whole: a token cannot move to another batch without rebuilding them.
# Positions are not among them: a token's position travels with it, as its hidden state does.
BATCH_INITS = ("seq_lens", "query_start_loc", "block_tables", "slot_mapping")


def token_inputs(plan: Plan) -> tuple[str, ...]:
    """The tensor inputs with a num_tokens dimension: the rows vLLM pads to a captured size."""
    return tuple(a.name for a in plan.tensor_args if a.role == "input" and plan.token_dim(a.name) is not None)


def rows_dependent(plan: Plan) -> str:
    """Why one token's results may depend on other tokens of the call; "" where each token's rows are computed from
    its own rows and the shared inputs alone (a norm, an activation, a per-token quant, a linear, RoPE)."""
    if not token_inputs(plan):
        return "no input has a num_tokens dimension"
    batch = [a.name for a in plan.tensor_args if a.init in BATCH_INITS]
    if batch:
        return (f"its inputs describe the batch's sequences ({', '.join(batch)}): a token cannot move to another "
                "batch without them")
    whole = [o for o in plan.op.outputs if plan.token_dim(o) is None]
    whole += [m for m in plan.op.mutates if m not in whole and plan.token_dim(m) is None]
    if whole:
        return f"it writes {', '.join(whole)}, with no num_tokens dimension: a result of every token at once"
    return ""


def batch_invariance_probed(plan: Plan) -> bool:
    """Whether the plan's cells probe batch invariance: asked for (numerics.batch_invariance not off) and possible."""
    return plan.numerics.batch_invariance != "off" and not rows_dependent(plan)
