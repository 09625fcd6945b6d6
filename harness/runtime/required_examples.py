"""Examples a cell checks whatever hypothesis draws: one past each of the kernel's size-selected code paths
(`op.paths`), and on a GPU one at vLLM's int32-overflow sizes (`numerics.int32_overflow`).

Random draws rarely reach a path taken only from 192 MiB of activations, and a CPU machine's element budget never
does: a plan names the condition, and each cell whose token range can reach it checks the cheapest example past it
(the fewest elements), as an explicit hypothesis example. The token range a path example may use reaches the
plan's largest benchmark token count of that phase as well as the scheduler's limits, since a size the plan
times is a size whose numerics must be checked. What each cell did about each path goes into its record's facts.
"""

from __future__ import annotations

import itertools

from harness.runtime.inputs import Example, per_token_elements, sizes_fit, token_cap, with_sequences, within_contract
from harness.plan.dtypes import DTYPE
from harness.plan.expressions import condition
from harness.cells.matrix import Cell
from harness.plan.model import Plan, token_probes

INT32_ELEMENTS = 2**31
MAX_SIZE_COMBINATIONS = 256  # size combinations searched for the cheapest example past a path


def token_range(plan: Plan, phase: str, sizes: dict, device: str) -> tuple[int, int]:
    """Plan.token_range, within a CPU machine's element budget."""
    low, high = plan.token_range(phase)
    cap = token_cap(plan, sizes, device)
    high = high if cap is None else min(high, cap)
    return min(low, high), high


def _fewest_tokens(expr: str, names: dict, low: int, high: int) -> int | None:
    """The fewest tokens in [low, high] past the condition, whichever way its comparisons go: `low` itself where
    it holds there (a path for short batches), the bisected threshold where it holds from some count on, else the
    first power of two (or the range's ends) where it holds (a condition on a single count); None where none does."""
    held = lambda n: condition(expr, {**names, "num_tokens": n})  # noqa: E731
    if held(low):
        return low
    if held(high):
        while low < high:
            mid = (low + high) // 2
            if held(mid):
                high = mid
            else:
                low = mid + 1
        return low
    return next((n for n in token_probes(low, high) if low < n < high and held(n)), None)


def _size_combinations(plan: Plan, device: str):
    cpu_sizes = dict(plan.numerics.cpu_sizes) if device == "cpu" else {}
    values = [cpu_sizes.get(sym, vals) for sym, vals in plan.sizes.items()]
    for combo in itertools.islice(itertools.product(*values), MAX_SIZE_COMBINATIONS):
        sizes = dict(zip(plan.sizes, combo))
        if sizes_fit(plan, sizes):
            yield sizes


def _example(plan: Plan, phase: str, num_tokens: int, sizes: dict) -> Example:
    decode = min(plan.numerics.max_num_seqs, num_tokens - 1) if phase == "chunked_prefill" else 0
    return Example(num_tokens=num_tokens, sizes=sizes, decode_tokens=decode)


def _elements(plan: Plan, ex: Example) -> int:
    return max((per_token_elements(a, ex.sizes) for a in plan.tensor_args), default=1) * ex.num_tokens


def path_example(plan: Plan, cell: Cell, device: str, expr: str) -> Example | str:
    """The cheapest example of this cell past a path's condition, or why the cell cannot reach it."""
    best, most = None, 0
    for sizes in _size_combinations(plan, device):
        low, high = token_range(plan, cell.phase, sizes, device)
        most = max(most, high)
        tokens = _fewest_tokens(expr, {**sizes, "act_bytes": DTYPE[cell.dtype].bytes}, low, high)
        if tokens is None:
            continue
        ex = _example(plan, cell.phase, tokens, sizes)
        if within_contract(plan, ex) and (best is None or _elements(plan, ex) < _elements(plan, best)):
            best = ex
    if best is not None:
        return best
    where = "on a CPU machine (numerics.cpu_element_budget)" if device == "cpu" else "in this cell's token range"
    return f"not reached {where}: no planned size reaches it within {most} tokens of {cell.phase} in {cell.dtype}"


def int32_example(plan: Plan, cell: Cell, device: str) -> Example | str:
    """A prefill example whose largest tensor holds more than 2**31 elements (GPU, eager prefill cells only)."""
    if device != "cuda":
        return "not run on a CPU machine: 2**31 elements take the interpreter hours"
    if cell.phase != "prefill" or cell.graph_mode != "eager" or cell.tp != 1:
        return "checked in the tp1 eager prefill cells"
    sizes = {sym: max(vals) for sym, vals in plan.sizes.items()}
    per_token = max((per_token_elements(a, sizes) for a in plan.tensor_args), default=0)
    if not per_token or not sizes_fit(plan, sizes):
        return "no tensor of the op grows with num_tokens at the plan's largest sizes"
    ex = Example(num_tokens=INT32_ELEMENTS // per_token + 1, sizes=sizes)
    if not within_contract(plan, ex):
        return "outside the kernel's contract at the plan's largest sizes"
    import torch  # only a GPU cell gets here

    torch.cuda.empty_cache()  # what earlier examples left cached is free for this one
    free, _ = torch.cuda.mem_get_info()
    # Every tensor argument, and per token-sized tensor a reference computing in fp32 (its intermediates): seen on
    # an H200, a 2**31-element bf16 RMSNorm example ran out at 124 GiB when its output was compared whole in fp64;
    # outputs that large are now compared in slices (runner.CHUNK_ELEMENTS) and skip the accumulation check.
    tensors = sum(max(per_token_elements(a, sizes), 1) for a in plan.tensor_args) * ex.num_tokens
    needed = tensors * (DTYPE[cell.dtype].bytes + 24)
    if needed > 0.8 * free:
        return f"needs about {needed / 2**30:.0f} GiB of the device's {free / 2**30:.0f} GiB free"
    return ex


def required_examples(plan: Plan, cell: Cell, device: str) -> tuple[list[Example], dict[str, str]]:
    """The examples this cell checks besides hypothesis's draws, and what it did about each (its record's facts)."""
    chosen, facts = [], {}
    if cell.graph_mode == "memcheck":  # the sanitizer's cost grows with every byte touched: the other modes check
        return chosen, {f"path {name}": "checked in the other graph modes (memcheck's cost grows with the bytes)"
                        for name, _ in plan.op.paths}
    for name, expr in plan.op.paths:
        found = path_example(plan, cell, device, expr)
        found = found if isinstance(found, str) else with_sequences(plan, cell, found, device)
        facts[f"path {name}"] = found if isinstance(found, str) else found.describe()
        if not isinstance(found, str):
            chosen.append(found)
    if plan.numerics.int32_overflow:
        found = int32_example(plan, cell, device)
        found = found if isinstance(found, str) else with_sequences(plan, cell, found, device)
        facts["int32 overflow"] = found if isinstance(found, str) else \
            f"{found.describe()} ({_elements(plan, found) / INT32_ELEMENTS:.2f} x 2**31 elements)"
        if not isinstance(found, str):
            chosen.append(found)
    return chosen, facts

