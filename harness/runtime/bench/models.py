"""Byte and flop models: the fewest bytes one benchmark call must move and the flops it does, from the plan's
benchmark.bytes and benchmark.flops expressions (checked when the plan loads: check_models), else from the call's
tensors as built. The record's GB/s, TFLOP/s and physical bound rest on them (harness.runtime.bench.measure).
"""

from __future__ import annotations

from harness.plan.expressions import evaluate
from harness.runtime.inputs import TORCH_DTYPES
from harness.plan.model import Plan, PlanError


def _plan_line(plan: Plan, text: str) -> int | None:
    return next((i + 1 for i, line in enumerate(plan.source.text.splitlines()) if text in line), None)


def model_names(plan: Plan, dtype: str, num_tokens: int, sizes: dict[str, int]) -> dict[str, float]:
    """Names a byte or flop expression may use: the plan's sizes, num_tokens, act_bytes (activation element size)."""
    return {**sizes, "num_tokens": num_tokens, "act_bytes": _itemsize(dtype)}


def _model(plan: Plan, field_name: str, expr: str, names: dict) -> float:
    try:
        return float(evaluate(expr, names))
    except ValueError as exc:
        raise PlanError(str(plan.path), _plan_line(plan, expr), field_name,
                        f"an arithmetic expression over {', '.join(sorted(names))} ({exc})", expr) from None


def _itemsize(dtype: str) -> int:
    return TORCH_DTYPES[dtype].itemsize


def bytes_moved(plan: Plan, dtype: str, num_tokens: int, sizes: dict[str, int], returned_bytes: int = 0,
                values: dict | None = None) -> int:
    """Fewest bytes one call must move: the plan's benchmark.bytes, else every tensor argument of the call
    (`values`, as built) read once, outputs written once, mutated arguments read and written; `returned_bytes`
    for outputs the op returns."""
    if plan.benchmark.bytes:
        names = model_names(plan, dtype, num_tokens, sizes)
        return int(_model(plan, "benchmark.bytes", plan.benchmark.bytes, names))
    total = 0
    for arg in plan.tensor_args:
        t = (values or {}).get(arg.name)
        if t is None:
            continue
        nbytes = t.numel() * t.element_size()
        total += 2 * nbytes if arg.name in plan.op.mutates else nbytes
    return total + returned_bytes


def flops_done(plan: Plan, dtype: str, num_tokens: int, sizes: dict[str, int]) -> float | None:
    if not plan.benchmark.flops:
        return None
    return _model(plan, "benchmark.flops", plan.benchmark.flops, model_names(plan, dtype, num_tokens, sizes))


def check_models(plan: Plan) -> None:
    """Raise PlanError now if the plan's byte or flop expression cannot be evaluated on its sizes."""
    sizes = {name: values[0] for name, values in plan.sizes.items()}
    for dtype in plan.matrix["dtype"]:
        if plan.benchmark.bytes:
            bytes_moved(plan, dtype, 1, sizes)
        flops_done(plan, dtype, 1, sizes)
