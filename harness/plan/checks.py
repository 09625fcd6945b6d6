"""A Plan that fits its schema, checked across fields as pydantic cannot express (`check`).

Run as the last step of the Plan's validation (Plan._complete), once pydantic has checked every key, type, range and
vocabulary; what is left needs more than one field at a time: a shape's symbols defined in op.sizes, outputs that
the op writes, rule values of the matrix, a contract something of the plan meets, a TP split that divides its
dimension. Each failure is a PlanError at the line of the field it names (harness.plan.model.Source). What needs the
same reading the checks do (the arguments parsed, the warnings) the Plan computes with the functions here, once, as it
is validated, so a validated Plan is complete however it was made (a file loaded, `Plan.model_validate(data)`) and a
copy or a pickle keeps it. Nothing here imports the user's code.
"""

from __future__ import annotations

import re
from typing import Any

from harness.plan.dtypes import DTYPE, QUANTIZED_DTYPES
from harness.plan.expressions import condition, evaluate, formula_text, is_condition, names_in
from harness.plan.fields import many, number_as_text
from harness.plan.implementations import BUILTIN, COMMON, COMPILED, KINDS, NATIVE, title
from harness.plan.model import Benchmark, Plan, TensorParallel, Source
from harness.plan.sections import Arg, Contract, Dim, Gather, Numerics, ParamInit, Quantization, Rule, \
    Shard, SizeArg, SizeSpec, TensorArg
from harness.plan.vocabulary import BUILTIN_SYMBOLS, PARAM_INITS, VALUE_SCALES
from harness.vllm_facts.attention_layout import attention_problem
from harness.vllm_facts.names import implementation_unsupported
from harness.vllm_facts.kernels import parse_schema
from harness.plan.yaml_lines import Loc, dotted
from harness.plan.plan_warnings import _never_applies, _would_mislead


# What each route into vLLM needs the plan to name: the IR op the provider registers for and the layer whose calls
# reach it; the CustomOp layer the out-of-tree class replaces; the linear layer a quantization method serves.
ROUTE_NEEDS = {"ir": ("ir_op", "layer"), "custom_op": ("layer",), "quantization": ("layer",),
               "attention_backend": ("layer",)}
ROUTE_NEEDS_WHY = {"ir_op": "vLLM IR op the provider registers for", "layer": "vLLM layer whose calls reach the kernel"}


def keys_of(w: Source, loc: Loc, mapping: dict, allowed: tuple[str, ...] | dict) -> None:
    """Keys that must be names of the plan's (arguments, outputs, size symbols)."""
    for key in mapping:
        if key not in allowed:
            raise w.fail(loc + (key,), f"one of the keys {', '.join(allowed)}", key)


def no_repeats(w: Source, loc: Loc, values: tuple) -> None:
    """A list whose repeats would mean nothing, or something else than they read (a returned output named twice)."""
    for i, v in enumerate(values):
        if v in values[:i]:
            raise w.fail(loc + (i,), f"values without repeats ({v} is listed before)", v)


