"""Warnings about settings that never apply to a cell, or that would mislead a reader of the run (called by
harness.plan.checks while it builds a plan)."""

from __future__ import annotations

import itertools
import math

from harness.plan.dtypes import CELL_OF_TORCH, DTYPE, QUANTIZED_DTYPES
from harness.plan.expressions import condition, names_in
from harness.plan.fields import many
from harness.plan.model import Plan, PlanError, Tolerance, Source, token_probes
from harness.plan.token_rows import rows_dependent
from harness.plan.vocabulary import AXES
from harness.plan.tolerances import DEFAULT_TOLERANCE


def _listed(values) -> str:
    return ", ".join(map(str, values))


def _tp_sizes_drawn(w: Source, plan: Plan) -> list[PlanError]:
    """A TP size's cells draw each sharded symbol as a multiple of what its split needs (ranks x merged parts, or
    whole units per rank; harness.runtime.tp.tp_multiples): a size of the plan's that is not one is never drawn in
    those cells (2 KV heads over 4 ranks without `replicate`, merged: 200 where 2 was meant)."""
    found, units = [], dict(plan.tp.units)
    splits = [(("tp", "inputs", n), n, dim, merged) for n, dim, merged in plan.tp.shard]
    merged_out = dict(plan.tp.merged_outputs)
    splits += [(("tp", "outputs", n), n, dim, merged_out.get(n, 1)) for n, how, dim in plan.tp.combine
               if how == "gather" and plan.has_arg(n)]
    for loc, name, dim, merged in splits:
        if name in plan.tp.replicate:
            continue
        d = plan.arg(name).shape[dim]
        for n in (n for n in plan.matrix["tp"] if n > 1):
            parts = n * merged
            if name in units:  # whole units per rank
                sym, step = units[name], parts
            elif d.symbol:  # N*symbol split into parts
                sym, step = d.symbol, parts // math.gcd(d.coeff, parts)
            else:
                break
            never = [v for v in plan.sizes.get(sym, ()) if v % step]
            if never:
                found.append(w.fail(loc, f"a split whose tp {n} cells draw every size of op.sizes.{sym} "
                                    f"({_listed(plan.sizes[sym])}): {name}'s dimension {dim} ({d}) over {n} ranks x "
                                    f"{merged} merged part(s) needs {sym} a multiple of {step}, so {sym} "
                                    f"{_listed(never)} is never drawn there" + (" (replicate: true replicates fewer "
                                    "units than ranks)" if name in units else ""), f"{n} ranks x merged {merged}"))
                break
    return found


# ---------------------------------------------------------------- settings that never apply


def _never_applies(w: Source, plan: Plan) -> tuple[str, ...]:
    """Settings that can never apply to any cell of the matrix, as warnings (file:line: field: ...): a narrowed
    matrix is a normal way of working, but a setting it leaves idle is said, not silently dropped."""
    m, found = plan.matrix, []
    for dt in plan.tolerance:
        if dt not in m["dtype"]:
            found.append(w.fail(("tolerance", dt), "a dtype of matrix.dtype", dt))
    if plan.cuda_graph is not None and "cuda_graph" not in m["graph_mode"]:
        found.append(w.fail(("cuda_graph",), "cuda_graph in matrix.graph_mode for capture sizes to apply",
                            list(m["graph_mode"])))
    if plan.tp.kind == "sharded" and max(m["tp"]) == 1:
        found.append(w.fail(("tp",), "a matrix.tp above 1 for sharding to apply", list(m["tp"]), field="tp.kind"))
    for phase in plan.benchmark.shapes():
        if phase not in m["phase"]:
            found.append(w.fail(("benchmark", phase), "a phase of matrix.phase", phase))
    routed = [f for f in ("layer", "ir_op", "custom_op", "provider", "adapter", "in_tree_provider", "why_not_proven")
              if getattr(plan.vllm, f) is not None]
    if plan.vllm.route is None and routed:
        found.append(w.fail(("vllm",), f"a vllm.route for vllm.{', vllm.'.join(routed)} to apply (without one the "
                            "plan has no plugin and no vLLM integration item runs)", "no vllm.route",
                            field="vllm.route"))
    if plan.numerics.batch_invariance == "required" and rows_dependent(plan):  # harness.runtime.batch_invariance
        found.append(w.fail(("numerics", "batch_invariance"), "an op whose token rows are computed independently "
                            f"for batch invariance to be checked ({rows_dependent(plan)})", "required"))
    cells = [dict(zip(AXES, v)) for v in itertools.product(*(m[a] for a in AXES))]
    for i, rule in enumerate(plan.expect):
        if not any(rule.matches(c) and not any(x.matches(c) for x in plan.exclude)
                   and c["dtype"] in (plan.contract.dtypes or m["dtype"]) for c in cells):
            found.append(w.fail(("expect", i), "a rule matching a cell the plan does not exclude", dict(rule.match)))
    found += _unreachable_axis_values(w, plan, cells)
    return tuple(str(x) for x in found)


