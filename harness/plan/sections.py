"""The sections of a plan file as pydantic models: keys, types, ranges and names, frozen once loaded.

Validation here is structural only: every key known (extra="forbid"), every value of its type (strict: no
"5" for 5, no true for 1), numbers in range, names from their vocabulary. Checks across fields (a shape's
symbols defined in op.sizes, an exclude rule naming values of the matrix, a contract something of the plan
meets) are harness.plan.checks's. A field's description is what an error says was expected
(`plan.yaml:8: op.args.x.dtype: expected ...`); an editor shows it with the README's words on the field
(harness.plan.field_docs, through harness.plan.schema's JSON Schema). The Plan (harness.plan.model) holds them.

Where a value may take several forms (a name or a list of names, a tensor spec or a scalar), the form is
picked by the value's YAML type (a `Discriminator`, harness.plan.fields), so an error speaks of the form that was
written. Dim and Arg are the op's arguments as harness.plan.checks parses them (Parts, not sections of the file).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, create_model

from harness.plan.expressions import evaluate, names_in, number_kind
from harness.plan.fields import MAPPING, ONE, VALUE, Number, PositiveInt, Section, Symbol, forms, import_path, many, \
    one_or_list
from harness.plan.dtypes import ARG_DTYPES, CELL_DTYPES
from harness.plan.vocabulary import AXES, GRANULARITIES, GRAPH_MODES, INITS, INTENTS, LAYOUTS, PHASES, \
    ROLES, SM_EXPECTED, SM_PATTERN, STRUCTURED_INITS, VALUE_SCALES


# How a kernel goes into vLLM, by the kind of op (harness.vllm_facts.names.ROUTE_KINDS says what each needs):
# an IR provider, an out-of-tree CustomOp, a quantization method, an attention backend (attention_backend; attention:
# stated, not driven), a fusion pass.
VLLM_ROUTES = ("ir", "custom_op", "quantization", "attention_backend", "attention", "fusion")


class Part(BaseModel):
    """A part of a loaded plan that harness.plan.checks builds (not a section as the file states it): frozen, its
    fields' types checked when built."""

    model_config = ConfigDict(frozen=True)


class Dim(Part):
    """One entry of a symbolic shape: an arithmetic expression over size symbols (`num_heads*head_size`,
    `num_seqs + 1`). `coeff` and `symbol` are set where it is `N*symbol`, `symbol` or a constant."""

    text: str
    coeff: int | None = None
    symbol: str | None = None

    def size(self, sizes: dict[str, int]) -> int:
        return int(evaluate(self.text, sizes))

    @property
    def names(self) -> set[str]:
        return names_in(self.text)

    def __str__(self) -> str:
        return self.text


class Arg(Part):
    """One argument of the op's call, in call order."""

    name: str
    shape: tuple[Dim, ...] | None = None  # None: a scalar passed as is
    dtype: str = "act"
    layouts: tuple[str, ...] = ("contiguous",)
    init: str = "normal"
    init_args: Any = None  # a parameterised init's parameters ([low, high], {base: B})
    role: str = "input"
    value: Any = None  # scalars only (None: an optional tensor left out)
    value_expr: str | None = None  # a scalar computed from the sizes (`head_size`)
    pad: Number = 0  # what CUDA-graph padding rows hold (a value valid for the op: a position, a length)
    optional: bool = False  # an input the kernel also takes as None: drawn with and without a value
    ignorable: str | None = None  # why a correct kernel may leave it unread (harness.runtime.mutants)
    value_scales: tuple[str, ...] = VALUE_SCALES  # the value scales this input is drawn at (others: normal)
    line: int | None = 0

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None

    @property
    def is_null(self) -> bool:
        """`name: null`: passed to the kernel as None, to the reference only where its signature names it."""
        return self.shape is None and self.value is None and self.value_expr is None

    @property
    def value_kind(self) -> str:
        """A computed scalar's type, "int" or "float" (harness.plan.expressions.number_kind)."""
        return number_kind(self.value_expr)


# The values each axis of the matrix takes (`matrix`, and the axes of an `exclude` or `expect` rule).
AXIS_TYPES = {"phase": Literal[PHASES], "dtype": Literal[CELL_DTYPES], "tp": PositiveInt,
              "graph_mode": Literal[GRAPH_MODES], "sm": Annotated[str, Field(pattern=SM_PATTERN.pattern,
                                                                          description=SM_EXPECTED)]}