def check(plan: Plan) -> Plan:
    """A validated Plan checked across its fields, in the file's order of concern (of two errors, the first a reader
    meets is said), and what it derives computed (its arguments parsed, its warnings; TP dims from the front)."""
    w, op, matrix = plan.source, plan.op, plan.matrix
    if op.kernel.startswith("vllm:"):  # vLLM's own kernel is not a kernel under test but a provider of the op
        raise w.fail(("op", "kernel"), "the import path of the kernel under test; vLLM's own kernel for the op runs "
                     "through the same cells as `implementations.vllm` with `role: [baseline, audited]`", op.kernel)
    sizes = plan.sizes
    _sizes(w, op.sizes, sizes)
    args = plan.args
    tensor_names = tuple(a.name for a in args if a.is_tensor)
    no_repeats(w, ("op", "outputs"), op.outputs)
    no_repeats(w, ("op", "mutates"), op.mutates)
    for i, name in enumerate(op.mutates):
        if name not in tensor_names:
            raise w.fail(("op", "mutates", i), f"one of {', '.join(tensor_names)}", name)
    for i, out in enumerate(op.outputs):
        a = next((a for a in args if a.name == out), None)
        if a is not None and a.role != "output" and out not in op.mutates:
            raise w.fail(("op", "outputs", i), "an output argument (role: output), a mutated input, or a name for a "
                         "returned value", out)
    for a in args:
        if a.role == "output" and a.name not in op.outputs:
            raise w.fail(("op", "args", a.name, "role"), "output arguments to be listed in op.outputs", a.name)
    for axis, values in matrix.items():
        if len(set(values)) != len(values):
            raise w.fail(("matrix", axis), "values without repeats", list(values))
    _numerics(w, plan.numerics, sizes)

    def contract_of(loc: Loc, c: Contract) -> None:
        _contract(w, loc, c, args, sizes, matrix["dtype"], plan.numerics.cpu_sizes)

    if plan.tolerances is not None:
        keys_of(w, ("tolerance", "outputs"), plan.tolerances.outputs, op.outputs)
    vllm = plan.vllm
    if vllm.provider in ("native", "unfused"):
        raise w.fail(("vllm", "provider"), "a provider name of lowercase letters, digits and _ other than native "
                     "and unfused", vllm.provider)
    for field_name in ROUTE_NEEDS.get(vllm.route, ()):
        if getattr(vllm, field_name) is None:
            raise w.fail(("vllm", "route"),
                         f"vllm.{field_name} beside route {vllm.route} (the {ROUTE_NEEDS_WHY[field_name]})",
                         f"route {vllm.route} without vllm.{field_name}")
    _rules(w, "exclude", plan.exclude, matrix)
    _rules(w, "expect", plan.expect, matrix)
    _benchmark(w, plan.benchmark, sizes, op.sizes, plan.numerics)
    plan = plan.model_copy(update={"tp": _tp(w, plan.tp, args, op.outputs, matrix["tp"], tuple(sizes))})
    _quantization(w, plan.quantization, args, op.outputs)
    if op.contract is not None:
        contract_of(("op", "contract"), op.contract)
    _paths(w, op.paths, sizes)
    _check_models(w, plan)
    _implementations(w, plan, contract_of)
    unfit = attention_problem(plan)  # the attention_backend route maps vLLM's tensors onto the plan's arguments
    if unfit:
        raise w.fail(("vllm", "route"), f"for route attention_backend, {unfit}", plan.vllm.route)
    plan.warnings  # noqa: B018 -- computed now: an error among them is the plan's, raised as it is validated
    return plan


def parse_args(plan: Plan) -> tuple[Arg, ...]:
    """The plan's arguments parsed: shapes over op.sizes' and the built-in symbols, inits and scalars checked."""
    return _args(plan.source, plan.op.args, set(plan.sizes) | set(BUILTIN_SYMBOLS))


def warnings_of(plan: Plan) -> tuple[str, ...]:
    """Old keys read into the new form, settings that can never apply to a cell, and settings that would mislead
    (of which some are errors, raised)."""
    w = plan.source
    return tuple(str(w.fail(loc, expected, "the old keys", field=dotted(loc))) for loc, expected in w.deprecated) \
        + _never_applies(w, plan) + _would_mislead(w, plan)


def _implementations(w: Source, plan: Plan, contract_of) -> None:
    """Each implementation beside the kernel: a name of its own, the fields of its kind and no others, its arguments
    the plan's and its schema's where the schema is known before a run; vLLM's kernel, where a fusion produces it,
    switched by the pass's flag."""
    for name, e in plan.implementations.items():
        loc, kind = ("implementations", name), KINDS[e.kind]
        if not re.fullmatch(r"[a-z][a-z0-9_]*", str(name)) or name == "kernel":
            raise w.fail(loc, "an implementation name of lowercase letters, digits and _ other than kernel (the "
                         "kernel under test is op.kernel)" + (" (YAML reads off/on/yes/no/true/false as a boolean: "
                         "quote the name)" if isinstance(name, bool) else ""), name, field=dotted(loc))
        if name not in BUILTIN and e.kind in BUILTIN:
            named = " or ".join(k for k in KINDS if k not in BUILTIN)
            raise w.fail(loc + ("kind",), f"{named} ({e.kind} is the entry named {e.kind})", e.kind)
        fields = (*kind.required, *kind.optional, *COMMON)
        for field_name in sorted(e.model_fields_set - set(fields) - {"kind"}, key=list(type(e).model_fields).index):
            raise w.fail(loc + (field_name,), f"a field of a {e.kind} implementation ({', '.join(fields)})",
                         field_name)
        for field_name in kind.required:
            if getattr(e, field_name) is None:
                raise w.fail(loc, f"{field_name} for a {e.kind} implementation ({kind.describes})",
                             f"no {field_name}")
        no_repeats(w, loc + ("role",), e.role)
        if "audited" in e.role and e.kind in (NATIVE, COMPILED):
            raise w.fail(loc + ("role",), "baseline (the reference runs in every cell already)", list(e.role))
        if "default" in e.role and e.kind in BUILTIN:
            raise w.fail(loc + ("role",), "baseline or audited (default is for the plan's own implementations: "
                         "native, compiled and vLLM's kernel are what vLLM runs per profile already)", list(e.role))
        if "default" in e.role and "baseline" not in e.role:
            raise w.fail(loc + ("role",), "baseline beside default (the decisions weigh the kernel against what vLLM "
                         "runs in its place: it is timed)", list(e.role))
        if kind.name_form and not re.fullmatch(kind.name_form[0], e.name):
            raise w.fail(loc + ("name",), kind.name_form[1], e.name)
        if e.contract is not None:
            contract_of(loc + ("contract",), e.contract)
        if e.signature:
            try:
                parse_schema(e.signature)
            except ValueError as exc:
                raise w.fail(loc + ("signature",), "a schema 'name(Tensor! out, Tensor x, float eps) -> ()'",
                             str(exc)) from None
        for i, arg in enumerate(e.args or ()):
            if not plan.has_arg(arg):
                raise w.fail(loc + ("args", i), f"an argument of the plan ({', '.join(a.name for a in plan.args)})",
                             arg)
        why = implementation_unsupported(plan, name)
        if why:
            raise w.fail(loc + ("args",), f"the plan arguments {title(name, e)} takes ({why})", e.args)
    defaults = [name for name, e in plan.implementations.items() if "default" in e.role]
    if len(defaults) > 1:  # what vLLM runs in the kernel's place is one implementation
        raise w.fail(("implementations", defaults[1], "role"), f"default on one implementation only ({defaults[0]} "
                     "has it: what vLLM runs in the kernel's place, in every profile)",
                     list(plan.implementation(defaults[1]).role))
    kernel, fusion = plan.vllm_kernel, plan.vllm.fusion
    if fusion is not None and (kernel is None or kernel.switch is None or kernel.switch.kind != "fusion_pass"):
        raise w.fail(("vllm", "fusion"), "implementations.vllm beside it, the kernel the pass rewrites into, with "
                     "switch {kind: fusion_pass, name: <the pass_config flag>}", "a fusion without that kernel")