def _never_runs(cell: dict) -> bool:
    """A cell no machine runs: memcheck is one process (tp1), the ROCm fp8 formats on an NVIDIA SM."""
    return (cell["graph_mode"] == "memcheck" and cell["tp"] > 1
            or DTYPE[cell["dtype"]].rocm_only and not cell["sm"].startswith("gfx"))


def _unreachable_axis_values(w: Source, plan: Plan, cells: list[dict]) -> list[PlanError]:
    """An axis value (graph mode, dtype, TP size, phase) the matrix names but no cell of some SM keeps, where no rule
    names it: several rules, or a rule and the contract, together remove it without a word (a contract of bf16 and
    an exclude of bf16 memcheck leave no memcheck cell). A rule naming the value, or the contract leaving its dtype
    out, says so already."""
    m, found = plan.matrix, []
    dtypes = plan.contract.dtypes
    outside = lambda c: bool(dtypes) and c["dtype"] not in dtypes  # noqa: E731
    kept = {tuple(c.values()) for c in cells
            if not _never_runs(c) and not any(x.matches(c) for x in plan.exclude) and not outside(c)}
    for sm in m["sm"]:
        for axis in (a for a in AXES if a != "sm"):
            for value in m[axis]:
                ours = [c for c in cells if c["sm"] == sm and c[axis] == value]
                if any(tuple(c.values()) in kept for c in ours):
                    continue
                if any(all(x.matches(c) for c in ours) for x in plan.exclude) or all(map(outside, ours)) \
                        or all(map(_never_runs, ours)):
                    continue  # one rule, the contract or the machine removes it alone: said where it is written
                rules = [i for i, x in enumerate(plan.exclude) if any(x.matches(c) for c in ours)]
                by = [f"exclude[{i}] (line {w.line(('exclude', i))})" for i in rules]
                if any(map(outside, ours)):
                    by.append(f"the kernel's contract (dtypes {_listed(dtypes)})")
                loc = ("exclude", rules[0]) if rules else ("op", "contract")
                found.append(w.fail(loc, f"rules that leave a {axis} {value} cell on {sm}, or one rule removing it "
                                    f"with its why: {' and '.join(by)} together remove every one",
                                    f"no {axis} {value} cell on {sm}", field="exclude" if rules else "op.contract"))
    return found



# Tolerances looser than this accept outputs that are not the op's: a kernel writing zeros passes most cells.
LOOSE_ATOL, LOOSE_RTOL = 1.0, 0.5


