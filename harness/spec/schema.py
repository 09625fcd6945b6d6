"""The plan file's structure as pydantic models: keys, types, ranges and names, and the JSON Schema of a plan.

Validation here is structural only: every key known (extra="forbid"), every value of its type (strict: no
"5" for 5, no true for 1), numbers in range, names from their vocabulary. Checks across fields (a shape's
symbols defined in op.sizes, an exclude rule naming values of the matrix, a contract something of the plan
meets) are harness.spec.checks's. A field's description is what an error says was expected
(`plan.yaml:8: op.args.x.dtype: expected ...`); an editor shows it with the README's words on the field
(harness.spec.field_docs, as `markdownDescription`): `python -m harness schema` prints the JSON Schema, committed as
plan.schema.json (`# yaml-language-server: $schema=./plan.schema.json`).

Where a value may take several forms (a name or a list of names, a tensor spec or a scalar), the form is
picked by the value's YAML type (a `Discriminator`, harness.spec.fields), so an error speaks of the form that was
written. What a Plan holds as written (numerics, quantization, vllm, tolerances, a size's constraints) are
harness.spec.plan's models, used here as they are.
"""

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Discriminator, Field, Tag, create_model

from harness.spec.dtypes import ARG_DTYPES, CELL_DTYPES
from harness.spec.field_docs import FIELD_DOCS
from harness.spec.fields import MAPPING, ONE, VALUE, Number, PositiveInt, Section, forms, \
    import_path, one_or_list
from harness.spec.plan import AXIS_TYPES, Contract, Exclude, Expect, Numerics, Quantization, SizeSpec, Tolerance, \
    Vllm
from harness.spec.vocabulary import AXES, BASELINES, INITS, INTENTS, LAYOUTS, ROLES, STRUCTURED_INITS, VALUE_SCALES

Text = Annotated[str, Field(description="text")]
# A number, a symbol or arithmetic over symbols (`num_seqs + 1`); the symbols are checked against op.sizes.
Expression = Annotated[Union[int, float, str], Field(description="a number or a size expression")]
Dim = Annotated[Union[Annotated[int, Field(ge=1)], str],
                Field(description="a positive integer, a symbol or a size expression (num_heads*head_size)")]
CellDtype = Literal[CELL_DTYPES]


# ---------------------------------------------------------------- op


Sizes = forms(one=PositiveInt, many=list[PositiveInt], mapping=SizeSpec,
              description="the sizes to draw: a list of positive integers, or {values: [...], divides: "
                          "symbol, multiple_of: N, even: true, at_most: symbol, awkward: false}")


class CosSinCache(Section):
    base: Number = Field(description="the rotary base (a number)")


class ParamInit(Section):
    """A parameterised init: exactly one of its keys (checked in harness.spec.checks)."""

    uniform: Optional[Annotated[list[Expression], Field(min_length=2, max_length=2, description="[low, high]")]] = None
    integers: Optional[Annotated[list[Expression], Field(min_length=2, max_length=2,
                                                         description="[low, high]")]] = None
    cos_sin_cache: Optional[CosSinCache] = None


Init = forms(one=Literal[INITS + STRUCTURED_INITS], mapping=ParamInit,
             description=f"one of {', '.join(INITS + STRUCTURED_INITS)}, or a one-key mapping of "
                         "uniform: [low, high], integers: [low, high], cos_sin_cache: {base: B}")


class TensorArg(Section):
    shape: list[Dim] = Field(description="a list of sizes or size expressions ([] for 0-d)")
    dtype: Literal[("act",) + ARG_DTYPES] = "act"
    layout: one_or_list(Literal[LAYOUTS], min_length=1) = ["contiguous"]
    init: Init = "normal"
    role: Literal[ROLES] = "input"
    pad: Number = Field(0, description="a number (the CUDA-graph padding value)")
    optional: bool = Field(False, description="true: the kernel also takes None here; every cell draws examples "
                           "with a value and without (None)")
    value_scales: Optional[one_or_list(
        Literal[VALUE_SCALES], "the value scales drawn for this input, one or a list (default: all of "
        f"{', '.join(VALUE_SCALES)}); an example of another scale fills it at the normal scale (attention's query "
        "and keys: logits of a model stay far below the 1e4 that values of 100 give)", min_length=1)] = None


class SizeArg(Section):
    value: Expression


def _arg_form(value: Any) -> str:
    return (VALUE if "value" in value else MAPPING) if isinstance(value, dict) else ONE