# ---------------------------------------------------------------- op


def _sizes(w: Source, specs: dict[str, SizeSpec], sizes: dict[str, tuple[int, ...]]) -> None:
    for sym, spec in specs.items():
        loc = ("op", "sizes", sym)
        if sym in BUILTIN_SYMBOLS:
            raise w.fail(loc, f"a symbol other than the built-in {', '.join(BUILTIN_SYMBOLS)}", sym)
        if not spec.values:
            raise w.fail(loc, "at least one size", [])
        for key in ("divides", "at_most"):
            other = getattr(spec, key)
            if other is not None and (other not in specs or other == sym):
                raise w.fail(loc + (key,), "another symbol of op.sizes", other)
        bad = [v for v in spec.values if v % spec.multiple_of or (spec.even and v % 2)]
        if bad:
            raise w.fail(loc + ("values",), "values that meet the symbol's own constraints (multiple_of, even)",
                         bad[0], field=dotted(loc))
    _relations_met(w, sizes, specs)


def _relations_met(w: Source, sizes: dict[str, tuple[int, ...]], specs: dict[str, SizeSpec]) -> None:
    """Each relation between two symbols (`a: {divides: b}`, `a: {at_most: b}`) holds for every size of either with
    some size of the other: a size that meets it with none is never drawn (another is drawn in its place), which is
    what a relation written the wrong way round does (`num_heads: {divides: num_kv_heads}`)."""
    for sym, spec in specs.items():
        for key in ("divides", "at_most"):
            other = getattr(spec, key)
            if other is None:
                continue
            holds = (lambda a, b: b % a == 0) if key == "divides" else (lambda a, b: a <= b)
            words = "divides" if key == "divides" else "is at most"
            mine = [v for v in sizes[sym] if not any(holds(v, o) for o in sizes[other])]
            theirs = [o for o in sizes[other] if not any(holds(v, o) for v in sizes[sym])]
            if mine or theirs:
                never, of = (mine[0], sym) if mine else (theirs[0], other)
                raise w.fail(("op", "sizes", sym, key), f"a relation every size of {sym} ({_listed(sizes[sym])}) and "
                             f"of {other} ({_listed(sizes[other])}) meets with some size of the other ({sym} {words} "
                             f"{other}): {of} {never} meets it with none, so it is never drawn (is the relation the "
                             f"wrong way round, `{other}: {{{key}: {sym}}}`?)", f"{sym}: {{{key}: {other}}}")


def _listed(values) -> str:
    return ", ".join(map(str, values))


def _paths(w: Source, paths: tuple[tuple[str, str], ...], sizes: dict) -> None:
    """op.paths: each a condition over the sizes, num_tokens and act_bytes (a plain number would always hold)."""
    known = set(sizes) | {"num_tokens", "act_bytes"}
    for name, expr in paths:
        loc = ("op", "paths", name)
        try:
            if not is_condition(expr):
                raise ValueError("an expression that is not a comparison")
            unknown = names_in(expr) - known
            if unknown:
                raise ValueError(f"unknown name {sorted(unknown)[0]!r}")
            condition(expr, {k: 1 for k in known})
        except ValueError as exc:
            raise w.fail(loc, f"a condition over {', '.join(sorted(known))} (e.g. num_tokens * hidden * act_bytes "
                         f">= 192 * 2**20): {exc}", expr) from None


