"""Plain arithmetic over named sizes, for the plan's byte and flop models (`benchmark.bytes`, `benchmark.flops`),
and conditions over them, for the kernel's size-selected code paths (`op.paths`).

Parsed with `ast` and walked by hand: numbers, names, + - * / // % ** and parentheses, comparisons and
`and`/`or`/`not`, nothing else, so a plan file can never run code.
"""

from __future__ import annotations

import ast
import operator

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}


def evaluate(expr: str, names: dict[str, float]) -> float:
    """Value of a plain arithmetic expression over `names` (numbers, names, + - * / // % **, parentheses).

    Nothing else is evaluated: no calls, attributes or subscripts. Raises ValueError saying what is wrong.
    """
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression ({exc.msg})") from None

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"unknown name {node.id!r}; known: {', '.join(sorted(names))}")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError(f"exponent {right} is too large")
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not value(node.operand)
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            left, ok = value(node.left), True
            for op, comparator in zip(node.ops, node.comparators):
                right = value(comparator)
                ok, left = ok and _COMPARE[type(op)](left, right), right
            return ok
        if isinstance(node, ast.BoolOp):
            values = [bool(value(v)) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        raise ValueError(f"{ast.unparse(node)!r} is not allowed: use numbers, size names, + - * / // % ** ( ), "
                         "comparisons and and/or/not")

    return value(tree.body)


def condition(expr: str, names: dict[str, float]) -> bool:
    """Whether a condition (`num_tokens * hidden * act_bytes >= 192 * 2**20`) holds; ValueError as evaluate."""
    return bool(evaluate(expr, names))


def is_condition(expr: str) -> bool:
    """Whether an expression's outermost operation is a comparison or and/or/not (ValueError if it does not parse)."""
    try:
        body = ast.parse(expr, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression ({exc.msg})") from None
    return isinstance(body, (ast.Compare, ast.BoolOp)) or isinstance(body, ast.UnaryOp) and isinstance(body.op, ast.Not)


def names_in(expr: str) -> set[str]:
    """The names an expression uses (ValueError if it is not an arithmetic expression)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression ({exc.msg})") from None
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def formula_text(text: object, sizes: set[str]) -> bool:
    """Whether a text value reads as a formula (`1/8`, `head_size ** -0.5`, `1/sqrt(head_size)`): arithmetic, or a
    call, over numbers or size names. A mode name (`gelu_tanh`) or a dashed word (`fp8-e4m3`) is not one."""
    if not isinstance(text, str):
        return False
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return False
    nodes = list(ast.walk(tree))
    operates = any(isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Call)) for n in nodes)
    numbers = any(isinstance(n, ast.Constant) and type(n.value) in (int, float) for n in nodes)
    named = any(isinstance(n, ast.Name) and n.id in sizes for n in nodes)
    return operates and (numbers or named)


def number_kind(expr: str) -> str:
    """"float" where an expression over integer sizes computes a float (a float constant, `/`, a negative power:
    `head_size ** -0.5`), else "int": the type the scalar it computes is passed as, never cast to the other."""
    for node in ast.walk(ast.parse(expr, mode="eval")):
        if isinstance(node, ast.Constant) and isinstance(node.value, float) \
                or isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) \
                or isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.right, ast.UnaryOp):
            return "float"
    return "int"