class Rule(Section):
    """An `exclude` or `expect` entry: the axis values it matches (each axis a value or a list), and why."""

    @property
    def match(self) -> tuple[tuple[str, tuple], ...]:
        """(axis, values) for each axis the rule names."""
        return tuple((axis, values) for axis in AXES if (values := getattr(self, axis)))

    def matches(self, cell_axes: dict[str, Any]) -> bool:
        return all(cell_axes[axis] in values for axis, values in self.match)


# Each axis a value or a list of them, held as a tuple.
_axes = {axis: (Optional[Annotated[one_or_list(AXIS_TYPES[axis]), AfterValidator(many)]], None) for axis in AXES}
Exclude = create_model("Exclude", __base__=Rule, **_axes,
                       why=(str, Field(pattern=r"\S", description="a reason as text")))
Expect = create_model("Expect", __base__=Exclude, status=(Literal["fail"], "fail"))


class Tolerance(Section):
    """How close an output must be: |actual - expected| <= atol + rtol * |expected|."""

    # The one tolerance type: a plan's (`tolerance`), vLLM's defaults (harness.plan.tolerances) and the one a result
    # records (harness.results.store). Built as Tolerance(atol, rtol) there; numbers held as floats.
    atol: Annotated[Number, Field(ge=0, description="a number >= 0"), AfterValidator(float)]
    rtol: Annotated[Number, Field(ge=0, description="a number >= 0"), AfterValidator(float)]
    # "max": atol as a fraction of the output's largest magnitude, for reductions (a GEMM, attention), whose outputs
    # cancel to near zero while their rounding error follows the size of what was summed. None (left out of results
    # files): atol as it is.
    atol_of: Optional[Literal["max"]] = Field(None, description="max: atol as a fraction of the output's largest "
                                              "magnitude")

    def __init__(self, *args: Any, **fields: Any):  # Tolerance(atol, rtol) as well as by name
        super().__init__(**dict(zip(("atol", "rtol", "atol_of"), args)), **fields)

    @property
    def of_max(self) -> bool:
        return self.atol_of == "max"


class SizeSpec(Section):
    """A size symbol's sizes to draw and its constraints on the other symbols."""

    values: Annotated[one_or_list(PositiveInt, "the sizes to draw (positive integers)"), AfterValidator(many)]
    # None: numerics.awkward_sizes decides
    awkward: Optional[bool] = Field(None, description="true or false: draw odd sizes besides these "
                                    "(default: numerics.awkward_sizes)")
    # this size divides that symbol's (GQA: num_kv_heads divides num_heads)
    divides: Optional[Symbol] = Field(None, description="another symbol of op.sizes, whose size this one divides")
    multiple_of: PositiveInt = 1
    even: bool = Field(False, description="true or false")
    # not larger than that symbol's size (a partial rotary dim)
    at_most: Optional[Symbol] = Field(None, description="another symbol of op.sizes, not exceeded by this one")

    def allows(self, v: int, others: dict[str, int]) -> bool:
        """Whether size `v` meets its constraints on the other sizes given (divides, at_most)."""
        return ((self.divides not in others or others[self.divides] % v == 0)
                and (self.at_most not in others or v <= others[self.at_most]))


def _pairs(mapping: dict) -> tuple:
    return tuple(mapping.items())