Arg = Annotated[Union[Annotated[TensorArg, Tag(MAPPING)], Annotated[SizeArg, Tag(VALUE)],
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
    args: dict[str, Arg] = Field(min_length=1, description="at least one argument: the op's arguments, in call "
                                 "order")
    outputs: one_or_list(str, "the op's outputs: output arguments, mutated inputs or names of returned values")
    mutates: one_or_list(str, "inputs the op writes") = []
    sizes: dict[str, Sizes] = {}
    accumulation: Literal["fp32", "input"] = "fp32"
    reduction: Literal["row_scale", "dot", "weighted_sum", "unknown"] = Field(
        "unknown", description="the op's kind of reduction, which says what the fp32-accumulation check can tell "
        "from a correct kernel's own roundings: row_scale (a reduction's result scales each output row: norms, "
        "per-token scales), dot (each output is a dot product: GEMMs), weighted_sum (softmax-weighted sums: "
        "attention), unknown (only what no correct kernel of any kind shows fails)")
    fake: Optional[import_path()] = None
    generate: Optional[import_path()] = None
    contract: Optional[Contract] = None
    paths: dict[str, str] = Field({}, description="path name: a condition over the sizes, num_tokens and "
                                  "act_bytes under which the kernel takes that code path")


# ---------------------------------------------------------------- the matrix and its rules


Matrix = create_model("Matrix", __base__=Section, **{
    axis: (one_or_list(AXIS_TYPES[axis], min_length=1), ...) for axis in AXES})


# ---------------------------------------------------------------- tolerances and numerics


Tolerances = create_model("Tolerances", __base__=Section,
                          **{dtype: (Optional[Tolerance], None) for dtype in CELL_DTYPES},
                          outputs=(dict[str, Tolerance], Field({}, description="per output of op.outputs")))


# ---------------------------------------------------------------- benchmark, vLLM, TP, quantization


class NamedBaseline(Section):
    path: import_path()
    contract: Optional[Contract] = None
    # Called once per input set before timing: the timed call gets what it returns (weights dequantized or prepacked
    # for a GEMM library), so that work stays outside the timed region.
    prepare: Optional[import_path("an import path 'package.module:attribute': a function taking the kernel's "
                                  "arguments by name and returning the baseline's, by name, outside the timed "
                                  "region")] = None
    # How a vLLM deployment runs this baseline (a checkpoint format, vLLM's own kernel choice, a flag): where the
    # kernel loses to it, the decision names this baseline and this setting.
    setting: Optional[str] = Field(None, description="how a vLLM deployment runs this baseline")


Baseline = forms(one=Literal[BASELINES],
                 mapping=Annotated[dict[Any, forms(one=import_path(), mapping=NamedBaseline)],
                                   Field(min_length=1, max_length=1)],
                 description=f"one of {', '.join(BASELINES)} or {{name: 'package.module:attribute'}} or "
                             "{name: {path: 'package.module:attribute', contract: {...}, "
                             "prepare: 'package.module:attribute', setting: '...'}}")


class Benchmark(Section):
    decode: one_or_list(PositiveInt) = []
    prefill: one_or_list(PositiveInt) = []
    chunked_prefill: one_or_list(PositiveInt) = []
    baselines: Optional[one_or_list(Baseline)] = None
    bytes: Optional[str] = Field(None, description="a byte-count expression")
    flops: Optional[str] = Field(None, description="a flop-count expression")
    models: dict[str, str] = Field({}, description="'symbol=value' pairs: the model these sizes come from")
    sizes: list[dict[str, PositiveInt]] = Field([], description="the size combinations to time, each naming every "
                                                "size of op.sizes")


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


class TensorParallel(Section):
    kind: Literal["trivial", "sharded"]
    inputs: dict[str, forms(one=Literal["replicated"], mapping=Shard,
                            description="replicated, or {shard: dim, merged: N, units: symbol}")] = {}
    outputs: dict[str, forms(one=Literal["replicated", "sum"], mapping=Gather,
                             description="replicated, sum, or a mapping {gather: dim, merged: N, units: symbol}")] = {}
    sequence_parallel: bool = Field(False, description="true or false")


class PlanFile(Section):
    """A plan file: what the op is, the matrix of cells it is tested in, and how."""

    model_config = ConfigDict(title="vllm-op-plan plan")
    op: Op
    matrix: Matrix
    exclude: Optional[list[Exclude]] = Field(None, description="a list of rules: the cells not to run, by axis "
                                             "values, and why")
    expect: Optional[list[Expect]] = Field(None, description="a list of rules: the cells expected to fail, by axis "
                                           "values, and why")
    tolerance: Optional[Tolerances] = None
    numerics: Optional[Numerics] = None
    benchmark: Optional[Benchmark] = None
    tp: Optional[TensorParallel] = None
    quantization: Optional[forms(one=Literal["none"], mapping=Quantization)] = None
    vllm: Optional[Vllm] = None
    cuda_graph: Optional[CudaGraph] = None
    # implementations of the op run through the numerics matrix beside the kernel (harness.spec.matrix)
    providers: Optional[list[str]] = Field(None, description=(
        "a list: vllm (vLLM's own compiled kernel for the op) or names of named baselines, run through the "
        "numerics cells beside the kernel; the page says what each accepts"))


def json_schema() -> dict:
    """The JSON Schema of a plan file (what `python -m harness schema` prints), as draft 7: what editors' YAML
    language servers support (it uses nothing of later drafts)."""
    schema = PlanFile.model_json_schema(ref_template="#/definitions/{model}")
    definitions = schema.pop("$defs")
    for doc in FIELD_DOCS:  # the README's words on hover; `description` stays what an error says was expected
        for definition, prop in doc.targets:
            node = schema if definition is None else definitions[definition]
            (node["properties"][prop] if prop else node)["markdownDescription"] = doc.says
    return {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": definitions, **schema}


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"