def _dim(entry: int | str) -> Dim | None:
    if isinstance(entry, int):
        return Dim(text=str(entry), coeff=entry)
    m = re.fullmatch(r"\s*(?:(\d+)\s*\*\s*)?([A-Za-z_]\w*)\s*", entry)
    if m:
        return Dim(text=entry.strip(), coeff=int(m.group(1) or 1), symbol=m.group(2))
    try:
        names_in(entry)
    except ValueError:
        return None
    return Dim(text=entry.strip())


def _expr(w: Source, loc: Loc, value: int | float | str, symbols: set[str]) -> str:
    """A size expression (a number, a symbol or arithmetic over symbols) naming only known symbols."""
    try:
        unknown = sorted(names_in(str(value)) - symbols)
    except ValueError as exc:
        raise w.fail(loc, f"a size expression ({exc})", value) from None
    if unknown:
        raise w.fail(loc, f"symbols defined in op.sizes or built in ({', '.join(sorted(symbols))})", unknown[0])
    return str(value)


# The values an integer tensor holds (`integers: [low, high)` must draw within them: torch wraps the others).
INTEGER_RANGES = {"int8": (-2**7, 2**7 - 1), "uint8": (0, 2**8 - 1), "int32": (-2**31, 2**31 - 1),
                  "int64": (-2**63, 2**63 - 1), "bool": (0, 1)}


def _init(w: Source, loc: Loc, init: str | ParamInit, symbols: set[str], dtype: str = "act") -> tuple[str, Any]:
    if isinstance(init, str):
        return init, None
    given = [k for k in PARAM_INITS if getattr(init, k) is not None]
    if len(given) != 1:
        raise w.fail(loc, f"a name or a one-key mapping of {', '.join(PARAM_INITS)}",
                     init.model_dump(exclude_none=True))
    kind = given[0]
    if kind == "cos_sin_cache":
        base = init.cos_sin_cache.base
        if not base > 1:  # base**(-2i/d): a base of 1 rotates every pair alike, one of 0 or below gives NaN or inf
            raise w.fail(loc + (kind, "base"), "a rotary base above 1 (10000 in Llama; the frequencies are "
                         "base**(-2i/rotary_dim))", base)
        return kind, {"base": float(base)}
    low, high = (_expr(w, loc + (kind, i), v, symbols) for i, v in enumerate(getattr(init, kind)))
    if not (names_in(low) or names_in(high)):
        lo, hi = evaluate(low, {}), evaluate(high, {})
        if lo >= hi:
            # [high, low] would draw a single value (every int8 weight -128) and every cell would still pass
            raise w.fail(loc + (kind,), "[low, high] with low below high" + (" (high is excluded)" if kind == "integers"
                         else ""), [lo, hi])
        if kind == "integers" and hi - lo < 2:  # [127, 128): every element the same value
            raise w.fail(loc + (kind,), "[low, high) holding at least two integers (high is excluded: one value "
                         "alone makes every element the same)", [lo, hi])
        if kind == "integers" and dtype in INTEGER_RANGES:
            least, most = INTEGER_RANGES[dtype]
            if lo < least or hi - 1 > most:
                raise w.fail(loc + (kind,), f"[low, high) within {dtype}'s values [{least}, {most + 1}) (others wrap "
                             "around when stored)", [lo, hi])
    return kind, (low, high)


