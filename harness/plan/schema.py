"""The plan file's JSON Schema: harness.plan.model's Plan, as `python -m harness schema` prints it.

A field's description is what an error says was expected (`plan.yaml:8: op.args.x.dtype: expected ...`); an editor
shows it with the README's words on the field (harness.plan.field_docs, as `markdownDescription`): the JSON Schema is
committed as plan.schema.json (`# yaml-language-server: $schema=./plan.schema.json`).
"""

import json

from harness.plan.field_docs import FIELD_DOCS
from harness.plan.model import Plan


def json_schema() -> dict:
    """The JSON Schema of a plan file (what `python -m harness schema` prints), as draft 7: what editors' YAML
    language servers support (it uses nothing of later drafts)."""
    schema = Plan.model_json_schema(ref_template="#/definitions/{model}")
    definitions = schema.pop("$defs")
    for doc in FIELD_DOCS:  # the README's words on hover; `description` stays what an error says was expected
        for definition, prop in doc.targets:
            node = schema if definition is None else definitions[definition]
            (node["properties"][prop] if prop else node)["markdownDescription"] = doc.says
    return {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": definitions, **schema}


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"
