"""The field types of a plan file's pydantic models: a section's strictness, the forms a value may take (a name or
a list of names, a tensor spec or a scalar, picked by the value's YAML type), import paths and numbers.

The Plan (harness.plan.model) and its sections' models (harness.plan.sections) are built from these, so a key, a
type and an error's words are the same wherever a section is read.
"""

import re
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

# Tags of the forms a value may take: in pydantic's error locations, never in the plan's own (dropped there).
ONE, LIST, MAPPING, VALUE = "<one>", "<list>", "<mapping>", "<value>"
TAGS = (ONE, LIST, MAPPING, VALUE)

IMPORT_PATH = r"^[\w.]+:[\w.]+$"
IMPORT_EXPECTED = "an import path 'package.module:attribute'"


class Section(BaseModel):
    """A section of the plan file: every key known (extra="forbid"), every value of its type (strict: no "5" for
    5), frozen once loaded."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True,
                              regex_engine="python-re")  # patterns with lookaheads


def _form(value: Any) -> str:
    return MAPPING if isinstance(value, dict) else LIST if isinstance(value, list) else ONE


def forms(*, one: Any = None, many: Any = None, mapping: Any = None, description: str | None = None) -> Any:
    """A value of several forms, picked by its YAML type: a scalar (`one`), a list, a mapping."""
    members = [Annotated[t, Tag(tag)] for t, tag in ((one, ONE), (many, LIST), (mapping, MAPPING)) if t is not None]
    extra = [Field(description=description)] if description else []
    return Annotated[Union[tuple(members)], Discriminator(_form), *extra]


def _one_or_list(value: Any) -> str:
    return LIST if isinstance(value, list) else ONE


def one_or_list(item: Any, description: str | None = None, min_length: int | None = None) -> Any:
    """A value or a list of them (`dtype: bf16` is `dtype: [bf16]`)."""
    many = Annotated[list[item], Field(min_length=min_length)] if min_length else list[item]
    extra = [Field(description=description)] if description else []
    return Annotated[Union[Annotated[item, Tag(ONE)], Annotated[many, Tag(LIST)]], Discriminator(_one_or_list), *extra]


def import_path(description: str = IMPORT_EXPECTED) -> Any:
    return Annotated[str, Field(pattern=IMPORT_PATH, description=description)]


PositiveInt = Annotated[int, Field(ge=1, description="a positive integer")]
Symbol = Annotated[str, Field(description="a size symbol")]
Number = Union[int, float]


# YAML 1.1 (PyYAML's) reads a number in exponent form as text unless it has a decimal point and a signed exponent
# (1e-6, 1.0e5 and 5E3 are text; 1.0e-6 and 1.0e+5 are numbers).
_EXPONENT_TEXT = re.compile(r"([-+]?(?:\d+|\d*\.\d+|\d+\.))[eE]([-+]?)(\d+)")


def number_as_text(value: Any) -> str:
    """What to say of a value YAML read as text although it was written as a number ("" for any other value)."""
    found = _EXPONENT_TEXT.fullmatch(value.strip()) if isinstance(value, str) else None
    if not found:
        return ""
    mantissa, sign, exponent = found.groups()
    fixed = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{sign or '+'}{exponent}"
    return (f"YAML reads {value.strip()} as text, not a number: write it with a decimal point and a signed exponent "
            f"({fixed})")


def many(value: Any) -> tuple:
    """A value or a list of them (one_or_list's forms; None: none), as a tuple."""
    return tuple(value) if isinstance(value, list) else () if value is None else (value,)