class Contract(Section):
    """What a kernel is written for (`op.contract`, or a named baseline's `contract`). Inputs outside it are not
    drawn for the kernel, cells of other dtypes are excluded, benchmark shapes outside it are not timed for it, and
    the kernel's vLLM plugin rejects calls outside it in supports_args (vLLM then falls back). Sizes are the plan's
    symbols as drawn (before tensor-parallel sharding); a row stride is stride(-2), in elements."""

    # The mappings are held as (name, N) pairs, in the plan's order.

    contiguous: Annotated[one_or_list(str, "tensors that must be fully contiguous"),
                          AfterValidator(many)] = Field([], validate_default=True)
    row_stride_multiple_of: Annotated[dict[str, PositiveInt], AfterValidator(_pairs)] = Field(
        {}, validate_default=True, description="tensor: N, its rows N elements apart")
    multiple_of: Annotated[dict[str, PositiveInt], AfterValidator(_pairs)] = Field(
        {}, validate_default=True, description="size symbol: N")
    at_least: Annotated[dict[str, PositiveInt], AfterValidator(_pairs)] = Field(
        {}, validate_default=True, description="size symbol: N")
    at_most: Annotated[dict[str, PositiveInt], AfterValidator(_pairs)] = Field(
        {}, validate_default=True, description="size symbol: N")
    # the cell dtypes it supports; None: all
    dtypes: Optional[Annotated[one_or_list(Literal[CELL_DTYPES]), AfterValidator(many)]] = None
    why: str = Field("", description="why the kernel has this contract (text)")
    @property
    def empty(self) -> bool:
        return not (self.contiguous or self.row_stride_multiple_of or self.multiple_of or self.at_least
                    or self.at_most or self.dtypes)

    def layouts(self, arg: Arg) -> tuple[str, ...]:
        """The layouts drawn for `arg`: contiguous alone where the contract says so."""
        return ("contiguous",) if arg.name in self.contiguous else arg.layouts

    def bounds(self, sym: str) -> tuple[int, int | None]:
        return dict(self.at_least).get(sym, 1), dict(self.at_most).get(sym)

    def size_step(self, sym: str, args: tuple[Arg, ...]) -> int:
        """What `sym` is drawn a multiple of: its multiple_of, and where a tensor drawn only contiguous has rows
        `N*sym` wide, what makes them a multiple of its row stride apart."""
        step = dict(self.multiple_of).get(sym, 1)
        for name, n in self.row_stride_multiple_of:
            arg = next(a for a in args if a.name == name)
            width = arg.shape[-1]
            if "strided" not in self.layouts(arg) and width.symbol == sym:
                step = math.lcm(step, n // math.gcd(n, width.coeff))
        return step

    def allows_size(self, sym: str, value: int, args: tuple[Arg, ...]) -> bool:
        low, high = self.bounds(sym)
        return value % self.size_step(sym, args) == 0 and value >= low and (high is None or value <= high)

    def outside(self, args: tuple[Arg, ...], sizes: dict[str, int], dtype: str) -> str:
        """Why a call on contiguous tensors of these sizes and dtype is outside the contract ("" when it is not)."""
        if self.dtypes and dtype not in self.dtypes:
            return f"dtype {dtype} is not one of {', '.join(self.dtypes)}"
        for sym, value in sizes.items():
            low, high = self.bounds(sym)
            n = dict(self.multiple_of).get(sym, 1)
            if value % n:
                return f"{sym} {value} is not a multiple of {n}"
            if value < low:
                return f"{sym} {value} is below {low}"
            if high is not None and value > high:
                return f"{sym} {value} is above {high}"
        for name, n in self.row_stride_multiple_of:
            width = next(a for a in args if a.name == name).shape[-1].size(sizes)
            if width % n:
                return f"{name}'s row stride {width} is not a multiple of {n}"
        return ""

    def describe(self) -> str:
        """The contract in words: "x contiguous; hidden a multiple of 8; dtypes bf16, fp16"."""
        parts = [f"{', '.join(self.contiguous)} contiguous"] if self.contiguous else []
        parts += [f"{name}'s row stride a multiple of {n} elements" for name, n in self.row_stride_multiple_of]
        parts += [f"{sym} a multiple of {n}" for sym, n in self.multiple_of]
        parts += [f"{sym} at least {n}" for sym, n in self.at_least]
        parts += [f"{sym} at most {n}" for sym, n in self.at_most]
        parts += [f"dtypes {', '.join(self.dtypes)}"] if self.dtypes else []
        return "; ".join(parts)


class QuantizedOutput(Section):
    """An output compared in its quantized domain, and its scales."""

    scale: str = Field(description="the argument or output holding the scales")
    granularity: Literal[GRANULARITIES]


class Quantization(Section):
    outputs: dict[str, QuantizedOutput]  # by output name; {}: the plan's `quantization: none`
    # At most this fraction of a quantized output's elements may be one quantization step off (vLLM's fp8 tests). At
    # most half: a kernel that rounds every element the wrong way (truncates) is one step off on about half of them,
    # so a larger fraction passes it; a percentage (1 for 1%) is refused with it.
    max_step_fraction: Annotated[Number, Field(ge=0, le=0.5, description="a fraction of the elements in [0, 0.5] "
                                               "(0.01 is 1%)"), AfterValidator(float)] = 0.01

    def of(self, output: str) -> QuantizedOutput | None:
        return self.outputs.get(output)


def _sizes_as_tuples(sizes: dict) -> dict[str, tuple[int, ...]]:
    return {sym: many(v) for sym, v in sizes.items()}


class Numerics(Section):
    """How numerics cells draw their examples: how many, at which token counts and sizes, within what time."""

    examples: PositiveInt = 30
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt = 8192
    prefill_tokens: Annotated[list[PositiveInt], Field(min_length=2, max_length=2, description="[min, max] token "
                                                       "counts"), AfterValidator(tuple)] = (128, 8192)
    timeout_s: Annotated[Number, Field(ge=1, description="seconds (at least 1)"), AfterValidator(float)] = 300.0
    # Triton's interpreter costs milliseconds per program instance, so CPU cells draw at most this many elements per
    # activation; the cap applied is recorded with each result.
    cpu_element_budget: PositiveInt = 65536
    # Longest context a sequence of a structured batch reaches (positions, paged KV); capped by the budget on CPUs.
    max_model_len: PositiveInt = 4096
    # Sizes a CPU machine draws instead of op.sizes (symbol -> values), where a model's real sizes would take the
    # interpreter minutes per example (a linear's weight); the report says what the CPU run sampled.
    cpu_sizes: Annotated[dict[str, one_or_list(PositiveInt)], Field(description="size symbol: the sizes a CPU "
                                                                     "draws"), AfterValidator(_sizes_as_tuples)] = {}
    # Draw odd, non-power-of-two sizes besides the plan's own (off only for a kernel that is exact for the listed
    # sizes alone).
    awkward_sizes: bool = Field(True, description="true or false")
    # On a GPU, one example per prefill eager cell whose largest tensor holds more than 2**31 elements, the sizes at
    # which vLLM's kernels have overflowed int32 index arithmetic.
    int32_overflow: bool = Field(False, description="true or false")
    # vLLM's batch-invariant mode needs a row's result independent of the batch around it; vLLM's default mode does
    # not (cuBLAS picks tiles by M), so by default a kernel that varies is reported, not failed.
    batch_invariance: Literal["required", "report", "off"] = Field(
        "report", description="required (a row whose result depends on the batch around it fails the cell), report "
        "(the page says whether it does) or off")
    # Two calls on the same inputs giving different bits is a race or an uninitialised read far more often than a
    # design; a kernel that reduces with atomics on purpose says `report`.
    determinism: Literal["required", "report"] = Field(
        "required", description="required (two calls on the same inputs giving different bits fail the cell) or "
        "report (the page says so)")


Text = Annotated[str, Field(description="text")]
# A number, a symbol or arithmetic over symbols (`num_seqs + 1`); the symbols are checked against op.sizes.
Expression = Annotated[Union[int, float, str], Field(description="a number or a size expression")]
DimEntry = Annotated[Union[Annotated[int, Field(ge=1)], str],
                Field(description="a positive integer, a symbol or a size expression (num_heads*head_size)")]


# ---------------------------------------------------------------- op


Sizes = forms(one=PositiveInt, many=list[PositiveInt], mapping=SizeSpec,
              description="the sizes to draw: a list of positive integers, or {values: [...], divides: "
                          "symbol, multiple_of: N, even: true, at_most: symbol, awkward: false}")


def _size_specs(sizes: dict) -> dict[str, SizeSpec]:
    return {sym: s if isinstance(s, SizeSpec) else SizeSpec(values=s) for sym, s in sizes.items()}


class CosSinCache(Section):
    base: Number = Field(description="the rotary base (a number)")


class ParamInit(Section):
    """A parameterised init: exactly one of its keys (checked in harness.plan.checks)."""

    uniform: Optional[Annotated[list[Expression], Field(min_length=2, max_length=2, description="[low, high]")]] = None
    integers: Optional[Annotated[list[Expression], Field(min_length=2, max_length=2,
                                                         description="[low, high]")]] = None
    cos_sin_cache: Optional[CosSinCache] = None


Init = forms(one=Literal[INITS + STRUCTURED_INITS], mapping=ParamInit,
             description=f"one of {', '.join(INITS + STRUCTURED_INITS)}, or a one-key mapping of "
                         "uniform: [low, high], integers: [low, high], cos_sin_cache: {base: B}")


class TensorArg(Section):
    shape: list[DimEntry] = Field(description="a list of sizes or size expressions ([] for 0-d)")
    dtype: Literal[("act",) + ARG_DTYPES] = "act"
    layout: one_or_list(Literal[LAYOUTS], min_length=1) = ["contiguous"]
    init: Init = "normal"
    role: Literal[ROLES] = "input"
    pad: Number = Field(0, description="a number (the CUDA-graph padding value)")
    optional: bool = Field(False, description="true: the kernel also takes None here; every cell draws examples "
                           "with a value and without (None)")
    ignorable: Optional[str] = Field(None, pattern=r"\S", description="why a correct kernel may leave this input "
                                     "unread in some calls (a generated wrong kernel that ignores it is then a warning "
                                     "at validate, not a refusal)")
    value_scales: Optional[one_or_list(
        Literal[VALUE_SCALES], "the value scales drawn for this input, one or a list (default: all of "
        f"{', '.join(VALUE_SCALES)}); an example of another scale fills it at the normal scale (attention's query "
        "and keys: logits of a model stay far below the 1e4 that values of 100 give)", min_length=1)] = None


class SizeArg(Section):
    value: Expression


def _arg_form(value: Any) -> str:
    return (VALUE if "value" in value else MAPPING) if isinstance(value, dict) else ONE


ArgEntry = Annotated[Union[Annotated[TensorArg, Tag(MAPPING)], Annotated[SizeArg, Tag(VALUE)],
                      Annotated[Union[bool, int, float, str, None], Tag(ONE)]], Discriminator(_arg_form),
                Field(description="a tensor spec mapping, {value: size expression}, a scalar or null")]


class Op(Section):
    name: str = Field(pattern=r"^[A-Za-z_]\w*$", description="an identifier (letters, digits, _)")
    intent: Literal[INTENTS]
    description: Text = ""
    kernel: import_path()
    reference: import_path()
    # What vLLM runs without the custom op, in the activation dtype (the layer's forward_native): the `native` and
    # `compiled` baselines time it; the reference stays the accuracy oracle.
    native: Optional[import_path("an import path 'package.module:attribute': what vLLM runs without the custom op "
                                 "(the layer's forward_native), called like the reference")] = None
    replaces: Optional[import_path()] = None
    args: dict[str, ArgEntry] = Field(min_length=1, description="at least one argument: the op's arguments, in call "
                                 "order")
    outputs: Annotated[one_or_list(str, "the op's outputs: output arguments, mutated inputs or names of returned "
                                   "values"), AfterValidator(many)]
    mutates: Annotated[one_or_list(str, "inputs the op writes"), AfterValidator(many)] = Field(
        [], validate_default=True)
    sizes: Annotated[dict[str, Sizes], AfterValidator(_size_specs)] = {}  # held as symbol -> its SizeSpec
    accumulation: Literal["fp32", "input"] = "fp32"
    reduction: Literal["row_scale", "dot", "weighted_sum", "unknown"] = Field(
        "unknown", description="the op's kind of reduction, which says what the fp32-accumulation check can tell "
        "from a correct kernel's own roundings: row_scale (a reduction's result scales each output row: norms, "
        "per-token scales), dot (each output is a dot product: GEMMs), weighted_sum (softmax-weighted sums: "
        "attention), unknown (only what no correct kernel of any kind shows fails)")
    fake: Optional[import_path()] = None
    generate: Optional[import_path()] = None
    contract: Optional[Contract] = None
    # held as (name, condition) pairs; each GPU cell checks one example past each
    paths: Annotated[dict[str, str], AfterValidator(_pairs)] = Field(
        {}, validate_default=True, description="path name: a condition over the sizes, num_tokens and act_bytes "
        "under which the kernel takes that code path")


# ---------------------------------------------------------------- the matrix and its rules


Matrix = create_model("Matrix", __base__=Section, **{
    axis: (one_or_list(AXIS_TYPES[axis], min_length=1), ...) for axis in AXES})


# ---------------------------------------------------------------- tolerances and numerics


Tolerances = create_model("Tolerances", __base__=Section,
                          **{dtype: (Optional[Tolerance], None) for dtype in CELL_DTYPES},
                          outputs=(dict[str, Tolerance], Field({}, description="per output of op.outputs")))


# ---------------------------------------------------------------- named baselines, CUDA graphs, TP splits


class CudaGraph(Section):
    capture_sizes: one_or_list(PositiveInt) = []


class _Split(Section):
    merged: int = Field(1, ge=1, description="the number of merged parts (>= 1)")
    units: Optional[str] = Field(None, description="the size symbol counting the dim's units (num_heads)")
    replicate: bool = Field(False, description="true or false")


class Shard(_Split):
    shard: int = Field(description="a dimension (an integer)")


class Gather(_Split):
    gather: int = Field(description="a dimension (an integer)")


class VllmSwitch(Section):
    """How a deployment turns vLLM's kernel for the op on or off; set beside vLLM's default for that kind of switch
    per platform and profile (harness.vllm_facts.defaults)."""

    kind: Literal["ir", "custom_op", "fusion_pass"] = Field(description=(
        "ir (an IR op's provider priority), custom_op (a compilation_config.custom_ops entry) or fusion_pass (a "
        "pass_config flag)"))
    name: str = Field(pattern=r"^\w+$", description="the IR op, the CustomOp's registry name or the pass_config flag")
    runs_for: str = Field(description="what vLLM runs the kernel for, in words")
    note: Optional[str] = Field(None, description="what else turns it on by itself, with where vLLM decides it")
    cpu_runs_native: Optional[str] = Field(None, description=(
        "where the layer's forward_cpu is its forward_native (a CPU machine never runs vLLM's kernel): that symbol"))


class VllmFusion(Section):
    """vLLM's fusion pass that rewrites a sequence of its layers into the op's kernel (implementations.vllm, whose
    switch is the pass's flag); the fusion items run it under each profile (harness.vllm_facts.fusion_cases)."""

    layers: str = Field(description="vLLM's layer sequence the pass rewrites, in words")
    pass_path: import_path() = Field(description="module:Class of vLLM's pass")
    layer_custom_op: str = Field(pattern=r"^\w+$", description="the first layer's CustomOp name")
    ir_ops: list[str] = Field([], description="the vLLM IR ops the first layer dispatches through")
    residual: bool = Field(False, description="true: the norm takes a residual (fused add)")


class Vllm(Section):
    """The route the kernel takes into vLLM, the names vLLM knows the op by (harness.vllm_facts.names), and vLLM's own
    kernel for the op with the fusion that produces it: every fact of vLLM about this op, beside the op."""

    target: Literal["v1"] = "v1"
    route: Optional[Literal[VLLM_ROUTES]] = None  # None: the plan names no route into vLLM
    layer: Optional[import_path()] = None  # e.g. vllm.model_executor.layers.layernorm:RMSNorm
    ir_op: Optional[str] = Field(None, description="a vLLM IR op name")  # under vllm.ir.ops
    custom_op: Optional[str] = Field(None, description="a vLLM CustomOp name")  # its registry name, e.g. rms_norm
    # the IR provider name the plugin registers (default: <op name>_kernel)
    provider: Optional[str] = Field(None, pattern=r"^[a-z_][a-z_0-9]*$", description=(
        "a provider name of lowercase letters, digits and _ other than native and unfused"))
    # the module holding the op's vLLM side (how vLLM's calls map onto the kernel's arguments): the kernel's own
    # module unless the plan names another (harness.vllm_facts.names.adapter_module)
    adapter: Optional[str] = Field(None, pattern=r"^[\w.]+$", description=(
        "a module 'package.module' holding the op's vLLM side (vllm_layer, vllm_forward_inputs, vllm_ir_inputs)"))
    in_tree_provider: Optional[str] = Field(None, pattern=r"^[a-z_][a-z_0-9]*$", description=(
        "vLLM's own IR provider for the op (vllm_c)"))
    # a route the harness cannot drive yet: why, in the plan's words
    why_not_proven: Optional[str] = Field(None, description="why the route is not proven by this harness (words)")
    fusion: Optional[VllmFusion] = None