def _args(w: Source, specs: dict, symbols: set[str]) -> tuple[Arg, ...]:
    args = []
    for name, spec in specs.items():
        loc = ("op", "args", name)
        line = w.line(loc)
        if isinstance(spec, SizeArg):  # a scalar computed from the sizes
            args.append(Arg(name=name, value_expr=_expr(w, loc + ("value",), spec.value, symbols), line=line))
            continue
        if not isinstance(spec, TensorArg):  # a scalar passed as is (eps, a flag; null: an optional tensor left out)
            hint = number_as_text(spec)
            if hint:  # kernel and reference would both get the text
                raise w.fail(loc, f"a number ({hint}), or text that does not read as one", spec)
            if formula_text(spec, symbols):  # text is passed as is: a kernel casting it would see 0 or garbage
                raise w.fail(loc, f"a number, or {{value: {spec.strip()}}} to compute it from the sizes (text is "
                             "passed as is to kernel and reference)", spec)
            args.append(Arg(name=name, value=spec, line=line))
            continue
        dims = []
        for i, entry in enumerate(spec.shape):
            dim = _dim(entry)
            if dim is None:
                raise w.fail(loc + ("shape", i), "a positive integer, a symbol or a size expression "
                             "(num_heads*head_size)", entry)
            unknown = sorted(dim.names - symbols)
            if unknown:
                raise w.fail(loc + ("shape", i), f"a symbol defined in op.sizes or built in "
                             f"({', '.join(sorted(symbols))})", unknown[0])
            dims.append(dim)
        init, init_args = _init(w, loc + ("init",), spec.init, symbols, spec.dtype)
        no_repeats(w, loc + ("layout",), many(spec.layout))
        no_repeats(w, loc + ("value_scales",), many(spec.value_scales))
        if spec.optional and spec.role == "output":
            raise w.fail(loc + ("optional",), "an input (an output buffer is always passed)", True)
        args.append(Arg(name=name, shape=tuple(dims), dtype=spec.dtype, layouts=many(spec.layout), init=init,
                        init_args=init_args, role=spec.role, pad=spec.pad, optional=spec.optional,
                        ignorable=spec.ignorable, value_scales=many(spec.value_scales) or VALUE_SCALES, line=line))
    return tuple(args)


# ---------------------------------------------------------------- numerics and tolerances


def _numerics(w: Source, n: Numerics, sizes: dict) -> None:
    if n.prefill_tokens[0] > n.prefill_tokens[1]:
        raise w.fail(("numerics", "prefill_tokens"), "[min, max] token counts", list(n.prefill_tokens))
    keys_of(w, ("numerics", "cpu_sizes"), n.cpu_sizes, tuple(sizes))


def _quantization(w: Source, q: Quantization, args: tuple[Arg, ...], outputs: tuple[str, ...]) -> None:
    keys_of(w, ("quantization", "outputs"), q.outputs, outputs)
    names = {a.name for a in args} | set(outputs)
    for out, spec in q.outputs.items():
        loc = ("quantization", "outputs", out)
        if spec.scale not in names:
            raise w.fail(loc + ("scale",), f"an argument or output ({', '.join(sorted(names))})", spec.scale)
        arg = next((a for a in args if a.name == out), None)
        if arg is not None and arg.dtype not in QUANTIZED_DTYPES:
            raise w.fail(loc, "an output of a quantized dtype (fp8, float8_*, int8)", arg.dtype)
        scale = next((a for a in args if a.name == spec.scale and a.is_tensor), None)
        shaped = _scale_shape_fits(scale.shape, spec.granularity) if scale is not None else ""
        if shaped:
            raise w.fail(loc + ("granularity",), f"a granularity that the scale tensor {spec.scale}'s shape "
                         f"[{', '.join(map(str, scale.shape))}] has ({shaped})", spec.granularity)


def _scale_shape_fits(shape: tuple[Dim, ...], granularity: str) -> str:
    """Why a scale tensor of this shape cannot hold scales of this granularity ("" where it can): per_tensor is one
    value, per_token one per token ([num_tokens] or [num_tokens, 1]), per_channel and per_group more than one, not
    one per token alone."""
    ones = all(d.coeff == 1 and d.symbol is None for d in shape)
    tokens = [d for d in shape if d.symbol == "num_tokens"]
    rest_ones = all(d.coeff == 1 and d.symbol is None for d in shape if d.symbol != "num_tokens")
    if granularity == "per_tensor" and not ones:
        return "per_tensor: one value, a shape of [] or [1]"
    if granularity == "per_token" and not (len(tokens) == 1 and tokens[0].coeff == 1 and rest_ones):
        return "per_token: one value per token, a shape of [num_tokens] or [num_tokens, 1]"
    if granularity in ("per_channel", "per_group") and (ones or tokens and rest_ones):
        return f"{granularity}: more than one value per token"
    return ""


def _rules(w: Source, key: str, rules: tuple[Rule, ...], matrix: dict[str, tuple]) -> None:
    for i, rule in enumerate(rules):
        for axis, values in rule.match:
            for v in values:
                if v not in matrix[axis]:
                    raise w.fail((key, i, axis), f"values of matrix.{axis} ({', '.join(map(str, matrix[axis]))})", v)
        if not rule.match:
            raise w.fail((key, i), "at least one axis to match", rule.model_dump(exclude_none=True))


# ---------------------------------------------------------------- contracts


