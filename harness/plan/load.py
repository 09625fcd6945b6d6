"""Loading a plan file: YAML with line numbers, the Plan validated (pydantic), the checks across fields.

`load_plan(path)` returns a Plan or raises PlanError at `file:line: field: expected ...; found ...`, so a
user fixes a plan without reading a traceback. Loading imports none of the user's code: the kernel,
reference, fake and input generator are import paths here; harness.runtime.resolve imports them.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Tag, ValidationError
from pydantic.fields import FieldInfo

from harness.plan.fields import TAGS, number_as_text
from harness.plan.model import Plan, PlanError
from harness.plan.yaml_lines import Loc, YamlError, dotted, line_of, parse


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(str(path), None, "(file)", "a readable plan file", exc.strerror) from None
    try:
        data, lines = parse(text)
    except YamlError as exc:
        raise PlanError(str(path), exc.line, "(yaml)", "valid YAML", exc.problem) from None
    if not isinstance(data, dict):
        raise PlanError(str(path), 1, "(top level)", "a mapping with an 'op' section", data)
    try:
        return Plan.model_validate(data, context={"path": str(path), "lines": lines, "text": text})
    except ValidationError as exc:
        raise first_error(str(path), exc, lines) from None


# ---------------------------------------------------------------- pydantic's errors as the plan's


def first_error(path: str, exc: ValidationError, lines: dict[Loc, int]) -> PlanError:
    """The error of a validation that comes first in the file, as a PlanError at its line and field."""
    errors = []
    for err in exc.errors():
        loc, at, expected, found = explain(err)
        hint = number_as_text(found)
        if hint and "number" in expected:  # not for an integer, which no exponent form gives
            expected += f" ({hint})"
        errors.append(PlanError(path, line_of(lines, at), dotted(loc) or "(top level)", expected, found))
    return min(errors, key=lambda e: e.line or 0)


def explain(err: dict) -> tuple[Loc, Loc, str, Any]:
    """(the field's location, the location of its line, what was expected, what was found) of a pydantic error."""
    loc, descriptions, annotation, model = walk(err["loc"])
    kind = err["type"]
    if kind == "missing":
        return loc, loc[:-1], "this key to be present", "nothing"
    if kind in ("extra_forbidden", "invalid_key") and model is not None and loc and loc[-1] not in keys(model):
        return loc, loc, f"one of the keys {', '.join(keys(model))}", loc[-1]
    if kind == "invalid_key":
        return loc, loc, "a name (YAML reads off/on/yes/no/true/false as a boolean: quote the name)", loc[-1]
    if err["loc"][-1:] == ("[key]",) and isinstance(err["input"], bool):  # a mapping's key read as a boolean
        at = loc[:-1] + (err["input"],)
        return at, at, "a name (YAML reads off/on/yes/no/true/false as a boolean: quote the name)", err["input"]
    ctx = err.get("ctx") or {}
    if kind in ("too_short", "too_long") and not descriptions:
        n, what = (ctx["min_length"], "at least") if kind == "too_short" else (ctx["max_length"], "at most")
        entries = "entr" + ("y" if n == 1 else "ies") if ctx.get("field_type") == "Dictionary" \
            else "value" + ("" if n == 1 else "s")
        expected = f"{what} {'one' if n == 1 else n} {entries}"
    elif descriptions:
        expected = descriptions[0]
    else:
        expected = words(annotation)
    return loc, loc, expected, err["input"]


def walk(pydantic_loc: tuple) -> tuple[Loc, list[str], Any, type[BaseModel] | None]:
    """Follow an error's location through the schema: (the location in the plan's data, the descriptions of the
    field there, innermost first, its annotation, the model holding it). The tags of a value's forms (ONE, LIST,
    ...) are steps of pydantic's, not the plan's: dropped; a plain union's member names end the walk."""
    annotation: Any = Plan
    loc, descriptions, model = [], [], None
    parts = list(pydantic_loc)
    while True:
        annotation, found = _unwrap(annotation)
        descriptions = found + descriptions
        if not parts or annotation is None or parts[0] == "[key]":
            break
        part = parts[0]
        if _is_union(annotation):
            members = {_tag(m): m for m in typing.get_args(annotation)}
            if part not in TAGS or part not in members:
                break  # pydantic names the members of a plain union: no data below
            annotation = members[parts.pop(0)]
            continue
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model, field = annotation, keys(annotation).get(part)
            loc.append(parts.pop(0))
            annotation, descriptions = (field.annotation, [field.description] if field and field.description
                                        else []) if field else (None, [])
            continue
        origin = typing.get_origin(annotation)
        if origin in (dict, list):
            loc.append(parts.pop(0))
            annotation, descriptions, model = typing.get_args(annotation)[-1], [], None
            continue
        break
    return tuple(loc), descriptions, annotation, model


def keys(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A model's fields by the key a plan file writes: its alias, where the model holds it under another name."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _unwrap(annotation: Any) -> tuple[Any, list[str]]:
    """An annotation without its Annotated metadata and Optional, and the descriptions found, innermost first."""
    found = []
    while True:
        if typing.get_origin(annotation) is Annotated:
            found = [m.description for m in annotation.__metadata__ if isinstance(m, FieldInfo) and m.description] \
                + found
            annotation = annotation.__origin__
        elif _is_union(annotation) and type(None) in typing.get_args(annotation) \
                and len(typing.get_args(annotation)) == 2:
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        else:
            return annotation, found


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def _tag(member: Any) -> str | None:
    if typing.get_origin(member) is Annotated:
        return next((m.tag for m in member.__metadata__ if isinstance(m, Tag)), None)
    return None


def words(annotation: Any) -> str:
    """What a value of `annotation` is, in words: "one of fp32, fp16", "a mapping", "an integer"."""
    annotation, found = _unwrap(annotation)
    if found:
        return found[0]
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(annotation)))
    if _is_union(annotation):
        return " or ".join(words(m) for m in typing.get_args(annotation) if m is not type(None))
    if origin is dict or isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a mapping"
    if origin is list:
        return "a list"
    return {bool: "true or false", int: "an integer", float: "a number", str: "text"}.get(annotation, "a value")