def _would_mislead(w: Source, plan: Plan) -> tuple[str, ...]:
    """Settings that validate but would make the run other than it reads: an error where the run would be wrong
    (no cell left, prefill draws that cannot exist), else a warning naming what the run does instead."""
    num, m, found = plan.numerics, plan.matrix, []
    cells = [dict(zip(AXES, v)) for v in itertools.product(*(m[a] for a in AXES))]
    if plan.exclude and all(any(x.matches(c) for x in plan.exclude) for c in cells):
        raise w.fail(("exclude",), "rules that leave at least one cell of the matrix to run", "every cell excluded")
    timed = [dict(c) for c in plan.benchmark.sizes]
    if timed and plan.benchmark.shapes() and not any(
            all(plan.contract.allows_size(sym, v, plan.args) for sym, v in c.items()) for c in timed):
        raise w.fail(("benchmark", "sizes"), f"a size combination the kernel's contract (op.contract, line "
                     f"{w.line(('op', 'contract'))}) allows: it takes none of these, so no GPU could time a benchmark",
                     timed)
    if num.prefill_tokens[0] > num.max_num_batched_tokens:
        raise w.fail(("numerics", "prefill_tokens"), f"a minimum within numerics.max_num_batched_tokens "
                     f"({num.max_num_batched_tokens}): vLLM never schedules a longer chunk", list(num.prefill_tokens))
    if num.prefill_tokens[1] > num.max_num_batched_tokens:
        found.append(w.fail(("numerics", "prefill_tokens"), f"a maximum within numerics.max_num_batched_tokens "
                            f"({num.max_num_batched_tokens}); prefill examples are drawn up to that",
                            list(num.prefill_tokens)))
    if num.max_num_seqs > num.max_num_batched_tokens:
        found.append(w.fail(("numerics", "max_num_seqs"), f"at most numerics.max_num_batched_tokens "
                            f"({num.max_num_batched_tokens}); decode batches are drawn up to that", num.max_num_seqs))
    found += _loose_tolerances(w, plan)
    largest_decode = num.max_num_seqs
    above = [s for s in (many(plan.cuda_graph.capture_sizes) if plan.cuda_graph else ()) if s > largest_decode]
    if above:
        found.append(w.fail(("cuda_graph", "capture_sizes"), f"sizes up to numerics.max_num_seqs ({largest_decode}), "
                            "the largest decode batch: a larger capture is never replayed by one", above))
    for a in plan.tensor_args:
        if a.name in plan.op.outputs and a.dtype in QUANTIZED_DTYPES and plan.quantization.of(a.name) is None:
            found.append(w.fail(("op", "args", a.name, "dtype"), f"a quantized output named in quantization.outputs "
                                f"(with its scale and granularity): {a.name} is compared as numbers with the default "
                                f"tolerance of {a.dtype}, not in quantization steps", a.dtype))
    for a in plan.args:  # `head_size: 128` beside op.sizes.head_size [64, 128]: the 64 cells would pass 128
        drawn = plan.sizes.get(a.name)
        if not a.is_tensor and not a.value_expr and type(a.value) is int and drawn and set(drawn) != {a.value}:
            raise w.fail(("op", "args", a.name), f"{{value: {a.name}}} for the size op.sizes.{a.name} draws "
                         f"({_listed(drawn)}): fixed, it contradicts every drawn size but {a.value}", a.value)
    for name in plan.output_tolerance:
        if plan.quantization.of(name):  # compared in steps: the tolerance would be dropped without a word
            found.append(w.fail(("tolerance", "outputs", name), f"no tolerance for a quantized output: {name} is "
                                "compared in quantization steps, a fraction of its elements (quantization."
                                f"max_step_fraction: {plan.quantization.max_step_fraction:g}) allowed one step off; "
                                "set that to 0 for an exact match", dict(atol=plan.output_tolerance[name].atol,
                                                                        rtol=plan.output_tolerance[name].rtol)))
    for i, name in enumerate(plan.op.mutates):
        if name not in plan.op.outputs:
            found.append(w.fail(("op", "mutates", i), f"inputs the op writes its result into, listed in op.outputs "
                                f"too: {name} is not compared with the reference, only let change (a scratch "
                                "buffer)", name))
    budget = num.cpu_element_budget
    # the sizes a CPU machine draws: numerics.cpu_sizes, else the plan's own where the matrix has cpu cells
    drawn_on_cpu = [dict(num.cpu_sizes)] if num.cpu_sizes else [{}] if "cpu" in m["sm"] else []
    for sym_values in drawn_on_cpu:
        sizes = {sym: max(sym_values.get(sym, vals)) for sym, vals in plan.sizes.items()}
        for a in plan.tensor_args:
            dims = [d for d in a.shape if d.symbol != "num_tokens"]
            if len(dims) < len(a.shape) and all(d.names <= set(sizes) for d in dims):
                per_token = 1
                for d in dims:
                    per_token *= d.size(sizes)
                if per_token > budget:
                    if num.cpu_sizes:
                        found.append(w.fail(("numerics", "cpu_sizes"), f"sizes whose {a.name} fits "
                                            f"numerics.cpu_element_budget ({budget}) per token; every CPU example has "
                                            f"one token of {per_token} elements", dict(num.cpu_sizes)))
                    else:
                        found.append(w.fail(("op", "sizes"), f"sizes whose {a.name} fits numerics.cpu_element_budget "
                                            f"({budget}) per token, or numerics.cpu_sizes for a CPU machine to draw "
                                            f"instead; every CPU example has one token of {per_token} elements",
                                            dict(plan.sizes)))
                    break
    found += _unreachable_paths(w, plan) + _tp_sizes_drawn(w, plan)
    return tuple(str(x) for x in found)


