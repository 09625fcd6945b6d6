"""YAML with line numbers: a plan file as plain data, and the line of every mapping key and list item in it.

Hand-written because pydantic validates data, not text: it has no YAML line numbers, so its error locations
(`("op", "args", "x", "shape", 1)`) are turned into `plan.yaml:8` through the map built here.
"""

from __future__ import annotations

from typing import Any

import yaml

Loc = tuple  # a location in the data: mapping keys and list indices, ("op", "args", "x", "shape", 1)


class YamlError(Exception):
    """Text that is not YAML, or repeats a key: the line (or None) and what is wrong."""

    def __init__(self, line: int | None, problem: str):
        self.line, self.problem = line, problem
        super().__init__(problem)


class _Map(dict):
    key_lines: dict


class _Seq(list):
    item_lines: list


class _Lines:
    """A safe loader that remembers the line of every mapping key and list item, and refuses repeated keys."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:  # YAML keeps the last of repeated keys silently: a plan must not
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} given twice",
                                                        key_node.start_mark)
            seen.add(key)
        mapping = _Map(super().construct_mapping(node, deep=True))
        mapping.key_lines = {self.construct_object(k): k.start_mark.line + 1 for k, _ in node.value}
        return mapping

    def construct_sequence(self, node, deep=False):
        seq = _Seq(super().construct_sequence(node, deep=True))
        seq.item_lines = [item.start_mark.line + 1 for item in node.value]
        return seq


class _LineLoader(_Lines, yaml.SafeLoader):
    """PyYAML's own parser: what a plan that is not YAML is explained with (its messages name the character)."""


# libyaml's parser where PyYAML was built with it, 5-10x faster (the plan-mutation tests validate thousands of plans),
# with the same safe constructor and resolver, so the data and the lines are the same.
_FastLineLoader = type("_FastLineLoader", (_Lines, yaml.CSafeLoader), {}) if yaml.__with_libyaml__ else _LineLoader

for _loader in {_LineLoader, _FastLineLoader}:
    _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _Lines.construct_mapping)
    _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _Lines.construct_sequence)


def parse(text: str) -> tuple[Any, dict[Loc, int]]:
    """The document as plain dicts and lists, and the line of each location in it (the root's is 1)."""
    try:
        root = yaml.load(text, Loader=_FastLineLoader)
    except yaml.YAMLError as fast:
        exc = fast
        try:  # PyYAML's own parser says what is wrong in its words (it names the character)
            yaml.load(text, Loader=_LineLoader)
        except yaml.YAMLError as own:
            exc = own
        mark = getattr(exc, "problem_mark", None)
        raise YamlError(mark.line + 1 if mark else None, getattr(exc, "problem", None) or str(exc)) from None
    lines: dict[Loc, int] = {(): 1}
    return _plain(root, (), lines), lines


def _plain(node: Any, loc: Loc, lines: dict[Loc, int]) -> Any:
    if isinstance(node, dict):
        key_lines = getattr(node, "key_lines", {})
        for key in node:
            lines[loc + (key,)] = key_lines.get(key, lines[loc])
        return {key: _plain(value, loc + (key,), lines) for key, value in node.items()}
    if isinstance(node, list):
        item_lines = getattr(node, "item_lines", [])
        for i in range(len(node)):
            lines[loc + (i,)] = item_lines[i] if i < len(item_lines) else lines[loc]
        return [_plain(value, loc + (i,), lines) for i, value in enumerate(node)]
    return node


def line_of(lines: dict[Loc, int], loc: Loc) -> int | None:
    """The line of `loc`, else of the nearest location above it that the text has."""
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def dotted(loc: Loc) -> str:
    """A location as a plan's field name: op.args.x.shape[1]."""
    out = ""
    for part in loc:
        index = isinstance(part, int) and not isinstance(part, bool)
        out += f"[{part}]" if index else f".{part}" if out else str(part)
    return out
