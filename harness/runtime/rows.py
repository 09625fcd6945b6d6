"""A call's token rows, for the checks that move them (harness.runtime.padding, batch_invariance, determinism): a
call's arguments rebuilt at another token count with chosen rows, which examples of a cell such a check runs on,
and where two results differ bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.runtime.inputs import Example, in_layout, poisoned
from harness.runtime.numerics import ordered
from harness.plan.model import Plan

# Examples with a larger tensor (the int32-overflow one) are left to the value checks: these checks hold several
# copies of every tensor at once.
MAX_ELEMENTS = 2**26


def largest(values: dict) -> int:
    return max((v.numel() for v in values.values() if isinstance(v, torch.Tensor)), default=0)


def token_dim(plan: Plan, name: str, t: torch.Tensor, n: int) -> int | None:
    """The num_tokens dimension of an argument or output `t` of a call of `n` tokens: the plan's, and for a returned
    output its first where that holds `n` rows (a returned per-tensor scale has none)."""
    if plan.has_arg(name):
        return plan.token_dim(name)
    return 0 if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == n else None


def grown(plan: Plan, base: dict, ex: Example, size: int) -> dict:
    """`base`'s arguments with every token dimension `size` rows long: token inputs uninitialised, in the example's
    layout (the caller writes every row), outputs poisoned; the others `base`'s own (copies where the op writes
    them, so that each call starts from the inputs as drawn)."""
    written = set(plan.written_args)
    out = {}
    for name, v in base.items():
        dim = plan.token_dim(name) if isinstance(v, torch.Tensor) else None
        if dim is None:
            out[name] = v.clone() if isinstance(v, torch.Tensor) and name in written else v
            continue
        shape = list(v.shape)
        shape[dim] = size
        if plan.arg(name).role == "output":
            out[name] = poisoned(shape, v.dtype, v.device)
        else:
            out[name] = in_layout(torch.empty(shape, dtype=v.dtype, device=v.device), *ex.layout(name))
    return out


def shared_from(plan: Plan, values: dict, base: dict) -> dict:
    """`values` (a call at another token count) with `base`'s tensors where they have no token dimension: the same
    weights, caches and scales, copies where the op writes them."""
    written = set(plan.written_args)
    out = dict(values)
    for name, v in base.items():
        if isinstance(v, torch.Tensor) and plan.token_dim(name) is None:
            out[name] = v.clone() if name in written else v
    return out


def token_rows(plan: Plan, values: dict, name: str, start: int, length: int) -> torch.Tensor:
    """The rows [start, start + length) of an argument along its token dimension (a view)."""
    return values[name].narrow(plan.token_dim(name), start, length)


def fill_(t: torch.Tensor, value: float) -> torch.Tensor:
    """Fill in place, fp8 too (fill_ has no fp8 kernel on a CPU)."""
    if t.is_floating_point() and t.element_size() == 1:
        return t.copy_(torch.full(t.shape, value, dtype=torch.float32, device=t.device))
    return t.fill_(value)


@dataclass(frozen=True)
class Difference:
    """Where two results of the same rows differ bit for bit: how many of how many elements, the first index and
    the two values there (None where the shapes or dtypes differ, said in `other`)."""

    count: int
    total: int
    index: tuple[int, ...] = ()
    first: float | None = None
    second: float | None = None
    other: str = ""

    def words(self, first: str = "first", second: str = "then") -> str:
        if self.other:
            return self.other
        at = ", ".join(map(str, self.index))
        return (f"{self.count} of {self.total} elements, first at [{at}]: {self.first!r} {first}, "
                f"{self.second!r} {second}")


def difference(a, b) -> Difference | None:
    """Where `a` and `b` differ bit for bit (NaN equals a NaN of the same bits; -0 equals 0); None: they do not."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None if a is None and b is None else Difference(1, 1, other=f"{type(a).__name__}, then "
                                                                          f"{type(b).__name__}")
    if a.shape != b.shape or a.dtype != b.dtype:
        return Difference(1, 1, other=f"shape {tuple(a.shape)} {a.dtype}, then {tuple(b.shape)} {b.dtype}")
    mask = ordered(a) != ordered(b)
    if not bool(mask.any()):
        return None
    index = tuple(int(i) for i in mask.nonzero()[0])
    return Difference(int(mask.sum()), a.numel(), index, _value(a[index]), _value(b[index]))


def _value(t: torch.Tensor) -> float:
    return t.float().item() if t.is_floating_point() else int(t.item())


class Probes:
    """Which examples of a cell a check runs on: the first `limit` it can (None: every one), and, once it failed in
    the cell, every one, so that hypothesis's shrinking and its replay of the minimal example run it too (a check run
    on a fixed few examples only would pass the replay and read as flaky)."""

    def __init__(self, limit: int | None):
        self.limit, self.ran, self.failing = limit, 0, False

    def wants(self, values: dict) -> bool:
        if largest(values) > MAX_ELEMENTS:
            return False
        return self.failing or self.limit is None or self.ran < self.limit

    def run(self, check, *args):
        """`check(*args)`, counted; a failure makes every later example of the cell run it."""
        self.ran += 1
        try:
            return check(*args)
        except Exception:
            self.failing = True
            raise
