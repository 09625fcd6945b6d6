"""The plan model: a loaded plan, frozen (the language's words are harness.spec.vocabulary's).

harness.spec.load reads a plan file into these (through the pydantic schema of harness.spec.schema and the
checks of harness.spec.checks). Every part of a Plan is a frozen pydantic model: the sections it
holds as the file states them (Numerics, Quantization, Vllm, SizeSpec, Tolerance, the exclude and expect rules) are
the models the file is validated with; the others (Parts: the Plan, its arguments, benchmark and TP split) are
what harness.spec.checks builds from the file's forms. harness.runtime.resolve imports the code a plan
names. Nothing here imports the user's code: a Plan holds import paths, and the line of every field it came from
(`Plan.where`), so that whoever finds a field wrong later still says `plan.yaml:8: op.kernel: expected ...; found
...`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, create_model

from harness.spec.expressions import evaluate, names_in
from harness.spec.fields import Number, PositiveInt, Section, Symbol, import_path, many, one_or_list
from harness.spec.dtypes import CELL_DTYPES
from harness.spec.vocabulary import AXES, GRANULARITIES, GRAPH_MODES, PHASES, SM_EXPECTED, SM_PATTERN, \
    VALUE_SCALES
from harness.spec.yaml_lines import Loc, dotted, line_of

# How a kernel goes into vLLM, by the kind of op (harness.vllm.names.ROUTE_KINDS says what each needs):
# an IR provider, an out-of-tree CustomOp, a quantization method, an attention backend, a fusion pass.
VLLM_ROUTES = ("ir", "custom_op", "quantization", "attention", "fusion")


class PlanError(Exception):
    """A plan that cannot be used, located at file:line and a dotted field."""

    def __init__(self, path: str, line: int | None, field_name: str, expected: str, found: Any):
        self.path, self.line, self.field, self.expected, self.found = path, line, field_name, expected, found
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {field_name}: expected {expected}; found {found!r}")


class Where:
    """A plan file's path and line map: PlanErrors at the line of a location."""

    def __init__(self, path: str, lines: dict[Loc, int]):
        self.path, self.lines = path, lines

    def line(self, loc: Loc) -> int | None:
        return line_of(self.lines, loc)

    def fail(self, loc: Loc, expected: str, found: Any, field: str | None = None) -> PlanError:
        return PlanError(self.path, self.line(loc), field or dotted(loc), expected, found)


# ---------------------------------------------------------------- the model


class Part(BaseModel):
    """A part of a loaded plan that harness.spec.checks builds (not a section as the file states it): frozen, its
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
    value_scales: tuple[str, ...] = VALUE_SCALES  # the value scales this input is drawn at (others: normal)
    line: int | None = 0

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None


# The values each axis of the matrix takes (`matrix`, and the axes of an `exclude` or `expect` rule).
AXIS_TYPES = {"phase": Literal[PHASES], "dtype": Literal[CELL_DTYPES], "tp": PositiveInt,
              "graph_mode": Literal[GRAPH_MODES], "sm": Annotated[str, Field(pattern=SM_PATTERN.pattern,
                                                                          description=SM_EXPECTED)]}


class Rule(Section):
    """An `exclude` or `expect` entry: the axis values it matches (each axis a value or a list), and why."""

    _line: int = PrivateAttr(0)  # where the plan states it (set by harness.spec.checks; not a key of the file)

    @property
    def line(self) -> int:
        return self._line

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

    # The one tolerance type: a plan's (`tolerance`), vLLM's defaults (harness.spec.tolerances) and the one a result
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
    _line: int = PrivateAttr(0)  # where the plan states it (set by harness.spec.checks)

    @property
    def line(self) -> int:
        return self._line

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


class Benchmark(Part):
    decode: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()
    chunked_prefill: tuple[int, ...] = ()
    baselines: tuple[str, ...] = ("native", "compiled")
    # Named baselines by import path (Liger-Kernel's, FlashInfer's, ...), called like the kernel: name -> path.
    named: tuple[tuple[str, str], ...] = ()
    # The size combinations timed, each naming every size symbol: ((("hidden", 4096),), ...); empty: every
    # combination of op.sizes that meets its constraints.
    sizes: tuple[tuple[tuple[str, int], ...], ...] = ()
    bytes: str | None = None  # optional byte model; default counts every tensor arg once
    flops: str | None = None
    # The real model each size comes from: ("hidden=4096", "Llama-3-8B"); a key may pair several symbols.
    models: tuple[tuple[str, str], ...] = ()
    contracts: tuple[tuple[str, Contract], ...] = ()  # named baseline -> its contract, where it states one
    # named baseline -> the import path of a function mapping the kernel's arguments to the baseline's once per input
    # set, outside the timed region (weights dequantized or prepacked), where it names one
    prepares: tuple[tuple[str, str], ...] = ()
    # named baseline -> how a vLLM deployment runs it, where the plan says (the decision can then name it)
    settings: tuple[tuple[str, str], ...] = ()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {p: getattr(self, p) for p in PHASES if getattr(self, p)}

    def times(self, sizes: dict) -> bool:
        """Whether the plan times these sizes: any, unless benchmark.sizes lists them (a stored record of sizes it
        no longer lists is stale)."""
        return not self.sizes or any(dict(listed) == sizes for listed in self.sizes)

    def prepare(self, name: str) -> str | None:
        """The import path of a named baseline's `prepare`, None where it names none."""
        return dict(self.prepares).get(name)

    def setting(self, name: str) -> str | None:
        """How a vLLM deployment runs a named baseline, None where the plan does not say."""
        return dict(self.settings).get(name)

    def contract(self, name: str) -> Contract | None:
        """A named baseline's contract, None where it states none."""
        return dict(self.contracts).get(name)

    def model(self, sizes: dict) -> str | None:
        """The model a benchmark shape's sizes come from (the entry naming the most symbols wins), else None."""
        best = None
        for key, model in self.models:
            pairs = [part.split("=") for part in key.split(",")]
            if all(str(sizes.get(sym)) == value for sym, value in pairs) and (best is None or len(pairs) > best[0]):
                best = (len(pairs), model)
        return best[1] if best else None