def _contract(w: Source, loc: Loc, c: Contract, args: tuple[Arg, ...], sizes: dict[str, tuple[int, ...]],
              matrix_dtypes: tuple[str, ...], cpu_sizes: dict) -> None:
    """A kernel's contract (`op.contract`, or a named baseline's), located: known names, and something of the plan
    left to draw under it."""
    name = dotted(loc)
    tensors = {a.name: a for a in args if a.is_tensor}
    for i, t in enumerate(c.contiguous):
        if t not in tensors:
            raise w.fail(loc + ("contiguous", i), f"one of {', '.join(tensors)}", t)
        if "contiguous" not in tensors[t].layouts:  # nothing of the plan's would be left to draw
            raise w.fail(loc + ("contiguous", i), f"a tensor the plan draws contiguous (op.args.{t}.layout lists "
                         "contiguous)", t)
    keys_of(w, loc + ("row_stride_multiple_of",), dict(c.row_stride_multiple_of), tuple(tensors))
    for k in ("multiple_of", "at_least", "at_most"):
        keys_of(w, loc + (k,), dict(getattr(c, k)), tuple(sizes))
    for t, n in c.row_stride_multiple_of:
        at, shape = loc + ("row_stride_multiple_of", t), tensors[t].shape
        if len(shape) < 2:
            raise w.fail(at, "a tensor of 2 or more dimensions (one with rows)", f"{t}: {len(shape)}-d")
        width = shape[-1]
        if not width.names <= set(sizes):
            raise w.fail(at, "a tensor whose last dimension is made of op.sizes symbols", str(width))
        if t in c.contiguous or "strided" not in tensors[t].layouts:  # its rows are its width apart
            if width.coeff is None:
                raise w.fail(at, f"a tensor whose last dimension is a number, a symbol or N*symbol, as {t} is drawn "
                             "contiguous only (its width is its row stride)", str(width))
            if width.symbol is None and width.coeff % n:
                raise w.fail(at, f"a multiple that {t}'s width ({width.coeff}) meets, as {t} is drawn contiguous "
                             "only", n)
    for sym, high in c.at_most:
        low = dict(c.at_least).get(sym, 1)
        if low > high:
            raise w.fail(loc + ("at_most", sym), f"at least {name}.at_least.{sym} ({low})", high)
    for i, dt in enumerate(c.dtypes or ()):
        if dt not in matrix_dtypes:
            raise w.fail(loc + ("dtypes", i), f"one of {', '.join(matrix_dtypes)}", dt)
    if c.dtypes == ():
        raise w.fail(loc + ("dtypes",), "at least one dtype of matrix.dtype", [])
    # Every constrained size keeps at least one of the plan's sizes (on a CPU machine, of numerics.cpu_sizes).
    for sym, planned in sizes.items():
        for values, where in ((planned, f"op.sizes.{sym}"), (dict(cpu_sizes).get(sym), f"numerics.cpu_sizes.{sym}")):
            if not values or any(c.allows_size(sym, v, args) for v in values):
                continue
            listed = ", ".join(map(str, values))
            k = next((k for k in ("multiple_of", "at_least", "at_most") if sym in dict(getattr(c, k))), None)
            if k:
                raise w.fail(loc + (k, sym), f"a constraint that a size of {where} ({listed}) meets",
                             dict(getattr(c, k))[sym])
            t = next(t for t, _ in c.row_stride_multiple_of if tensors[t].shape[-1].symbol == sym)
            raise w.fail(loc + ("row_stride_multiple_of", t), f"a multiple that {t}'s rows ({tensors[t].shape[-1]} "
                         f"wide, drawn contiguous only) meet for a size of {where} ({listed})",
                         dict(c.row_stride_multiple_of)[t])


# ---------------------------------------------------------------- benchmark


def _benchmark(w: Source, b: Benchmark, sizes: dict, size_specs: dict, numerics: Numerics) -> None:
    for i, tokens in enumerate(b.decode):
        if tokens > numerics.max_num_seqs:  # a decode step has one token per sequence: no such batch exists
            raise w.fail(("benchmark", "decode", i), f"a decode batch of at most numerics.max_num_seqs "
                         f"({numerics.max_num_seqs}) tokens, one per sequence", tokens)
    # vLLM's phases by size: a decode batch is at most max_num_seqs tokens, a prefill or a chunked-prefill batch no
    # fewer than the largest decode batch (a "prefill" of 2-32 tokens is decode-sized, and decided as prefill)
    for phase in ("chunked_prefill", "prefill"):
        for i, tokens in enumerate(getattr(b, phase)):
            if b.decode and tokens < max(b.decode):
                raise w.fail(("benchmark", phase, i), f"a {phase.replace('_', ' ')} batch of no fewer tokens than "
                             f"the largest decode batch timed ({max(b.decode)}), as vLLM's phases are sized "
                             "(decode ≤ chunked prefill ≤ prefill)", tokens)
    _models(w, b.listed_models, sizes)
    _timed_sizes(w, b.listed_sizes, sizes, size_specs)


