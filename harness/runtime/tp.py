"""Tensor parallelism: one example split over N ranks as the plan's `tp` section says, and put back together.

Per input: replicated (every rank gets it whole) or sharded along a dimension; `merged: k` marks a
buffer of k concatenated parts, laid out the way vLLM's merged column-parallel linear produces
gate_up: rank r holds [gate_r | up_r]. Per output: replicated (every rank must agree), gathered
along a dimension (undoing a merged layout), or summed (the all-reduce after a row-parallel op).
With sequence parallelism every tensor with a num_tokens dimension is split by tokens, padded to
a multiple of the TP size.

Every rank of a worker group (workers.py) runs `run_cell_on_rank`; rank 0 runs the cell's
hypothesis loop with TPCheck. Per example
it broadcasts the drawn Example; every rank rebuilds the full inputs from the example's seed (no
input tensor crosses process boundaries), takes its shard, runs the op in the cell's graph mode;
rank 0 gathers the outputs, recombines them and compares them with the unsharded reference.
Ranks above 0 run `follow_cell` until rank 0 calls `finish_cell`.
"""

from __future__ import annotations

import math
import time
import traceback

import torch
import torch.distributed as dist

from harness.runtime import numerics
from harness.runtime.calls import kernel_outputs
from harness.runtime.device import detect
from harness.runtime.inputs import Example, build_args, in_layout, poisoned
from harness.cells.matrix import Cell
from harness.runtime.modes import make_runner
from harness.runtime.numerics import Mismatch
from harness.plan.model import Plan
from harness.runtime.runner import CellCheck, KernelRaised, Outcome, exception_text, not_run, raised, run_examples
from harness.runtime.tasks import CellTask
from harness.runtime.implementations import KernelUnavailable, load_implementation

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"tp recombination": 1}


# ---------------------------------------------------------------- layouts


def shard(t: torch.Tensor, dim: int, merged: int, rank: int, size: int) -> torch.Tensor:
    """Rank `rank`'s slice along `dim`: its 1/size share of each of the `merged` parts, concatenated (a copy)."""
    part = t.shape[dim] // merged
    if part * merged != t.shape[dim] or part % size:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not split into {merged} part(s) "
                         f"x {size} ranks")
    step = part // size
    return torch.cat([t.narrow(dim, j * part + rank * step, step) for j in range(merged)], dim)


def unshard(pieces: list[torch.Tensor], dim: int, merged: int) -> torch.Tensor:
    """The full tensor from every rank's shard (in rank order): the inverse of `shard`."""
    step = pieces[0].shape[dim] // merged
    return torch.cat([p.narrow(dim, j * step, step) for j in range(merged) for p in pieces], dim)