# vLLM's own tolerances are its kernel tests' defaults (harness.plan.tolerances): a plan's looser than this many times
# them lets a kernel that far off pass unseen. Bundled plans stay within 80x (the int8 GEMMs' fp32 rtol over dot
# products of up to 14336 terms). An `atol_of: max` above LOOSE_OF_MAX passes any element within that fraction of the
# output's largest magnitude.
LOOSE_FACTOR, LOOSE_OF_MAX = 100, 0.1
# Cell dtypes from the most precise: a tolerance for one looser than for a less precise one is one for the wrong dtype.
BY_PRECISION = ("fp32", "fp16", "bf16")


def _loose_tolerances(w: Source, plan: Plan) -> list[PlanError]:
    """Tolerances that accept what is not the op's output: an error where a kernel writing zeros passes every element
    (rtol of 1 or more; with atol_of: max, atol + rtol of 1 or more), a warning where it passes most (atol above 1,
    rtol above 0.5), where a kernel LOOSE_FACTOR times further off than vLLM's own tests allow passes, and where a
    dtype's tolerance is looser than a less precise dtype's."""
    found = []
    entries = [(("tolerance", dt), dt, tol) for dt, tol in plan.tolerance.items()]
    for out, tol in plan.output_tolerance.items():
        a = next((a for a in plan.args if a.name == out and a.is_tensor), None)
        fixed = DTYPE.get(a.dtype) if a is not None and a.dtype != "act" else None
        dt = CELL_OF_TORCH.get(fixed.torch) if fixed else None
        entries.append((("tolerance", "outputs", out), dt, tol))
    for loc, dt, tol in entries:
        found_as = {"atol": tol.atol, "rtol": tol.rtol, **({"atol_of": "max"} if tol.of_max else {})}
        if tol.rtol >= 1 or tol.of_max and tol.atol + tol.rtol >= 1:
            raise w.fail(loc, "a tolerance a kernel writing zeros fails (rtol below 1" + (", atol + rtol below 1 with "
                         "atol_of: max" if tol.of_max else "") + "): this one accepts an all-zero output everywhere",
                         found_as)
        default = DEFAULT_TOLERANCE.get(dt) if dt else None
        if dt is None:  # an output in the activation dtype: the loosest of the matrix's dtypes
            known = [DEFAULT_TOLERANCE[d] for d in plan.matrix["dtype"] if d in DEFAULT_TOLERANCE]
            default = Tolerance(max(t.atol for t in known), max(t.rtol for t in known)) if known else None
        if not tol.of_max and (tol.atol > LOOSE_ATOL or tol.rtol > LOOSE_RTOL):
            found.append(w.fail(loc, f"atol at most {LOOSE_ATOL:g} and rtol at most {LOOSE_RTOL:g} (this one accepts "
                                "outputs that are not the op's: a kernel writing zeros passes most examples)",
                                found_as))
        elif tol.of_max and tol.atol > LOOSE_OF_MAX:
            found.append(w.fail(loc, f"atol at most {LOOSE_OF_MAX:g} with atol_of: max (this one passes every element "
                                f"within {tol.atol:g} of the output's largest magnitude, whatever the kernel wrote "
                                "there: a kernel writing zeros passes most of a reduction's elements)", found_as))
        elif default:
            factor = max(tol.rtol / default.rtol if default.rtol else 0,
                         tol.atol / default.atol if default.atol and not tol.of_max else 0)
            if factor > LOOSE_FACTOR:
                found.append(w.fail(loc, f"a tolerance within {LOOSE_FACTOR}x vLLM's default for "
                                    f"{dt or 'the activation dtype'} (atol {default.atol:g}, rtol {default.rtol:g}; "
                                    f"this one passes a kernel {factor:.0f}x as far off as vLLM's own tests allow)",
                                    found_as))
    for i, fine in enumerate(BY_PRECISION):
        for coarse in BY_PRECISION[i + 1:]:
            p, q = plan.tolerance.get(fine), plan.tolerance.get(coarse)
            if p is None or q is None or p.of_max != q.of_max:
                continue
            if p.atol >= q.atol and p.rtol >= q.rtol:  # equal too: a YAML alias (`fp16: *bf16`) copies it
                found.append(w.fail(("tolerance", fine), f"a tolerance for {fine} tighter than {coarse}'s (atol "
                                    f"{q.atol:g}, rtol {q.rtol:g}) in atol or rtol: {fine} keeps more bits, so this "
                                    f"one, no tighter in either, looks like {coarse}'s, and {fine} cells pass what "
                                    f"{coarse}'s own tolerance would fail",
                                    {"atol": p.atol, "rtol": p.rtol}))
    return found


