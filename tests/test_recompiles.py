"""torch_compile cells: a compile caused by the harness's own draws is not a recompile; one for a new token count is.

An op is compiled once per input variant the harness draws (an optional input as None and as a tensor, a Python
scalar's value, sizes, layouts, dtypes: Dynamo guards on each); a cell fails only where a graph compiled for the
same variant compiles again, i.e. where only num_tokens changed. Cells run in this process through run_cell, with
the `ci` profile (derandomized), on small plain-torch ops (each compile takes about a second on a CPU).
"""

from __future__ import annotations

import torch

from harness.results.store import to_json
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from tests.plans import cpu_machine_only, write_plan


def bounded_scale(x, bound, eps, blocks):
    """Rows scaled by their largest magnitude, clamped to `bound` where one is given (per-token fp8 quant's
    scale_ub); `blocks`, a Python int that changes with each batch, as unified attention's max_seqlen_k does."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    if bound is not None:
        amax = amax.clamp(max=bound)
    return x / (amax + eps)


def fake_by_token_count(x, bound, eps, blocks=None):
    """A fake that branches in Python on the token count: each side of the branch is a graph of its own."""
    if x.shape[0] > 6:
        return torch.empty_like(x)
    return torch.empty_like(x)


def _plan(tmp_path, blocks, fake: str | None = None, name: str = "bounded_scale"):
    """bounded_scale as an op of its own `name`, `blocks` its last argument (a scalar, or a size to take the value of)
    and `fake` its fake, on decode and prefill torch_compile cells of one size."""
    return write_plan(
        tmp_path / "plan.yaml",
        op={"name": name, "intent": "drop-in", "kernel": "tests.test_recompiles:bounded_scale",
            "reference": "tests.test_recompiles:bounded_scale",
            "args": {"x": {"shape": ["num_tokens", "hidden"], "dtype": "act"},
                     "bound": {"shape": [1], "dtype": "float32", "init": {"uniform": [0.5, 4.0]}, "optional": True},
                     "eps": 1.0e-6, "blocks": blocks},
            "outputs": ["y"], "sizes": {"hidden": {"values": [64], "awkward": False}},
            **({"fake": fake} if fake else {})},
        matrix={"phase": ["decode", "prefill"], "dtype": ["fp32"], "tp": [1], "graph_mode": ["torch_compile"],
                "sm": ["cpu"]},
        numerics={"examples": 8, "max_num_seqs": 32, "prefill_tokens": [2, 12]})


def _run(plan, examples: int = 8, cell: str = "decode-fp32-tp1-torch_compile-cpu") -> dict:
    return to_json(run_cell(CellTask.load(plan, cell, RunSettings(examples, "ci", None))).record)


@cpu_machine_only
def test_optional_none_and_tensor_and_a_scalar_per_batch_compile_once_each_not_a_recompile(tmp_path):
    # One size and one layout: every example differs only in num_tokens, whether `bound` is None and `blocks`.
    outcome = _run(_plan(tmp_path, {"value": "max_blocks_per_seq"}))
    assert outcome["status"] == "passed", outcome["reason"]
    facts = outcome["facts"]
    assert facts["opcheck"] == "passed"
    # a graph per variant (bound given or None, each value of blocks: its schema type `int` specialises it), none
    # per token count: a variant compiled again for a new token count fails the cell (the test below). A variant's
    # first call may compile twice where an earlier test in the same process left Dynamo state behind (seen: 17
    # graphs for 16 variants under xdist), so the count is bounded by the variants' and not pinned to it.
    assert 2 <= facts["compiles"] <= 2 * facts["shapes"], facts


@cpu_machine_only
def test_a_fake_branching_on_the_token_count_still_fails_the_cell_with_the_recompile(tmp_path, monkeypatch):
    # The harness marks the token dimension unbacked, where such a branch cannot compile at all (below). Marked only
    # dynamic, as vLLM marks it by default, the branch guards on num_tokens, and the next token count on its other
    # side compiles the same variant again.
    # Prefill cells of 2 to 12 tokens: a size 1, which a dynamic dimension specialises on, would fail it first.
    # An op of its own name: the process keeps compiled graphs per op, and these are not the harness's.
    monkeypatch.setattr(torch._dynamo.decorators, "mark_unbacked", torch._dynamo.mark_dynamic)
    plan = _plan(tmp_path, 3, "tests.test_recompiles:fake_by_token_count", "backed_scale")
    outcome = _run(plan, cell="prefill-fp32-tp1-torch_compile-cpu")
    assert outcome["status"] == "failed", outcome
    reason = outcome["reason"]
    assert reason.startswith("torch.compile recompiled when only num_tokens changed ("), reason
    assert "the token dimension must stay dynamic" in reason, reason
    assert "Dynamo's guard that failed: " in reason and "x.size()[0]" in reason, reason  # the branch, by name


@cpu_machine_only
def test_the_same_fake_under_an_unbacked_token_dimension_fails_at_compile(tmp_path):
    outcome = _run(_plan(tmp_path, 3, "tests.test_recompiles:fake_by_token_count"), 3)
    assert outcome["status"] == "failed", outcome
    assert "data-dependent" in outcome["reason"], outcome["reason"]
