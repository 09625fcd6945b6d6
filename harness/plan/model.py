"""The plan model: a plan file as loaded, frozen (the language's words are harness.plan.vocabulary's).

Plan is the one model of a plan file: its fields are the file's keys (harness.plan.load validates the file with it;
its JSON Schema is harness.plan.schema's), held in the form the runtime reads where that maps one to one onto the
file's (the matrix as axis -> values, a section left out as its default). What needs several fields (the arguments
parsed, the TP split's dims counted from the front, the benchmark's sizes) harness.plan.checks derives as the last
step of validation, so any validated Plan is complete (`Plan.model_validate(data)` as much as a file loaded).
Nothing here imports the user's code: a Plan holds import paths, and the line of every field it came from
(`Plan.where`), so that whoever finds a field wrong later still says `plan.yaml:8: op.kernel: expected ...; found
...`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional

from pydantic import AfterValidator, ConfigDict, Field, PrivateAttr, ValidationInfo, model_validator

from harness.plan.dtypes import CELL_DTYPES
from harness.plan.fields import PositiveInt, Section, forms, many, one_or_list
from harness.plan.implementations import BUILTIN, DEFAULT, VLLM, Implementation, kind_of, upgrade
from harness.plan.sections import Arg, Contract, CudaGraph, Exclude, Expect, Gather, Matrix, Numerics, Op, \
    Quantization, Shard, Tolerance, Tolerances, Vllm
from harness.plan.vocabulary import AXES, PHASES
from harness.plan.yaml_lines import Loc, dotted, line_of


class PlanError(Exception):
    """A plan that cannot be used, located at file:line and a dotted field."""

    def __init__(self, path: str, line: int | None, field_name: str, expected: str, found: Any):
        self.path, self.line, self.field, self.expected, self.found = path, line, field_name, expected, found
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {field_name}: expected {expected}; found {found!r}")


@dataclass(frozen=True)
class Source:
    """Where a plan came from, which its data does not say: the file, its text, the line of every field, and the old
    keys read into the new form (`deprecated`: each location with the form to write). PlanErrors at those lines."""

    path: Path = Path()
    text: str = ""
    lines: dict[Loc, int] = field(default_factory=dict)
    deprecated: tuple[tuple[Loc, str], ...] = ()

    def line(self, loc: Loc) -> int | None:
        return line_of(self.lines, loc)

    def fail(self, loc: Loc, expected: str, found: Any, field: str | None = None) -> PlanError:
        return PlanError(str(self.path) if self.path != Path() else "(plan data)", self.line(loc),
                         field or dotted(loc), expected, found)


# ---------------------------------------------------------------- the model


def _tokens() -> Any:
    """A phase's token counts to time: one or a list, held as a tuple (none: the phase is not timed)."""
    return Annotated[one_or_list(PositiveInt), AfterValidator(many)]


# The `benchmark` section (absent: Benchmark()). The file's models and sizes are held as listed under those keys
# (aliases); the runtime reads them as `models` and `sizes`. What is timed beside the kernel: `implementations`.
class Benchmark(Section):
    decode: _tokens() = Field([], validate_default=True)
    prefill: _tokens() = Field([], validate_default=True)
    chunked_prefill: _tokens() = Field([], validate_default=True)
    bytes: Optional[str] = Field(None, description="a byte-count expression")  # default: every tensor arg once
    flops: Optional[str] = Field(None, description="a flop-count expression")
    listed_models: dict[str, str] = Field({}, alias="models", description="'symbol=value' pairs: the model these "
                                          "sizes come from")
    listed_sizes: list[dict[str, PositiveInt]] = Field([], alias="sizes", description="the size combinations to "
                                                       "time, each naming every size of op.sizes")
    @property
    def models(self) -> tuple[tuple[str, str], ...]:
        """The real model each size comes from, keys written alike ("hidden=4096", "Llama-3-8B"); a key may pair
        several symbols."""
        return tuple((",".join(f"{sym.strip()}={int(value)}" for sym, _, value in
                               (part.partition("=") for part in key.split(","))), " ".join(model.split()))
                     for key, model in self.listed_models.items())

    @property
    def sizes(self) -> tuple[tuple[tuple[str, int], ...], ...]:
        """The size combinations timed ((("hidden", 4096),), ...); empty: every combination of op.sizes that meets
        its constraints."""
        return tuple(tuple(combo.items()) for combo in self.listed_sizes)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {p: getattr(self, p) for p in PHASES if getattr(self, p)}

    def times(self, sizes: dict) -> bool:
        """Whether the plan times these sizes: any, unless benchmark.sizes lists them (a stored record of sizes it
        no longer lists is stale)."""
        return not self.sizes or any(dict(listed) == sizes for listed in self.sizes)

    def model(self, sizes: dict) -> str | None:
        """The model a benchmark shape's sizes come from (the entry naming the most symbols wins), else None."""
        best = None
        for key, model in self.models:
            pairs = [part.split("=") for part in key.split(",")]
            if all(str(sizes.get(sym)) == value for sym, value in pairs) and (best is None or len(pairs) > best[0]):
                best = (len(pairs), model)
        return best[1] if best else None