def split_tokens(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    """Sequence parallelism: rank `rank`'s run of tokens, after zero-padding to a multiple of `size` (a copy)."""
    n = t.shape[dim]
    padded = -(-n // size) * size
    if padded != n:
        pad_shape = list(t.shape)
        pad_shape[dim] = padded - n
        t = torch.cat([t, torch.zeros(pad_shape, dtype=t.dtype, device=t.device)], dim)
    step = padded // size
    return t.narrow(dim, rank * step, step).clone()


def input_shard(plan: Plan, name: str) -> tuple[int, int] | None:
    """(dim, merged parts) of a sharded input; None when every rank gets it whole."""
    return next(((dim, merged) for n, dim, merged in plan.tp.shard if n == name), None)


def output_combine(plan: Plan, name: str) -> tuple[str, int, int]:
    """(how, dim, merged parts) an output's per-rank values become one: replicated, sum or gather."""
    for out, how, dim in plan.tp.combine:
        if out == name:
            return how, dim, dict(plan.tp.merged_outputs).get(name, 1)
    spec = input_shard(plan, name)  # a sharded input written in place comes back in its own layout
    return ("gather", *spec) if spec else ("replicated", 0, 1)


def tp_multiples(plan: Plan, size: int) -> dict[str, int]:
    """Size symbol -> the multiple it must be drawn as, so every sharded dimension splits evenly."""
    need: dict[str, int] = {}
    split = list(plan.tp.shard)
    for name in plan.op.outputs:
        how, dim, merged = output_combine(plan, name)
        if how == "gather" and plan.has_arg(name):
            split.append((name, dim, merged))
    units = dict(plan.tp.units)
    for name, dim, merged in split:
        d = plan.arg(name).shape[dim]
        parts = size * merged
        if name in plan.tp.replicate:  # fewer units than ranks are replicated: any count dividing or divided
            continue
        if name in units:  # whole units (heads) per rank: the unit count splits evenly
            need[units[name]] = math.lcm(need.get(units[name], 1), parts)
        elif d.symbol:
            need[d.symbol] = math.lcm(need.get(d.symbol, 1), parts // math.gcd(d.coeff, parts))
    return need


def replicas(plan: Plan, name: str, sizes: dict, size: int) -> int:
    """How many ranks hold each unit of `name`: 1, or size / units where there are fewer units than ranks."""
    unit = dict(plan.tp.units).get(name)
    if name not in plan.tp.replicate or unit is None or sizes[unit] >= size:
        return 1
    if size % sizes[unit]:
        raise ValueError(f"{sizes[unit]} {unit} cannot be replicated evenly over {size} ranks")
    return size // sizes[unit]


def local_values(plan: Plan, ex: Example, full: dict, rank: int, size: int) -> dict:
    """This rank's keyword arguments: its shard of each input (fresh copies), its output buffers poisoned."""
    local = {}
    for arg in plan.args:
        value = full[arg.name]
        if not arg.is_tensor or value is None:  # a scalar, or an optional input left out
            local[arg.name] = value
            continue
        tdim = plan.token_dim(arg.name)
        if plan.tp.sequence_parallel and tdim is not None:
            value = split_tokens(value, tdim, rank, size)
        copies = replicas(plan, arg.name, ex.sizes, size)
        if arg.role == "output":
            how, dim, _ = output_combine(plan, arg.name)
            shape = list(value.shape)
            if how == "gather":
                shape[dim] //= size // copies
            local[arg.name] = poisoned(shape, value.dtype, value.device)
            continue
        spec = input_shard(plan, arg.name)  # replicated units: rank r holds unit r // copies, as vLLM's KV heads
        value = shard(value, *spec, rank // copies, size // copies) if spec else \
            value.clone(memory_format=torch.contiguous_format)
        local[arg.name] = in_layout(value, *ex.layout(arg.name))
    return local


def recombine(plan: Plan, name: str, pieces: list[torch.Tensor], num_tokens: int,
              sizes: dict | None = None) -> torch.Tensor:
    """One output from every rank's value, as the plan says; Mismatch when replicated ranks disagree."""
    tdim = plan.token_dim(name)
    if plan.tp.sequence_parallel and tdim is not None:
        return torch.cat(pieces, tdim).narrow(tdim, 0, num_tokens)  # drop the padding tokens
    how, dim, merged = output_combine(plan, name)
    copies = replicas(plan, name, sizes or {}, len(pieces)) if sizes else 1
    if how == "gather" and copies > 1:  # the ranks holding one unit must agree; then one of each is gathered
        for r in range(len(pieces)):
            _same(name, pieces[r - r % copies], pieces[r], r)
        return unshard(pieces[::copies], dim, merged)
    if how == "gather":
        return unshard(pieces, dim, merged)
    if how == "sum":  # the all-reduce, accumulated in fp32 so the comparison judges the kernel, not the sum
        acc = torch.float64 if pieces[0].dtype == torch.float64 else torch.float32
        total = torch.stack([p.to(acc) for p in pieces]).sum(0)
        return total.to(pieces[0].dtype)
    for r, other in enumerate(pieces[1:], 1):
        _same(name, pieces[0], other, r)
    return pieces[0]


def _same(name: str, first: torch.Tensor, other: torch.Tensor, r: int) -> None:
    """Replicated ranks must agree bit for bit (NaN where both have NaN)."""
    differ = other != first
    if first.is_floating_point():
        differ &= ~(other.isnan() & first.isnan())
    if differ.any():
        worst = float((other.double() - first.double()).abs().nan_to_num(float("inf")).max())
        raise Mismatch(f"output '{name}' is replicated across ranks, but rank {r}'s differs from its replica's in "
                       f"{int(differ.sum())} of {first.numel()} elements (max difference {worst:.3g})")


# ---------------------------------------------------------------- one rank's side


class RankRun:
    """One rank's part of a cell: the op in the cell's graph mode on its shard of each example."""

    def __init__(self, plan: Plan, cell: Cell, device: str, rank: int, size: int, runner=None):
        self.plan, self.cell, self.device, self.rank, self.size = plan, cell, device, rank, size
        self.runner = runner or make_runner(cell.graph_mode, plan, load_implementation(plan, cell.provider), device)

    def __call__(self, ex: Example, full: dict | None = None) -> tuple[dict, dict]:
        """(meta, outputs); meta["error"] says what went wrong on this rank instead of raising, so every
        rank always reaches the exchange that follows."""
        plan = self.plan
        try:
            full = full if full is not None else build_args(plan, self.cell, ex, self.device)
            local = local_values(plan, ex, full, self.rank, self.size)
            untouched = {a.name: local[a.name].clone() for a in plan.tensor_args
                         if a.role == "input" and a.name not in plan.op.mutates and a.name not in ex.omitted}
        except Exception as exc:
            return {"error": _error("raised", f"building this rank's inputs failed: {_short(exc)}")}, {}
        try:
            outputs = kernel_outputs(plan, local, self.runner(local, ex))
        except Mismatch as exc:
            return {"error": _error("mismatch", str(exc))}, {}
        except Exception as exc:
            return {"error": _error("raised", f"the kernel raised {raised(exc)}")}, {}
        try:
            for name, before in untouched.items():
                numerics.check_unchanged(name, before, local[name])
        except Mismatch as exc:
            return {"error": _error("mismatch", str(exc))}, {}
        meta = {n: (tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else None for n, t in outputs.items()}
        return {"error": None, "outputs": meta}, outputs


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exception_text(exc)[:500]}"


def _error(kind: str, message: str) -> dict:
    return {"kind": kind, "message": message, "traceback": traceback.format_exc()}


def exchange(meta: dict, outputs: dict, rank: int, size: int) -> tuple[list[dict], dict | None]:
    """Every rank's meta to every rank; then, if all ranks produced same-shaped tensors, the tensors to rank 0.

    Tensors travel as bytes, so any dtype (fp8 included) goes through gloo and NCCL alike.
    Returns (metas, {output: [per-rank tensor]}) on rank 0; pieces is None where nothing was sent.
    """
    metas: list = [None] * size
    dist.all_gather_object(metas, meta)
    if any(m["error"] for m in metas):
        return metas, None
    first = metas[0]["outputs"]
    if any(m["outputs"] != first for m in metas) or any(v is None for v in first.values()):
        return metas, None
    pieces = {}
    for name in first:
        t = outputs[name]
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        bufs = [torch.empty_like(flat) for _ in range(size)] if rank == 0 else None
        dist.gather(flat, bufs, dst=0)
        if rank == 0:
            pieces[name] = [b.view(t.dtype).reshape(t.shape) for b in bufs]
    return metas, pieces


def _broadcast(command=None):
    box = [command]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def follow_cell(plan: Plan, cell: Cell, rank: int, size: int, device: str) -> None:
    """Ranks above 0: run each example rank 0 broadcasts, until it says the cell is done."""
    run, setup_error = None, None
    try:
        run = RankRun(plan, cell, device, rank, size)
    except Exception as exc:
        setup_error = _error("raised", f"setting up the cell failed: {_short(exc)}")
    all_set_up()
    while True:
        command = _broadcast()
        if command[0] == "done":
            return
        meta, outputs = ({"error": setup_error}, {}) if setup_error else run(command[1])
        exchange(meta, outputs, rank, size)


def finish_cell() -> None:
    """Rank 0: release the other ranks from the cell (they return to waiting for the next task)."""
    _broadcast(("done",))


def all_set_up() -> None:
    """Every rank, once its plan, kernel and runner are loaded (or failed to load): returns when all are, so
    rank 0 starts timing examples only after the slowest rank's imports (harness.runtime.workers)."""
    dist.all_gather_object([None] * dist.get_world_size(), None)


# ---------------------------------------------------------------- rank 0: the check


class TPCheck(CellCheck):
    """Checks one example on every rank of the group: recombined outputs against the unsharded reference."""

    def __init__(self, plan: Plan, cell: Cell, device: str):
        super().__init__(plan, cell, device)
        self.accumulation_checked, self.accumulation_note = False, None  # tp1 cells check it on the same kernel
        self.size = cell.tp
        self.tp_multiple = tp_multiples(plan, self.size)
        self.local = RankRun(plan, cell, device, 0, self.size, self.runner)
        self.rank_traceback: str | None = None  # of the last rank that raised
        self.restart = False  # a rank raised or a collective failed: the group is replaced after the cell

    def _outputs(self, full: dict, ex: Example) -> tuple[dict, None]:
        """Every rank's outputs for the example, recombined as the plan's `tp` section says (CellCheck._check
        compares them with the unsharded reference)."""
        plan = self.plan
        try:
            _broadcast(("example", ex))
            metas, pieces = exchange(*self.local(ex, full), 0, self.size)
        except Exception:
            self.restart = True  # a collective failed: a rank died, or the ranks are out of step
            raise
        for r, meta in enumerate(metas):
            err = meta["error"]
            if err is None:
                continue
            where = f"rank {r} of {self.size}"
            if err["kind"] == "raised":
                self.rank_traceback, self.restart = f"{where}:\n{err['traceback']}", True
                raise KernelRaised(f"{where}: {err['message']}")
            raise Mismatch(f"{where}: {err['message']}")
        if pieces is None:
            raise Mismatch(_disagreement(metas))
        return {name: recombine(plan, name, pieces[name], ex.num_tokens, ex.sizes) for name in plan.op.outputs}, None


def run_cell_on_rank(task: CellTask, progress=None) -> Outcome | None:
    """One tp>1 cell, called on every rank of a group with the same task: rank 0 draws and checks (or checks only
    `task.replay`), the others follow it. Rank 0 reports `progress` (runner.run_examples), from once every rank has
    set up the cell."""
    start = time.monotonic()
    device = detect().device
    rank, size = dist.get_rank(), dist.get_world_size()
    plan, cell = task.plan, task.cell
    if size != cell.tp:
        raise RuntimeError(f"a tp{cell.tp} cell runs on a group of {cell.tp} ranks, not {size}")
    if rank != 0:
        follow_cell(plan, cell, rank, size, device)
        return None
    try:
        try:
            check = TPCheck(plan, cell, device)
        finally:
            all_set_up()
        outcome = run_examples(plan, cell, check, task.run, check.tp_multiple, start=start, progress=progress,
                               replay=task.replay)
    except KernelUnavailable as exc:  # vLLM's kernel cannot be loaded here: not run, on every rank alike
        finish_cell()
        return not_run(cell, str(exc))
    except BaseException:
        finish_cell()
        raise  # the group replies with a fault, and is replaced
    finish_cell()
    if outcome.record.status != "passed" and check.rank_traceback:
        outcome.traceback = check.rank_traceback
    outcome.fatal = outcome.fatal or check.restart  # a rank raised: its process (or device) may be in any state
    return outcome


def _disagreement(metas: list[dict]) -> str:
    for name, want in metas[0]["outputs"].items():
        for r, meta in enumerate(metas):
            got = meta["outputs"].get(name)
            if got is None:
                return f"rank {r} of {len(metas)}: output '{name}' is not a tensor"
            if got != want:
                return (f"output '{name}': rank {r} produced {got[1]} of shape {got[0]}, rank 0 {want[1]} of shape "
                        f"{want[0]}: every rank must produce its shard in the same shape")
    return "the ranks returned different outputs"
