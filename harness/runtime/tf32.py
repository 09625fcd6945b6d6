"""What a kernel computes fp32 dot products in: `tl.dot` on fp32 operands runs in TF32 on sm80 and later (10-bit
mantissas, ~1e-3 relative) unless the call says `input_precision="ieee"` (or `allow_tf32=False`), or
TRITON_F32_DEFAULT says otherwise. A page states it beside the fp32 cells, so an fp32 failure of ~1e-3 reads as
TF32, not as a bug, and an fp32 pass says what precision it was earned in.

Read from the source of the kernel's module (its `tl.dot` calls), so the fact is the same on every machine; a
kernel with no Python source (a compiled library's) says nothing.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
from pathlib import Path

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"tf32": 1}

IEEE = {"ieee"}


@functools.cache
def _dots(path: str) -> tuple[tuple[int, str], ...]:
    """(line, precision) per `tl.dot` / `triton.language.dot` call in the file: the precision it asks for, or
    "default" when it names none."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return ()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dot" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in ("tl", "language"):
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(kw.get("input_precision"), ast.Constant):
                precision = str(kw["input_precision"].value)
            elif isinstance(kw.get("allow_tf32"), ast.Constant):
                precision = "tf32" if kw["allow_tf32"].value else "ieee"
            else:
                precision = "default" if "input_precision" not in kw and "allow_tf32" not in kw else "computed"
            out.append((node.lineno, precision))
    return tuple(sorted(out))


def fp32_dot_precision(kernel) -> str | None:
    """How the kernel's module computes fp32 `tl.dot`s, in words; None when it has none (or no source)."""
    try:
        path = inspect.getsourcefile(inspect.unwrap(getattr(kernel, "func", kernel)))
    except TypeError:
        return None
    dots = _dots(path) if path else ()
    if not dots:
        return None
    default = os.environ.get("TRITON_F32_DEFAULT", "tf32")
    resolved = [(line, default if p == "default" else p) for line, p in dots]
    tf32 = [line for line, p in resolved if p in ("tf32", "tf32x3")]
    name = Path(path).name
    if not tf32:
        return f"IEEE fp32 (every tl.dot in {name} asks input_precision='ieee')" \
            if all(p in IEEE for _, p in resolved) else f"as each tl.dot in {name} computes its precision"
    return (f"TF32 on sm80 and later: tl.dot at {name}:{', '.join(map(str, tf32))} rounds fp32 operands to 10-bit "
            "mantissas (input_precision='ieee' computes in fp32)")