# How the op runs on N ranks (`tp`; absent: trivial, every rank gets the full inputs, replicated). No docstring:
# it would be the JSON Schema's description of the section.
class TensorParallel(Section):
    kind: Literal["trivial", "sharded"]
    inputs: dict[str, forms(one=Literal["replicated"], mapping=Shard,
                            description="replicated, or {shard: dim, merged: N, units: symbol}")] = {}
    outputs: dict[str, forms(one=Literal["replicated", "sum"], mapping=Gather,
                             description="replicated, sum, or a mapping {gather: dim, merged: N, units: symbol}")] = {}
    # tensors with a num_tokens dim are split across ranks by tokens
    sequence_parallel: bool = Field(False, description="true or false")
    @property
    def shard(self) -> tuple[tuple[str, int, int], ...]:
        """(input, dim, merged parts) for each sharded input (absent inputs are replicated)."""
        return tuple((name, s.shard, s.merged) for name, s in self.inputs.items() if not isinstance(s, str))

    @property
    def combine(self) -> tuple[tuple[str, str, int], ...]:
        """(output, "replicated" | "sum" | "gather", dim) for each output listed (those not listed are replicated)."""
        return tuple((name, s, 0) if isinstance(s, str) else (name, "gather", s.gather)
                     for name, s in self.outputs.items())

    @property
    def _splits(self) -> list[tuple[str, Shard | Gather]]:
        return [(name, s) for name, s in (*self.inputs.items(), *self.outputs.items()) if not isinstance(s, str)]

    @property
    def units(self) -> tuple[tuple[str, str], ...]:
        """(tensor, symbol): a sharded dim made of `symbol` equal units (whole heads), split only between units."""
        return tuple((name, s.units) for name, s in self._splits if s.units is not None)

    @property
    def replicate(self) -> tuple[str, ...]:
        """Tensors whose units are replicated when there are fewer than ranks (vLLM's KV heads below the TP size)."""
        return tuple(name for name, s in self._splits if s.replicate)

    @property
    def merged_outputs(self) -> tuple[tuple[str, int], ...]:
        """(output, merged parts) for gathered outputs in a merged layout ([a_r | b_r] on rank r)."""
        return tuple((name, s.merged) for name, s in self.outputs.items() if not isinstance(s, str) and s.merged > 1)


def _with_kinds(entries: dict[str, Implementation] | None) -> dict[str, Implementation]:
    """Each entry with its kind set (a built-in name's, else its own or import); none: the default's."""
    if entries is None:
        entries = {name: Implementation.model_validate(entry) for name, entry in DEFAULT.items()}
    return {name: e.model_copy(update={"kind": kind_of(name, e)}) for name, e in entries.items()}


def _absent_as(default: Callable[[], Any]) -> AfterValidator:
    """A section left out (or null) held as its default: the runtime never reads None, the schema still says null."""
    return AfterValidator(lambda section: default() if section is None else section)