def _models(w: Source, models: dict[str, str], sizes: dict) -> None:
    """`benchmark.models`: `{"hidden=4096": "Llama-3-8B"}`, keys of `symbol=value` pairs (comma-separated) over
    the plan's sizes, values the model's name."""
    choices = "; ".join(f"{sym}: {', '.join(map(str, values))}" for sym, values in sizes.items()) or "none"
    for key, model in models.items():
        named = []
        for part in key.split(","):
            sym, eq, value = (t.strip() for t in part.partition("="))
            if not eq or sym not in sizes or not value.isdigit() or int(value) not in sizes[sym]:
                raise w.fail(("benchmark", "models", key), f"'symbol=value' pairs with sizes of op.sizes ({choices})",
                             key)
            if sym in named:  # no shape has two values of one size
                raise w.fail(("benchmark", "models", key), "'symbol=value' pairs naming each symbol once", key)
            named.append(sym)
        if not model.strip():
            raise w.fail(("benchmark", "models", key), "the name of the model these sizes come from", model)


def _timed_sizes(w: Source, combos: list[dict[str, int]], sizes: dict, size_specs: dict) -> None:
    """`benchmark.sizes`: the combinations a benchmark times (the sizes real models run), each naming every size
    symbol with one of its op.sizes values and meeting the constraints between them."""
    for i, combo in enumerate(combos):
        loc = ("benchmark", "sizes", i)
        if set(combo) != set(sizes):
            raise w.fail(loc, f"a value for every size of op.sizes ({', '.join(sizes)}) and nothing else",
                         dict(combo))
        for sym, value in combo.items():
            if value not in sizes[sym]:
                raise w.fail(loc + (sym,), f"one of op.sizes.{sym} ({', '.join(map(str, sizes[sym]))})", value)
            if not size_specs[sym].allows(value, combo):
                raise w.fail(loc + (sym,), f"a size meeting op.sizes.{sym}'s constraints on the others", value)
        if combo in combos[:i]:
            raise w.fail(loc, "size combinations without repeats", dict(combo))


def _check_models(w: Source, plan: Plan) -> None:
    """The byte and flop models evaluate on the plan's sizes (else --bench would fail at collection)."""
    for key, expr in (("bytes", plan.benchmark.bytes), ("flops", plan.benchmark.flops)):
        if expr is None:
            continue
        names = {**{sym: values[0] for sym, values in plan.sizes.items()}, "num_tokens": 1, "act_bytes": 2}
        try:
            evaluate(expr, names)
        except ValueError as exc:
            raise w.fail(("benchmark", key), f"an arithmetic expression over {', '.join(sorted(names))} ({exc})",
                         expr) from None
    if plan.benchmark.bytes and not plan.returned_outputs:
        _byte_model_per_token(w, plan)


# A byte model's bytes per token may differ from the call's tensors' by this fraction at some timed shape (a lower
# bound leaving out what a shape does not read), not at all of them (a term left out halves every GB/s).
BYTE_MODEL_SLACK = 0.10


def _byte_model_per_token(w: Source, plan: Plan) -> None:
    """benchmark.bytes grows with num_tokens as the call's tensors with a num_tokens dimension do (read once,
    written once, a mutated one read and written), at one timed shape at least: bytes that do not grow with the
    batch (weights, caches) may be left out or counted, so only the per-token part is compared."""
    combos = [dict(c) for c in plan.benchmark.sizes] or [{sym: values[0] for sym, values in plan.sizes.items()}]
    off = []
    for sizes in combos:
        names = {**sizes, "act_bytes": 2}
        model = evaluate(plan.benchmark.bytes, {**names, "num_tokens": 2}) - \
            evaluate(plan.benchmark.bytes, {**names, "num_tokens": 1})
        tensors = 0
        for a in plan.tensor_args:
            if not any(d.symbol == "num_tokens" for d in a.shape):
                continue
            per_token = 1
            for d in a.shape:
                per_token *= 1 if d.symbol == "num_tokens" else d.size(sizes)
            size = 2 if a.dtype == "act" else DTYPE[a.dtype].bytes
            tensors += per_token * size * (2 if a.name in plan.op.mutates else 1)
        if tensors and abs(model - tensors) <= BYTE_MODEL_SLACK * tensors:
            return
        off.append(f"{model:g} against {tensors} ({', '.join(f'{k}={v}' for k, v in sizes.items())})")
    raise w.fail(("benchmark", "bytes"), "a byte model whose bytes per token are those of the call's tensors with a "
                 f"num_tokens dimension, within {BYTE_MODEL_SLACK:.0%} at one timed shape at least (bf16; every "
                 "GB/s and bound rests on it): per token " + "; ".join(off), plan.benchmark.bytes)