class TensorParallel(Part):
    """How the op runs on N ranks. `trivial`: every rank gets the full inputs (replicated)."""

    kind: str = "trivial"
    # input name -> (dim, merged parts) for sharded inputs; absent inputs are replicated
    shard: tuple[tuple[str, int, int], ...] = ()
    # (output, "replicated" | "sum" | "gather", dim); outputs not listed are replicated
    combine: tuple[tuple[str, str, int], ...] = ()
    sequence_parallel: bool = False  # tensors with a num_tokens dim are split across ranks by tokens
    # (tensor, symbol): a sharded dim made of `symbol` equal units (whole heads), split only between units
    units: tuple[tuple[str, str], ...] = ()
    # tensors whose units are replicated when there are fewer than ranks (vLLM's KV heads below the TP size)
    replicate: tuple[str, ...] = ()
    # (output, merged parts) for gathered outputs in a merged layout ([a_r | b_r] on rank r)
    merged_outputs: tuple[tuple[str, int], ...] = ()


class VllmSwitch(Section):
    """How a deployment turns vLLM's kernel for the op on or off; set beside vLLM's default for that kind of switch
    per platform and profile (harness.vllm.defaults)."""

    kind: Literal["ir", "custom_op", "fusion_pass"] = Field(description=(
        "ir (an IR op's provider priority), custom_op (a compilation_config.custom_ops entry) or fusion_pass (a "
        "pass_config flag)"))
    name: str = Field(pattern=r"^\w+$", description="the IR op, the CustomOp's registry name or the pass_config flag")
    runs_for: str = Field(description="what vLLM runs the kernel for, in words")
    note: Optional[str] = Field(None, description="what else turns it on by itself, with where vLLM decides it")
    cpu_runs_native: Optional[str] = Field(None, description=(
        "where the layer's forward_cpu is its forward_native (a CPU machine never runs vLLM's kernel): that symbol"))


class VllmKernel(Section):
    """vLLM's own compiled kernel for the op, torch.ops._C.<name>: the plan's `vllm` provider (run through its
    numerics cells) and `vllm` benchmark baseline, called with the plan's arguments that `args` picks."""

    name: str = Field(pattern=r"^\w+$", description="its torch.ops._C name")
    args: list[str] = Field(description="the plan argument passed for each parameter of its schema, in order")
    signature: Optional[str] = Field(None, description=(
        "its schema as vLLM registers it, 'name(Tensor! out, Tensor x, float eps) -> ()', where harness.vllm.kernels"
        "'s table lacks it (an installed vLLM's registered schema is read at run time)"))
    dtypes: Optional[list[Literal[CELL_DTYPES]]] = Field(None, description="the cell dtypes it takes, where not all")
    why: Optional[str] = Field(None, description="why those dtypes only (words)")
    # As a provider: the fraction of a quantized output's elements allowed one fp8 step from the reference's, where
    # vLLM's kernel rounds in another order than the op's native path (None: the plan's quantization's).
    max_step_fraction: Optional[Annotated[float, Field(ge=0, le=1)]] = Field(None, description="a fraction in [0, 1]")
    switch: Optional[VllmSwitch] = None

    @property
    def call(self) -> str:
        return f"torch.ops._C.{self.name}"


class VllmFusion(Section):
    """vLLM's fusion pass that rewrites a sequence of its layers into the op's kernel (vllm.kernel, whose switch is
    the pass's flag); the fusion items run it under each profile (harness.vllm.fusion_cases)."""

    layers: str = Field(description="vLLM's layer sequence the pass rewrites, in words")
    pass_path: import_path() = Field(description="module:Class of vLLM's pass")
    layer_custom_op: str = Field(pattern=r"^\w+$", description="the first layer's CustomOp name")
    ir_ops: list[str] = Field([], description="the vLLM IR ops the first layer dispatches through")
    residual: bool = Field(False, description="true: the norm takes a residual (fused add)")


