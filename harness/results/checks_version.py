"""The version of the checks that make a record: a short hash of the harness modules that decide its verdict and of
the plan file. A run stores it with its provenance; the report marks records made by other checks as stale, so a
page never presents a result the current code and plan did not produce as current.

Plain Python: the files are read as bytes beside this package, never imported (no torch here).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HARNESS_DIR = Path(__file__).resolve().parents[1]  # the installed harness package

# Per kind of record, the modules whose code decides it (relative to HARNESS_DIR; those missing are skipped).
# "numerics": cells; "integration": vLLM items (routes, fusion passes, the engine; the plugin they load);
# "bench": benchmark records. A change to one kind's modules leaves the other kinds' records current.
CHECKED_MODULES = {
    "numerics": tuple(f"runtime/{name}.py" for name in (
        "accumulation", "numerics", "runner", "modes", "inputs", "calls", "tp", "memcheck", "required_examples",
        "upcast", "shrinking", "check_code", "tf32")) + ("vllm/compiled.py", "spec/tolerances.py"),
    "integration": (*(f"vllm/{name}.py" for name in ("routes", "fusion", "fusion_cases", "engine", "engine_probe",
                                                       "plugin_source")),
                    *(f"vllm/plugin_templates/{t}.py.tmpl" for t in ("custom_op", "ir", "quantization")),
                    "runtime/numerics.py", "spec/tolerances.py"),
    "bench": (*(f"runtime/bench/{name}.py" for name in (
        "specs", "models", "implementations", "precompile", "measure", "records")),
        "runtime/timing.py", "decisions/bounds.py"),
}


def checks_version(plan_path: Path | str) -> dict[str, str]:
    """Per kind ("numerics", "integration", "bench"), 12 hex digits of the sha256 of its modules' bytes and the
    plan file's."""
    plan = Path(plan_path)
    plan_bytes = plan.read_bytes() if plan.is_file() else b""
    out = {}
    for kind, modules in CHECKED_MODULES.items():
        digest = hashlib.sha256()
        for rel in modules:
            path = HARNESS_DIR / rel
            if path.is_file():
                # The name too, so that moving code between the modules changes the stamp.
                digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
        digest.update(b"plan\0" + plan_bytes)
        out[kind] = digest.hexdigest()[:12]
    return out