class Plan(Section):
    """A plan file: what the op is, the matrix of cells it is tested in, and how."""

    model_config = ConfigDict(title="vllm-op-plan plan")
    op: Op
    matrix: Annotated[Matrix, AfterValidator(lambda m: {axis: many(getattr(m, axis)) for axis in AXES})]  # by axis
    exclude: Annotated[Optional[list[Exclude]], _absent_as(list)] = Field(
        None, validate_default=True, description="a list of rules: the cells not to run, by axis values, and why")
    expect: Annotated[Optional[list[Expect]], _absent_as(list)] = Field(
        None, validate_default=True, description="a list of rules: the cells expected to fail, by axis values, and why")
    # held as written; the runtime reads `tolerance` (by dtype) and `output_tolerance`
    tolerances: Optional[Tolerances] = Field(None, alias="tolerance")
    numerics: Annotated[Optional[Numerics], _absent_as(Numerics)] = Field(None, validate_default=True)
    benchmark: Annotated[Optional[Benchmark], _absent_as(Benchmark)] = Field(None, validate_default=True)
    tp: Annotated[Optional[TensorParallel], _absent_as(lambda: TensorParallel(kind="trivial"))] = Field(
        None, validate_default=True)
    # `none` or absent: no quantized output
    quantization: Annotated[Optional[forms(one=Literal["none"], mapping=Quantization)], AfterValidator(
        lambda q: q if isinstance(q, Quantization) else Quantization(outputs={}))] = Field(None, validate_default=True)
    vllm: Annotated[Optional[Vllm], _absent_as(Vllm)] = Field(None, validate_default=True)
    cuda_graph: Optional[CudaGraph] = None
    # The op's implementations beside the kernel, by name (harness.plan.implementations), each with its kind set;
    # absent: native and compiled, timed.
    implementations: Annotated[Optional[dict[str, Implementation]], AfterValidator(_with_kinds)] = Field(
        None, validate_default=True, description=(
            "a mapping name: {kind, role, ...}: native, compiled, vllm (vLLM's own kernel) or the plan's own "
            "implementations, timed beside the kernel (role baseline) or run through its cells (role audited)"))
    _source: Source = PrivateAttr(default_factory=Source)  # not a key of the file: set as the plan is validated

    @model_validator(mode="wrap")
    @classmethod
    def _complete(cls, data: Any, handler: Callable[[Any], "Plan"], info: ValidationInfo) -> "Plan":
        """The plan checked across its fields (harness.plan.checks) as part of its validation, so that
        `Plan.model_validate(data)` gives what the runtime reads, as loading a file does. The context says where
        the data came from (`path`, its `text` and the `lines` of its fields: PlanErrors at file:line)."""
        if not isinstance(data, dict):  # a Plan given as is: already checked
            return handler(data)
        ctx = info.context or {}
        lines = dict(ctx.get("lines", {}))
        data, deprecated = upgrade(data, lines)  # the keys plans wrote before `implementations`
        plan = handler(data)
        plan._source = Source(Path(ctx.get("path") or ""), ctx.get("text", ""), lines, tuple(deprecated))
        return checks.check(plan)

    @property
    def source(self) -> Source:
        return self._source

    @property
    def path(self) -> Path:
        return self._source.path

    # What the checks derive from several fields, computed once (a copy or a pickle keeps it): the arguments parsed
    # (op.sizes and the built-in symbols are what their shapes may name), and the warnings validation gives.
    args = cached_property(lambda self: checks.parse_args(self))
    warnings = cached_property(lambda self: checks.warnings_of(self))

    @property
    def tolerance(self) -> dict[str, Tolerance]:
        """The plan's tolerance by dtype, in matrix.dtype's order (then any other dtype's)."""
        t = self.tolerances
        order = [*self.matrix["dtype"], *(dt for dt in CELL_DTYPES if dt not in self.matrix["dtype"])]
        return {dt: getattr(t, dt) for dt in order if t is not None and getattr(t, dt, None) is not None}

    @property
    def baselines(self) -> tuple[str, ...]:
        """The implementations timed beside the kernel: the built-in ones in their order, then the plan's own."""
        timed = [name for name, e in self.implementations.items() if "baseline" in e.role]
        return tuple([b for b in BUILTIN if b in timed] + [n for n in timed if n not in BUILTIN])

    @property
    def providers(self) -> tuple[str, ...]:
        """The implementations run through the numerics cells beside the kernel (role audited), in plan order."""
        return tuple(name for name, e in self.implementations.items() if "audited" in e.role)

    def implementation(self, name: str) -> Implementation | None:
        return self.implementations.get(name)

    @property
    def default_implementation(self) -> str | None:
        """What vLLM runs in the kernel's place in every profile (the entry with role default), where the plan names
        it: the decisions weigh the kernel against it instead of native and compiled."""
        return next((name for name, e in self.implementations.items() if "default" in e.role), None)

    @property
    def vllm_kernel(self) -> Implementation | None:
        """vLLM's own kernel for the op (the `vllm` implementation), where the plan names it."""
        return self.implementations.get(VLLM)

    @property
    def sizes(self) -> dict[str, tuple[int, ...]]:
        """Each size symbol's sizes to draw."""
        return {sym: spec.values for sym, spec in self.op.sizes.items()}

    @property
    def contract(self) -> Contract:
        """The kernel's preconditions (op.contract; none: Contract())."""
        return self.op.contract or Contract()

    @property
    def output_tolerance(self) -> dict[str, Tolerance]:
        """Per output, over the dtype table (scales of a quantized output)."""
        return self.tolerances.outputs if self.tolerances else {}

    @property
    def native_path(self) -> str:
        """The function the `native` and `compiled` baselines time: op.native, else the reference."""
        return self.op.native or self.op.reference

    def where(self, field_name: str) -> int | None:
        """The line of a dotted field (`op.kernel`, `op.args.x.shape[1]`), else of the nearest field above it."""
        name, lines = field_name, {dotted(loc): line for loc, line in self._source.lines.items() if loc}
        while name:
            if name in lines:
                return lines[name]
            name = name[:max(name.rfind("."), name.rfind("["), 0)]
        return None

    def error(self, field_name: str, expected: str, found: Any) -> PlanError:
        """A PlanError at the line of `field_name`."""
        return PlanError(str(self.path), self.where(field_name), field_name, expected, found)

    def arg(self, name: str) -> Arg:
        return next(a for a in self.args if a.name == name)

    def has_arg(self, name: str) -> bool:
        return any(a.name == name for a in self.args)

    @property
    def tensor_args(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.is_tensor)

    @property
    def returned_outputs(self) -> tuple[str, ...]:
        """Outputs the op returns (the others are written into its arguments)."""
        return tuple(o for o in self.op.outputs if not self.has_arg(o))

    @property
    def written_args(self) -> tuple[str, ...]:
        """Arguments the op writes: output buffers, then the inputs it mutates."""
        return tuple(a.name for a in self.args if a.role == "output") + tuple(self.op.mutates)

    def token_dim(self, name: str) -> int | None:
        """The num_tokens dimension of an argument (None: it has none); returned outputs have tokens first."""
        if not self.has_arg(name):
            return 0
        return next((i for i, d in enumerate(self.arg(name).shape or ()) if d.symbol == "num_tokens"), None)

    @property
    def op_namespace(self) -> str:
        """The torch.library namespace of the op: the kernel's top-level package (e.g. `kernels`)."""
        return re.sub(r"\W", "_", self.op.kernel.split(":")[0].split(".")[0])

    @property
    def op_qualname(self) -> str:
        """The one torch.library name of the op: what cells test, the report documents and the plugin ships."""
        return f"{self.op_namespace}::{self.op.name}"

    def schema(self) -> str:
        """The torch.library schema of the kernel's call: written arguments aliased, scalars typed."""
        written = set(self.written_args)
        params = []
        for i, a in enumerate(self.args):
            if a.is_tensor:
                params.append(f"Tensor(a{i}!) {a.name}" if a.name in written else
                              f"Tensor{'?' if a.optional else ''} {a.name}")
            elif a.value_expr:
                params.append(f"{a.value_kind} {a.name}")
            elif a.value is None:  # an optional tensor left out
                params.append(f"Tensor? {a.name}")
            else:
                kind = {bool: "bool", int: "int", float: "float", str: "str"}[type(a.value)]
                params.append(f"{kind} {a.name}")
        n_ret = len(self.returned_outputs)
        ret = "()" if n_ret == 0 else "Tensor" if n_ret == 1 else "(" + ", ".join(["Tensor"] * n_ret) + ")"
        return f"({', '.join(params)}) -> {ret}"

    def token_range(self, phase: str) -> tuple[int, int]:
        """(fewest, most) tokens a GPU example of this phase may have: the scheduler's limits (numerics) or the
        plan's largest benchmark token count of the phase, whichever is larger (a size the plan times is checked)."""
        num = self.numerics
        timed = max(getattr(self.benchmark, phase, ()) or (0,))
        return {"decode": (1, max(num.max_num_seqs, timed)),
                "prefill": (num.prefill_tokens[0], max(num.max_num_batched_tokens, timed)),
                "chunked_prefill": (2, max(num.max_num_batched_tokens, timed))}[phase]

    def cuda_graph_sizes(self) -> list[int]:
        """Capture sizes: the plan's, else vLLM's defaults for numerics.max_num_seqs."""
        planned = many(self.cuda_graph.capture_sizes) if self.cuda_graph else ()
        return sorted(planned or vllm_capture_sizes(self.numerics.max_num_seqs))


def token_probes(low: int, high: int) -> list[int]:
    """The token counts a condition on num_tokens is tried at within [low, high]: both ends, the count after the
    first, and the powers of two between (where a kernel's size-selected path usually switches)."""
    return sorted({n for n in (low, low + 1, high, *(2 ** k for k in range(high.bit_length()))) if low <= n <= high})


def vllm_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default cudagraph capture sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)."""
    largest = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
    return [s for s in sizes if s <= largest]


# The checks across fields, which validation runs last (Plan._complete), read the classes above: imported after them,
# as a module, so that either module may be imported first.
from harness.plan import checks  # noqa: E402