# ---------------------------------------------------------------- tensor parallelism


def _tp(w: Source, t: TensorParallel, args: tuple[Arg, ...], outputs: tuple[str, ...], tp_sizes: tuple[int, ...],
        symbol_names: tuple[str, ...]) -> TensorParallel:
    """The TP section checked, held with each split's dim counted from the front (-1: the last; the same split)."""
    sp, tensors = t.sequence_parallel, {a.name: a for a in args if a.is_tensor}
    keys_of(w, ("tp", "inputs"), t.inputs, tuple(tensors))
    keys_of(w, ("tp", "outputs"), t.outputs, outputs)

    def has_tokens(name: str) -> bool:
        return name in tensors and any(d.symbol == "num_tokens" for d in tensors[name].shape)

    def check_dim(loc: Loc, spec: Shard | Gather, key: str, name: str) -> int:
        """A dimension of `name` that can be split into tp * merged equal parts for every TP size."""
        dim = getattr(spec, key)
        if spec.units is not None:
            if spec.units not in symbol_names:
                raise w.fail(loc + ("units",), "a symbol of op.sizes", spec.units)
        if spec.replicate and spec.units is None:
            raise w.fail(loc + ("replicate",), "units to replicate (set units too)", True)
        if name not in tensors:
            return dim  # a returned output: its shape is the op's to decide
        shape = tensors[name].shape
        if not -len(shape) <= dim < len(shape):
            raise w.fail(loc + (key,), f"a dimension of a {len(shape)}-d tensor", dim)
        d = shape[dim]
        if spec.units is not None and spec.units not in d.names:
            raise w.fail(loc + ("units",), f"a symbol of the dimension split ({name}'s dimension {dim}: {d}), whose "
                         "units the ranks take whole", spec.units)
        # In a product (num_heads*head_size) the outermost factor counts the blocks that lie whole in memory: a rank
        # given whole units of an inner one gets a slice of every block.
        outer = re.findall(r"[A-Za-z_]\w*", d.text)
        if spec.units is not None and "*" in d.text and not re.search(r"[-+/%(]", d.text) and spec.units != outer[0]:
            raise w.fail(loc + ("units",), f"the outermost factor of the dimension split ({name}'s dimension {dim}: "
                         f"{d}), {outer[0]}: its units lie whole in memory, one after another", spec.units)
        if d.symbol == "num_tokens":
            raise w.fail(loc + (key,), "a dimension other than num_tokens (tokens are split with "
                         "tp.sequence_parallel)", dim)
        bad = [n for n in tp_sizes if d.symbol is None and d.coeff is not None and d.coeff % (n * spec.merged)]
        if bad:
            raise w.fail(loc + (key,), f"a dimension divisible by tp x merged ({bad[0]} x {spec.merged})", str(d))
        return dim % len(shape)

    inputs, outputs_held = dict(t.inputs), dict(t.outputs)  # each split's dim counted from the front
    for name, spec in t.inputs.items():
        loc = ("tp", "inputs", name)
        if spec == "replicated":
            continue
        if sp and has_tokens(name):
            raise w.fail(loc, "'replicated' (tp.sequence_parallel already splits it by tokens)",
                         spec.model_dump(exclude_defaults=True))
        inputs[name] = spec.model_copy(update={"shard": check_dim(loc, spec, "shard", name)})
    for name, spec in t.outputs.items():
        loc = ("tp", "outputs", name)
        if sp and has_tokens(name) and spec != "replicated":
            raise w.fail(loc, "'replicated' (tp.sequence_parallel puts it back together by tokens)",
                         spec if isinstance(spec, str) else spec.model_dump(exclude_defaults=True))
        if not isinstance(spec, str):
            outputs_held[name] = spec.model_copy(update={"gather": check_dim(loc, spec, "gather", name)})
    t = t.model_copy(update={"inputs": inputs, "outputs": outputs_held})
    if t.kind == "trivial" and (t.shard or any(c[1] != "replicated" for c in t.combine)):
        raise w.fail(("tp", "kind"), "'sharded' when inputs are sharded or outputs combined", t.kind)
    if t.kind == "sharded" and not t.shard and not sp:
        raise w.fail(("tp", "kind"), "at least one sharded input for kind 'sharded'", "none", field="tp.inputs")
    if t.kind == "sharded":
        declared = {c[0] for c in t.combine}
        for name in outputs:
            if name not in declared and not (sp and has_tokens(name)):
                raise w.fail(("tp", "outputs") if ("tp", "outputs") in w.lines else ("tp", "kind"),
                             "how ranks' outputs combine for kind 'sharded' (replicated, sum or "
                             "{gather: dim})", "nothing", field=f"tp.outputs.{name}")
    return t