def _path_points(plan: Plan, names: set[str]):
    """The points a path's condition is tried at: every drawn value of each size symbol it names (its smallest and
    largest where the values are many), per phase its fewest and most tokens and the powers of two between, and
    each dtype's width. Any comparison, either way round, then finds where it holds and where it does not."""
    symbols = {sym: sorted(vals) if len(vals) <= 4 else [min(vals), max(vals)]
               for sym, vals in plan.sizes.items() if sym in names}
    tokens = set()
    for phase in plan.matrix["phase"]:
        low, high = plan.token_range(phase)
        tokens.update(token_probes(low, high))
    widths = sorted({DTYPE[d].bytes for d in plan.matrix["dtype"]})
    for values in itertools.product(*symbols.values()):
        for n in sorted(tokens) if "num_tokens" in names else (1,):
            for b in widths:
                yield {**dict(zip(symbols, values)), "num_tokens": n, "act_bytes": b}


def _unreachable_paths(w: Source, plan: Plan) -> list[PlanError]:
    """op.paths no GPU cell reaches within the plan's sizes and token ranges, or that every example takes (a
    condition that selects nothing)."""
    found = []
    fallback = {sym: max(vals) for sym, vals in plan.sizes.items()}  # symbols a condition does not name
    for name, expr in plan.op.paths:
        held = {condition(expr, {**fallback, **point}) for point in _path_points(plan, names_in(expr))}
        if True not in held:
            found.append(w.fail(("op", "paths", name), "a condition some cell reaches (within the plan's sizes "
                                "and token ranges none does: no example checks this path)", expr))
        elif False not in held:
            found.append(w.fail(("op", "paths", name), "a condition some examples do not meet (every example "
                                "takes this path, so it selects nothing)", expr))
    return found
