"""The plan file as a whole (PlanFile, over harness.spec.sections' models) and its JSON Schema.

A field's description is what an error says was expected (`plan.yaml:8: op.args.x.dtype: expected ...`); an editor
shows it with the README's words on the field (harness.spec.field_docs, as `markdownDescription`): `python -m harness
schema` prints the JSON Schema, committed as plan.schema.json (`# yaml-language-server: $schema=./plan.schema.json`).
"""

import json
from typing import Literal, Optional

from pydantic import ConfigDict, Field

from harness.spec.field_docs import FIELD_DOCS
from harness.spec.fields import Section, forms
from harness.spec.plan import Benchmark, TensorParallel
from harness.spec.sections import CudaGraph, Exclude, Expect, Matrix, Numerics, Op, Quantization, \
    Tolerances, Vllm


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