class Vllm(Section):
    """The route the kernel takes into vLLM, the names vLLM knows the op by (harness.vllm.names), and vLLM's own
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
    # module unless the plan names another (harness.vllm.names.adapter_module)
    adapter: Optional[str] = Field(None, pattern=r"^[\w.]+$", description=(
        "a module 'package.module' holding the op's vLLM side (vllm_layer, vllm_forward_inputs, vllm_ir_inputs)"))
    in_tree_provider: Optional[str] = Field(None, pattern=r"^[a-z_][a-z_0-9]*$", description=(
        "vLLM's own IR provider for the op (vllm_c)"))
    # a route the harness cannot drive yet: why, in the plan's words
    why_not_proven: Optional[str] = Field(None, description="why the route is not proven by this harness (words)")
    kernel: Optional[VllmKernel] = None
    fusion: Optional[VllmFusion] = None


class Plan(Part):
    path: Path
    name: str
    intent: str
    kernel: str
    reference: str
    fake: str | None  # torch.compile fake implementation; derived from the reference when absent
    description: str
    replaces: str | None
    args: tuple[Arg, ...]
    outputs: tuple[str, ...]
    mutates: tuple[str, ...]
    sizes: dict[str, tuple[int, ...]]
    size_specs: dict[str, SizeSpec]
    matrix: dict[str, tuple]
    excludes: tuple[Exclude, ...]
    expects: tuple[Expect, ...]
    tolerance: dict[str, Tolerance]
    output_tolerance: dict[str, Tolerance]  # per output, over the dtype table (scales of a quantized output)
    numerics: Numerics
    benchmark: Benchmark
    tp: TensorParallel
    quantization: Quantization
    generate: str | None  # import path of a custom input generator
    vllm: Vllm
    capture_sizes: tuple[int, ...] | None
    accumulation: str
    reduction: str  # op.reduction: what the accumulation check can tell (harness.runtime.accumulation)
    raw_text: str = Field("", repr=False)
    warnings: tuple[str, ...] = ()  # settings that can never apply to a cell of the matrix
    contract: Contract = Contract()  # the kernel's preconditions (op.contract)
    # What vLLM runs without the custom op, in the activation dtype (op.native: the layer's forward_native; for a
    # quantized linear, dequantize to the activation dtype and F.linear); None: the reference is that too
    native: str | None = None
    lines: dict[str, int] = Field({}, repr=False)  # dotted field -> its line
    # The kernel's size-selected code paths (op.paths): (name, condition); each GPU cell checks one example past each.
    paths: tuple[tuple[str, str], ...] = ()
    # Implementations run through the numerics cells beside the kernel (`providers`): vllm, named baselines.
    providers: tuple[str, ...] = ()

    @property
    def native_path(self) -> str:
        """The function the `native` and `compiled` baselines time: op.native, else the reference."""
        return self.native or self.reference

    def where(self, field_name: str) -> int | None:
        """The line of a dotted field (`op.kernel`, `op.args.x.shape[1]`), else of the nearest field above it."""
        name = field_name
        while name:
            if name in self.lines:
                return self.lines[name]
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
        return tuple(o for o in self.outputs if not self.has_arg(o))

    @property
    def written_args(self) -> tuple[str, ...]:
        """Arguments the op writes: output buffers, then the inputs it mutates."""
        return tuple(a.name for a in self.args if a.role == "output") + tuple(self.mutates)

    def token_dim(self, name: str) -> int | None:
        """The num_tokens dimension of an argument (None: it has none); returned outputs have tokens first."""
        if not self.has_arg(name):
            return 0
        return next((i for i, d in enumerate(self.arg(name).shape or ()) if d.symbol == "num_tokens"), None)

    @property
    def op_namespace(self) -> str:
        """The torch.library namespace of the op: the kernel's top-level package (e.g. `kernels`)."""
        return re.sub(r"\W", "_", self.kernel.split(":")[0].split(".")[0])

    @property
    def op_qualname(self) -> str:
        """The one torch.library name of the op: what cells test, the report documents and the plugin ships."""
        return f"{self.op_namespace}::{self.name}"

    def schema(self) -> str:
        """The torch.library schema of the kernel's call: written arguments aliased, scalars typed."""
        written = set(self.written_args)
        params = []
        for i, a in enumerate(self.args):
            if a.is_tensor:
                params.append(f"Tensor(a{i}!) {a.name}" if a.name in written else
                              f"Tensor{'?' if a.optional else ''} {a.name}")
            elif a.value_expr:
                params.append(f"int {a.name}")
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
        return sorted(self.capture_sizes or vllm_capture_sizes(self.numerics.max_num_seqs))


def token_probes(low: int, high: int) -> list[int]:
    """The token counts a condition on num_tokens is tried at within [low, high]: both ends, the count after the
    first, and the powers of two between (where a kernel's size-selected path usually switches)."""
    return sorted({n for n in (low, low + 1, high, *(2 ** k for k in range(high.bit_length()))) if low <= n <= high})


def vllm_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default cudagraph capture sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)."""
    largest = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
    return [s for s in sizes if s <= largest]

