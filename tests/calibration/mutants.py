"""Kernels derived from a bundled kernel's module by editing its source: the other tile sizes, paths and roundings a
correct kernel may choose, and the bugs a broken one has (a 16-bit accumulator, a dropped mask, a wrong scale).

Editing the source keeps each variant one line away from the kernel it calibrates against, with no copy of the
kernel in the tree. The edited module is written under build/ (Triton compiles `@triton.jit` functions from their
source file, so it must be a real file) and imported under a name of its own.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

BUILD = Path(__file__).resolve().parents[2] / "build" / "calibration_mutants"


def mutant(module: str, name: str, *edits: tuple[str, str]) -> ModuleType:
    """`module` with each (old, new) edit applied once, imported as `calibration_mutants.<name>`. An edit whose
    `old` is not in the source fails at once: a kernel that changed must not leave its variant silently equal."""
    qualified = f"calibration_mutants.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    source = inspect.getsource(importlib.import_module(module))
    for old, new in edits:
        if source.count(old) < 1:
            raise ValueError(f"{module}: mutant {name}: {old!r} is not in the source")
        source = source.replace(old, new)
    BUILD.mkdir(parents=True, exist_ok=True)
    path = BUILD / f"{name}.py"
    if not path.exists() or path.read_text() != source:  # rewritten only when changed: Triton caches by source
        tmp = path.with_suffix(f".{id(source)}.tmp")
        tmp.write_text(source)
        tmp.replace(path)
    spec = importlib.util.spec_from_file_location(qualified, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = mod
    spec.loader.exec_module(mod)
    return mod
